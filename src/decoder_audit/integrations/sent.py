"""`batch_as_sent`: the first batches sent to the model exactly as the collator built them and the
trainer passes them (every entry: position_ids with or without an attention_mask, a 4-D mask,
flash attention's cu_seq_lens_q/k and max_length_q/k, labels, and the flags the trainer adds),
on the model as it will run, in eval mode (dropout off, so a document and itself alone are one
computation):

  the form      the model takes it: a call that raises is a failure naming the form (the
                entries and their shapes), not an error;
  the documents each document a packed row declares (gate.documents: every signal the batch
                carries) has the logits it has alone, within the shape-change tolerance of the
                model's dtype. Transformers reads restarting position_ids as document
                boundaries only where no attention_mask is passed: a collator that sends an
                all-ones mask beside them trains each document on the ones before it, and this
                is where that shows.

The gate's `packing` check sends its own probe rows in the forms the model declares; this one
judges what this run's collator sends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..gate import CheckResult, declared_documents, shape_change
from ..objective import logits_of

MAX_DOCUMENTS = 32
"""Documents compared with themselves alone, at most (the first ones of the first batches):
one forward each, at their own length."""

Call = Callable[[Mapping[str, Any]], Any]
"""Calls the model on a batch as the trainer does; returns its output (.logits, or logits)."""


def form_of(batch: Mapping[str, Any]) -> str:
    """The batch's form as the model receives it: each entry, its shape, and what it declares."""
    parts = []
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            said = f"{name} {tuple(value.shape)}"
            if name == "position_ids" and value.dim() == 2 and bool((value[:, 1:] == 0).any()):
                said += " restarting"
            if name == "attention_mask" and value.dim() == 2:
                said += " all ones" if bool((value != 0).all()) else " with padding"
            if name == "attention_mask" and value.dim() > 2:
                said += f" ({value.dim()}-D, {value.dtype})"
            parts.append(said)
        else:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)


@contextmanager
def in_eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode and without gradients within the block; every module's train
    flag as it was afterwards."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in flags:
            module.training = training


def sent_outputs(batches: Sequence[Mapping], call: Call) -> tuple[list[Any], str | None]:
    """(the model's output on each batch as sent, or on none: why the first refused call raised,
    naming the batch and its form)."""
    outputs = []
    for i, batch in enumerate(batches):
        try:
            outputs.append(call(batch))
        except Exception as exc:  # noqa: BLE001 - the model's refusal of the form is the finding
            said = (str(exc).strip().splitlines() or [""])[0][:240]
            return [], (f"batch {i} as the collator sends it ({form_of(batch)}): the model "
                        f"raised {type(exc).__name__}: {said}; it cannot take this form, and "
                        "the run would stop at its first step")
    return outputs, None


def check_batch_as_sent(batches: Sequence[Mapping], outputs: Sequence[Any], refused: str | None,
                        alone: Callable[[torch.Tensor], Any]) -> CheckResult:
    """batch_as_sent (module docstring): `outputs` are the model's on each batch as sent
    (`sent_outputs`), `refused` why it could not take one; `alone(ids (1, n))` calls it on one
    document by itself."""
    if refused is not None:
        return CheckResult("batch_as_sent", False, refused, {"refused": refused})
    rows, records = [], []
    for i, (batch, out) in enumerate(zip(batches, outputs)):
        spans = declared_documents(batch)
        logits = logits_of(out)  # (B, T, V)
        for row, pieces in enumerate(spans or []):
            rows += [(i, row, start, length, logits) for start, length in pieces]
    forms = sorted({form_of(b) for b in batches})
    if not rows:
        return CheckResult("batch_as_sent", True, f"the model takes the {len(batches)} first "
                           f"batches as sent ({forms[0]}); they declare no packed documents",
                           {"forms": forms, "documents": []})
    for i, row, start, length, logits in rows[:MAX_DOCUMENTS]:
        ids = batches[i]["input_ids"][row:row + 1, start:start + length]  # (1, n)
        own = logits_of(alone(ids))[0].float()  # (n, V)
        packed = logits[row, start:start + length].float()  # (n, V)
        scale = float(own.abs().max())
        allowed = shape_change(logits.dtype) * scale
        worst = float((packed.to(own.device) - own).abs().max())
        records.append({"batch": i, "row": row, "start": start, "length": length,
                        "max_abs_diff": worst, "allowed": allowed})
        if not worst <= allowed:
            return CheckResult(
                "batch_as_sent", False, f"batch {i}, row {row}: the document at tokens {start}.."
                f"{start + length - 1} differs from itself alone by up to {worst:.3g} (allowed "
                f"{allowed:.1e}) as the collator sends it ({form_of(batches[i])}): the "
                "documents read across their boundaries on the path the run takes",
                {"forms": forms, "documents": records})
    return CheckResult("batch_as_sent", True, f"{len(records)} packed documents of the first "
                       f"batches, sent as the collator sends them ({forms[0]}), each equal to "
                       "itself alone", {"forms": forms, "documents": records,
                                        "compared": len(records), "declared": len(rows)})


__all__ = ["check_batch_as_sent", "form_of", "in_eval_mode", "sent_outputs"]
