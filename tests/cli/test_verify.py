"""`decoder-audit verify`'s own flags."""

from __future__ import annotations

import sys

import pytest
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


def test_verify_report_into_a_folder_holding_the_users_report_md_is_refused(tmp_path,
                                                                           capsys):
    """Issue 44: it replaced the user's report.md silently (verify-batch refuses the folder).
    Refused before the gate runs; a folder of an earlier report is written again."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("# what I found\n")
    before = snapshot(mine)
    assert main(["verify", "--report", str(mine), "--no-progress"]) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err, "verify")
    assert repr(str(mine)) in line and "report.md" in line, line
    assert captured.out == ""  # said before the gate ran
    assert_kept(before)
    assert sorted(p.name for p in mine.iterdir()) == ["report.md"]
    ours = tmp_path / "ours"
    for _ in range(2):  # the second run replaces the first one's report
        assert main(["verify", "--report", str(ours), "--no-progress"]) == 0
    assert (ours / "report.md").read_text().startswith("# decoder-audit gate report")
    capsys.readouterr()


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


# ---- issue 44: a --hf folder that is not there, or not readable here --------------------------

def test_verify_hf_without_transformers_is_a_usage_error_with_the_constrained_install(
        tmp_path, monkeypatch, capsys):
    """After the README's first install (no `hf` extra), `verify --hf DIR` ended with status 1
    ("unexpected ImportError", the failed-check status) and a hint that skipped the
    constraints. The folder is looked at first: a missing one is said as missing."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}\n')
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    assert main(["verify", "--hf", str(tmp_path / "missing"), "--no-progress"]) == 2
    assert "does not exist" in one_line(capsys.readouterr().err, "verify")
    assert main(["verify", "--hf", str(folder), "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "verify")
    assert "transformers" in line and "-c constraints.txt" in line and "[hf]" in line, line


@pytest.mark.parametrize("command", ["verify", "account", "ledger"])
def test_a_hub_id_or_a_missing_folder_given_as_hf_says_which(tmp_path, monkeypatch, capsys,
                                                             command):
    """Both said "has no config.json": a Hub id is never downloaded (how to get its folder is
    said), and a path that is not there "does not exist"."""
    monkeypatch.chdir(tmp_path)  # no folder named gpt2 here
    for hub_id in ("gpt2", "meta-llama/Llama-3.2-1B"):
        assert main([command, "--hf", hub_id]) == 2
        line = one_line(capsys.readouterr().err, command)
        assert repr(hub_id) in line and "save_pretrained" in line, line
        assert f"hf download {hub_id}" in line and "huggingface-cli download" in line, line
        assert "config.json" not in line and "does not exist" not in line, line
    assert main([command, "--hf", "/nonexistent"]) == 2
    line = one_line(capsys.readouterr().err, command)
    assert "'/nonexistent' does not exist" in line and "download" not in line, line
