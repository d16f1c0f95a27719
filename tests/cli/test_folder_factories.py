"""A run folder is data, never code (issue 35): the factory.json of a --model run names a
FILE.py:FACTORY, and no command follows it. `verify --checkpoint`, `sample --checkpoint`,
`account --checkpoint`, `ledger --checkpoint` and `train --resume` refuse such a folder in one line (status 2) naming the
factory it records, unless the user names the factory with --model; and the one they name must
be the code the weights were trained under: the same FACTORY in a file with the SHA-256
factory.json records. An edited or replaced file is refused before a line of it runs, with
nothing changed on disk.

Each case plants a marker-writing file where the folder points: a command that imported it
leaves the marker."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
from cli_support import FOREIGN, TRAIN, assert_kept, error_line, snapshot
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from decoder_audit.cli import build_parser, main

SHAPE = ["--vocab-size", "8", "--max-seq-len", "4"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step run of model.py:build (cli_support's PrefixMean, V = 8, 4 positions)."""
    root = tmp_path_factory.mktemp("factories")
    (root / "model.py").write_text(FOREIGN)
    assert main(["train", "--model", f"{root / 'model.py'}:build", *SHAPE, "--steps", "2",
                 "--out", str(root / "run"), *TRAIN]) == 0
    return root


@pytest.fixture
def copy(trained, tmp_path):
    """The run and its model.py, copied: (the run folder, model.py, the marker path)."""
    shutil.copytree(trained / "run", tmp_path / "run")
    shutil.copy(trained / "model.py", tmp_path / "model.py")
    return tmp_path / "run", tmp_path / "model.py", tmp_path / "ran.txt"


def _planted(marker: Path, body: str = FOREIGN) -> str:
    """Python that writes `marker` when it is imported, then defines `body`."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{body}"


def _point_at(run: Path, spec: str) -> None:
    """Rewrite the run's factory.json and trainer.json to record `spec` as the factory (what a
    downloaded folder may say: it is the folder's word)."""
    for name in ("factory.json", "trainer.json"):
        path = run / "checkpoint" / name
        data = json.loads(path.read_text())
        (data if name == "factory.json" else data["factory"])["factory"] = spec
        path.write_text(json.dumps(data))
    # the recorded digests of the two files would refuse the edit: a folder made elsewhere
    # carries digests of its own files, so drop ours to stand for one
    weights = run / "checkpoint" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        metadata = {k: v for k, v in (handle.metadata() or {}).items()
                    if not k.startswith("decoder_audit.file_sha256.")}
    save_file(load_file(weights), weights, metadata=metadata)


COMMANDS = {
    "verify": lambda run: ["verify", "--checkpoint", str(run), "--no-progress"],
    "sample": lambda run: ["sample", "--checkpoint", str(run), "--prompt", "<bos> A"],
    "account": lambda run: ["account", "--checkpoint", str(run), "--no-measure"],
    "ledger": lambda run: ["ledger", "--checkpoint", str(run)],
    "train": lambda run: ["train", "--resume", str(run), "--no-progress"],
}


@pytest.mark.parametrize("where", ["absolute", "relative"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_runs_the_factory_a_folder_names(copy, tmp_path, monkeypatch, capsys,
                                                     command, where):
    run, _, marker = copy
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "evil.py").write_text(_planted(marker))
    monkeypatch.chdir(tmp_path)  # a relative factory is read against the working folder
    spec = (f"{elsewhere / 'evil.py'}:build" if where == "absolute"
            else "elsewhere/evil.py:build")
    _point_at(run, spec)
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(COMMANDS[command](run)) == 2
    line = error_line(capsys, command)
    assert spec in line and "--model" in line, line
    assert not marker.exists(), f"{command} ran the code {spec} names"
    assert_kept(before)


def test_the_named_factory_must_be_the_file_the_weights_were_trained_under(copy, capsys):
    """model.py edited after training (a different readout scale, and a marker): sample, verify
    and resume refuse it, naming the SHA-256 factory.json records, and never run it."""
    run, model, marker = copy
    recorded = json.loads((run / "checkpoint" / "factory.json").read_text())
    assert recorded["factory_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    model.write_text(_planted(marker, FOREIGN.replace("return self.head(x)",
                                                      "return 3 * self.head(x)")))
    before = snapshot(run.parent)
    named = ["--model", f"{model}:build"]
    for argv in (["sample", "--checkpoint", str(run), *named, "--prompt", "<bos> A"],
                 ["verify", "--checkpoint", str(run), *named, "--no-progress"],
                 ["train", "--resume", str(run), *named, "--no-progress"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        line = error_line(capsys, argv[0])
        assert recorded["factory_sha256"][:12] in line and "factory.json" in line, line
        assert str(model) in line, line
    assert not marker.exists()
    assert_kept(before)


def test_another_factory_of_the_same_file_is_refused(copy, capsys):
    run, model, _ = copy
    recorded = json.loads((run / "checkpoint" / "factory.json").read_text())["factory"]
    before = snapshot(run)
    assert main(["verify", "--checkpoint", str(run), "--model", f"{model}:raises",
                 "--no-progress"]) == 2
    line = error_line(capsys, "verify")
    assert "'raises'" in line and recorded in line, line  # the one named, and the one recorded
    assert_kept(before)


def test_the_named_factory_rebuilds_the_run_and_the_rerun_names_it(copy, capsys):
    """The same file copied elsewhere (same bytes) is the same code: it rebuilds the run; the
    report's rerun command names the checkpoint and the factory, and parses back to them."""
    run, model, _ = copy
    moved = model.parent / "moved"
    moved.mkdir()
    shutil.copy(model, moved / "model.py")
    capsys.readouterr()
    assert main(["verify", "--checkpoint", str(run), "--model", f"{moved / 'model.py'}:build",
                 "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and (report["vocab_size"], report["max_seq_len"]) == (8, 4)
    words = shlex.split(report["command"])
    args = build_parser().parse_args(words[1:])
    assert (args.checkpoint, args.model) == (str(run), f"{moved / 'model.py'}:build")


def test_model_beside_a_preset_is_one_line(copy, capsys):
    _, model, _ = copy
    assert main(["verify", "--preset", "tiny-368", "--model", f"{model}:build",
                 "--no-progress"]) == 2
    line = error_line(capsys, "verify")
    assert "--model" in line and "--preset" in line, line


def test_model_beside_a_decoders_checkpoint_is_one_line(copy, tmp_path, capsys):
    """A Decoder's checkpoint is rebuilt by its config.json: a --model beside it is refused,
    never run."""
    _, model, marker = copy
    model.write_text(_planted(marker))
    assert main(["train", "--steps", "1", "--out", str(tmp_path / "decoder"), *TRAIN]) == 0
    capsys.readouterr()
    assert main(["verify", "--checkpoint", str(tmp_path / "decoder"), "--model",
                 f"{model}:build", "--no-progress"]) == 2
    line = error_line(capsys, "verify")
    assert str(tmp_path / "decoder") in line and "--model" in line, line
    assert not marker.exists()
