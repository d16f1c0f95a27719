"""The training shape (gate/checks/trainshape.py): probed at the run's own length, past the audit's
64-token probes; cut only by the model's hard limit or by memory, and then never called the
training shape, with the length audited and the reason in the evidence."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from zoo_training import PathLM, T, V

import decoder_audit as da
from decoder_audit.gate.checks import trainshape
from decoder_audit.gate.peak import PREDICTION_MARGIN


class LeaksPast(nn.Module):
    """A causal toy (each position's logits from its own token) that reads the next token in
    rows longer than `past`; no length limit."""

    def __init__(self, past: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.past, self.embed = past, nn.Embedding(V, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.embed(ids)  # (B, T, V)
        if ids.shape[1] > self.past:
            logits = logits + nn.functional.one_hot(torch.roll(ids, -1, dims=1), V)
        return logits


def test_a_leak_past_the_audits_own_probes_is_caught_at_the_runs_length():
    """T=100 declared: the probe runs at T=100 (one row, several cuts over its length), not at
    the 64 tokens every other probe stops at, and names it the training shape; at T=64 the
    same model passes."""
    report = da.audit(LeaksPast(), vocab_size=V, checks=["causal"],
                      training=da.TrainingPath(1, 100))
    causal = report["causal"]
    shape = causal.evidence["training_shape"]
    assert not causal.passed and causal.evidence["seq_len"] == 64
    assert (shape["batch"], shape["seq_len"], shape["whole"]) == (1, 100, True)
    assert shape["cuts"] >= trainshape.MIN_SHAPE_CUTS and shape["leaks"]
    assert "the training shape (B=1, T=100)" in causal.detail
    short = da.audit(LeaksPast(), vocab_size=V, checks=["causal"],
                     training=da.TrainingPath(1, 64))
    assert short.passed


def test_a_run_longer_than_the_hard_limit_is_probed_at_the_limit_and_says_so():
    """PathLM rejects rows past T=32: a path of T=50 is probed at 32, the evidence says the
    model's hard limit is why, and the report does not call T=32 the training shape."""
    report = da.audit(PathLM(dropout=0.0), vocab_size=V, max_seq_len=T,
                      checks=["causal", "train_mode"], training=da.TrainingPath(4, 50))
    shape = report["causal"].evidence["training_shape"]
    assert report.passed
    assert (shape["seq_len"], shape["training"]["seq_len"], shape["whole"]) == (T, 50, False)
    assert f"rejects inputs longer than {T} tokens" in shape["why"]
    said = report["train_mode"].detail
    assert f"B=4, T={T}, short of the training shape (B=4, T=50" in said
    assert f"the training shape (B=4, T={T})" not in said


def test_rows_are_cut_to_what_memory_holds_and_the_reason_is_given(monkeypatch):
    """Memory for two rows of the probe's logits (3 x T x V float32 each, within the
    prediction's margin): 2 of the run's 8 rows are probed, at the full length."""
    per_row = trainshape.SHAPE_LOGITS_ALIVE * T * V * 4
    monkeypatch.setattr(trainshape, "memory_available",
                        lambda device: (int(2.5 * per_row * PREDICTION_MARGIN), ""))
    report = da.audit(PathLM(), vocab_size=V, max_seq_len=T, checks=["causal"],
                      training=da.TrainingPath(8, T))
    shape = report["causal"].evidence["training_shape"]
    assert report.passed and (shape["batch"], shape["seq_len"]) == (2, T)
    assert not shape["whole"] and "2 rows fit" in shape["why"]
    assert "8 rows" in shape["why"] and "short of the training shape (B=8" in shape["named"]


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_few_rows_get_several_batches_so_the_cuts_cover_the_length(batch):
    report = da.audit(LeaksPast(past=20), vocab_size=V, checks=["causal"],
                      training=da.TrainingPath(batch, 40))
    shape = report["causal"].evidence["training_shape"]
    assert shape["cuts"] >= trainshape.MIN_SHAPE_CUTS and not shape["passed"]
    assert max(leak["cut"] for leak in shape["leaks"]) > 20  # cuts reach the late positions
