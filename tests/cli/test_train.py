"""`decoder-audit train` through the real entry point: resume, the run lock, divergence, a
factory's weights, damaged training state, options refused before the gate. Every case ends in
the right behaviour or in a non-zero exit with one line naming the value, and every file that
existed before is still there, byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_support import TRAIN, Interrupt, assert_kept, error_line, snapshot, strict_rows
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import decoder_audit as da
import decoder_audit.storage.folder as folder_module
import decoder_audit.training.loop as loop
from decoder_audit.cli import main
from decoder_audit.storage.checkpoint import load_module_weights
from decoder_audit.training.state import read_trainer_state


def test_resume_keeps_save_every_and_tolerates_a_torn_metrics_line(run_copy, capsys,
                                                                   monkeypatch):
    # A kill -9 in the middle of writing a metrics line leaves it torn.
    with (run_copy / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 14, "loss": 1.9')
    # Resume with no --save-every, and interrupt after step 20: the run's own save_every=8 must
    # have written the step-16 checkpoint (forgotten, the last checkpoint would still be 8).
    monkeypatch.setattr(loop, "_record", Interrupt(20))
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 130
    assert "the last checkpoint is at step 16" in capsys.readouterr().err
    meta, _ = read_trainer_state(run_copy / "checkpoint")
    assert meta["step"] == 16
    assert meta["run_options"] == {"save_every": 8, "eval_every": 50, "device": "cpu",
                                   "threads": "auto"}
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 0
    rows = strict_rows(run_copy / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(25))  # each step once, the torn line gone
    assert not (run_copy / "run.lock").exists()


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_holds_it(run_copy, capsys):
    before = snapshot(run_copy)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from decoder_audit.training.lock import RunLock\n"
         f"with RunLock({str(run_copy)!r}):\n"
         "    print('held', flush=True)\n"
         "    sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["train", "--out", str(run_copy), *TRAIN],
                     ["train", "--resume", str(run_copy), "--no-progress"]):
            assert main(argv) == 2
            line = error_line(capsys, "train")
            assert f"run folder {str(run_copy)!r} is in use by another decoder-audit train" in line
            assert f"pid {holder.pid}" in line
    finally:
        holder.communicate("")  # releases the lock and exits
    assert_kept(before)


def test_a_fresh_run_never_writes_over_an_earlier_runs_metrics(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "eval_loss": 2.0}\n')
    before = snapshot(out)
    assert main(["train", "--out", str(out), *TRAIN]) == 2
    assert "already holds ['metrics.jsonl'] of an earlier run" in error_line(capsys, "train")
    assert_kept(before)


def test_a_diverging_run_stops_with_the_step_and_value_and_keeps_the_last_good_checkpoint(
        tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--lr", "1e10", "--warmup", "0", "--steps", "30", "--save-every", "1",
                 "--out", str(out), "--batch-size", "16", "--no-progress"])
    assert code == 1
    line = error_line(capsys, "train")
    meta, _ = read_trainer_state(out / "checkpoint")
    good = meta["step"]
    said = re.fullmatch(
        r"decoder-audit train: error: training diverged: the (training loss|gradient norm) is "
        r"(nan|inf|-inf) at step (\d+) \(not applied\), learning rate ([0-9.e+]+); the run "
        r"stopped and the last good checkpoint, step (\d+), is kept in (.+)", line)
    assert said, line
    assert int(said[3]) == good + 1 and int(said[5]) == good and said[6] == str(out / "checkpoint")
    assert float(said[4]) > 1e9
    model = da.load_checkpoint(out / "checkpoint")  # finite, loads
    assert all(torch.isfinite(p).all() for p in model.parameters())
    rows = strict_rows(out / "metrics.jsonl")  # valid JSON: no bare NaN
    assert [row["step"] for row in rows] == list(range(good + 1))
    assert not (out / "loss_curve.png").exists() and not (out / "run.lock").exists()


def test_train_model_factory_saves_its_weights_and_resumes(foreign, tmp_path, capsys,
                                                           monkeypatch):
    out = tmp_path / "run"
    argv = ["train", "--model", f"{foreign}:build", "--vocab-size", "8", "--max-seq-len", "4",
            "--steps", "6", "--save-every", "2", "--out", str(out), *TRAIN]
    monkeypatch.setattr(loop, "_record", Interrupt(3))
    assert main(argv) == 130
    monkeypatch.undo()
    checkpoint = out / "checkpoint"
    assert json.loads((checkpoint / "factory.json").read_text()) == {
        "factory": f"{foreign.resolve()}:build", "vocab_size": 8, "max_seq_len": 4,
        "intervention_len": None,  # a hard limit: trained at it, no other length to record
        "factory_sha256": hashlib.sha256(foreign.read_bytes()).hexdigest()}  # the file pinned
    assert read_trainer_state(checkpoint)[0]["step"] == 2
    capsys.readouterr()
    named = ["--model", f"{foreign}:build"]  # the factory, named again: the folder's never runs
    assert main(["train", "--resume", str(out), *named, "--no-progress"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert read_trainer_state(checkpoint)[0]["step"] == 6
    # The saved state dict loads into what the factory builds, and differs from the fresh one.
    sys.path.insert(0, str(foreign.parent))
    try:
        import foreign as module
    finally:
        sys.path.pop(0)
    fresh = module.build()
    trained = load_module_weights(module.build(), checkpoint)
    assert trained.head.weight is trained.emb.weight  # the tie survives the alias
    assert not torch.equal(trained.emb.weight, fresh.emb.weight)
    # It is not a Decoder checkpoint: verify rebuilds it with its factory (issue 26), reads the
    # V and length limit factory.json records, and audits the trained weights; nothing changes.
    before = snapshot(out)
    capsys.readouterr()
    assert main(["verify", "--checkpoint", str(out), *named, "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["vocab_size"], report["max_seq_len"]) == (8, 4)
    assert_kept(before)


def test_train_state_replaced_by_a_custom_pickle(run_copy, capsys):
    state = run_copy / "checkpoint" / "train_state.pt"
    torch.save({"step": 8, "payload": Interrupt(3)}, state)
    before = snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    line = error_line(capsys, "train")
    assert "train_state.pt' (" in line and "is not the file saved with this checkpoint" in line
    assert "weights_only=False" not in line
    # A checkpoint written before digests were recorded: refused unread by weights_only=True.
    _drop_file_digests(run_copy / "checkpoint")
    before = snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    line = error_line(capsys, "train")
    assert (f"train_state.pt' holds a pickled object ({Interrupt.__module__}.Interrupt) that is not "
            "a training state") in line
    assert "weights_only=False" not in line
    assert_kept(before)


def test_train_state_truncated(run_copy, capsys):
    state = run_copy / "checkpoint" / "train_state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    assert "(1,000 bytes) is not the file saved" in error_line(capsys, "train")
    _drop_file_digests(run_copy / "checkpoint")
    before = snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    assert "(1,000 bytes) is truncated or corrupt" in error_line(capsys, "train")
    assert_kept(before)


def _drop_file_digests(folder: Path) -> None:
    """Rewrite model.safetensors without the extra files' digests (as an older save)."""
    weights = folder / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if "file_sha256" not in k}
    save_file(load_file(str(weights)), str(weights), metadata=metadata)


def test_text_on_an_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = tmp_path / "run"
    assert main(["train", "--text", str(empty), "--config", str(_byte_config(tmp_path)),
                 "--out", str(out), "--no-progress"]) == 2
    assert f"--text file {str(empty)!r} is empty (0 bytes)" in error_line(capsys, "train")
    assert not out.exists()


def _byte_config(tmp_path: Path) -> Path:
    path = tmp_path / "bytes.json"
    da.DecoderConfig(vocab_size=256, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                     max_seq_len=8).save(path)
    return path


@pytest.mark.parametrize("argv, says", [
    (["--device", "tpu"], "--device 'tpu' is not a device decoder-audit trains on"),
    # the flag, not the Python; out of the option's range (cli/values.py), before anything runs
    (["--threads", "-1"], "argument --threads: -1 is not an integer from 1 to"),
    (["--threads", "0"], "argument --threads: 0 is not an integer from 1 to"),
    (["--save-every", "-2"], "argument --save-every: -2 is not an integer from 0 to"),
])
def test_train_options_that_cannot_work_are_refused_before_the_gate(tmp_path, capsys, argv, says):
    out = tmp_path / "run"
    try:
        status = main(["train", "--out", str(out), *argv, *TRAIN])
    except SystemExit as refused:  # argparse's refusal of a value out of range
        status = refused.code
    assert status == 2
    assert says in error_line(capsys, "train")
    assert not out.exists()


# ---- issue 26: an interrupted checkpoint swap, the data a resumed run reads ---------------------

def _rename_hook(monkeypatch, hook):
    """os.rename inside storage/folder.py calls hook(real_rename, src, dst) instead."""
    real = folder_module.os.rename
    monkeypatch.setattr(folder_module.os, "rename", lambda src, dst: hook(real, src, dst))


def test_ctrl_c_in_the_middle_of_a_checkpoint_swap_keeps_the_new_checkpoint(run_copy, capsys,
                                                                            monkeypatch):
    checkpoint = run_copy / "checkpoint"

    def ctrl_c_after_moving_the_old_one_aside(real, src, dst):
        real(src, dst)
        if os.fspath(src) == str(checkpoint):  # step 16's save moved step 8's aside
            signal.raise_signal(signal.SIGINT)

    _rename_hook(monkeypatch, ctrl_c_after_moving_the_old_one_aside)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 130
    monkeypatch.undo()
    assert "the last checkpoint is at step 16" in capsys.readouterr().err
    assert read_trainer_state(checkpoint)[0]["step"] == 16
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 0
    assert "at step 16/24" in " ".join(capsys.readouterr().out.split())  # resumed there


def test_a_swap_torn_by_a_crash_resumes_from_the_newer_checkpoint(run_copy, capsys, monkeypatch):
    checkpoint = run_copy / "checkpoint"

    def die_before_the_new_one_is_in_place(real, src, dst):
        if os.fspath(dst) == str(checkpoint):
            raise KeyboardInterrupt  # the process dies: step 8's and step 16's are both aside
        real(src, dst)

    _rename_hook(monkeypatch, die_before_the_new_one_is_in_place)
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 130
    monkeypatch.undo()
    assert not checkpoint.exists()
    assert "the last checkpoint is at step 16" in capsys.readouterr().err
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 0
    assert "at step 16/24" in " ".join(capsys.readouterr().out.split())  # resumed there
    assert read_trainer_state(checkpoint)[0]["step"] == 24
    assert [row["step"] for row in strict_rows(run_copy / "metrics.jsonl")] == list(range(25))
    assert not [p.name for p in run_copy.iterdir() if p.name.startswith(".checkpoint.")]


def test_a_symlinked_checkpoint_folder_is_refused_before_training(run_copy, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    (run_copy / "checkpoint").rename(elsewhere)
    (run_copy / "checkpoint").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(elsewhere, run_copy / "metrics.jsonl")
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 2
    line = error_line(capsys, "train")
    assert str(run_copy / "checkpoint") in line and str(elsewhere) in line
    assert (run_copy / "checkpoint").is_symlink()
    assert_kept(before)


@pytest.fixture
def data_run(tmp_path, monkeypatch):
    """A byte-level run on a prepared dataset, prepared and started from tmp_path/first with
    relative paths (--data data --out run) and interrupted after step 3 (checkpoint at step 2).
    The working directory is tmp_path/first afterwards."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "text.txt").write_text("the cat sat on the mat. " * 40)
    monkeypatch.chdir(first)
    assert main(["prepare", "--text", "text.txt", "--tokenizer", "bytes", "--out", "data"]) == 0
    with monkeypatch.context() as patch:
        patch.setattr(loop, "_record", Interrupt(3))
        assert main(["train", "--config", str(_byte_config(tmp_path)), "--data", "data",
                     "--steps", "4", "--save-every", "2", "--eval-every", "2", "--out", "run",
                     *TRAIN]) == 130
    return first


def test_resuming_a_data_run_from_another_directory_reads_its_data(data_run, tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)  # not where the run was started
    capsys.readouterr()
    assert main(["train", "--resume", str(data_run / "run"), "--no-progress"]) == 0
    assert read_trainer_state(data_run / "run" / "checkpoint")[0]["step"] == 4


def test_resuming_on_a_rewritten_tokens_bin_is_refused_naming_it(data_run, capsys):
    tokens = data_run / "data" / "tokens.bin"
    ids = np.fromfile(tokens, dtype="<u2")
    ids[::-1].tofile(tokens)  # the same size, ids and header, in another order
    before = snapshot(data_run)
    capsys.readouterr()
    assert main(["train", "--resume", str(data_run / "run"), "--no-progress"]) == 2
    assert str(tokens) in error_line(capsys, "train")
    assert_kept(before)


def test_resuming_a_text_run_from_another_directory_reads_its_text(tmp_path, capsys,
                                                                  monkeypatch):
    first = tmp_path / "first"
    first.mkdir()
    (first / "text.txt").write_text("the cat sat on the mat. " * 40)
    monkeypatch.chdir(first)
    with monkeypatch.context() as patch:
        patch.setattr(loop, "_record", Interrupt(3))
        assert main(["train", "--config", str(_byte_config(tmp_path)), "--text", "text.txt",
                     "--steps", "4", "--save-every", "2", "--out", "run", *TRAIN]) == 130
    monkeypatch.chdir(tmp_path)  # not where the run was started
    assert main(["train", "--resume", str(first / "run"), "--no-progress"]) == 0
    assert read_trainer_state(first / "run" / "checkpoint")[0]["step"] == 4
