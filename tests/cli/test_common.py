"""The model sources every command takes (cli/common.py, sources.py): factories that exit, raise
or need arguments, files that do not import, edited or non-UTF-8 configs, weights that cannot
fit, devices this machine lacks, run folders."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from cli_support import TRAIN, assert_kept, error_line, one_line, snapshot, strict_rows

import decoder_audit as da
from decoder_audit.cli import build_parser, main


@pytest.mark.parametrize("factory, code, says", [
    ("exits", 2, "exits() in {path!r} failed: it called sys.exit(0) instead of returning a "
                 "module"),
    ("exits_in_forward", 1, "user code called sys.exit(0) before the command finished; nothing "
                            "was checked"),
    ("needs_arguments", 2, "needs_arguments() in {path!r} needs arguments ['width'] (signature "
                           "(width, depth=2))"),
    ("raises", 2, "raises() in {path!r} failed: ValueError: width must be positive, got -3"),
])
def test_model_factories_that_exit_raise_or_need_arguments(foreign, capsys, factory, code, says):
    assert main(["verify", "--model", f"{foreign}:{factory}", "--vocab-size", "8",
                 "--max-seq-len", "4", "--no-progress"]) == code
    assert says.format(path=str(foreign)) in error_line(capsys, "verify")


@pytest.mark.parametrize("source, says", [
    ("def build(:\n    pass\n", "failed to import: SyntaxError at line 1"),
    ("import not_a_module_xyz\n\ndef build():\n    pass\n",
     "failed to import: ModuleNotFoundError: No module named 'not_a_module_xyz'"),
])
def test_model_files_that_do_not_import(tmp_path, capsys, source, says):
    path = tmp_path / "broken.py"
    path.write_text(source)
    assert main(["verify", "--model", f"{path}:build", "--vocab-size", "8"]) == 2
    assert f"--model file {str(path)!r} {says}" in error_line(capsys, "verify")


def test_an_edited_config_json_is_caught(tmp_path, capsys):
    folder = da.save_checkpoint(da.Decoder(da.preset("tiny-368")), tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    assert config["mlp"] == "relu"
    config["mlp"] = "gelu"  # the same shapes: only the recorded digest can tell
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    before = snapshot(folder)
    assert main(["verify", "--checkpoint", str(folder)]) == 2
    line = error_line(capsys, "verify")
    assert "config.json' was changed after the checkpoint was saved" in line
    assert_kept(before)


def test_a_config_that_is_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.json"
    raw = '{"vocab_size": 8, "notes": "caf\u00e9"}'.encode("latin-1")  # e-acute is 0xe9
    path.write_bytes(raw)
    offset = raw.index(b"\xe9")
    for command in ("verify", "ledger", "train"):
        extra = ["--out", str(tmp_path / "run")] if command == "train" else []
        assert main([command, "--config", str(path), *extra]) == 2
        line = error_line(capsys, command)
        assert f"config file {str(path)!r} is not UTF-8 text (byte 0xe9 at offset {offset})" in line


HUGE = {"vocab_size": 10**9, "d_model": 1024, "n_layers": 1, "n_heads": 1, "d_ff": 4,
        "max_seq_len": 4}


@pytest.mark.parametrize("command", ["verify", "train"])
def test_weights_that_cannot_fit_are_refused_before_allocating(tmp_path, capsys, command):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(HUGE))
    out = tmp_path / "run"
    extra = ["--out", str(out), "--no-progress"] if command == "train" else []
    assert main([command, "--config", str(path), *extra]) == 2
    line = error_line(capsys, command)
    assert "vocab_size=1000000000" in line
    assert not out.exists()
    if command == "verify":  # the gate's predicted peak, asked before the weights are built
        from decoder_audit.gate import gate_peak

        peak = gate_peak(da.DecoderConfig.from_dict(HUGE))
        assert f"{peak.total / 1e9:,.1f} GB" in line and peak.check in line
        assert peak.total > 1_024_004_212_736 * 4  # at least the float32 weights
        return
    assert "the model does not fit in memory" in line and "nothing was allocated" in line
    assert "(1,024,004,212,736 parameters x 4 bytes x 4)" in line


def _takes_device(command: str) -> bool:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return "--device" in subparsers.choices[command].format_usage()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["train", "verify"])
def test_device_cuda_without_cuda_is_said_before_the_gate(tmp_path, capsys, command):
    if not _takes_device(command):
        pytest.skip(f"{command} has no --device option in this tree")
    out = tmp_path / "run"
    extra = ["--out", str(out), "--no-progress"] if command == "train" else []
    assert main([command, "--device", "cuda", *extra]) == 2
    captured = capsys.readouterr()
    assert "CUDA is not available on this machine (" in one_line(captured.err, command)
    assert captured.out == ""  # said before the gate (or anything else) ran
    assert not out.exists()


def test_verify_ledger_account_and_train_take_a_run_folder(run_copy, tmp_path, capsys):
    before = snapshot(run_copy)
    for command in ("verify", "ledger", "account"):
        assert main([command, "--checkpoint", str(run_copy), "--json"]) == 0, command
    capsys.readouterr()
    # train --checkpoint RUN_FOLDER; its --out holds the stale lock of a run that was killed.
    out = tmp_path / "again"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (out / "run.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": "here",
                                              "started": "2020-01-01T00:00:00"}))
    assert main(["train", "--checkpoint", str(run_copy), "--out", str(out), "--steps", "2",
                 *TRAIN]) == 0
    printed = capsys.readouterr().out
    assert f"took over the stale lock of pid {int(dead.stdout)}" in printed
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "loss_curve.png",
                                                     "metrics.jsonl"]
    assert math.isfinite(strict_rows(out / "metrics.jsonl")[-1]["loss"])
    assert_kept(before)


# ---- issue 26: factories that raise a BaseException or return a module on meta -----------------

ODD_FACTORIES = '''
import torch


class Boom(BaseException):
    pass


def boom():
    raise Boom("factory blew up")


def on_meta():
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
'''


@pytest.mark.parametrize("command", ["verify", "ledger", "train"])
@pytest.mark.parametrize("factory, facts", [("boom", ["Boom", "factory blew up"]),
                                            ("on_meta", ["meta", "'0.weight'"])])
def test_factories_raising_a_base_exception_or_returning_meta_are_one_line(
        tmp_path, capsys, command, factory, facts):
    path = tmp_path / "odd.py"
    path.write_text(ODD_FACTORIES)
    argv = [command, "--model", f"{path}:{factory}", "--vocab-size", "8"]
    if command != "ledger":
        argv += ["--no-progress"]
    if command == "train":
        argv += ["--steps", "1", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    line = error_line(capsys, command)
    assert all(fact in line for fact in facts) and str(path) in line, line
