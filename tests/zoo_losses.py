"""Decoders that compute their own loss, each a different way targets reach it (model_loss):

    IdxLossLM       forward(idx, labels=None) -> (logits, loss): nanoGPT's positional ids and
                    tuple output, Hugging Face's shift inside; correct;
    AlignedLossLM   forward(idx, labels=None) -> (logits, loss) with labels taken as the targets
                    themselves (logit t against label t: the caller shifted); correct;
    ShiftLabelsLM   forward(input_ids, labels=None, shift_labels=None, num_items_in_batch=None):
                    Hugging Face's ForCausalLMLoss written out (shift_labels used as given, the
                    labels shifted once otherwise, the sum divided by num_items_in_batch when
                    given). `defect` (None: correct):
        "ignores_shift_labels"   takes shift_labels and always shifts the labels itself (a
                                 forward that drops its loss kwargs: transformers#48570)
        "shifts_shift_labels"    shifts the given shift_labels once more
        "scores_ignored"         counts the -100 of shift_labels as token 0
    NoLossLM        forward(idx, labels=None) -> logits only: a labels argument but no loss.

All are PathLM (zoo_training) underneath: one causal attention layer, no dropout.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from zoo_training import PathLM

IGNORE = -100


def _shifted_once(labels: torch.Tensor) -> torch.Tensor:
    """labels (B, T) -> targets (B, T): label t + 1 at t, IGNORE at the last position."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE)


def _loss(logits, targets, count=None):
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                            ignore_index=IGNORE, reduction="sum")
    return total / ((targets != IGNORE).sum() if count is None else count)


class IdxLossLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = PathLM(dropout=0.0)

    def forward(self, idx, labels=None):
        logits = self.inner(idx)  # (B, T, V)
        return logits, (None if labels is None else _loss(logits, _shifted_once(labels)))


class AlignedLossLM(IdxLossLM):
    def forward(self, idx, labels=None):
        logits = self.inner(idx)  # (B, T, V)
        return logits, (None if labels is None else _loss(logits, labels))


class ShiftLabelsLM(nn.Module):
    def __init__(self, defect: str | None = None) -> None:
        super().__init__()
        self.defect, self.inner = defect, PathLM(dropout=0.0)

    def forward(self, input_ids, labels=None, shift_labels=None, num_items_in_batch=None):
        logits = self.inner(input_ids)  # (B, T, V)
        if labels is None:
            return SimpleNamespace(logits=logits, loss=None)
        if shift_labels is None or self.defect == "ignores_shift_labels":
            targets = _shifted_once(labels)
        elif self.defect == "shifts_shift_labels":
            targets = _shifted_once(shift_labels)
        elif self.defect == "scores_ignored":
            targets = shift_labels.masked_fill(shift_labels == IGNORE, 0)
        else:
            targets = shift_labels
        return SimpleNamespace(logits=logits, loss=_loss(logits, targets, num_items_in_batch))


class NoLossLM(IdxLossLM):
    def forward(self, idx, labels=None):
        return self.inner(idx)
