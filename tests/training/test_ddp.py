"""DistributedDataParallel: `decoder-audit train` under torchrun with 2 CPU processes (gloo, on
127.0.0.1 only) ends with the weights of single-process training on the same global batch.

Why they can differ at all: each rank averages the loss over its 8 rows and DDP averages the two
gradients, while one process averages over 16 rows; the sums run in a different order, so
float32 results differ in the last bits and Adam carries that forward. Tolerance: 1e-5 absolute
on weights of size ~1 after 40 steps (float32 epsilon is 1.2e-7; measured 6e-7). The horizon is
short on purpose: once training escapes its loss plateau (steps ~60-150), last-bit differences
grow to ~0.2 in the weights, exactly as they do between 1- and 2-thread single-process runs."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import cli_path, torchrun

from decoder_audit.storage.checkpoint import load_checkpoint
from decoder_audit.training import train

TOLERANCE = 1e-5
RUN = ["--steps", "40", "--batch-size", "16", "--warmup", "4", "--seed", "3"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_two_process_ddp_equals_single_process(tmp_path):
    out = tmp_path / "ddp"
    proc = torchrun("--no-python", cli_path(), "train", "--out", str(out), "--no-progress", *RUN,
                    timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Rank 0 alone printed (one gate summary, every check passed) and wrote.
    summaries = re.findall(r"gate: (\d+)/(\d+) checks passed", proc.stdout)
    assert len(summaries) == 1 and summaries[0][0] == summaries[0][1], proc.stdout
    assert not (out / "run.lock").exists()  # rank 0 held the run folder's lock and let it go
    assert "distributed: 2 processes, 8 rows each of a global batch of 16" in proc.stdout

    single = train("tiny-368", steps=40, batch_size=16, warmup=4, seed=3, progress=False,
                   verbose=False)
    ddp = load_checkpoint(out / "checkpoint")
    assert ddp.lm_head.weight is ddp.token_embeddings.weight
    worst = max((ddp.state_dict()[n] - t).abs().max().item()
                for n, t in single.model.state_dict().items())
    assert worst <= TOLERANCE, worst
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(41))  # one writer: no duplicated lines
    meta = json.loads((out / "checkpoint" / "trainer.json").read_text())
    assert meta["world_size"] == 2
    print(f"DDP (2 processes) vs single process: max abs weight difference {worst:.3g}")


# ---- the gate crashing on rank 0 ----------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2])
def test_a_gate_that_crashes_refuses_training_on_every_rank(monkeypatch, world_size):
    """If the audit itself raises, nothing trains: alone, the exception propagates; with
    several ranks, rank 0 sends the others a failing verdict naming the exception (they would
    otherwise wait forever or train an unaudited model), and refuses too."""
    from decoder_audit.gate import model_facts
    from decoder_audit.training import gatekeeper
    from decoder_audit.training.distributed import RankInfo

    def crash(*args, **kwargs):
        raise RuntimeError("boom in the gate")

    sent = []

    def broadcast(ranks, values):  # what rank 0 would send to the other ranks
        sent.append(list(values))
        return values

    monkeypatch.setattr(gatekeeper, "audit", crash)
    monkeypatch.setattr(gatekeeper, "share_from_main", broadcast)
    ranks = RankInfo(rank=0, world_size=world_size)
    expected = RuntimeError if world_size == 1 else gatekeeper.GateRefusal
    with pytest.raises(expected, match="boom in the gate"):
        model = torch.nn.Linear(2, 2)
        facts = model_facts(model, vocab_size=8, max_seq_len=4)
        gatekeeper.run_gate(model, ranks, facts, seed=0, say=lambda *a, **k: None)
    if world_size == 2:
        assert sent == [[False, "gate", "the gate itself raised RuntimeError('boom in the gate')"]]
