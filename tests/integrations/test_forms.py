"""Batches as sent (integrations/sent.py, `batch_as_sent`) under transformers' real Trainer: every
form a collator emits is judged as the trainer passes it to the model. Packed rows with
restarting position_ids alone, with flash attention's length keywords, and with a 4-D
block-diagonal mask train; an all-ones mask beside the restarting positions and a 4-D mask
without the blocks are refused; a form the model cannot take (position_ids, cu_seq_lens_q,
labels) is a refusal naming the form, never a raw error or a ConfigError."""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("transformers")
from test_trainer import _refused, gated  # noqa: E402
from transformers import DataCollatorWithFlattening  # noqa: E402
from zoo_integrations import (  # noqa: E402
    block_mask_collator,
    masked_flattening_collator,
    narrow_llama,
    tiny_llama,
)


def _sent(gate) -> dict:
    (check,) = [c for c in gate.verdict.checks if c.name == "batch_as_sent"]
    return check


@pytest.mark.parametrize("collator, form", [
    (DataCollatorWithFlattening(), "position_ids (1, "),
    (DataCollatorWithFlattening(return_flash_attn_kwargs=True), "cu_seq_lens_q (5,)"),
    (block_mask_collator, "attention_mask (1, 1, "),
], ids=["position-ids", "flash-kwargs", "4d-mask"])
def test_each_packed_form_a_correct_llama_takes_trains_judged_as_sent(tmp_path, collator, form):
    """Four documents a row: each, packed as the collator sends it, equals itself alone."""
    trainer, gate = gated(tiny_llama(), tmp_path, collator=collator)
    trainer.train()
    sent = _sent(gate)
    assert sent.passed and trainer.state.global_step == 2
    assert sent.evidence["compared"] == 4 and form in sent.evidence["forms"][0]
    assert all(d["max_abs_diff"] <= d["allowed"] for d in sent.evidence["documents"])


def test_an_all_ones_mask_beside_restarting_positions_is_refused_as_sent(tmp_path):
    """The collator's packed rows carry restarting position_ids and an all-ones attention_mask:
    transformers then ignores the restarts, and each document attends to the ones before it.
    The gate's packing probe (position_ids alone) passes; the batches as sent do not: each
    document, packed as sent, differs from itself alone."""
    refusal = _refused(tiny_llama(), tmp_path / "run", collator=masked_flattening_collator)
    assert refusal.value.failed == ("batch_as_sent",)
    assert refusal.value.report["packing"].passed
    assert "attention_mask" in refusal.value.detail and "all ones" in refusal.value.detail
    evidence = json.loads((tmp_path / "run" / "decoder-audit" / "gate.json").read_text())
    (sent,) = [c for c in evidence["checks"] if c["name"] == "batch_as_sent"]
    documents = sent["evidence"]["documents"]
    assert documents[0]["max_abs_diff"] <= documents[0]["allowed"]  # the first reads nothing
    assert documents[-1]["max_abs_diff"] > documents[-1]["allowed"]


def test_a_4d_mask_without_the_document_blocks_is_refused_as_sent(tmp_path):
    refusal = _refused(tiny_llama(), tmp_path / "run",
                       collator=functools.partial(block_mask_collator, blocks=False))
    assert "batch_as_sent" in refusal.value.failed
    assert "4-D" in refusal.value.detail


@pytest.mark.parametrize("takes, collator, entry", [
    (("input_ids", "attention_mask", "labels", "num_items_in_batch"),
     DataCollatorWithFlattening(), "position_ids"),
    (("input_ids", "attention_mask", "position_ids", "labels", "num_items_in_batch"),
     DataCollatorWithFlattening(return_flash_attn_kwargs=True), "cu_seq_lens_q"),
    (("input_ids", "attention_mask", "position_ids"), DataCollatorWithFlattening(), "labels"),
], ids=["no-position-ids", "no-flash-kwargs", "no-labels"])
def test_a_form_the_model_cannot_take_is_a_refusal_naming_it(tmp_path, takes, collator, entry):
    """The forward names no such argument: the trainer's first step would raise TypeError. The
    gate refuses before it, naming batch_as_sent and the entry, with its evidence written
    (a ConfigError for position_ids, a raw TypeError for the others, before)."""
    refusal = _refused(narrow_llama(*takes), tmp_path / "run", collator=collator)
    assert "batch_as_sent" in refusal.value.failed
    evidence = json.loads((tmp_path / "run" / "decoder-audit" / "gate.json").read_text())
    (sent,) = [c for c in evidence["checks"] if c["name"] == "batch_as_sent"]
    assert not sent["passed"] and "TypeError" in sent["detail"] and repr(entry) in sent["detail"]
