"""`decoder-audit verify`'s own flags."""

from __future__ import annotations

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
