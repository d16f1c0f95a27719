"""FSDP2 sharding: `decoder-audit train --shard` under torchrun with 2 CPU processes (gloo, on
127.0.0.1 only) trains as one unsharded process does on the same global batch, and its
checkpoints (sharded ones, through torch.distributed.checkpoint) resume either way: a sharded run
resumes unsharded and the reverse, the optimizer state included.

The expectation is always the plain single-process run (no DTensor, no collective). Why the two
can differ at all: each rank averages the loss over its 8 rows and the reduce-scatter averages
the two gradients, while one process averages over 16 rows; the clipping norm is summed shard
by shard. So float32 results differ in the last bits and Adam carries that forward. Tolerance:
test_ddp.py's, 1e-5 absolute on weights of size ~1 (float32 epsilon is 1.2e-7), for the
same reason; the run is 16 steps, not 40, because each FSDP2 step is ~11 collectives (an
all-gather per group in forward and again in backward, a reduce-scatter per group, the clipping
norm, the logged loss) and on a busy 2-core machine each waits for the other process.
Measured: 1.2e-6 (2 processes, 16 steps), 0 on one process. Had a resume lost the optimizer
state, Adam would restart with steps of ~lr per weight: measured 0.065, 6000x the tolerance
(the control in test_sharded_checkpoint_resumes_unsharded).

Two torchrun launches: a sharded run from scratch that keeps a copy of its step-8 checkpoint
(a Python script, so it can copy mid-run), and the CLI's --shard resuming an unsharded run's
step-8 checkpoint. A sharded run's checkpoints are sharded (torch.distributed.checkpoint,
storage/sharded.py); tests/storage/test_sharded_matrix.py resumes them on 1, 2 and 3 ranks."""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
import zoo
from helpers import cli_path, torchrun

from decoder_audit import Decoder, preset
from decoder_audit.errors import ConfigError
from decoder_audit.objective import next_token_loss
from decoder_audit.storage.checkpoint import load_checkpoint
from decoder_audit.training import distributed, train
from decoder_audit.training.state import STATE_FILE, TRAINER_FILE

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed missing")

TOLERANCE = 1e-5
STOP = 8  # the step whose checkpoint the other kind of run resumes
RUN = {"steps": 16, "batch_size": 16, "warmup": 4, "seed": 3}

# Rank 0 copies the step-8 checkpoint (written before the callback runs) and the metrics.
SCRIPT = textwrap.dedent("""
    import os, shutil, sys
    from pathlib import Path
    from decoder_audit.training import train

    out, copy = Path(sys.argv[1]), Path(sys.argv[2])
    def keep(step, row):
        if step == {stop} and os.environ["RANK"] == "0":
            shutil.copytree(out / "checkpoint", copy / "checkpoint")
            shutil.copy2(out / "metrics.jsonl", copy / "metrics.jsonl")
    train("tiny-368", out=out, save_every={stop}, shard=True, progress=False, callback=keep,
          **{run})
""").format(stop=STOP, run=RUN)


def _keep(out: Path, copy: Path) -> None:
    shutil.copytree(out / "checkpoint", copy / "checkpoint")
    shutil.copy2(out / "metrics.jsonl", copy / "metrics.jsonl")


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _state(folder: Path) -> tuple[dict, dict]:
    ckpt = folder / "checkpoint"
    return (json.loads((ckpt / TRAINER_FILE).read_text()),
            torch.load(ckpt / STATE_FILE, weights_only=True))


def _worst(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((a.state_dict()[name] - t).abs().max().item() for name, t in b.state_dict().items())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The expectation: one unsharded process, uninterrupted; its step-8 checkpoint kept."""
    root = tmp_path_factory.mktemp("single")
    out, copy = root / "run", root / "at_stop"

    def keep(step, row):
        if step == STOP:
            _keep(out, copy)

    result = train("tiny-368", out=out, save_every=STOP, progress=False, verbose=False,
                   callback=keep, **RUN)
    return result, out, copy


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Two sharded processes from scratch; their step-8 checkpoint kept."""
    root = tmp_path_factory.mktemp("sharded")
    script = root / "sharded_run.py"
    script.write_text(SCRIPT)
    out, copy = root / "run", root / "at_stop"
    proc = torchrun(str(script), str(out), str(copy))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out, copy


def test_fully_shard_keeps_the_tied_embedding_one_dtensor():
    """One rank (an in-process group): the readout is the embedding's DTensor after sharding,
    and its one gradient is the sum of both paths, as in the unsharded model."""
    from torch.distributed.tensor import DTensor

    ranks = distributed.init_distributed("cpu", shard=True)
    try:
        torch.manual_seed(0)
        plain = Decoder(preset("tiny-368"))
        model = Decoder(preset("tiny-368"))
        model.load_state_dict(plain.state_dict())
        assert distributed.wrap(model, ranks, "cpu") is model
        assert isinstance(model.token_embeddings.weight, DTensor)
        assert model.lm_head.weight is model.token_embeddings.weight
        assert len(list(model.parameters())) == len(list(plain.parameters()))  # tie counted once
        ids = torch.randint(0, 8, (4, 4))
        next_token_loss(plain, ids, ids).backward()
        next_token_loss(model, ids, ids).backward()
        grad = model.token_embeddings.weight.grad.full_tensor()
        torch.testing.assert_close(grad, plain.token_embeddings.weight.grad, rtol=0, atol=1e-6)
    finally:
        distributed.close(ranks)


def test_one_process_shard_equals_unsharded(single):
    """--shard without torchrun: FSDP2 over one rank, nothing split; same result."""
    expected = single[0]
    result = train("tiny-368", shard=True, progress=False, verbose=False, **RUN)
    assert type(result.model) is Decoder  # gathered back into a plain Decoder
    assert result.model.lm_head.weight is result.model.token_embeddings.weight
    worst = _worst(result.model, expected.model)
    assert worst <= TOLERANCE, worst
    print(f"FSDP2 on one process vs unsharded: max abs weight difference {worst:.3g}")


def test_two_sharded_processes_equal_single_process(single, sharded):
    expected, single_out, _ = single
    proc, out, _ = sharded
    # Rank 0 alone printed (one gate summary, every check passed) and wrote.
    summaries = re.findall(r"gate: (\d+)/(\d+) checks passed", proc.stdout)
    assert len(summaries) == 1 and summaries[0][0] == summaries[0][1], proc.stdout
    assert "the tied embedding and readout are one sharded Parameter" in proc.stdout
    assert not (out / "run.lock").exists()
    model = load_checkpoint(out / "checkpoint")
    assert model.lm_head.weight is model.token_embeddings.weight
    worst = _worst(model, expected.model)
    assert worst <= TOLERANCE, worst
    rows, wanted = _rows(out), _rows(single_out)
    assert [r["step"] for r in rows] == list(range(RUN["steps"] + 1))
    for row, want in zip(rows[1:], wanted[1:]):
        assert abs(row["loss"] - want["loss"]) <= TOLERANCE, (row, want)
    # A sharded checkpoint (storage/sharded.py): one file of chunks per rank, no whole weights
    assert sorted(os.listdir(out / "checkpoint" / "dcp")) == [".metadata", "__0_0.distcp",
                                                             "__1_0.distcp"]
    assert not (out / "checkpoint" / "model.safetensors").exists()
    (meta, _), (want_meta, _) = _state(out), _state(single_out)
    assert (meta["world_size"], meta["sharded"]) == (2, True)
    assert (want_meta["world_size"], want_meta["sharded"]) == (1, False)
    print(f"FSDP2 (2 processes) vs single process: max abs weight difference {worst:.3g}")


def test_sharded_checkpoint_resumes_unsharded(single, sharded, tmp_path, monkeypatch):
    """Sharded for steps 1-8 (2 processes), unsharded for 9-16: the uninterrupted run."""
    expected = single[0]
    meta, _ = _state(sharded[2])
    assert (meta["step"], meta["sharded"]) == (STOP, True)
    shutil.copytree(sharded[2], tmp_path / "run")
    resumed = train(resume=tmp_path / "run", progress=False, verbose=False)
    assert resumed.step == RUN["steps"]
    worst = _worst(resumed.model, expected.model)
    assert worst <= TOLERANCE, worst
    print(f"sharded to step {STOP}, unsharded after: max abs weight difference {worst:.3g}")
    # The control: the same resume with AdamW's state dropped misses by far more.
    monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", lambda self, state_dict: None)
    shutil.copytree(sharded[2], tmp_path / "control")
    control = train(resume=tmp_path / "control", progress=False, verbose=False)
    control_worst = _worst(control.model, expected.model)
    assert control_worst > 100 * TOLERANCE, control_worst
    print(f"the same with AdamW's state dropped: {control_worst:.3g}")


def test_unsharded_checkpoint_resumes_sharded(single, tmp_path):
    """Unsharded for steps 1-8, `torchrun ... train --shard --resume` for 9-16."""
    expected, single_out, at_stop = single
    run = tmp_path / "run"
    shutil.copytree(at_stop, run)
    proc = torchrun("--no-python", cli_path(), "train", "--resume", str(run), "--shard",
                     "--no-progress")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"at step {STOP}/{RUN['steps']}" in " ".join(proc.stdout.split())  # lines wrap
    model = load_checkpoint(run / "checkpoint")
    worst = _worst(model, expected.model)
    assert worst <= TOLERANCE, worst
    print(f"unsharded to step {STOP}, sharded after: max abs weight difference {worst:.3g}")
    rows, wanted = _rows(run), _rows(single_out)
    assert [r["step"] for r in rows] == list(range(RUN["steps"] + 1))
    for row, want in zip(rows[STOP + 1:], wanted[STOP + 1:]):
        assert abs(row["loss"] - want["loss"]) <= TOLERANCE, (row, want)
    meta, _ = _state(run)
    assert (meta["world_size"], meta["sharded"]) == (2, True)


def test_shard_refuses_a_module_that_is_not_a_decoder():
    """Refused before the gate runs: FSDP2 here shards our Decoder's blocks."""
    with pytest.raises(ConfigError, match=r"--shard shards a decoder-audit Decoder.*TorchDecoder"):
        train(zoo.TorchDecoder(), shard=True, vocab_size=13, max_seq_len=9, progress=False,
              verbose=False, steps=2)


def test_shard_refuses_a_batch_the_processes_do_not_divide(monkeypatch, capsys):
    """Rank 0 of two (the process group faked: the refusal comes before any collective), before
    the gate is spent."""
    monkeypatch.setattr(distributed, "init_distributed",
                        lambda device, shard=False: distributed.RankInfo(0, 2, sharded=shard))
    with pytest.raises(ConfigError,
                       match=r"batch_size=15 must be divisible by the number of processes \(2\)"):
        train("tiny-368", shard=True, batch_size=15, steps=2, progress=False)
    assert "gate:" not in capsys.readouterr().out


def test_memory_check_counts_a_shard_of_the_training_state(monkeypatch):
    """On a GPU an unsharded run needs four whole copies (weights, gradients, AdamW's two
    moments) on each device; sharded over N, max(1, 4/N): a model too big for one device is what
    --shard is for. A device with room for 2.5 copies (float32 bytes from the ledger's count)."""
    from decoder_audit.accounting import memory
    from decoder_audit.accounting.ledger import parameter_ledger
    from decoder_audit.training import prepare

    cfg = preset("tiny-368")
    room = int(parameter_ledger(cfg).total * 4 * 2.5)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": room)
    for ranks in (distributed.RankInfo(), distributed.RankInfo(0, 2),
                  distributed.RankInfo(0, 1, sharded=True)):  # 4 copies each
        with pytest.raises(ConfigError, match="does not fit"):
            # private: the CUDA memory check cannot run without a GPU through train()
            prepare._check_memory(cfg, "cuda:0", ranks)
    prepare._check_memory(cfg, "cuda:0", distributed.RankInfo(0, 2, sharded=True))  # 2 copies
