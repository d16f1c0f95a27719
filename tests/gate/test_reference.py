"""The oracle check (gate/checks/reference.py): located mismatches, gradient passes, the ledger."""

from __future__ import annotations

import pytest
import torch
import zoo

import decoder_audit as da

# private: _rows's view-or-copy and _chunks's grouping are memory behaviour, invisible in the
# verdict (the gate's memory is measured in tests/gate/test_scale.py)
from decoder_audit.gate.checks.reference import _rows


class _Params:
    """The one thing reference._chunks asks of a Subject: its parameters."""

    def __init__(self, *params):
        self._params = params

    def parameters(self):
        return iter(self._params)


@pytest.mark.parametrize("share", [1.0, 0.3])
def test_a_tied_weight_gets_its_gradient_in_one_pass_only(monkeypatch, share):
    """reference._chunks: a weight read by two stages (a tied embedding: the readout first in
    backward order, the lookup last) belongs to the pass of its first stage alone, and the
    passes' sizes add up to the unique parameters (mutant `id(None) not in seen` put it in
    both passes, so it was counted twice and its gradient taken twice)."""
    from decoder_audit.gate.checks import reference

    monkeypatch.setattr(reference, "GRAD_SHARE", share)
    tied, block, norm = (torch.nn.Parameter(torch.zeros(n)) for n in (30, 20, 5))
    named = {"lm_head.weight": tied, "layers.0.w": block, "ln_f.weight": norm,
             "token_embeddings.weight": tied}
    stages = [("readout", {"lm_head.weight": None}), ("final_norm", {"ln_f.weight": None}),
              ("block 0", {"layers.0.w": None}), ("lookup", {"token_embeddings.weight": None})]
    chunks = reference._chunks(_Params(tied, block, norm), named, stages)
    params = [p for chunk in chunks for p in chunk.params]
    assert sorted(map(id, params)) == sorted(map(id, (tied, block, norm)))
    assert any(p is tied for p in chunks[0].params)
    assert sum(chunk.numel for chunk in chunks) == 55
    assert [stage for chunk in chunks for stage in chunk.stages] == [s for s, _ in stages]


def test_the_oracle_gradient_scale_is_the_largest_piece_not_at_least_one():
    """reference._GradientLedger: the oracle-gradient tolerance is tol * scale, scale the
    largest |oracle gradient piece|; at gradients far below 1 it must be that piece, not 1
    (mutant `self.scale = 1.0` loosened the gradient comparison by 1 / max|grad|), and the
    error is exactly |fast - oracle|."""
    from decoder_audit.gate.checks import reference

    weight = torch.nn.Parameter(torch.zeros(4, 3, dtype=torch.float64))
    oracle = 1e-3 * torch.arange(12, dtype=torch.float64).reshape(4, 3)
    weight.grad = oracle.clone()
    weight.grad[1, 2] += 1e-9
    ledger = reference._GradientLedger({"w": weight}, [("only", {"w": None})])
    ledger.piece(0, weight, None, oracle)
    ledger.end_stage(0, weight)
    assert ledger.scale == pytest.approx(11e-3, rel=1e-12)
    assert ledger.errors == {"w": pytest.approx(1e-9, rel=1e-6)}


class _LateOffset(da.Decoder):
    """Correct up to position 2; every logit from position 3 on is 0.5 too high (a readout that
    mis-indexes late positions): the oracle's value comparison must place the error there."""

    def forward(self, ids, *args, **kwargs):
        logits = super().forward(ids, *args, **kwargs).clone()
        logits[:, 3:] += 0.5
        return logits


def test_an_oracle_mismatch_is_located_by_position_not_by_batch_row():
    # check_oracle mutant 95 took the error per batch row (amax over T and V) instead of per
    # position (over B and V): the first differing position read 0 and the list had B entries.
    report = da.audit(zoo.decoder(cls=_LateOffset), checks=["oracle"])
    oracle = report["oracle"]
    assert not oracle.passed
    seq_len = oracle.evidence["seq_len"]
    by_position = oracle.evidence["error_by_position"]
    assert len(by_position) == seq_len != oracle.evidence["batch"]
    assert all(err < 1e-4 for err in by_position[:3])
    assert all(err == pytest.approx(0.5, abs=1e-4) for err in by_position[3:])
    assert "first differing position 3" in oracle.detail


def test_the_ledger_reads_consecutive_rows_as_a_view_and_others_as_a_copy():
    # reference._rows mutants 6 and 16 (a copy where a view was promised). A readout block of
    # GPT-2 XL is 2048 x 1600 floats: the ledger must read it in place, not gather a 13 MB copy
    # per block; scattered rows (embedding lookups) are gathered.
    grad = torch.arange(40.0).reshape(10, 4)
    for rows in (torch.arange(2, 9), torch.arange(3, 5), torch.tensor([6])):
        block = _rows(grad, rows)
        assert block.data_ptr() == grad[int(rows[0])].data_ptr()  # shares the storage
        assert torch.equal(block, grad[rows])
    scattered = torch.tensor([1, 2, 7])
    picked = _rows(grad, scattered)
    assert torch.equal(picked, grad[scattered])
    assert picked.data_ptr() != grad[1].data_ptr()
