"""The input and output contract checks (gate/checks/inputs.py): shapes, raw logits, overlength."""

from __future__ import annotations

import pytest
import torch
import zoo
from zoo_foreign import FixedTableLM, V

import decoder_audit as da


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
    from decoder_audit.gate.checks.inputs import NO_HARD_LIMIT_HINT

    ours = da.audit(zoo.decoder(cls=zoo.WrapsPositions), checks=["overlength"])["overlength"]
    assert not ours.passed and "hint" not in ours.evidence
    assert ours.detail == ("T=5 > max_seq_len=4 was accepted (output (1, 5, 8)): positions past "
                           "the limit were clipped, wrapped or extrapolated silently")
    theirs = da.audit(zoo.TorchDecoder(clip_positions=True), checks=["overlength"],
                      **zoo.TORCH_BLACKBOX)["overlength"]
    assert not theirs.passed and theirs.evidence["hint"] == NO_HARD_LIMIT_HINT
    assert theirs.detail.endswith(f"silently. {NO_HARD_LIMIT_HINT}")


def test_an_undeclared_hard_limit_is_found_and_the_checks_stay_within_it():
    """A 32-row position table nobody declared: the probes used to run to 64 positions and five
    checks failed with IndexError at T = 33. The gate finds the longest T that runs, reports it
    as the model's fact with what declaring it would check, and audits within it."""
    report = da.audit(FixedTableLM(rows=32), vocab_size=V)
    assert report.passed, report.first_failure
    assert report.facts.length_limit == 32
    assert report["causal"].evidence["seq_len"] == 32
    assert "32" in report["overlength"].evidence["reason"]
    assert any("max_seq_len=32" in note for note in report.notes)
    declared = da.audit(FixedTableLM(rows=32), vocab_size=V, max_seq_len=32)
    assert declared.passed and not declared["overlength"].skipped
    assert declared.facts.length_limit is None  # a declared limit is not probed


def test_a_model_failing_at_every_length_is_not_given_a_limit():
    """An error that does not say where a table ends (a model that cannot run T = 2) is a
    defect for the checks to show, not a limit to audit within."""

    class Breaks(FixedTableLM):
        def forward(self, ids):
            if ids.shape[1] > 1:
                raise RuntimeError("broken arithmetic")
            return super().forward(ids)

    report = da.audit(Breaks(), vocab_size=V)
    assert report.facts.length_limit is None and not report.passed


def test_a_hugging_face_model_that_raises_inside_its_declared_context_fails_inputs():
    """A rotary model raising at T=6 although its config declares 32 positions (Gemma 2 in
    transformers 4.48.1 raised past its window): `inputs` names it, and the other checks judge
    what runs, within T=5."""
    tf = pytest.importorskip("transformers")

    class RaisesPastFive(tf.LlamaForCausalLM):
        def forward(self, input_ids=None, **kwargs):
            if input_ids is not None and input_ids.shape[-1] > 5:
                raise IndexError("index 5 is out of bounds for dimension 0 with size 5")
            return super().forward(input_ids=input_ids, **kwargs)

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=32)
    report = da.audit(RaisesPastFive(config).eval(), checks=["inputs", "causal"])
    assert report.facts.length_limit == 5
    assert not report["inputs"].passed and "32" in report["inputs"].detail
    assert report["causal"].passed and report["causal"].evidence["seq_len"] == 5


class _MetaOutput(da.Decoder):
    """Computes its logits, then hands back an empty tensor of their shape on the meta
    device (shapes without values); invalid ids still raise."""

    def forward(self, ids, *args, **kwargs):
        logits = super().forward(ids, *args, **kwargs)
        return torch.empty(logits.shape, device="meta")


def test_logits_on_the_meta_device_fail_inputs_naming_the_device():
    """Read where the audit first reads the output (Subject.run): a clean failure of `inputs`
    whose evidence says the logits lie on the meta device, not torch's "Tensor.item() cannot be
    called on meta tensors" (issue 44); `shapes` says the same."""
    report = da.audit(zoo.decoder(cls=_MetaOutput), checks=["inputs", "shapes"])
    for name in ("inputs", "shapes"):
        result = report[name]
        assert not result.passed and "meta device" in result.detail, result.detail
        assert "item()" not in result.detail, result.detail
    assert all("meta device" in failure for failure in report["inputs"].evidence["failures"]
               if "raised" in failure)
