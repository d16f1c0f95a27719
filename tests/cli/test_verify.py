"""`decoder-audit verify`'s own flags."""

from __future__ import annotations

import torch
from cli_support import assert_kept, one_line, snapshot

from decoder_audit.cli import main


def test_verify_report_pointing_at_an_existing_file(tmp_path, capsys):
    path = tmp_path / "report.md"
    path.write_text("my own report\n")
    before = snapshot(path)
    assert main(["verify", "--report", str(path)]) == 2
    captured = capsys.readouterr()
    assert f"--report {str(path)!r} is a file" in one_line(captured.err, "verify")
    assert captured.out == ""  # refused before the gate ran
    assert_kept(before)


def test_a_preset_is_built_directly_in_the_dtype_asked_for(monkeypatch):
    """verify --dtype bfloat16 builds a preset's weights in bfloat16: no float32 copy exists
    first (a 7B model would need 27 GB for it)."""
    from decoder_audit.model import decoder as decoder_module

    built = []
    original = decoder_module.Decoder.__init__

    def spy(self, config, *, device=None, dtype=None):
        built.append(dtype)
        original(self, config, device=device, dtype=dtype)

    monkeypatch.setattr(decoder_module.Decoder, "__init__", spy)
    assert main(["verify", "--preset", "tiny-368", "--dtype", "bfloat16", "--json"]) == 0
    assert built[0] == torch.bfloat16
