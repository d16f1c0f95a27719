"""The gate inside TRL's SFTTrainer with packing=True (its padding-free collator: restarting
position_ids and flash attention's cu_seq_lens in one flattened row): a tiny Llama trained gated
on that path; a planted leak refused before the first step; SFTTrainer computes its own loss, so
a defect of the model's labels= loss is reported and does not refuse it (the path is not its)."""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from zoo_integrations import LeakyLlama, OwnCountLlama, documents, tiny_llama, tokenizer  # noqa: E402

import decoder_audit as da  # noqa: E402
from decoder_audit.integrations import gate_trainer  # noqa: E402


def sft(model, out, **overrides):
    settings = dict(output_dir=str(out), per_device_train_batch_size=2, max_steps=2,
                    report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                    logging_strategy="no", packing=True, max_length=16, seed=0)
    args = trl.SFTConfig(**(settings | overrides))
    trainer = trl.SFTTrainer(model=model, args=args, processing_class=tokenizer(),
                             train_dataset=datasets.Dataset.from_list(documents(lengths=(4, 8))))
    return trainer, gate_trainer(trainer)


def test_sft_with_packing_trains_gated_on_the_packed_path(tmp_path):
    trainer, gate = sft(tiny_llama(), tmp_path)
    trainer.train()
    plan = gate.verdict.plan
    batch = gate.verdict.batches[0]
    assert plan.trainer == "SFTTrainer" and plan.path.pack and batch.shape[0] == 1
    # an eager Llama's attention reads the documents from the position_ids, not cu_seq_lens
    assert plan.path.pack_form == "position_ids"
    assert plan.path.seq_len == batch.shape[1] and plan.path.precision == "bf16"
    assert plan.paths == ("training",)  # SFTTrainer computes its own loss
    report = gate.verdict.report
    assert report.passed and not report["packing"].skipped and not report["autocast"].skipped
    assert batch["packed"].passed and not batch["packed"].skipped
    assert trainer.state.global_step == 2


def test_a_planted_leak_stops_sft_before_its_first_step(tmp_path):
    trainer, _ = sft(tiny_llama(LeakyLlama), tmp_path)
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.train()
    assert refusal.value.check == "causal" and trainer.state.global_step == 0


def test_a_defect_of_the_models_own_loss_is_not_sfts_path(tmp_path):
    """OwnCountLlama's labels= loss ignores num_items_in_batch: transformers' Trainer refuses it
    (test_trainer.py); SFTTrainer never calls that loss, so the failure is in the report and the
    run trains."""
    trainer, gate = sft(tiny_llama(OwnCountLlama), tmp_path, gradient_accumulation_steps=2)
    trainer.train()
    assert not gate.verdict.report["model_loss"].passed
    assert gate.verdict.report["model_loss"].paths == ("model loss",)
    assert not gate.verdict.refused and trainer.state.global_step == 2
