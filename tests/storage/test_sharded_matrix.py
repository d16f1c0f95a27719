"""Sharded checkpoints across world sizes, under torchrun (gloo on the CPU, 127.0.0.1 only):
written by 2 ranks and resumed on 2 (bitwise: the uninterrupted run's losses and weights), on 1
plain process and on 3 ranks; written by 1 and resumed on 2; and a rank killed in the middle of
a save, which leaves the previous checkpoint in place and resumable. Several torchrun launches:
run by .ci/sharded-checkpoints (DECODER_AUDIT_SLOW_TESTS=1), not in the default suite.

Across world sizes the expectation is the uninterrupted run to test_shard.py's tolerance, 1e-5
(each world size sums the gradients in its own order, so even uninterrupted runs on 2 and 3
ranks differ in the last bits); the state read back is the state saved, bit for bit (the 1-rank
resume compares it with the whole weights FSDP2's own gather returned at the save)."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import cli_path, torchrun

from decoder_audit.storage.checkpoint import load_checkpoint
from decoder_audit.training import train

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing"),
    pytest.mark.skipif(os.environ.get("DECODER_AUDIT_SLOW_TESTS") != "1",
                       reason="several torchrun launches: .ci/sharded-checkpoints runs them "
                              "(DECODER_AUDIT_SLOW_TESTS=1)")]

TOLERANCE = 1e-5
STOP = 6
RUN = {"steps": 12, "batch_size": 12, "warmup": 2, "seed": 3}  # 12 rows: 1, 2 and 3 ranks

# A sharded run that keeps a copy of its step-6 checkpoint and the whole weights FSDP2 gathers
# there; with KILL set, rank 1 dies (os._exit) inside the step-12 save's write of its chunks.
SCRIPT = textwrap.dedent("""
    import os, shutil, sys
    from pathlib import Path
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from decoder_audit.training import train
    from decoder_audit.training.state import gather_full_state

    out, copy, kill = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "kill"
    rank = int(os.environ["RANK"])
    held = {{}}
    if kill:
        original = FileSystemWriter.write_data
        def write_data(self, plan, planner):
            if held.get("saved") and rank == 1:
                os._exit(9)  # killed mid-save: rank 0 is inside the same save
            return original(self, plan, planner)
        FileSystemWriter.write_data = write_data
    def keep(step, row):
        if step == {stop}:
            held["saved"] = True
            if rank == 0:
                shutil.copytree(out / "checkpoint", copy / "checkpoint")
                shutil.copy2(out / "metrics.jsonl", copy / "metrics.jsonl")
    result = train("tiny-368", out=out, save_every={stop}, shard=True, progress=False,
                   callback=keep, **{run})
""").format(stop=STOP, run=RUN)


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def _launch(tmp: Path, nproc: int, kill: bool = False):
    script = tmp / "run.py"
    script.write_text(SCRIPT)
    out, copy = tmp / "run", tmp / "at_stop"
    proc = torchrun(str(script), str(out), str(copy), "kill" if kill else "keep", nproc=nproc)
    return proc, out, copy


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    proc, out, copy = _launch(tmp_path_factory.mktemp("two"), 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, copy


def _resume_cli(run: Path, nproc: int):
    proc = torchrun("--no-python", cli_path(), "train", "--resume", str(run), "--shard",
                    "--no-progress", nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _assert_close_losses(got: Path, want: Path, atol: float) -> None:
    for step, (a, b) in enumerate(zip(_losses(got), _losses(want), strict=True), start=1):
        assert abs(a - b) <= atol, (step, a, b)


def test_two_to_two_is_bitwise_the_uninterrupted_run(two, tmp_path):
    out, copy = two
    run = tmp_path / "run"
    shutil.copytree(copy, run)
    _resume_cli(run, 2)
    assert _losses(run) == _losses(out)
    a, b = load_checkpoint(run / "checkpoint"), load_checkpoint(out / "checkpoint")
    for name, tensor in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], tensor), name


def test_two_to_one_plain_process(two, tmp_path):
    out, copy = two
    run = tmp_path / "run"
    shutil.copytree(copy, run)
    train(resume=run, progress=False, verbose=False)  # no --shard: one plain process
    _assert_close_losses(run, out, TOLERANCE)


def test_two_to_three(two, tmp_path):
    out, copy = two
    run = tmp_path / "run"
    shutil.copytree(copy, run)
    _resume_cli(run, 3)
    _assert_close_losses(run, out, TOLERANCE)
    assert json.loads((run / "checkpoint" / "trainer.json").read_text())["world_size"] == 3


def test_one_to_two(tmp_path):
    """One sharded process to step 6 (stopped there by its callback, after the step's save),
    two ranks after: the uninterrupted one-process run."""
    full, out = tmp_path / "full", tmp_path / "stopped"
    train("tiny-368", out=full, shard=True, progress=False, verbose=False, **RUN)

    class Stop(Exception):
        pass

    def stop(step, row):
        if step == STOP:
            raise Stop

    with pytest.raises(Stop):
        train("tiny-368", out=out, shard=True, save_every=STOP, progress=False, verbose=False,
              callback=stop, **RUN)
    _resume_cli(out, 2)
    _assert_close_losses(out, full, TOLERANCE)


def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    proc, out, copy = _launch(tmp_path, 2, kill=True)
    assert proc.returncode != 0
    ckpt = out / "checkpoint"
    assert json.loads((ckpt / "trainer.json").read_text())["step"] == STOP
    assert sorted(os.listdir(ckpt)) == sorted(os.listdir(copy / "checkpoint"))
    for name in os.listdir(ckpt / "dcp"):
        assert (ckpt / "dcp" / name).read_bytes() == (copy / "checkpoint" / "dcp" / name
                                                      ).read_bytes()
    load_checkpoint(ckpt)  # loadable, its digests hold
    # rank 0 either removed its temporary folder (gloo told it its peer was gone) or was
    # stopped before it could: a marked folder the next save sweeps
    train(resume=out, progress=False, verbose=False, shard=True)  # and resumable
    assert not [p for p in out.iterdir() if p.name.startswith(".checkpoint.")]  # swept
