"""`decoder-audit verify-batch FILE` (issue 35): a batch from torch.save (read with
weights_only: nothing else is unpickled), safetensors or a collator FILE.py:FN, audited by
`da.audit_batch`; exit 0 pass, 1 fail, 2 with one line for a usage error or a FILE that holds no
batch. docs/batches.md's example is what the command prints, and its table and `--help` name the
checks a report holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_support import assert_kept, error_line, snapshot

import decoder_audit as da
from decoder_audit.cli import main

DOC = (Path(__file__).resolve().parents[2] / "docs" / "batches.md").read_text()
IDS = [[1, 3, 4, 5, 2], [1, 3, 2, 0, 0]]
MASK = [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
GOOD = {"input_ids": torch.tensor(IDS), "attention_mask": torch.tensor(MASK),
        "labels": torch.tensor([[1, 3, 4, 5, 2], [1, 3, 2, -100, -100]])}


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC, re.S)


def _report_names() -> list[str]:
    """The checks a report holds, in order (read off a report, not the module's table)."""
    return [c.name for c in da.audit_batch({"input_ids": [[1, 2]], "labels": [[1, 2]]}).checks]


def test_the_docs_example_is_what_the_command_prints(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    make = next(block for block in _blocks("python") if "torch.save" in block)
    exec(compile(make, "docs/batches.md", "exec"), {})  # writes batch.pt, as the reader does
    command = next(b for b in _blocks("bash") if "verify-batch" in b).split()[1:]
    failing, passing = _blocks("text")
    capsys.readouterr()
    assert main(command) == 1
    assert capsys.readouterr().out == failing
    batch = torch.load("batch.pt", weights_only=True)
    batch["labels"][batch["attention_mask"] == 0] = -100  # the fix the page states
    torch.save(batch, "batch.pt")
    assert main(command) == 0
    assert capsys.readouterr().out == passing


def test_the_docs_table_and_the_help_name_every_check_of_a_report(capsys):
    table = re.findall(r"^\| `(\w+)` \| (.+) \|$", DOC, re.M)
    assert [name for name, _ in table] == _report_names()
    assert dict(table) == da.BatchReport.CHECK_TITLES
    with pytest.raises(SystemExit):
        main(["verify-batch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, title in table:
        assert f"{name}: {title}" in text


def test_verify_batch_is_listed_beside_the_other_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert re.search(r"^\s+verify-batch\s", capsys.readouterr().out, re.M)


def test_a_safetensors_batch_shifted_twice_fails_with_status_1(tmp_path, capsys):
    from safetensors.torch import save_file

    shifted = torch.full_like(GOOD["labels"], -100)
    shifted[:, :-1] = GOOD["labels"][:, 1:]  # shifted here; a Hugging Face model shifts again
    path = tmp_path / "batch.safetensors"
    save_file({**GOOD, "labels": shifted}, str(path))
    assert main(["verify-batch", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first_failure"] == "shift" and report["shape"] == [2, 5]
    assert main(["verify-batch", str(path), "--labels-shifted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"]


def test_a_malformed_batch_is_a_failed_verdict_not_a_usage_error(tmp_path, capsys):
    path = tmp_path / "ragged.pt"
    torch.save({"input_ids": [[1, 2, 3], [4, 5]], "labels": [[1, 2, 3], [4, 5]]}, path)
    assert main(["verify-batch", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first_failure"] == "tensors" and "[3, 2]" in report["checks"][0]["detail"]


class Recorded:
    """An object whose unpickling would run code: it records that it ran."""

    ran = False

    def __setstate__(self, state):
        Recorded.ran = True


def test_a_pickled_object_is_refused_and_never_unpickled(tmp_path, capsys):
    path = tmp_path / "batch.pt"
    torch.save({"input_ids": torch.tensor(IDS), "labels": torch.tensor(IDS),
                "extra": Recorded()}, path)
    assert main(["verify-batch", str(path)]) == 2
    line = error_line(capsys, "verify-batch")
    assert "Recorded" in line and str(path) in line
    assert not Recorded.ran


@pytest.mark.parametrize("content, fact", [
    (b"not a batch at all", "neither"),
    (None, "Tensor"),  # a torch.save of one tensor: no mapping
])
def test_a_file_that_holds_no_batch_is_one_line_and_status_2(tmp_path, capsys, content, fact):
    path = tmp_path / "batch.pt"
    if content is None:
        torch.save(torch.tensor(IDS), path)
    else:
        path.write_bytes(content)
    assert main(["verify-batch", str(path)]) == 2
    assert fact in error_line(capsys, "verify-batch")


def test_a_missing_file_and_a_python_file_without_a_function_are_usage_errors(tmp_path, capsys):
    assert main(["verify-batch", str(tmp_path / "nowhere.pt")]) == 2
    assert "nowhere.pt" in error_line(capsys, "verify-batch")
    (tmp_path / "collate.py").write_text("def batch():\n    return {}\n")
    assert main(["verify-batch", str(tmp_path / "collate.py")]) == 2
    assert "FILE.py:FN" in error_line(capsys, "verify-batch")


COLLATE = '''
import sys


def good():
    print("collating")  # a collator's own output: kept off stdout
    return {"input_ids": [[1, 3, 2]], "labels": [[1, 3, 2]]}


def minus_one():
    return {"input_ids": [[1, 3, 2, 0]], "attention_mask": [[1, 1, 1, 0]],
            "labels": [[-1, 3, 2, -1]]}


def broken():
    raise RuntimeError("the dataset is not there")


def exits():
    sys.exit(0)
'''


def test_a_collator_function_is_called_and_its_batch_audited(tmp_path, capsys):
    (tmp_path / "collate.py").write_text(COLLATE)
    spec = f"{tmp_path / 'collate.py'}"
    assert main(["verify-batch", f"{spec}:good", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] and "collating" in captured.err
    assert main(["verify-batch", f"{spec}:minus_one", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["first_failure"] == "values"
    assert main(["verify-batch", f"{spec}:minus_one", "--ignore-index", "-1", "--json"]) == 0
    capsys.readouterr()
    for name, fact in (("broken", "the dataset is not there"), ("exits", "sys.exit"),
                       ("absent", "absent")):
        assert main(["verify-batch", f"{spec}:{name}"]) == 2, name
        assert fact in error_line(capsys, "verify-batch")


def test_report_writes_the_json_and_markdown_and_keeps_a_users_folder(tmp_path, capsys):
    path = tmp_path / "batch.pt"
    torch.save(GOOD, path)
    out = tmp_path / "report"
    assert main(["verify-batch", str(path), "--tokenizer", "tiny-vocab", "--report",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    written = json.loads((out / "report.json").read_text())
    assert written["passed"] and written["pair"] == ["input:  <bos> A B C",
                                                     "target: A B C <eos>"]
    assert "PASSED" in (out / "report.md").read_text() and str(out) in printed
    assert main(["verify-batch", str(path), "--report", str(out)]) == 0  # its own: replaced
    capsys.readouterr()
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    kept = snapshot(users)
    assert main(["verify-batch", str(path), "--report", str(users)]) == 2
    assert "notes.txt" in error_line(capsys, "verify-batch")
    assert_kept(kept)
    assert not (users / "report.json").exists()
