"""The loss of the first batches a trainer's dataloader yields: the cross entropy their labels
define, and the model's own loss on them against it (`batch_loss`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..gate import CheckResult
from ..objective import logits_of

IGNORE_INDEX = -100
BATCH_LOSS_TOLERANCE = 1e-4
"""Relative: the model's loss and the definition reduce the same logits, the model in float32
(a pairwise sum errs by about log2(N) ulps, 1e-6 for a million tokens), the definition in
float64. A loss that reads its labels otherwise (shifted twice, normalised by another count, the
ignored labels read) differs by far more on any batch whose labels are not all alike."""

LossCall = Callable[[Mapping[str, Any]], tuple[Any, float | None]]
"""Calls the model's own loss on one batch as the trainer does: (its output, with .loss and
.logits; the num_items_in_batch it was given, or None)."""


def _targets(batch: Mapping[str, Any], logits: torch.Tensor, labels_shifted: bool
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) as a causal LM scores them: shift_labels (or labels the collator
    shifted already, `labels_shifted`) against every logit, else the labels shifted once (logit
    t against label t + 1). logits (B, T, V), targets (B, T')."""
    shifted = batch.get("shift_labels")
    if isinstance(shifted, torch.Tensor):
        return logits, shifted.to(logits.device)
    labels = batch["labels"].to(logits.device)
    return (logits, labels) if labels_shifted else (logits[:, :-1], labels[:, 1:])


def summed_loss(batch: Mapping[str, Any], logits: torch.Tensor, labels_shifted: bool = False
                 ) -> tuple[float, int]:
    """(summed cross entropy in float64, labels scored) of logits (B, T, V) on the batch."""
    scored, targets = _targets(batch, logits, labels_shifted)
    total = F.cross_entropy(scored.double().reshape(-1, scored.shape[-1]), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return float(total), int((targets != IGNORE_INDEX).sum())


def model_inputs(batch: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """The batch's entries a forward takes for logits, on the model's device (no labels: the
    model's loss is not asked for)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
            if k not in ("labels", "shift_labels")}


def check_batch_loss(batches: Sequence[Mapping], outputs: Sequence[tuple[Any, float | None]],
                     aux_coef: float | None = None) -> CheckResult:
    """The model's own loss on each first batch, called as the trainer calls it (`outputs`: what
    a LossCall returned for each, with the trainer's num_items_in_batch where it passes one),
    equals the cross entropy of the logits it returned against the labels shifted once (or the
    shift_labels), summed and divided by num_items_in_batch, or by the labels it scores when
    none is passed; plus `aux_coef` x the load-balancing loss a routed model returns beside it
    where its router aux loss is on (output_router_logits: the term the trainer steps on too,
    whose own value the gate's router_aux_loss check holds to its router logits)."""
    rows = []
    for i, (batch, (out, items)) in enumerate(zip(batches, outputs)):
        loss = getattr(out, "loss", None)
        if not isinstance(loss, torch.Tensor):
            return CheckResult("batch_loss", False, f"batch {i}: given labels=, the model "
                               "returned no loss", {"batch": i})
        total, scored = summed_loss(batch, logits_of(out))
        divisor = scored if items is None else float(items)
        aux = getattr(out, "aux_loss", None) if aux_coef is not None else None
        added = 0.0 if aux is None else aux_coef * float(aux)
        expected = (total / divisor if divisor else 0.0) + added
        rows.append({"batch": i, "loss": float(loss), "expected": expected,
                     "num_items_in_batch": None if items is None else float(items),
                     "labels_scored": scored, "router_aux_added": added})
        if abs(float(loss) - expected) > BATCH_LOSS_TOLERANCE * max(abs(expected), 1e-12):
            said = "num_items_in_batch" if items is None else f"num_items_in_batch={items:g}"
            plus = "" if aux is None else f", plus {aux_coef:g} x its aux_loss {float(aux):.6g}"
            return CheckResult(
                "batch_loss", False, f"batch {i}: the model's own loss is {float(loss):.6g}, "
                f"not the cross entropy of its logits against the labels shifted once, summed "
                f"and divided by {said if items is not None else f'the {scored} labels read'}"
                f"{plus} ({expected:.6g}): the loss the trainer steps on is not the one its "
                "labels define", {"rows": rows}, BATCH_LOSS_TOLERANCE)
    aux = " plus the router aux loss times its coef" if any(r["router_aux_added"]
                                                             for r in rows) else ""
    return CheckResult("batch_loss", True, f"the model's own loss on {len(rows)} first batches "
                       "= cross entropy of its logits against the labels shifted once, over "
                       f"the trainer's item count{aux}", {"rows": rows}, BATCH_LOSS_TOLERANCE)
