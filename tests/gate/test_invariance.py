"""The behavioural invariants (gate/checks/invariance.py): causal cuts, prefixes."""

from __future__ import annotations

import pytest
import zoo
from zoo_foreign import RowRoundedLM, V

import decoder_audit as da


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


def test_rounding_that_depends_on_the_whole_row_is_confirmed_in_float64_not_called_a_leak():
    """A routed-expert-like model: a later token moves earlier float32 logits by a few ulps
    (measured here, not assumed), which the float64 copy shows to be rounding."""
    report = da.audit(RowRoundedLM(), vocab_size=V, checks=["causal"])
    causal = report["causal"]
    wide = causal.evidence["float64"]
    assert causal.passed, causal.detail
    assert wide["float32_max_change_earlier"] > 0  # the float32 rows did move
    assert wide["max_change_earlier"] <= wide["allowed"]


def test_a_leak_of_1e_6_is_still_a_leak_when_confirmed_in_float64():
    report = da.audit(RowRoundedLM(leak=1e-6), vocab_size=V, checks=["causal"])
    causal = report["causal"]
    assert not causal.passed
    wide = causal.evidence["float64"]
    assert wide is not None and not wide["passed"] and wide["max_change_earlier"] > 1e-7


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_the_training_shape_probe_takes_batches_of_one_two_and_three(batch):
    """Two rows give one changed row a batch: the sampled cut positions need a spread of two (a
    division by zero once); one row (a flattened packed batch) is itself the changed row, in as
    many batches of one as there are cuts (trainshape.MIN_SHAPE_CUTS at least)."""
    report = da.audit(da.Decoder(da.preset("tiny-368")), checks=["causal"],
                      training=da.TrainingPath(batch, 4))
    shape = report["causal"].evidence["training_shape"]
    assert report.passed and shape["batch"] == batch and shape["leaks"] == []
