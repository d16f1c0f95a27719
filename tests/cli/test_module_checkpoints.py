"""What each command offers and takes (issue 26): no help text names a flag its command lacks;
`train --intervention-len` for a --model without a hard length limit; the checkpoint of a
--model run (factory.json + model.safetensors, not a Decoder) read by `verify --checkpoint` and
`sample --checkpoint`, and refused by `train --checkpoint` naming what continues it; a Hugging
Face folder given as --checkpoint named as one."""

from __future__ import annotations

import json
import re

import pytest
import torch
from cli_support import NO_LIMIT, TRAIN, assert_kept, error_line, snapshot

from decoder_audit import training
from decoder_audit.cli import COMMANDS, build_parser, main
from decoder_audit.storage.checkpoint import save_module_weights


def _parsers() -> dict:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return {name: subparsers.choices[name] for name in COMMANDS}


@pytest.mark.parametrize("command", COMMANDS)
def test_no_help_text_names_a_flag_its_command_lacks(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no flag broken across lines by the wrapping
    parser = _parsers()[command]
    offered = {flag for action in parser._actions for flag in action.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", parser.format_help()))
    assert named <= offered, f"{command} --help names {sorted(named - offered)}"


def test_train_takes_intervention_len_and_passes_it_on(foreign, tmp_path, monkeypatch):
    given = {}

    def recorded(model, **kwargs):
        given.update(kwargs, model=model)

    monkeypatch.setattr(training, "train", recorded)
    assert main(["train", "--model", f"{foreign}:build", "--vocab-size", "8",
                 "--intervention-len", "16", "--out", str(tmp_path / "run")]) == 0
    assert given["intervention_len"] == 16 and given["max_seq_len"] is None
    assert given["model"].kind == "model"


def test_train_refuses_an_intervention_len_below_1(foreign, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:  # out of the option's range (cli/values.py)
        main(["train", "--model", f"{foreign}:build", "--vocab-size", "8",
              "--intervention-len", "0", "--out", str(tmp_path / "run")])
    assert refused.value.code == 2
    assert "--intervention-len: 0 is not an integer from 1" in error_line(capsys, "train")
    assert not (tmp_path / "run").exists()


def test_train_a_model_without_a_length_limit_at_its_intervention_len(tmp_path, capsys):
    path = tmp_path / "running.py"
    path.write_text(NO_LIMIT)
    out = tmp_path / "run"
    assert main(["train", "--model", f"{path}:build", "--vocab-size", "8",
                 "--intervention-len", "4", "--steps", "2", "--out", str(out), *TRAIN]) == 0
    factory = json.loads((out / "checkpoint" / "factory.json").read_text())
    assert factory["vocab_size"] == 8 and factory["max_seq_len"] is None
    assert factory["intervention_len"] == 4  # what a resumed run is audited and trained at


# ---- the checkpoint of a --model run -----------------------------------------------------------

@pytest.fixture
def module_run(foreign, tmp_path):
    """A run of foreign.py:build (a PrefixMean, V = 8, 4 positions): checkpoint/ holds its
    factory.json and model.safetensors."""
    out = tmp_path / "run"
    assert main(["train", "--model", f"{foreign}:build", "--vocab-size", "8", "--max-seq-len",
                 "4", "--steps", "3", "--out", str(out), *TRAIN]) == 0
    assert (out / "checkpoint" / "factory.json").is_file()
    return out


def test_verify_and_sample_take_the_checkpoint_of_a_model_run(module_run, foreign, capsys):
    from decoder_audit.generation.generate import generate
    from decoder_audit.sources import load_factory
    from decoder_audit.storage.checkpoint import load_module_weights

    before = snapshot(module_run)
    capsys.readouterr()
    factory = ["--model", f"{foreign}:build"]  # named: a folder's factory.json is never run
    assert main(["verify", "--checkpoint", str(module_run), *factory, "--json",
                 "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and (report["vocab_size"], report["max_seq_len"]) == (8, 4)
    assert main(["sample", "--checkpoint", str(module_run), *factory, "--prompt", "<bos> A",
                 "--json"]) == 0
    sampled = json.loads(capsys.readouterr().out)
    # the trained weights, generated with directly: the same greedy tokens up to the limit
    trained = load_module_weights(load_factory(f"{foreign}:build"), module_run / "checkpoint")
    expected = generate(trained.eval(), [1, 3], max_new_tokens=3, max_seq_len=4)
    assert sampled["ids"][:2] == [1, 3] and sampled["new_ids"] == expected.new_ids[0]
    assert_kept(before)


def test_train_checkpoint_of_a_model_run_names_what_continues_it(module_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["train", "--checkpoint", str(module_run), "--out", str(tmp_path / "again"),
                 "--no-progress"]) == 2
    line = error_line(capsys, "train")
    assert "factory.json" in line and f"--resume {module_run}" in line, line
    assert not (tmp_path / "again").exists()


def test_a_module_checkpoint_whose_factory_lies_inside_it_is_never_run(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    marker = tmp_path / "ran.txt"
    (run / "model.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
                                  "import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    save_module_weights(torch.nn.Linear(2, 2), run / "checkpoint", factory={
        "factory": f"{run / 'model.py'}:build", "vocab_size": 2, "max_seq_len": 2})
    assert main(["verify", "--checkpoint", str(run), "--no-progress"]) == 2
    assert str(run / "model.py") in error_line(capsys, "verify")
    assert not marker.exists()


@pytest.mark.parametrize("command", ["train", "verify", "sample"])
def test_a_hugging_face_folder_given_as_checkpoint_is_named_as_one(hf_folder, tmp_path, capsys,
                                                                   command):
    argv = {"train": ["--out", str(tmp_path / "run"), "--no-progress"],
            "verify": ["--no-progress"], "sample": ["--prompt", "a"]}[command]
    assert main([command, "--checkpoint", str(hf_folder), *argv]) == 2
    line = error_line(capsys, command)
    assert str(hf_folder) in line and "Hugging Face folder" in line and "--hf" in line, line
    assert "unknown config field" not in line
    assert not (tmp_path / "run").exists()
