"""Tests that kill surviving mutations of the gate's own code (issue 16, docs/mutation.md): each
names the mutant it was written for and checks the gate's arithmetic against an independent
expectation, in milliseconds, with no model."""

from __future__ import annotations

import math

import pytest
import torch
import zoo

import decoder_audit as da
from decoder_audit.accounting.ledger import parameter_ledger
from decoder_audit.gate import weights
from decoder_audit.gate.reference import _rows


def _seen(d_lookup, d_logits, h) -> dict[str, torch.Tensor]:
    """What the forward hooks keep: the lookup's output and the readout's output with their
    gradients, and the readout's input."""
    lookup_out = torch.zeros_like(d_lookup, requires_grad=True)
    lookup_out.grad = d_lookup
    readout_out = torch.zeros_like(d_logits, requires_grad=True)
    readout_out.grad = d_logits
    return {"lookup_out": lookup_out, "readout_out": readout_out, "readout_in": h}


@pytest.mark.parametrize("row_block", [2, 2048])
def test_tied_gradient_sums_match_the_formula_at_small_scale(monkeypatch, row_block):
    """weights._compare_path_sums against dW = d_logits^T h + scatter(ids, d_lookup), written
    out with a Python loop, at gradients far below 1 (a fresh model's): `expected_max` must be
    the largest |expected| itself, not floored at 1 (mutant `expected_max: 1.0` made the
    tolerance tol * 1 instead of tol * max|expected|), `error` exactly the planted error."""
    monkeypatch.setattr(weights, "ROW_BLOCK", row_block)  # several row blocks, then one
    gen = torch.Generator().manual_seed(0)
    vocab, dim, batch, seq_len = 5, 3, 2, 3
    ids = torch.tensor([[0, 3, 3], [4, 0, 1]])  # (B, T); row 2 never looked up
    d_lookup = 1e-3 * torch.randn(batch, seq_len, dim, generator=gen, dtype=torch.float64)
    d_logits = 1e-3 * torch.randn(batch, seq_len, vocab, generator=gen, dtype=torch.float64)
    h = torch.randn(batch, seq_len, dim, generator=gen, dtype=torch.float64)
    readout = torch.zeros(vocab, dim, dtype=torch.float64)
    expected = torch.zeros(vocab, dim, dtype=torch.float64)
    for b in range(batch):
        for t in range(seq_len):
            for v in range(vocab):
                readout[v] += d_logits[b, t, v] * h[b, t]
            expected[ids[b, t]] += d_lookup[b, t]
    expected += readout
    emb = torch.zeros(vocab, dim, dtype=torch.float64, requires_grad=True)
    emb.grad = expected.clone()
    emb.grad[2, 1] += 1e-9  # the planted error, on a row no id looks up
    sums = weights._compare_path_sums(emb, ids, _seen(d_lookup, d_logits, h), vocab)
    # the scale of the comparison: the largest of either path's sum and the readout path alone
    scale = max(float(expected.abs().max()), float(readout.abs().max()))
    assert sums["expected_max"] == pytest.approx(scale, rel=1e-12)
    assert scale < 0.1
    assert sums["readout_max"] == pytest.approx(float(readout.abs().max()), rel=1e-12)
    assert sums["error"] == pytest.approx(1e-9, rel=1e-6)
    assert sums["shared_minus_lookup"] == pytest.approx(
        float((emb.grad - (expected - readout)).abs().max()), rel=1e-12)


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
    from decoder_audit.gate import reference

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
    from decoder_audit.gate import reference

    weight = torch.nn.Parameter(torch.zeros(4, 3, dtype=torch.float64))
    oracle = 1e-3 * torch.arange(12, dtype=torch.float64).reshape(4, 3)
    weight.grad = oracle.clone()
    weight.grad[1, 2] += 1e-9
    ledger = reference._GradientLedger({"w": weight}, [("only", {"w": None})])
    ledger.piece(0, weight, None, oracle)
    ledger.end_stage(0, weight)
    assert ledger.scale == pytest.approx(11e-3, rel=1e-12)
    assert ledger.errors == {"w": pytest.approx(1e-9, rel=1e-6)}


def test_a_params_failure_names_the_component_and_the_total():
    """check_params with two differences (one extra bias of D in layer 0, hence the total too)
    says both, the first and the last (mutant `len(problems) == 1 or True` kept the first
    only, so the detail no longer said the total was off)."""
    extra = zoo.TINY.d_model
    total = parameter_ledger(zoo.TINY).total
    detail = da.audit(zoo.extra_attention_bias(), checks=["params"])["params"].detail
    assert "layers.0.attn" in detail and f"(+{extra})" in detail
    assert f"total: analytic {total} vs measured {total + extra}" in detail


def test_a_declared_tie_that_holds_says_it_is_one_parameter_object():
    """The passing `tying` detail names what was verified, the object identity (mutant: the
    words upper-cased)."""
    tying = da.audit(zoo.decoder(zoo.TINY), checks=["tying"])["tying"]
    assert zoo.TINY.tie_embeddings and tying.passed
    assert tying.detail == "lm_head.weight is token_embeddings.weight (one Parameter object)"


def test_two_parameters_over_one_storage_are_named_as_such():
    """The shared-storage failure says what is wrong in the words of the contract: two
    Parameter objects (mutant: 'parameter objects', which the zoo's substring did not see)."""
    tying = da.audit(zoo.shared_storage_readout(), checks=["tying"])["tying"]
    assert not tying.passed
    assert tying.detail == ("declared tied, but two Parameter objects share one storage: the "
                            "optimizer keeps two states")


def test_a_padding_failure_keeps_its_tolerance():
    """A failing `padding` verdict carries the tolerance it was judged with, as a passing one
    does (mutant: the failing CheckResult lost it, so the report printed 'exact')."""
    import zoo_generation as zg

    from decoder_audit.gate import tolerances

    padding = da.audit(zg.decoder(zg.LEARNED, zg.MaskIgnored), checks=["padding"])["padding"]
    assert not padding.passed
    assert padding.tolerance == tolerances.shape_change(torch.float32)


def test_tying_grad_fails_when_the_lookup_bypasses_its_module():
    """A model whose token lookup never goes through the token_embeddings module's call (no
    hook can see it) cannot show the tied gradient's two paths: `tying_grad` fails and says so
    (mutant: the message upper-cased)."""
    model = zoo.decoder(zoo.TINY)
    lookup = model.token_embeddings

    class Unhooked(type(lookup)):
        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)  # nn.Module.__call__ runs the hooks; this not

    lookup.__class__ = Unhooked
    tying_grad = da.audit(model, checks=["tying_grad"])["tying_grad"]
    assert not tying_grad.passed
    assert tying_grad.detail == ("the lookup or readout path was never run through "
                                 "token_embeddings / lm_head")


def test_kv_cache_passes_a_model_with_room_for_one_token():
    """max_seq_len = 1 leaves no cached step to compare: `kv_cache` passes and says why
    (mutant: it failed such a model)."""
    import dataclasses

    model = zoo.decoder(dataclasses.replace(zoo.TINY, max_seq_len=1))
    kv_cache = da.audit(model, checks=["kv_cache"])["kv_cache"]
    assert kv_cache.passed and not kv_cache.skipped
    assert "no cached step" in kv_cache.detail


def test_a_model_changed_by_an_all_ones_mask_is_told_so_before_any_pad():
    """`padding` first compares a row under an all-ones mask with the plain run; a model that
    the mere presence of a mask changes fails there, and the detail says it was without any
    pad (mutant: that sentence upper-cased)."""
    import zoo_generation as zg

    class MaskMoves(da.Decoder):
        def forward(self, ids, attention_mask=None, *, cache=None, last_only=False):
            out = super().forward(ids, attention_mask, cache=cache, last_only=last_only)
            return out if attention_mask is None else out + 1e-2

    padding = da.audit(zg.decoder(zg.LEARNED, MaskMoves), checks=["padding"])["padding"]
    assert not padding.passed
    assert "without any pad, an all-ones attention_mask" in padding.detail


def test_future_keys_with_the_extra_keys_first():
    """attention._future_mask with k = S - T extra keys first (a cache, sink tokens): key j is
    position j - k, in query i's future when j - k > i; with them last, key j < T is position
    j and the extra keys are visible. Written out for T = 3, S = 5 (mutant: j + k > i)."""
    from decoder_audit.gate import attention

    f, t = False, True
    assert attention._future_mask(3, 5, extra_first=True).tolist() == [
        [f, f, f, t, t], [f, f, f, f, t], [f, f, f, f, f]]
    assert attention._future_mask(3, 5, extra_first=False).tolist() == [
        [f, t, t, f, f], [f, f, t, f, f], [f, f, f, f, f]]


def test_the_normalised_sum_tolerance_is_four_eps_of_a_16_bit_dtype():
    """tolerances.normalised_sum: 1e-3, or 4 eps for a dtype whose eps is larger: bfloat16 has
    7 explicit mantissa bits (eps 2^-7), float16 10 (eps 2^-10) (mutant: 4 / eps, a tolerance of
    ~1e16 in float64, under which any row "sums to 1")."""
    from decoder_audit.gate import tolerances

    assert tolerances.normalised_sum(torch.bfloat16) == 4 * 2.0 ** -7
    assert tolerances.normalised_sum(torch.float16) == 4 * 2.0 ** -10  # 3.9e-3 > 1e-3
    assert tolerances.normalised_sum(torch.float32) == 1e-3
    assert tolerances.normalised_sum(torch.float64) == 1e-3


def test_every_shape_site_of_a_correct_decoder_records_its_declared_shape():
    """`shapes` evidence: each site's recorded shape, equal to the declared one for a correct
    model (mutant: nothing recorded, every site shown as "not recorded")."""
    shapes = da.audit(zoo.decoder(zoo.TINY), checks=["shapes"])["shapes"]
    assert shapes.passed and shapes.evidence["sites"]
    for site in shapes.evidence["sites"]:
        assert site["ok"] and site["got"] == site["expected"], site


def test_a_black_box_shapes_verdict_claims_no_trace_ledger():
    """Without a trace (a black box) `shapes` judges the logits alone and its detail ends
    there: no ledger claimed, nothing appended (mutant: 'XXXX' appended)."""
    shapes = da.audit(zoo.TorchDecoder(), checks=["shapes"], **zoo.TORCH_BLACKBOX)["shapes"]
    assert shapes.passed and shapes.detail.endswith("= (B, T, V)"), shapes.detail


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


def test_a_passing_loss_alignment_shows_the_pair_the_rows_and_the_loss():
    """The passing `loss_alignment` detail is what a user reads as proof of the shift: the seeds'
    input / target pair on tiny-368, the flattening (B=2, T=4: 8 rows of V) and the loss beside
    ln V = ln 8, which a fresh model's loss sits near (mutant 240: the detail was None)."""
    result = da.audit(zoo.decoder(zoo.TINY), checks=["loss_alignment"])["loss_alignment"]
    assert result.passed
    loss = result.evidence["loss"]
    assert abs(loss - math.log(8)) < 0.1  # near-uniform predictions of a fresh model
    assert result.detail == ("input: <bos> A B C / target: A B C <eos>; (B, T, V) -> (8, V) "
                             f"rows aligned; loss {loss:.4f} (ln V = 2.0794)")


def test_the_last_position_has_no_later_gradient_to_report():
    """grad_causal evidence: position T-1 has no later input, so its largest later gradient is
    0 and no later position is listed (mutant 65: 1.0 for an empty range, a phantom gradient
    into the future in the evidence of a passing model)."""
    result = da.audit(zoo.decoder(zoo.TINY), checks=["grad_causal"])["grad_causal"]
    assert result.passed
    last = result.evidence["positions"][-1]
    assert last["position"] == zoo.TINY.max_seq_len - 1 == 3
    assert last["max_grad_later"] == 0.0 and last["later_positions_nonzero"] == []
    assert all(r["max_grad_later"] == 0.0 for r in result.evidence["positions"])
    # mutant 85: the passing detail said "a T=None sequence"
    assert result.detail == ("losses at positions [0, 1, 2, 3] of a T=4 sequence: gradient "
                             "exactly 0 at every later input, nonzero at their own")


class _AllNaN(da.Decoder):
    """Valid ids give NaN logits at every (batch, position); invalid ids still raise."""

    def forward(self, ids, *args, **kwargs):
        return super().forward(ids, *args, **kwargs) * float("nan")


def test_non_finite_logits_are_listed_six_pairs_at_most():
    """check_inputs names at most 6 non-finite (batch, position) pairs per run. On tiny-368 the
    run B=5, T=2 has 10 such pairs; its failure lists the first 6 in row-major order (mutant 39:
    7 pairs)."""
    result = da.audit(zoo.decoder(cls=_AllNaN), checks=["inputs"])["inputs"]
    assert not result.passed
    assert result.detail == ("B=3, T=1: non-finite logits at (batch, position) "
                             "[[0, 0], [1, 0], [2, 0]]")
    assert ("B=5, T=2: non-finite logits at (batch, position) "
            "[[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]]") in result.evidence["failures"]


def test_the_no_hard_limit_hint_goes_to_black_boxes_only():
    """An accepted overlength input fails both models; the hint to audit with max_seq_len=None
    fits a black box (a stock rotary model may have no limit by design), never our Decoder,
    whose max_seq_len is its own config's limit (mutant 81: `if s.whitebox`, hint swapped)."""
    from decoder_audit.gate.inputs import NO_HARD_LIMIT_HINT

    ours = da.audit(zoo.decoder(cls=zoo.WrapsPositions), checks=["overlength"])["overlength"]
    assert not ours.passed and "hint" not in ours.evidence
    assert ours.detail == ("T=5 > max_seq_len=4 was accepted (output (1, 5, 8)): positions past "
                           "the limit were clipped, wrapped or extrapolated silently")
    theirs = da.audit(zoo.TorchDecoder(clip_positions=True), checks=["overlength"],
                      **zoo.TORCH_BLACKBOX)["overlength"]
    assert not theirs.passed and theirs.evidence["hint"] == NO_HARD_LIMIT_HINT
    assert theirs.detail.endswith(f"silently. {NO_HARD_LIMIT_HINT}")


def test_the_causal_dependency_matrix_has_one_column_per_cut():
    """T = 5 gives 5 cuts, sent B - 1 = 2 at a time (B = 3): groups [0, 1], [2, 3], [4], the last
    partial. The evidence's dependency matrix is T rows by 5 columns, column k the change when
    the tokens from cut k on change: exactly 0 above the cut (a causal model), nonzero from it
    on (mutant 61: the partial group added a sixth column, a row of the unchanged batch)."""
    result = da.audit(zoo.decoder(zoo.SMALL), checks=["causal"], intervention_len=5)["causal"]
    assert result.passed
    dependency = result.evidence["dependency"]
    assert dependency["rows"] == [0, 1, 2, 3, 4] and dependency["cols"] == [0, 1, 2, 3, 4]
    max_change = dependency["max_change"]
    assert len(max_change) == 5
    for row, changes in enumerate(max_change):
        assert len(changes) == 5, changes
        assert [c > 0 for c in changes] == [cut <= row for cut in range(5)], (row, changes)


def test_prefix_passes_a_model_with_room_for_one_token_under_its_own_name():
    """max_seq_len = 1 leaves no proper prefix: `prefix` passes, says why, and is named
    "prefix" as every result of that check (mutant 102: named None, which the runner rejects)."""
    import dataclasses

    model = zoo.decoder(dataclasses.replace(zoo.TINY, max_seq_len=1))
    prefix = da.audit(model, checks=["prefix"])["prefix"]
    assert prefix.name == "prefix" and prefix.passed and not prefix.skipped
    assert prefix.detail == "max_seq_len is 1: no proper prefix exists"


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
