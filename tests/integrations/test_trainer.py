"""The gate inside transformers' Trainer (decoder_audit.integrations.trainer): a tiny Llama
trained gated; a planted leak, two collator bugs, a checkpointing bug and a loss that ignores
num_items_in_batch each stop it before the first optimizer step, naming the check; a loss that
collapses stops it with the figures; the gate changes nothing of the run it lets through."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import (  # noqa: E402
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    Trainer,
    TrainingArguments,
)
from zoo_integrations import (  # noqa: E402
    AuxTwiceMixtral,
    HalfLeakLlama,
    LateLeakLlama,
    LeakyLlama,
    OwnCountLlama,
    ReentrantLlama,
    config,
    documents,
    shifted_twice_collator,
    tiny_llama,
    tiny_mixtral,
    tokenizer,
)

import decoder_audit as da  # noqa: E402
from decoder_audit.integrations import gate_trainer  # noqa: E402


def arguments(out, **overrides) -> TrainingArguments:
    settings = dict(output_dir=str(out), per_device_train_batch_size=4, max_steps=2,
                    report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                    logging_strategy="no", seed=0, data_seed=0)
    return TrainingArguments(**(settings | overrides))


def gated(model, out, *, collator=None, data=None, gate_options=None, **overrides):
    trainer = Trainer(model=model, args=arguments(out, **overrides),
                      train_dataset=data or documents(),
                      data_collator=collator or DataCollatorWithFlattening(),
                      processing_class=tokenizer())
    return trainer, gate_trainer(trainer, **(gate_options or {}))


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_tiny_llama_trains_gated_and_the_gate_changes_nothing_of_the_run(tmp_path):
    """The path is read from the trainer (4 rows x 2 micro-batches x 1 process = 8 rows a step;
    the flattening collator's rows: 4 documents of 12 tokens in one row, (1, 48); bf16;
    checkpointing; position_ids packing); every check passes, the float32 ones on the forward
    without accelerate's autocast wrapper; the report is written; and the run's weights after 2
    steps are bit for bit those of the same run without the gate (it puts back every random
    state)."""
    data = documents(lengths=(12, 12))
    trainer, gate = gated(tiny_llama(), tmp_path / "gated", data=data, bf16=True,
                          gradient_accumulation_steps=2, gradient_checkpointing=True)
    trainer.train()
    plan = gate.verdict.plan
    assert plan.global_batch == 4 * 2 * 1 and plan.accumulation == 2
    assert (plan.path.batch_size, plan.path.seq_len) == (1, 4 * 12)
    assert plan.path.checkpointing and plan.path.pack and plan.path.pack_form == "position_ids"
    assert plan.path.precision == "bf16" and plan.paths == ("training", "model loss")
    assert gate.verdict.report.passed and not gate.verdict.refused
    assert gate.verdict.report.dtype == "float32"
    for name in ("packing", "checkpointing", "autocast", "model_loss"):
        assert not gate.verdict.report[name].skipped, name  # the paths it takes were audited
    assert [c.name for c in gate.verdict.checks if c.passed] == [
        "batch_as_sent", "batch_loss", "first_loss", "lineage"]
    assert gate.verdict.checks[0].evidence["documents"]  # the packed documents, each alone
    folder = tmp_path / "gated" / "decoder-audit"
    assert {"report.md", "report.json", "gate.json", "batches.md"} <= {
        p.name for p in folder.iterdir()}
    assert json.loads((folder / "gate.json").read_text())["passed"] is True
    plain = Trainer(model=tiny_llama(), args=arguments(tmp_path / "plain", bf16=True,
                                                       gradient_accumulation_steps=2,
                                                       gradient_checkpointing=True),
                    train_dataset=data, data_collator=DataCollatorWithFlattening())
    plain.train()
    assert trainer.state.global_step == plain.state.global_step == 2
    ours, theirs = weights(trainer.model), weights(plain.model)
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)


def _refused(model, out, **kwargs) -> pytest.ExceptionInfo:
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint-7").mkdir()
    (out / "checkpoint-7" / "model.safetensors").write_bytes(b"an earlier run's weights")
    before = weights(model)
    trainer, _ = gated(model, out, **kwargs)
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.train()
    # before the first optimizer step: nothing trained, nothing of the run's folder written over
    assert trainer.state.global_step == 0
    assert all(torch.equal(before[n], p) for n, p in weights(model).items())
    assert (out / "checkpoint-7" / "model.safetensors").read_bytes() == b"an earlier run's weights"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-7", "decoder-audit"]
    verdict = json.loads((out / "decoder-audit" / "gate.json").read_text())
    assert verdict["passed"] is False and verdict["refused"] == list(refusal.value.failed)
    return refusal


def test_a_planted_leak_stops_the_trainer_before_its_first_step_naming_causal(tmp_path):
    refusal = _refused(tiny_llama(LeakyLlama), tmp_path / "run")
    assert refusal.value.check == "causal" and "causal" in str(refusal.value)
    assert refusal.value.report["causal"].evidence  # the rows that moved, in the report


def test_a_leak_only_past_64_tokens_is_refused_at_the_runs_own_length(tmp_path):
    """Documents of 24 to 30 tokens, four flattened into each row: rows of up to 4 x 30 = 120
    tokens, past the audit's own 64-token probes. The gate reads that length from the dataset's
    examples and the collator (the four longest, end to end), probes the model at it, and the
    leak that starts past 64 tokens is refused naming causal (the report calls that probe the
    training shape, for it is)."""
    data = documents(lengths=(24, 30))
    longest = sum(sorted((len(d["input_ids"]) for d in data), reverse=True)[:4])
    assert longest > 64
    refusal = _refused(tiny_llama(LateLeakLlama), tmp_path / "run", data=data)
    assert refusal.value.check == "causal"
    shape = refusal.value.report["causal"].evidence["training_shape"]
    assert (shape["batch"], shape["seq_len"]) == (1, longest) and shape["whole"]
    assert shape["leaks"] and f"T={longest}" in refusal.value.detail
    assert refusal.value.report["causal"].evidence["seq_len"] == 64  # its own probe passed it


def test_pad_equal_to_eos_masking_every_eos_stops_it_naming_last_token(tmp_path):
    """transformers' own collator with pad = eos sets every eos label to -100: the model never
    learns to stop (transformers#23530)."""
    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    refusal = _refused(tiny_llama(), tmp_path / "run", collator=collator)
    assert refusal.value.failed == ("last_token",)
    assert "batch 0" in refusal.value.detail


def test_examples_a_collator_cuts_without_declaring_it_are_refused_naming_lineage(tmp_path):
    """A collator that keeps each example's first 8 tokens: no truncation is declared (the
    Trainer's collators take whole examples), yet the first batches' documents are prefixes of
    their examples: refused naming lineage, with each document's origin in the evidence."""
    def first_eight(features):
        return DataCollatorWithFlattening()([{"input_ids": f["input_ids"][:8]}
                                             for f in features])

    data = documents(lengths=(10, 12))
    refusal = _refused(tiny_llama(), tmp_path / "run", collator=first_eight, data=data)
    assert refusal.value.failed == ("lineage",)
    evidence = json.loads((tmp_path / "run" / "decoder-audit" / "gate.json").read_text())
    (lineage,) = [c for c in evidence["checks"] if c["name"] == "lineage"]
    assert lineage["evidence"]["counts"]["cut"] == 4  # the first batch's four examples
    assert all(d[2] == 0 and d[3] == 8 for d in lineage["evidence"]["documents"])


def test_labels_shifted_twice_stop_it_naming_shift(tmp_path):
    refusal = _refused(tiny_llama(), tmp_path / "run", collator=shifted_twice_collator)
    assert refusal.value.check == "shift"


def test_a_checkpointing_bug_stops_it_naming_checkpointing(tmp_path):
    refusal = _refused(tiny_llama(ReentrantLlama), tmp_path / "run",
                       gradient_checkpointing=True)
    assert refusal.value.failed == ("checkpointing",)
    assert refusal.value.report["checkpointing"].evidence


@pytest.mark.parametrize("preserve_rng_state", [False, True])
def test_checkpointing_is_audited_under_the_trainers_own_kwargs(tmp_path, preserve_rng_state):
    """gradient_checkpointing_kwargs={"use_reentrant": False, "preserve_rng_state": False} on a
    model with attention dropout: the recomputation draws other dropout masks, so the gradients
    are not the forward's. The gate audits the checkpointing the Trainer switched on, with those
    kwargs (it once re-enabled it with defaults, and passed), and refuses; with the RNG state
    preserved it trains, and every module keeps the function the Trainer gave it."""
    kwargs = {"use_reentrant": False, "preserve_rng_state": preserve_rng_state}
    torch.manual_seed(0)
    model = type(tiny_llama())(config(attention_dropout=0.1))
    options = dict(gradient_checkpointing=True, gradient_checkpointing_kwargs=kwargs)
    if not preserve_rng_state:
        refusal = _refused(model, tmp_path / "run", **options)
        assert refusal.value.failed == ("checkpointing",)
        evidence = refusal.value.report["checkpointing"].evidence
        assert evidence["configured"] and evidence["grad_max_abs_diff"] > evidence["grad_allowed"]
        return
    trainer, gate = gated(model, tmp_path / "run", **options)
    trainer.train()
    assert gate.verdict.report["checkpointing"].evidence["configured"]
    functions = [m._gradient_checkpointing_func for m in model.modules()
                 if getattr(m, "gradient_checkpointing", False)]
    assert functions and all(f.keywords == kwargs for f in functions)


def test_the_weights_the_run_freezes_stay_frozen_and_are_the_only_ones_left_out(tmp_path):
    """The run freezes the embeddings: the gate's gradient checks run with them frozen (the
    checkpointed gradients of the other weights compared), and after it they are still."""
    model = tiny_llama()
    model.model.embed_tokens.requires_grad_(False)
    trainer, gate = gated(model, tmp_path / "run", gradient_checkpointing=True)
    trainer.train()
    check = gate.verdict.report["checkpointing"]
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert check.passed and check.evidence["frozen_by_the_run"] == 1
    assert f"{trainable} trainable weights" in check.detail
    assert not model.model.embed_tokens.weight.requires_grad


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_is_audited_as_configured(tmp_path, precision):
    """A leak only under float16 autocast: TrainingArguments(fp16=True) runs the forward there,
    and the gate audits it there (it once audited bf16 only and said fp16 was not audited), so
    it is refused naming autocast; under bf16=True the run never takes that path, and trains."""
    model = tiny_llama(HalfLeakLlama)
    if precision == "fp16":
        refusal = _refused(model, tmp_path / "run", fp16=True)
        assert refusal.value.failed == ("autocast",)
        assert "float16" in refusal.value.report["autocast"].evidence["autocast"]
        return
    trainer, gate = gated(model, tmp_path / "run", bf16=True)
    trainer.train()
    assert gate.verdict.plan.path.precision == "bf16" and gate.verdict.report["autocast"].passed


@pytest.mark.parametrize("router_aux", [True, False], ids=["aux-on", "aux-off"])
def test_the_router_aux_loss_is_audited_where_it_is_configured(tmp_path, router_aux):
    """A correct Mixtral with output_router_logits on: its loss is the cross entropy plus
    router_aux_loss_coef x aux_loss, which batch_loss holds it to (it once read the sum as the
    cross entropy alone, and refused it). The aux loss added twice is refused where the run
    adds it, and only reported where output_router_logits is off: the run never adds it."""
    trainer, gate = gated(tiny_mixtral(router_aux=router_aux), tmp_path / "correct")
    trainer.train()
    assert gate.verdict.plan.router_aux is router_aux and not gate.verdict.refused
    assert gate.verdict.report["router_aux_loss"].passed
    (batch_loss,) = [c for c in gate.verdict.checks if c.name == "batch_loss"]
    added = [row["router_aux_added"] for row in batch_loss.evidence["rows"]]
    assert all(a > 0 for a in added) if router_aux else added == [0.0]
    twice = tiny_mixtral(AuxTwiceMixtral, router_aux=router_aux)
    if router_aux:
        refusal = _refused(twice, tmp_path / "twice")
        assert "router_aux_loss" in refusal.value.failed
        return
    trainer, gate = gated(twice, tmp_path / "twice")
    trainer.train()
    assert not gate.verdict.report["router_aux_loss"].passed and not gate.verdict.refused


def test_neftune_noise_the_trainer_switches_on_is_train_modes_declared_noise(tmp_path):
    """neftune_noise_alpha: the Trainer hooks noise onto the input embedding in train mode, a
    flag the trainer sets on the model. train_mode read it as a forward that branches on
    self.training with no dropout declared, and refused a correct model; it is declared noise,
    held fixed per call like dropout's masks, and the run trains."""
    trainer, gate = gated(tiny_llama(), tmp_path / "run", neftune_noise_alpha=5.0)
    trainer.train()
    check = gate.verdict.report["train_mode"]
    assert check.passed and any("NEFTune" in d for d in check.evidence["dropout"])


def test_a_loss_that_ignores_the_trainers_item_count_stops_it_on_the_model_loss_path(tmp_path):
    """Two micro-batches of unequal label counts: the trainer passes their total, the model
    divides by its own: the gate's model_loss and the run's batch_loss (on the trainer's own
    batches and num_items_in_batch) both fail."""
    refusal = _refused(tiny_llama(OwnCountLlama), tmp_path / "run",
                       gradient_accumulation_steps=2, per_device_train_batch_size=2)
    assert set(refusal.value.failed) == {"model_loss", "batch_loss"}


def test_a_loss_that_collapses_in_the_first_steps_stops_it_with_the_figures(tmp_path):
    """A leak that switches on after 2 trainer forwards: the gate passes it, the loss of step 3
    falls to near zero, and the run stops at that step with the loss and the limit."""
    model = tiny_llama(LeakyLlama, after=2)
    trainer, gate = gated(model, tmp_path / "run", max_steps=6)
    with pytest.raises(da.LeakageSuspected) as stop:
        trainer.train()
    assert gate.verdict.report.passed
    assert stop.value.step == 3 == trainer.state.global_step
    limit = 0.01 * torch.log(torch.tensor(37.0)).item()
    assert stop.value.loss < limit and stop.value.floor == pytest.approx(limit)
    assert f"{stop.value.loss:.4g}" in str(stop.value)


def test_a_declared_floor_stops_a_loss_below_it(tmp_path):
    """The data's floor declared (ln V: uniform random ids): a step whose loss falls below half
    of it stops the run, past the first steps too."""
    floor = torch.log(torch.tensor(37.0)).item()
    model = tiny_llama(LeakyLlama, after=2)
    trainer, _ = gated(model, tmp_path / "run", max_steps=6,
                       gate_options={"loss_floor": floor, "near_zero": None})
    with pytest.raises(da.LeakageSuspected) as stop:
        trainer.train()
    assert stop.value.step == 3 and stop.value.floor == floor and stop.value.loss < floor / 2


def test_a_trainer_that_computes_the_loss_itself_does_not_take_the_model_loss_path(tmp_path):
    """With a compute_loss_func the trainer never steps on the model's labels= loss: a defect
    there (OwnCountLlama ignores num_items_in_batch) is reported, not refused."""
    def mean_cross_entropy(outputs, labels, num_items_in_batch=None):
        logits = outputs.logits[:, :-1].flatten(0, 1)
        return torch.nn.functional.cross_entropy(logits, labels[:, 1:].flatten())

    trainer = Trainer(model=tiny_llama(OwnCountLlama), train_dataset=documents(),
                      args=arguments(tmp_path), data_collator=DataCollatorWithFlattening(),
                      compute_loss_func=mean_cross_entropy)
    gate = gate_trainer(trainer)
    trainer.train()
    assert gate.verdict.plan.paths == ("training",) and trainer.state.global_step == 2
    assert not gate.verdict.report["model_loss"].passed
    assert [c.name for c in gate.verdict.checks] == ["batch_as_sent", "first_loss", "lineage"]


def test_a_count_of_batches_that_is_not_positive_is_refused():
    trainer = Trainer(model=tiny_llama(), args=arguments("unused"), train_dataset=documents())
    with pytest.raises(ValueError, match="batches=0"):
        gate_trainer(trainer, batches=0)
