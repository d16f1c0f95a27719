"""The next-token contract shared by the gate, the data and the trainer.

A model's forward returns logits (B, T, V): a tensor, an object with `.logits` (Hugging Face), or a
tuple whose first item is the logits. `logits_of` reads all three the same way everywhere.

For a batch of sequences of length T + 1, the inputs are the first T ids and the targets the
last T, so the logit row at position t is scored against id t + 1:

    sequence: <bos> A B C <eos>
    input:    <bos> A B C
    target:   A     B C <eos>

The loss flattens logits (B, T, V) -> (B*T, V) and targets (B, T) -> (B*T,) in the same
row-major order: flat row r is (b, t) = (r // T, r % T) in both. The gate's `loss_alignment`
check proves these helpers on a model's real logits against an explicit per-(b, t) loop; the
trainer uses exactly these helpers, so what the gate proved is what trains.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class OutputError(TypeError):
    """The model ran but returned something that is not logits. Unlike an exception raised by
    the model, this never counts as the model rejecting its input."""


def logits_of(output: Any) -> torch.Tensor:
    """The logits tensor of a forward's output: a tensor, `.logits`, or a tuple's first item."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise OutputError(f"the model returned {type(output).__name__}; expected logits (B, T, V), "
                      "an object with .logits, or a tuple whose first item is the logits")


def next_token_batch(sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sequences (B, T+1) -> inputs (B, T) = the first T ids, targets (B, T) = the last T."""
    if sequences.dim() != 2 or sequences.shape[1] < 2:
        raise ValueError(f"sequences must be (B, T+1) with T >= 1, got shape "
                         f"{tuple(sequences.shape)}")
    return sequences[:, :-1], sequences[:, 1:]


def flatten_for_loss(logits: torch.Tensor, targets: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V) -> (B*T, V), targets (B, T) -> (B*T,), both row-major, so flat row
    r = b*T + t pairs logits[b, t] with targets[b, t]."""
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} "
                         "disagree on (B, T)")
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


def next_token_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                    weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of the model's logits (B, T, V) against targets (B, T), flattened
    row-major by `flatten_for_loss`. `weights` (B,) weights whole sequences (they sum to one);
    None means a plain mean over all B*T tokens."""
    logits = logits_of(model(inputs))  # (B, T, V)
    flat_logits, flat_targets = flatten_for_loss(logits, targets)  # (B*T, V), (B*T,)
    if weights is None:
        return F.cross_entropy(flat_logits, flat_targets)
    per_token = F.cross_entropy(flat_logits, flat_targets, reduction="none")  # (B*T,)
    per_token = per_token.view(targets.shape)  # (B, T)
    return (per_token.mean(1) * weights.to(per_token.dtype)).sum()


__all__ = ["OutputError", "flatten_for_loss", "logits_of", "next_token_batch", "next_token_loss"]
