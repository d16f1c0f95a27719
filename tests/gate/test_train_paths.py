"""Train mode told apart from its noise, and the training shape probed in train mode
(gate/training.py): a model whose identical train-mode calls differ (it reseeds its own dropout,
as Reformer does) is reported as nondeterministic and never called a leak; one that also leaks
in train mode is still caught; a leak that lives only in train mode at the training batch size
is caught by `causal`'s training-shape probe; packing is probed at the training batch size."""

from __future__ import annotations

import torch
from zoo_training import PathLM, ReseedingLM, T, V

import decoder_audit as da

FACTS = {"vocab_size": V, "max_seq_len": T, "intervention_len": 16}
EVAL_PATH = ["causal", "batch_independence", "prefix", "determinism"]


def test_a_model_that_reseeds_its_dropout_is_nondeterministic_not_a_leak():
    check = da.audit(ReseedingLM(), checks=["train_mode"], **FACTS)["train_mode"]
    assert check.passed, check.detail
    found = check.evidence["nondeterministic"]
    assert found["reseeds"] and found["max_abs_diff"] > 0
    assert found["checked"] == "with its 1 dropout modules off"  # then judged exactly
    assert check.evidence["leaks"] == []


def test_a_reseeding_model_that_also_leaks_in_train_mode_is_still_caught():
    model = ReseedingLM(leak=True)
    check = da.audit(model, checks=["train_mode"], **FACTS)["train_mode"]
    assert not check.passed and check.evidence["leaks"], check.detail
    assert check.evidence["nondeterministic"]["reseeds"]
    assert da.audit(ReseedingLM(leak=True), checks=EVAL_PATH, **FACTS).passed  # train mode only


def test_a_reseeding_model_with_functional_dropout_is_judged_beyond_its_spread_and_says_so():
    """No dropout module to switch off: only a movement beyond 4x the spread of identical calls
    would be a leak, and the verdict and the notes say that smaller ones were out of reach."""
    report = da.audit(ReseedingLM(functional=True), checks=["train_mode"], **FACTS)
    check = report["train_mode"]
    assert check.passed, check.detail
    found = check.evidence["nondeterministic"]
    assert found["checked"] == "beyond the spread of identical calls"
    assert found["spread_checked"] > 0
    assert check.evidence["index_noise"] >= found["spread_checked"]  # the floor the cuts met
    assert "out of reach" in check.detail and any("out of reach" in n for n in report.notes)


def test_a_model_with_steady_dropout_is_not_called_nondeterministic():
    check = da.audit(PathLM(), checks=["train_mode"], **FACTS)["train_mode"]
    assert check.passed and "nondeterministic" not in check.evidence
