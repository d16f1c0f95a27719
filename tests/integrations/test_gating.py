"""The run's gate shared by decoder-audit's train and the callbacks (training.gatekeeper.run_gate
with the paths a trainer takes; GateRefusal naming every failing check), and RunGate's own checks
of the first batches."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments  # noqa: E402
from zoo_integrations import (  # noqa: E402
    LabelReadingLlama,
    LeakyLlama,
    OwnCountLlama,
    documents,
    tiny_llama,
)

import decoder_audit as da  # noqa: E402
from decoder_audit.gate import model_facts  # noqa: E402
from decoder_audit.integrations import RunGate, gate_trainer  # noqa: E402
from decoder_audit.training.distributed import RankInfo  # noqa: E402
from decoder_audit.training.gatekeeper import run_gate  # noqa: E402

QUIET = {"say": lambda *a, **k: None, "seed": 0}


def test_run_gate_refuses_a_failure_only_on_a_path_the_trainer_takes():
    """OwnCountLlama's labels= loss is wrong: decoder-audit's train (which computes its own loss)
    is not refused; a trainer that steps on the model's loss is, naming model_loss."""
    model = tiny_llama(OwnCountLlama)
    facts = model_facts(model)
    report = run_gate(model, RankInfo(), facts, **QUIET)
    assert not report["model_loss"].passed and report["model_loss"].paths == ("model loss",)
    with pytest.raises(da.GateRefusal) as refusal:
        run_gate(model, RankInfo(), facts, paths=("training", "model loss"), **QUIET)
    assert refusal.value.check == "model_loss" and refusal.value.failed == ("model_loss",)


def test_a_refusal_names_every_failing_check():
    model = tiny_llama(LeakyLlama)
    with pytest.raises(da.GateRefusal) as refusal:
        run_gate(model, RankInfo(), model_facts(model), **QUIET)
    failed = refusal.value.failed
    expected = [c.name for c in refusal.value.report.failures if "training" in c.paths]
    assert list(failed) == expected and len(failed) > 1 and failed[0] == refusal.value.check
    assert all(name in str(refusal.value) for name in failed)


def test_a_loss_near_zero_before_any_step_is_refused_naming_first_loss(tmp_path):
    """Target leakage through the labels: ids alone are causal (the behavioural checks pass),
    the trainer's own call on its first batch scores near zero: refused before the first step,
    naming first_loss (the gate's model_loss fails it too: its loss is 0 where the cross entropy
    of its logits is 4e-12)."""
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                             max_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, logging_strategy="no")
    trainer = Trainer(model=tiny_llama(LabelReadingLlama), args=args,
                      train_dataset=documents(), data_collator=DataCollatorWithFlattening())
    gate = gate_trainer(trainer)
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.train()
    assert gate.verdict.report["causal"].passed and "first_loss" in refusal.value.failed
    (first,) = [c for c in gate.verdict.checks if c.name == "first_loss"]
    assert first.evidence["loss"] < 0.01 * math.log(37) and trainer.state.global_step == 0


@pytest.mark.parametrize("options", [{"loss_floor": -1.0}, {"loss_floor": float("nan")},
                                     {"near_zero": 1.5}, {"near_zero": 0.0},
                                     {"watch_steps": -1}])
def test_options_out_of_range_are_refused_naming_the_value(options):
    (name, value), = options.items()
    with pytest.raises(ValueError, match=name):
        RunGate(**options)
