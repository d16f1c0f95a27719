"""Modules of their own that take packed rows in the padding-free forms (the packing check's
position_ids and flash_kwargs forms):

    PositionPackedLM  forward(input_ids, position_ids=None): documents read from where the
                      position_ids restart, each attending only to its own earlier tokens, the
                      positions feeding a learned table. `defect="plain_causal"`: the positions
                      are used, the boundaries are not (huggingface/trl#2834's backend);
    FlashPackedLM     forward(input_ids, position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                      max_length_q=None, max_length_k=None): the documents from cu_seq_lens over
                      the flattened batch, as varlen flash attention reads them.
                      `defect="ignores_cu_seq_lens"`: the positions restart, the attention is the
                      plain causal square.

One attention layer, explicit masked softmax, no dropout.
"""

from __future__ import annotations

import math

import torch
from torch import nn

V, D, H, T = 16, 16, 2, 32


class _PackedAttentionLM(nn.Module):
    def __init__(self, defect: str | None = None, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.defect = defect
        self.embed, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.qkv, self.proj, self.head = nn.Linear(D, 3 * D), nn.Linear(D, D), nn.Linear(D, V)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, segment: torch.Tensor):
        """ids, positions, segment (B, T): token t reads s <= t of its own segment."""
        batch, seq_len = ids.shape
        x = self.embed(ids) + self.pos(positions)  # (B, T, D)
        q, k, v = (t.view(batch, seq_len, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
                   for t in self.qkv(x).chunk(3, -1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)  # (B, H, T, T)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        allowed = causal & (segment[:, :, None] == segment[:, None, :])  # (B, T, T)
        z = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1) @ v
        return self.head(x + self.proj(z.transpose(1, 2).reshape(batch, seq_len, D)))


def _segments_from_positions(positions: torch.Tensor) -> torch.Tensor:
    """(B, T) positions -> (B, T) segment index: a new document wherever they restart at 0."""
    return (positions == 0).long().cumsum(1)


class PositionPackedLM(_PackedAttentionLM):
    def forward(self, input_ids, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        segment = _segments_from_positions(position_ids)
        if self.defect == "plain_causal":
            segment = torch.zeros_like(segment)
        return self._run(input_ids, position_ids, segment)


class FlashPackedLM(_PackedAttentionLM):
    def forward(self, input_ids, position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                max_length_q=None, max_length_k=None):
        batch, seq_len = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(seq_len).expand_as(input_ids)
        segment = torch.zeros(batch * seq_len, dtype=torch.long)  # (B*T,): the flattened batch
        if cu_seq_lens_q is not None and self.defect != "ignores_cu_seq_lens":
            for index, (start, end) in enumerate(zip(cu_seq_lens_q[:-1], cu_seq_lens_q[1:])):
                segment[int(start):int(end)] = index
        return self._run(input_ids, position_ids, segment.view(batch, seq_len))
