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


def sft(model, out, *, source=None, data=None, **overrides):
    settings = dict(output_dir=str(out), per_device_train_batch_size=2, max_steps=2,
                    report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                    logging_strategy="no", packing=True, max_length=16, seed=0)
    args = trl.SFTConfig(**(settings | overrides))
    trainer = trl.SFTTrainer(model=model, args=args, processing_class=tokenizer(),
                             train_dataset=data or source or datasets.Dataset.from_list(
                                 documents(lengths=(4, 8))))
    return trainer, gate_trainer(trainer, source=source)


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


def _lineage(gate):
    (check,) = [c for c in gate.verdict.checks if c.name == "lineage"]
    return check


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split"])
def test_the_lineage_of_packed_examples_is_counted_and_judged_against_the_policy(tmp_path,
                                                                                 strategy):
    """Examples of 4 to 20 tokens packed into rows of 16: "bfd" cuts the longer ones (its
    declared policy), "bfd_split" splits them; either way the others are whole, every packed
    document is found in its source example, and batches.md says so."""
    data = documents(lengths=(4, 20))
    longer = sum(1 for d in data if len(d["input_ids"]) > 16)
    assert 0 < longer < len(data)
    source = datasets.Dataset.from_list(data)
    trainer, gate = sft(tiny_llama(), tmp_path, packing_strategy=strategy, source=source)
    trainer.train()
    counts = _lineage(gate).evidence["counts"]
    assert _lineage(gate).passed and counts["examples"] == len(data)
    assert counts["cut" if strategy == "bfd" else "split"] == longer
    assert counts["whole"] == len(data) - longer and counts["dropped"] == 0
    assert counts["unmatched_documents"] == 0
    assert "## lineage: pass" in (tmp_path / "decoder-audit" / "batches.md").read_text()


def test_an_example_dropped_silently_is_refused_naming_lineage(tmp_path):
    """Without packing, max_length=16 keeps a prompt of 20 words and cuts its completion: the
    example has no label left, and SFT drops it without a word. The gate counts it dropped,
    which no setting declares, and refuses naming the example."""
    rows = [{"prompt": " ".join(f"w{i}" for i in range(n)), "completion": " w3 w4 </s>"}
            for n in (4, 6, 20, 5)]
    source = datasets.Dataset.from_list(rows)
    trainer, gate = sft(tiny_llama(), tmp_path, packing=False, source=source, data=source)
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.train()
    assert refusal.value.failed == ("lineage",) and trainer.state.global_step == 0
    assert _lineage(gate).evidence["dropped"] == [2]


def test_without_the_source_sft_lineage_is_skipped_saying_how_to_get_it(tmp_path):
    trainer, gate = sft(tiny_llama(), tmp_path)
    trainer.train()
    assert _lineage(gate).skipped and "source=" in _lineage(gate).detail
