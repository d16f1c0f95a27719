"""Decoders that leak only on a path training takes (issue 24): in train mode, under autocast, at
a training batch size, or whose dropout is never applied. Each is a correct causal decoder on
the eval-mode path the gate always audited, so only the check for its path can catch it.

`PathLM(defect=...)`: token embedding + fixed positions, one attention layer through
F.scaled_dot_product_attention or an explicit masked softmax, dropout on the attention output,
a readout. `defect` (None: correct):
  "causal_only_in_eval"   is_causal=not self.training (the condition inverted)
  "mask_only_in_eval"     the explicit causal mask applied only `if not self.training`
  "leak_under_autocast"   is_causal=not torch.is_autocast_enabled("cpu")
  "leak_at_batch_16"      is_causal only for batches under 16 rows (a batch-size-dependent
                          kernel: pytorch/pytorch#139462)
  "dropout_never_applied" an nn.Dropout(p) module, but F.dropout(..., training=False)
  "checkpointing_forgets_mask"  with gradient checkpointing on (in train mode) the recomputed
                          attention runs without the causal mask
  "checkpointing_reentrant"     checkpointing through torch.utils.checkpoint(use_reentrant=True):
                          with the input embeddings frozen, no gradient reaches the weights inside
                          (huggingface/transformers#26221)
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import decoder_audit as da
from decoder_audit.model.decoder import packed_documents

V, D, H, T = 16, 16, 2, 32
DEFECTS = ("causal_only_in_eval", "mask_only_in_eval", "leak_under_autocast", "leak_at_batch_16",
           "dropout_never_applied", "checkpointing_forgets_mask", "checkpointing_reentrant")


class PathLM(nn.Module):
    gradient_checkpointing = False  # Hugging Face's switch names: enable/disable below

    def gradient_checkpointing_enable(self) -> None:
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.gradient_checkpointing = False

    def __init__(self, defect: str | None = None, dropout: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        assert defect is None or defect in DEFECTS, defect
        torch.manual_seed(seed)
        self.defect = defect
        self.embed = nn.Embedding(V, D)
        # fixed positions (a buffer, not a weight): with the token embedding frozen, nothing
        # before the attention layer needs a gradient
        self.register_buffer("pos", torch.randn(T, D))
        self.qkv, self.proj, self.head = nn.Linear(D, 3 * D), nn.Linear(D, D), nn.Linear(D, V)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be (B, T) int64, got {tuple(ids.shape)} {ids.dtype}")
        if ids.shape[1] > T:
            raise ValueError(f"T={ids.shape[1]} exceeds max_seq_len={T}")
        seq_len = ids.shape[1]
        x = self.embed(ids) + self.pos[:seq_len]  # (B, T, D)
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            reentrant = self.defect == "checkpointing_reentrant"
            return self.head(checkpoint(self._layer, x, use_reentrant=reentrant))
        return self.head(self._layer(x))

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        q, k, v = (t.view(batch, seq_len, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
                   for t in self.qkv(x).chunk(3, -1))
        if self.defect == "mask_only_in_eval":
            scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)  # (B, H, T, T)
            if not self.training:
                future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            z = scores.softmax(-1) @ v
        else:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=self._is_causal(batch))
        z = z.transpose(1, 2).reshape(batch, seq_len, D)
        if self.defect == "dropout_never_applied":
            z = F.dropout(z, self.drop.p, training=False)
        else:
            z = self.drop(z)
        return x + self.proj(z)  # (B, T, D)

    def _is_causal(self, batch: int) -> bool:
        if self.defect == "causal_only_in_eval":
            return not self.training
        if self.defect == "leak_under_autocast":
            return not torch.is_autocast_enabled("cpu")
        if self.defect == "leak_at_batch_16":
            return batch < 16
        if self.defect == "checkpointing_forgets_mask":
            return not (self.gradient_checkpointing and self.training)
        return True


# ---- packing: our Decoder's document_ids interface, broken two ways -------------------------

class PacksAcrossDocuments(da.Decoder):
    """Positions restart at each document but attention is the plain causal square: a packed
    document reads the documents before it (pytorch/torchtitan#3130, huggingface/trl#3067)."""

    def forward(self, ids, attention_mask=None, *, cache=None, last_only=False,
                document_ids=None):
        if document_ids is None:
            return super().forward(ids, attention_mask, cache=cache, last_only=last_only)
        positions, _ = packed_documents(document_ids, ids)
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
        return self._run(ids, None, positions=positions, allowed=causal[None, None])


class PacksWithoutCausal(da.Decoder):
    """The document mask without the causal triangle inside each document."""

    def forward(self, ids, attention_mask=None, *, cache=None, last_only=False,
                document_ids=None):
        if document_ids is None:
            return super().forward(ids, attention_mask, cache=cache, last_only=last_only)
        positions, allowed = packed_documents(document_ids, ids)
        same = document_ids[:, :, None] == document_ids[:, None, :]
        return self._run(ids, None, positions=positions, allowed=same[:, None])


# ---- a model that computes its own loss, as Hugging Face models do ----------------------------

class OwnLossLM(nn.Module):
    """forward(input_ids, labels=None, num_items_in_batch=None) -> .logits and .loss, labels
    shifted inside (Hugging Face's convention). `defect` (None: correct):
      "shifted_twice"      the labels are shifted by two (transformers#47395)
      "reads_ignored"      the loss is built from input_ids, not labels: -100 is never honoured
      "own_count"          num_items_in_batch ignored: each micro-batch divides by its own count
                           (transformers#34191)"""

    def __init__(self, defect: str | None = None) -> None:
        super().__init__()
        self.defect, self.inner = defect, PathLM(dropout=0.0)

    def forward(self, input_ids, labels=None, num_items_in_batch=None, **kwargs):
        logits = self.inner(input_ids)  # (B, T, V)
        loss = None
        if labels is not None:
            shift = 2 if self.defect == "shifted_twice" else 1
            scores = logits[:, :-shift].reshape(-1, logits.shape[-1])
            targets = labels[:, shift:].reshape(-1)
            if self.defect == "reads_ignored":
                targets = input_ids[:, shift:].reshape(-1)
            total = F.cross_entropy(scores, targets, ignore_index=-100, reduction="sum")
            count = (targets != -100).sum()
            if num_items_in_batch is not None and self.defect != "own_count":
                count = num_items_in_batch
            loss = total / count
        return SimpleNamespace(logits=logits, loss=loss)


# ---- train mode that is nondeterministic by design -------------------------------------------

class ReseedingLM(PathLM):
    """PathLM that reseeds torch's RNG at every train-mode call (`torch.seed()`, as Reformer's
    reversible layers do to replay their dropout in backward), so identical train-mode calls
    draw other dropout masks whatever seed was set before them: nondeterministic, not leaking.
    leak:       also causal only in eval mode (PathLM's "causal_only_in_eval"): in train mode
                every row reads the future.
    functional: its dropout is F.dropout(p, training=self.training), not a module, so no
                dropout module can be switched off to steady it."""

    def __init__(self, *, leak: bool = False, functional: bool = False,
                 dropout: float = 0.1) -> None:
        super().__init__("causal_only_in_eval" if leak else None, dropout=dropout)
        if functional:
            del self.drop
            self.drop = lambda z: F.dropout(z, dropout, training=self.training)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.training:
            torch.seed()
        return super().forward(ids)


# ---- a leak no probe of the gate reaches: only in a training step ---------------------------

class ReadsTargetsWhenTraining(nn.Module):
    """A byte-level decoder (V=256, max_seq_len `T`): embeddings and fixed positions, one causal
    attention layer, a readout. `leak`: in train mode with gradients on (what a training step
    does, and no probe of the gate: its train-mode calls run without gradients) each position
    also reads the next token, the target it predicts (its embedding, turned by a fixed
    rotation so the readout can tell it from the token's own)."""

    def __init__(self, leak: bool = True, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.leak = leak
        self.embed = nn.Embedding(256, D)
        self.register_buffer("pos", torch.randn(T, D))
        self.register_buffer("turn", torch.linalg.qr(torch.randn(D, D))[0])  # fixed rotation
        self.qkv, self.proj, self.head = nn.Linear(D, 3 * D), nn.Linear(D, D), nn.Linear(D, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be (B, T) int64, got {tuple(ids.shape)} {ids.dtype}")
        if ids.shape[1] > T:
            raise ValueError(f"T={ids.shape[1]} exceeds max_seq_len={T}")
        batch, seq_len = ids.shape
        x = self.embed(ids) + self.pos[:seq_len]  # (B, T, D)
        if self.leak and self.training and torch.is_grad_enabled():
            ahead = F.pad(self.embed(ids[:, 1:]) @ self.turn, (0, 0, 0, 1))  # (B, T, D): t + 1 at t
            x = x + ahead
        q, k, v = (t.view(batch, seq_len, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
                   for t in self.qkv(x).chunk(3, -1))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + self.proj(z.transpose(1, 2).reshape(batch, seq_len, D)))


class LeaksTrainingAt16(PathLM):
    """Causal except in train mode at 16 rows or more: `is_causal=not (self.training and B >=
    16)` (a train-only kernel chosen by batch size). Eval mode at any batch size, and train mode
    at the gate's own batch sizes, are causal."""

    def _is_causal(self, batch: int) -> bool:
        return not (self.training and batch >= 16)


class DropsDocumentsAt16(da.Decoder):
    """Our Decoder, but document_ids are dropped at 16 rows or more: a big packed batch is read
    as one causal row, each document reading the ones before it."""

    def forward(self, ids, attention_mask=None, *, cache=None, last_only=False,
                document_ids=None):
        if document_ids is not None and ids.shape[0] >= 16:
            document_ids = None
        return super().forward(ids, attention_mask, cache=cache, last_only=last_only,
                               document_ids=document_ids)
