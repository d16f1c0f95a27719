"""Decoders that are not ours, written the way outside libraries write them: `ToyLM`, an explicit
attention decoder that hands back `attentions` the way Hugging Face models do, with knobs for
sinks, memory keys, a state tensor, a late leak, a wider input vocabulary and a squeezed time axis
(tests/gate/test_foreign.py; a `--model` file imports it from here)."""

from __future__ import annotations

import math
import random
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


# ---- forwards whose parameter names suggest a calling convention they do not follow ----------
# (issue 22: each raised TypeError inside kv_cache and padding, reported as the model's fault)

class BridgeLike(nn.Module):
    """TransformerLens 4.x TransformerBridge's signature: forward(input, ..., attention_mask,
    past_key_values=None, **kwargs); the ids go in positionally (input_ids= lands in **kwargs and
    `input` is missing), and it hands back logits, no cache."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input, attention_mask=None, past_key_values=None, **kwargs):  # noqa: A002
        return self.inner(input, attention_mask)


class WrapperLike(nn.Module):
    """x-transformers TransformerWrapper's signature: forward(x, return_intermediates=False,
    cache=None, mask=None, **kwargs): a `cache` parameter but logits only, unless asked."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, return_intermediates=False, cache=None, mask=None, **kwargs):
        return self.inner(x, mask)


class KVGPTLike(nn.Module):
    """LLMs-from-scratch's kv-cache GPTModel signature: forward(in_idx, use_cache=False,
    cache=None); no **kwargs, so input_ids= is an unexpected keyword; logits only."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, in_idx, use_cache=False, cache=None):
        return self.inner(in_idx)


class RowRoundedLM(nn.Module):
    """A causal model whose float32 rounding depends on the whole row, as a routed-expert layer's
    does (which tokens an expert batches together depends on every token): each position's
    embedding is shifted by a constant c computed from the whole row and shifted back,
    (x + c) - c, which is x exactly in real arithmetic (and to 2^-53 in float64) but rounds x to
    the ulp of c in float32, so changing a later token moves earlier logits by a few ulps.
    `leak`: every position also reads the last token, scaled by it (a real dependence)."""

    def __init__(self, vocab: int = V, dim: int = D, seed: int = 0, leak: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.leak = leak
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (B, T, D)
        c = 1.0 + 1e-3 * x.detach().abs().mean(dim=(1, 2), keepdim=True)  # (B, 1, 1): whole row
        x = (x + c) - c  # = x, but rounded at the ulp of c in float32
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=x.dtype).tril()
        mixed = (causal / causal.sum(-1, keepdim=True)) @ self.mix(x)  # (B, T, D): a causal mean
        return self.head(torch.tanh(mixed + x + self.leak * x[:, -1:]))


class FixedTableLM(nn.Module):
    """A learned position table of `rows` rows and nothing declaring it (CTRL, GPT-J, CodeGen,
    MPT, a litgpt GPT built with a 32-row rotary cache): T = rows + 1 raises IndexError."""

    def __init__(self, rows: int = 32, vocab: int = V, dim: int = D, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(rows, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T), got {tuple(ids.shape)}")
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))  # (B, T, D)
        causal = torch.ones(ids.shape[1], ids.shape[1]).tril()
        return self.head((causal / causal.sum(-1, keepdim=True)) @ x)


class _CachedAttention(nn.Module):
    """One causal attention layer keeping its keys and values in buffers between cached calls,
    as LLMs-from-scratch's ch04/03_kv-cache MultiHeadAttention does (registered as None,
    concatenated on every use_cache=True call, emptied by reset_cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)

    def forward(self, x: torch.Tensor, use_cache: bool) -> torch.Tensor:
        q, k, v = (t.view(*t.shape[:2], H, D // H).transpose(1, 2)  # (B, H, T, Dh)
                   for t in self.qkv(x).chunk(3, -1))
        if use_cache:
            if self.cache_k is not None:
                k, v = torch.cat([self.cache_k, k], 2), torch.cat([self.cache_v, v], 2)
            self.cache_k, self.cache_v = k, v
        new, seen = q.shape[2], k.shape[2]
        future = torch.ones(seen, seen, dtype=torch.bool).triu(1)[-new:]  # (T_new, T_seen)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D // H)).masked_fill(future, float("-inf"))
        z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(*x.shape)
        return x + self.proj(z)

    def reset_cache(self) -> None:
        self.cache_k, self.cache_v = None, None


class StatefulGPT(nn.Module):
    """LLMs-from-scratch's kv-cache GPT-2 in small: a learned position table of `rows` rows, a
    position counter `current_pos` and a cached attention layer; forward(in_idx,
    use_cache=False, cache=None) reads positions current_pos.. and advances the counter only when use_cache
    (ch04/03_kv-cache); `reset_kv_cache()` starts over; input longer than `limit` (default
    `rows`) raises ValueError. Beside it, state a forward may keep: the lengths it saw (a list),
    its last hidden state (a plain tensor attribute), running statistics written in place in
    train mode (a buffer), and draws from Python's `random` in train mode (a dropout of its own
    beside the nn.Dropout before the readout).

    from_counter: positions come from current_pos on every call, cached or not, as the
                  `llms_from_scratch.kv_cache.gpt2` release 1.0.19 reads them: right from a
                  reset state, shifted after any cached call until reset_kv_cache().
    drift:        the counter advances on every call and nothing resets it: the same ids give
                  other answers on the next call (the model's own state, not noise)."""

    def __init__(self, *, rows: int = 16, limit: int | None = None, from_counter: bool = False,
                 drift: bool = False, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.rows, self.from_counter, self.drift = rows, from_counter, drift
        self.limit = rows if limit is None else limit  # longer input is refused
        self.embed, self.pos = nn.Embedding(V, D), nn.Embedding(rows, D)
        self.att = _CachedAttention()
        self.head, self.drop = nn.Linear(D, V), nn.Dropout(0.1)
        self.register_buffer("running_mean", torch.zeros(D))
        self.current_pos = 0
        self.lengths_seen: list[int] = []
        self.last_hidden: torch.Tensor | None = None

    def forward(self, in_idx: torch.Tensor, use_cache: bool = False, cache=None) -> torch.Tensor:
        # `cache`: the package's signature (a caller's KVCache); this one keeps its own buffers
        if in_idx.dim() != 2 or in_idx.is_floating_point():
            raise ValueError(f"in_idx must be integer (B, T), got {tuple(in_idx.shape)}")
        seq_len = in_idx.shape[1]
        if seq_len > self.limit:
            raise ValueError(f"T={seq_len} exceeds the context length {self.limit}")
        start = self.current_pos if (use_cache or self.from_counter or self.drift) else 0
        x = self.embed(in_idx) + self.pos(torch.arange(start, start + seq_len))  # (B, T, D)
        if use_cache or self.drift:
            self.current_pos += seq_len
        x = self.att(x, use_cache)
        self.lengths_seen.append(seq_len)
        self.last_hidden = x.detach()
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(0.1 * x.mean((0, 1)))
            keep = torch.tensor([random.random() > 0.1 for _ in range(D)], dtype=x.dtype)
            x = x * keep / 0.9
        return self.head(self.drop(x))

    def reset_kv_cache(self) -> None:
        self.att.reset_cache()
        self.current_pos = 0


class ScratchLM(ToyLM):
    """ToyLM (correct) that takes a scratch buffer of `scratch` bytes in every forward of
    `from_len` tokens or more, as a kernel's workspace: never touched, so it costs no memory
    where the allocator may hand out address space, and fails to allocate under an
    address-space limit (`ulimit -v`) or when `scratch` is past any machine."""

    def __init__(self, scratch: int = 3 * 2**30, from_len: int = 8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scratch, self.from_len = scratch, from_len

    def forward(self, ids: torch.Tensor, output_attentions: bool = False) -> Output:
        if ids.dim() == 2 and ids.shape[1] >= self.from_len:
            torch.empty(self.scratch, dtype=torch.uint8)
        return super().forward(ids, output_attentions)


def scratch_lm() -> ScratchLM:
    """A --model factory (a file holding `from zoo_foreign import scratch_lm`, tests/ on the
    path): 3 GiB of scratch at T >= 8."""
    return ScratchLM()
