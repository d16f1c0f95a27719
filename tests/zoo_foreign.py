"""Decoders that are not ours, written the way outside libraries write them: `ToyLM`, an explicit
attention decoder that hands back `attentions` the way Hugging Face models do, with knobs for
sinks, memory keys, a state tensor, a late leak, a wider input vocabulary and a squeezed time axis
(tests/gate/test_foreign.py; a `--model` file imports it from here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

V, D, H = 11, 16, 2


@dataclass
class Output:
    """What a Hugging Face forward returns: .logits and, when asked, .attentions."""

    logits: torch.Tensor
    attentions: tuple | None = None


class ToyLM(nn.Module):
    """One explicit causal attention layer and a readout, no position table (the causal mask is
    the only order it knows, so it runs at any length). forward(ids, output_attentions=False).

    sinks:      a learned logit per head joins every softmax row and is dropped (GPT-OSS style);
                rows of the returned pattern sum to less than 1.
    memory:     that many learned key/value slots visible to every query, returned as the first
                columns of a (T, memory + T) pattern.
    state:      a second entry of `attentions` that is a (B, H, 16, 16) state, not a pattern.
    leak_from:  rows >= leak_from also read the next token (a late causal leak).
    input_vocab: rows of the input embedding (default V): ids >= it raise IndexError.
    squeeze:    squeezes the time axis, so (B, 1) ids give (B, B, V) logits.
    scale_rows: multiplies the returned pattern (a wrong normalisation of what is reported).
    """

    def __init__(self, *, sinks: bool = False, memory: int = 0, state: bool = False,
                 leak_from: int | None = None, input_vocab: int = V, squeeze: bool = False,
                 scale_rows: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.input_vocab, self.squeeze, self.scale_rows = input_vocab, squeeze, scale_rows
        self.leak_from, self.state = leak_from, state
        self.embed = nn.Embedding(input_vocab, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.head = nn.Linear(D, V)
        self.sinks = nn.Parameter(torch.randn(H)) if sinks else None
        self.memory_k = nn.Parameter(torch.randn(memory, D)) if memory else None
        self.memory_v = nn.Parameter(torch.randn(memory, D)) if memory else None

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], H, D // H).transpose(-3, -2)  # (..., H, n, Dh)

    def forward(self, ids: torch.Tensor, output_attentions: bool = False) -> Output:
        if ids.dtype != torch.long or ids.dim() != 2:
            raise TypeError(f"ids must be (B, T) int64, got {tuple(ids.shape)} {ids.dtype}")
        if bool((ids < 0).any()) or bool((ids >= self.input_vocab).any()):
            raise IndexError(f"ids must lie in [0, {self.input_vocab})")
        x = self.embed(ids)  # (B, T, D)
        batch, seq_len, _ = x.shape
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, -1))  # (B, H, T, Dh)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)  # (B, H, T, T)
        scores = scores.masked_fill(torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1),
                                    float("-inf"))
        if self.memory_k is not None:
            mem_k = self.split(self.memory_k).expand(batch, -1, -1, -1)  # (B, H, m, Dh)
            mem_v = self.split(self.memory_v).expand(batch, -1, -1, -1)
            scores = torch.cat([q @ mem_k.transpose(-2, -1) / math.sqrt(D // H), scores], -1)
            v = torch.cat([mem_v, v], -2)  # (B, H, m + T, Dh)
        if self.sinks is not None:
            sink = self.sinks.view(1, H, 1, 1).expand(batch, H, seq_len, 1)
            pattern = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        else:
            pattern = scores.softmax(-1)
        z = (pattern @ v).transpose(1, 2).reshape(batch, seq_len, D)
        y = x + self.proj(z)
        if self.leak_from is not None and seq_len > self.leak_from + 1:
            y = y.clone()
            y[:, self.leak_from:-1] += x[:, self.leak_from + 1:]  # row t reads token t + 1
        logits = self.head(y)  # (B, T, V)
        if self.squeeze:
            logits = logits.squeeze(1) + logits  # T = 1: (B, V) + (B, 1, V) -> (B, B, V)
        attentions = None
        if output_attentions:
            attentions = (pattern * self.scale_rows,)
            if self.state:
                attentions += (torch.randn(batch, H, 16, 16),)
        return Output(logits, attentions)
