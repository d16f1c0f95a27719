"""The documents a collator's batch declares, in every form collators send them:

  position_ids        restarting at 0 where a document begins (DataCollatorWithFlattening, TRL's
                      padding-free collator), with or without an attention_mask beside them;
  cu_seq_lens_q       flash attention's cumulative document lengths over the flattened batch
                      (`return_flash_attn_kwargs=True`; TRL always);
  a 4-D mask          attention_mask (B, 1, T, T) or (B, T, T), block-diagonal: a token that may
                      not attend to the one before it begins a document. Boolean (True: may
                      attend), additive (0: may attend, a large negative: may not) or 0/1;
  document_ids        decoder-audit's own: a run of one id is a document.

A batch may carry several; a document begins wherever any of them says so. Padding (a 2-D
attention_mask's 0, a 4-D mask's row that may attend to nothing, itself included) is in no
document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

SIGNALS = ("position_ids", "cu_seq_lens_q", "attention_mask", "document_ids")
"""The entries a batch declares documents with (a 2-D attention_mask declares padding only)."""


def mask_allowed(mask: torch.Tensor) -> torch.Tensor:
    """A 4-D (B, 1, T, T) or 3-D (B, T, T) attention mask as booleans (B, T, T): True where a
    query may attend to a key. Additive masks (any negative value) allow their zeros; boolean
    masks their True; 0/1 masks their ones."""
    square = mask[:, 0] if mask.dim() == 4 else mask  # (B, T, T)
    if square.dtype == torch.bool:
        return square
    if square.is_floating_point() and bool((square < 0).any()):
        return square > torch.finfo(square.dtype).min / 2
    return square != 0


def real_tokens(mask: torch.Tensor) -> torch.Tensor:
    """The tokens (B, T) that are not padding, by a 2-D mask (1 real, 0 padding) or a 4-D one
    (a token that may attend to itself)."""
    if mask.dim() == 2:
        return mask != 0
    return mask_allowed(mask).diagonal(dim1=-2, dim2=-1)


def starts(batch: Mapping[str, Any]) -> torch.Tensor | None:
    """(B, T) booleans: where a document begins (position 0 of each row included), by every
    signal the batch carries; None when it carries none (it declares no packing)."""
    ids = batch["input_ids"]
    rows, length = ids.shape
    found = torch.zeros(rows, length, dtype=torch.bool)
    signalled = False
    positions = batch.get("position_ids")
    if isinstance(positions, torch.Tensor) and positions.shape == ids.shape:
        restarts = positions.cpu() == 0
        restarts[:, 0] = False
        signalled = signalled or bool(restarts.any())
        found |= restarts
    cumulative = batch.get("cu_seq_lens_q")
    if isinstance(cumulative, torch.Tensor) and cumulative.dim() == 1:
        flat = found.flatten()  # the varlen kernels read the batch as one flattened row
        inside = cumulative.cpu().long()
        flat[inside[(inside > 0) & (inside < flat.numel())]] = True
        found = flat.view(rows, length)
        signalled = True
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() in (3, 4):
        allowed = mask_allowed(mask.cpu())  # (B, T, T)
        cut = ~allowed.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, T - 1): t may not see t - 1
        found[:, 1:] |= cut
        signalled = True
    documents = batch.get("document_ids")
    if isinstance(documents, torch.Tensor) and documents.shape == ids.shape:
        found[:, 1:] |= documents[:, 1:].cpu() != documents[:, :-1].cpu()
        signalled = True
    if not signalled:
        return None
    found[:, 0] = True
    return found


def spans(batch: Mapping[str, Any]) -> list[list[tuple[int, int]]] | None:
    """Per row, the (start, length) of each document the batch declares, padding left out of
    every one; None when it declares no packing."""
    begins = starts(batch)
    if begins is None:
        return None
    mask = batch.get("attention_mask")
    real = real_tokens(mask.cpu()) if isinstance(mask, torch.Tensor) and mask.dim() in (
        2, 3, 4) else torch.ones_like(begins)
    found = []
    for row in range(begins.shape[0]):
        edges = begins[row].nonzero().flatten().tolist() + [begins.shape[1]]
        pieces = []
        for start, end in zip(edges, edges[1:]):
            kept = real[row, start:end].nonzero().flatten()
            if len(kept):  # a document's real tokens: from its first to its last
                pieces.append((start + int(kept[0]), int(kept[-1]) - int(kept[0]) + 1))
        found.append(pieces)
    return found


__all__ = ["SIGNALS", "mask_allowed", "real_tokens", "spans", "starts"]
