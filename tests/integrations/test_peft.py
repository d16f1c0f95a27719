"""PEFT adapters under the gate (decoder_audit.integrations.peft): a LoRA model passes, audited
through its base model's spec, with dead_parameters judging the trainable adapters; a merge that
forgets the scaling, an adapter that makes a tied head its own copy, an adapter on a tied
embedding, and an adapter whose scaling is 0 each fail the check named; a LoRA model trained by
transformers' Trainer runs gated."""

from __future__ import annotations

import json

import pytest

peft = pytest.importorskip("peft")
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from zoo_integrations import config, documents, tiny_llama, tokenizer  # noqa: E402

import decoder_audit as da  # noqa: E402
from decoder_audit.gate import model_facts  # noqa: E402
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
    # labelled as the trainers' gate labels them: the merged base's failures apart
    assert report.labels == ["tying", "merged:params", "merged:tying"]


@pytest.mark.parametrize("side", ["embed_tokens", "lm_head"])
def test_an_adapter_on_either_side_of_a_tie_fails_tying_live_and_adapter_merge(side):
    """LoRA on embed_tokens of a tied model (the docs' own example) reads E + dE and scores with
    E; LoRA on lm_head reads E and scores with E + dE: the live tying check fails naming the
    adapted module (it passed: the wrapped layer's .weight is still E), and merged, the update
    moves both, so adapter_merge fails."""
    report = audit_adapters(lora(tied_llama(), target_modules=[side, "q_proj"]))
    assert [c.name for c in report.failures] == ["tying", "adapter_merge"]
    tying = report.live["tying"]
    assert tying.evidence["structure"] == "adapted"
    assert ("the readout" if side == "lm_head" else "the input embedding") in tying.detail


def test_da_audit_of_a_peft_model_reads_its_base_models_facts():
    """`da.audit(peft_model)` asked for vocab_size=: V, the length policy and the packed forms
    are the base Llama's; LoRA on the head of a tied model fails tying there too."""
    report = da.audit(lora())
    assert report.passed, [(c.name, c.detail) for c in report.failures]
    assert report.vocab_size == config().vocab_size
    assert report.facts.origin["vocab_size"] == "hugging face"
    base = model_facts(tiny_llama())
    assert (report.facts.packing_forms, report.facts.max_seq_len) == (base.packing_forms,
                                                                       base.max_seq_len)
    tied = da.audit(lora(tied_llama(), target_modules=["lm_head"]), checks=["tying"])
    assert not tied["tying"].passed


def _trained(model):
    """Every adapter factor drawn, as after training (neither is zero)."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(5))


def test_a_merged_model_is_audited_merged_and_given_back_bit_for_bit():
    """Found merged, the model was unmerged at the end with its merged weights put back, so the
    update counted twice (the logits moved by 0.05 to 0.15). Now: the logits after equal those
    before bit for bit, each layer's merged adapters are the same, adapter_merge compares the
    merge with the unmerged adapters and passes, and the live audit says what a run would
    train of a merged model: none of its adapter factors (dead_parameters)."""
    model = _trained(lora())
    model.merge_adapter()
    merged_names = [list(m.merged_adapters) for m in model.modules() if hasattr(m, "lora_B")]
    before = _logits(model, IDS)
    report = audit_adapters(model)
    assert torch.equal(_logits(model, IDS), before)
    assert [list(m.merged_adapters) for m in model.modules() if hasattr(m, "lora_B")] == \
        merged_names
    merge = report.checks[0]
    assert merge.name == "adapter_merge" and merge.passed and not merge.skipped
    assert merge.evidence["merge_max_abs_diff"] <= merge.evidence["allowed"]
    assert report.merged.passed
    assert [c.name for c in report.failures] == ["dead_parameters"]
    dead = report.live["dead_parameters"].evidence["dead"]
    assert dead and all("lora_" in name for name in dead)


def test_a_disabled_model_is_audited_as_its_base_and_left_as_found():
    """Inside disable_adapter() the forward is the base model's: audited as it is, with
    adapter_merge skipped saying so (it failed: the merged view was compared with the base),
    the logits unchanged bit for bit, and the adapters active again after the block."""
    model = _trained(lora())
    active = _logits(model, IDS)
    with model.disable_adapter():
        before = _logits(model, IDS)
        flags = {n: p.requires_grad for n, p in model.named_parameters()}
        report = audit_adapters(model)
        assert torch.equal(_logits(model, IDS), before)
        assert flags == {n: p.requires_grad for n, p in model.named_parameters()}
    assert report.passed, [(c.name, c.detail) for c in report.failures]
    merge = report.checks[0]
    assert merge.skipped and "disable_adapter" in merge.detail
    assert torch.equal(_logits(model, IDS), active)


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


# ---- one gate for a PEFT model in every trainer ------------------------------------------------

def _trainer(model, out):
    args = tf.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4,
                                max_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                                disable_tqdm=True, logging_strategy="no")
    return tf.Trainer(model=model, args=args, train_dataset=documents(),
                      data_collator=tf.DataCollatorWithFlattening(),
                      processing_class=tokenizer())


def _refused_with_adapter_evidence(trainer, gate, out):
    """The run is refused before its first step naming the live tying and adapter_merge; the
    adapter checks are in the verdict beside the live audit, labelled, and written out."""
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.train()
    assert refusal.value.failed == ("tying", "adapter_merge")
    verdict = gate.verdict
    assert verdict.adapters.state == "active" and verdict.adapters.merged is not None
    assert [c.name for c in verdict.adapters.checks] == ["adapter_merge"]
    written = json.loads((out / "decoder-audit" / "gate.json").read_text())
    assert written["adapters"]["state"] == "active"
    assert (out / "decoder-audit" / "merged" / "report.md").exists()
    return refusal.value


@pytest.mark.parametrize("side", ["embed_tokens", "lm_head"])
def test_an_adapter_on_a_tie_is_refused_by_the_trainer_before_its_first_step(tmp_path, side):
    """The Trainer's gate ran only the live audit: LoRA on lm_head or embed_tokens of a tied
    model trained. Now the adapter checks run beside it."""
    trainer = _trainer(lora(tied_llama(), target_modules=[side, "q_proj"]), tmp_path)
    gate = gate_trainer(trainer)
    _refused_with_adapter_evidence(trainer, gate, tmp_path)
    assert trainer.state.global_step == 0


def test_an_adapter_on_a_tie_is_refused_by_sft(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    args = trl.SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                         report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                         logging_strategy="no", packing=True, max_length=16, seed=0)
    trainer = trl.SFTTrainer(model=tied_llama(), args=args, processing_class=tokenizer(),
                             train_dataset=datasets.Dataset.from_list(documents(lengths=(4, 8))),
                             peft_config=peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                         target_modules=["embed_tokens", "q_proj"]))
    gate = gate_trainer(trainer)
    _refused_with_adapter_evidence(trainer, gate, tmp_path)


def test_an_adapter_on_a_tie_is_refused_by_lightning(tmp_path):
    lightning = pytest.importorskip("lightning.pytorch")
    from decoder_audit.integrations import LightningGate

    class Module(lightning.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model
            model.config.use_cache = False

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    loader = torch.utils.data.DataLoader(documents(), batch_size=4,
                                         collate_fn=tf.DataCollatorWithFlattening())
    gate = LightningGate("model", model_loss=True, tokenizer=tokenizer())
    trainer = lightning.Trainer(callbacks=[gate], max_steps=2, accelerator="cpu", devices=1,
                                logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=str(tmp_path))
    module = Module(lora(tied_llama(), target_modules=["embed_tokens", "q_proj"]))
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.fit(module, loader)
    assert refusal.value.failed == ("tying", "adapter_merge")
    assert gate.verdict.adapters.state == "active"


def test_adapter_checks_that_cannot_read_the_adapters_refuse_naming_adapter_merge(tmp_path):
    """trainable_token_indices wraps the embedding in a TrainableTokensWrapper, which the merged
    view cannot read (audit_adapters raises ConfigError naming it): in a trainer that is a
    refusal naming adapter_merge and the wrapper, before the first step, never a raw error."""
    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(
        r=4, target_modules=["q_proj"], trainable_token_indices=[1, 2]))
    trainer = _trainer(model, tmp_path)
    gate_trainer(trainer)
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.train()
    assert refusal.value.failed == ("adapter_merge",)
    assert "TrainableTokensWrapper" in refusal.value.detail
    assert trainer.state.global_step == 0
