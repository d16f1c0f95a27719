"""PEFT adapters under the gate (decoder_audit.integrations.peft): a LoRA model passes, audited
through its base model's spec, with dead_parameters judging the trainable adapters; a merge that
forgets the scaling, an adapter that makes a tied head its own copy, an adapter on a tied
embedding, and an adapter whose scaling is 0 each fail the check named; a LoRA model trained by
transformers' Trainer runs gated."""

from __future__ import annotations

import pytest

peft = pytest.importorskip("peft")
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from zoo_integrations import config, documents, tiny_llama, tokenizer  # noqa: E402

from decoder_audit.integrations import audit_adapters, gate_trainer  # noqa: E402

TARGETS = ["q_proj", "v_proj", "down_proj"]


def lora(model=None, **options):
    settings = dict(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0)
    return peft.get_peft_model(model or tiny_llama(), peft.LoraConfig(**(settings | options)))


def tied_llama():
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config(tie_word_embeddings=True))


def test_a_lora_model_passes_through_its_base_spec_and_is_left_as_it_was():
    """Every check passes; dead_parameters judged the 12 adapter factors (A and B of 3 targets
    in 2 layers), not the frozen base; the merged base was held to its config as the spec (params
    and oracle ran, on the Hugging Face Llama layout); every value is as it was, B still 0."""
    model = lora()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = audit_adapters(model)
    assert report.passed, [(c.name, c.detail) for c in report.failures]
    dead = report.live["dead_parameters"]
    assert not dead.skipped and dead.evidence["trainable"] == 2 * len(TARGETS) * 2
    for name in ("params", "oracle", "tying"):
        assert not report.merged[name].skipped, name
    assert "Hugging Face Llama" in report.merged["params"].evidence["layout"]
    assert report.checks[0].name == "adapter_merge" and report.checks[0].passed
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert not any(p.any() for n, p in model.named_parameters() if "lora_B" in n)


def test_a_merge_that_forgets_the_scaling_fails_adapter_merge(monkeypatch):
    """lora_alpha / r = 2: a merge of B A without it moves the logits by half the update."""
    right = peft.tuners.lora.layer.Linear.get_delta_weight
    monkeypatch.setattr(peft.tuners.lora.layer.Linear, "get_delta_weight",
                        lambda self, adapter: right(self, adapter) / self.scaling[adapter])
    report = audit_adapters(lora())
    assert [c.name for c in report.failures] == ["adapter_merge"]
    evidence = report.checks[0].evidence
    assert evidence["merge_max_abs_diff"] > 100 * evidence["allowed"]


def test_modules_to_save_on_a_tied_head_unties_it_and_fails_tying():
    """modules_to_save=["lm_head"] trains a copy of the head, no longer the embedding."""
    report = audit_adapters(lora(tied_llama(), target_modules=["q_proj"],
                                 modules_to_save=["lm_head"]))
    assert report.merged.facts.declared_tie is True
    assert not report.merged["tying"].passed and not report.live["tying"].passed
    # examples/trainers/lora.py printed "tying, params, tying" (issue 44): each failure goes
    # under the audit it failed in, no check twice in one list, every failure said once
    example = _example("lora")
    said = dict(part.split(": ", 1) for part in example.failures_by_audit(report).split("; "))
    groups = [names.split(", ") for names in said.values()]
    assert len(said) >= 2 and all(len(set(names)) == len(names) for names in groups), said
    assert sorted(sum(groups, [])) == sorted(c.name for c in report.failures)


def _example(name: str):
    """examples/trainers/NAME.py imported as its own folder runs it (beside tiny.py)."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "examples" / "trainers"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def test_an_adapter_on_a_tied_embedding_fails_adapter_merge():
    """LoRA on embed_tokens of a tied model: the adapted model reads E + dE and scores with E;
    merged, the head is E + dE too."""
    report = audit_adapters(lora(tied_llama(), target_modules=["embed_tokens", "q_proj"]))
    assert [c.name for c in report.failures] == ["adapter_merge"]


def test_an_adapter_whose_scaling_is_zero_fails_dead_parameters():
    """lora_alpha=0: every update is 0 times B A, so no factor gets a gradient."""
    report = audit_adapters(lora(lora_alpha=0))
    dead = report.live["dead_parameters"]
    assert not dead.passed and len(dead.evidence["dead"]) == 2 * len(TARGETS) * 2


def test_a_lora_model_trained_by_the_trainer_runs_gated(tmp_path):
    """Through TrainerGate the PEFT model's adapters are judged as above: a fresh adapter's A is
    not called dead, and the run trains."""
    args = tf.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                                max_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                                disable_tqdm=True, logging_strategy="no")
    trainer = tf.Trainer(model=lora(), args=args, train_dataset=documents(),
                         data_collator=tf.DataCollatorWithFlattening(),
                         processing_class=tokenizer())
    gate = gate_trainer(trainer)
    trainer.train()
    report = gate.verdict.report
    assert report.passed and not report["dead_parameters"].skipped
    assert not report["packing"].skipped  # the base model's packed form, through the adapters
    assert trainer.state.global_step == 2


def test_a_model_without_adapters_is_refused_naming_its_class():
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        audit_adapters(tiny_llama())
