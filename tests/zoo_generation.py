"""Mutants of the generation path and the backward pass (DEFECTS.md H25-H27), each with the
check that must catch it, and the correct models that must pass those checks.

Each mutant is our `Decoder` (or its `KVCache`) with one method overridden: every full-forward
check still passes (the defect lives only in cached steps, padded batches or the backward), so
only the generation checks can see it. The unmutated `Decoder` of the same config is in the
passing set, so each mutant differs from a passing model by exactly its defect.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import configs
import torch
from helpers import randomise
from torch import nn
from zoo import Case

import decoder_audit as da
from decoder_audit.model.cache import KVCache
from decoder_audit.model.layers import LayerNorm

# Learned positions, untied, GQA 4/2, T=5: positions are a table lookup, so an offset shows.
LEARNED = configs.named("ln-gelu-learned-biases-gqa-untied")
# RoPE, GQA 4/2, T=7.
ROPE = configs.named("gqa-small")
# RoPE, GQA 6/3, T=40: room for a sliding window shorter than the cache probe (16 tokens).
LONG = configs.named("long-context-40")
TINY = da.preset("tiny-368")


def decoder(cfg: da.DecoderConfig, cls: type = da.Decoder, seed: int = 0) -> da.Decoder:
    """Weights ~ N(0, 0.3) (norm gains and biases too): positions and keys matter at O(1)."""
    return randomise(cls(cfg), seed, std=0.3)


# ---- H25: cache positions and offsets ---------------------------------------------------------

class PositionsRestart(da.Decoder):
    """Every cached call numbers its tokens from 0 again (Blaizzy/mlx-vlm#1983: every decoded
    token gets position 0): the learned position row is indexed by the step's own length."""

    def _positions(self, ids, mask, cache):
        positions, allowed = super()._positions(ids, mask, cache)
        if cache is not None:
            positions = positions - positions[..., :1]
        return positions, allowed


class RopeOffsetIgnored(da.Decoder):
    """The RoPE table is built for 0..T-1 of the tokens at hand, ignoring their offset after
    the prefill (fla-org/flash-linear-attention#766's family)."""

    def _rotations(self, positions, seq_len, like):
        return super()._rotations(None, seq_len, like)


class DropsLastEntryCache(KVCache):
    """Hands attention every filled slot but the newest one already cached when a call starts
    (an off-by-one in the cached length): each step loses the token just before it."""

    def _kept(self) -> torch.Tensor:
        kept = torch.arange(self.length, device=self.keys.device)
        return kept if self.start == 0 else kept[kept != self.start - 1]

    def update(self, layer, k, v):
        keys, values = super().update(layer, k, v)
        kept = self._kept()
        return keys.index_select(2, kept), values.index_select(2, kept)

    def allowed(self):
        allowed = super().allowed()
        return None if allowed is None else allowed.index_select(-1, self._kept())


class DropsLastEntry(da.Decoder):
    cache_class = DropsLastEntryCache


class SlidingWindowOffByOne(da.Decoder):
    """A decoder with a sliding window: each query reads itself and the WINDOW - 1 keys before
    it. Its full forward applies the window; its cached steps count the cached keys off by one
    and read one key more."""

    WINDOW = 12

    def forward(self, ids, attention_mask=None, *, cache=None, last_only=False):
        if attention_mask is None and cache is None:  # the window needs an explicit mask
            attention_mask = torch.ones_like(ids)
        return super().forward(ids, attention_mask, cache=cache, last_only=last_only)

    def _positions(self, ids, mask, cache):
        positions, allowed = super()._positions(ids, mask, cache)
        start = 0 if cache is None else cache.start
        keys = torch.arange(start + ids.shape[1])  # (S,)
        queries = torch.arange(start, start + ids.shape[1])[:, None]  # (T, 1)
        reach = self.WINDOW + (1 if start > 0 else 0)  # the defect: one more key once cached
        inside = (keys <= queries) & (queries - keys < reach)  # (T, S): causal, in the window
        return positions, inside if allowed is None else allowed & inside


# ---- H26: padding -----------------------------------------------------------------------------

class MaskIgnored(da.Decoder):
    """Accepts an attention_mask and drops it: pads are read as tokens and counted as positions."""

    def forward(self, ids, attention_mask=None, *, cache=None, last_only=False):
        return super().forward(ids, None, cache=cache, last_only=last_only)


class PadPositionsCounted(da.Decoder):
    """Masks the pads but numbers positions by slot (unsloth#3699: one shared position_ids for
    every left-padded row), so a row padded by k starts at position k."""

    def _positions(self, ids, mask, cache):
        _, allowed = super()._positions(ids, mask, cache)
        start = 0 if cache is None else cache.start
        return torch.arange(start, start + ids.shape[1])[None], allowed


# ---- H27: a backward that leaks ---------------------------------------------------------------

class MixesPositionsInBackward(torch.autograd.Function):
    """The identity forward; its backward also hands every position half the gradient of the
    position before it (a gradient kernel accumulating a neighbour's block)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        leaked = grad.clone()
        leaked[:, 1:] += 0.5 * grad[:, :-1]  # position t + 1 receives part of t's gradient
        return leaked


class LeakyBackwardNorm(LayerNorm):
    """The final LayerNorm, its output passed through MixesPositionsInBackward."""

    def forward(self, x):
        return MixesPositionsInBackward.apply(super().forward(x))


def leaky_backward() -> da.Decoder:
    model = decoder(TINY)
    model.ln_final.__class__ = LeakyBackwardNorm
    return model


class BlackBox(nn.Module):
    """A module wrapping a decoder behind forward(ids) only: no config, no cache, no mask."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(ids)


class CacheKeptElsewhere(nn.Module):
    """Names cache= and use_cache= in its forward (the Hugging Face convention) but returns no
    cache object, as models whose cache lives in the module or in a caller-owned dict do (XLM,
    RecurrentGemma). Its next token is (last id + 1) % 11; it cannot be stepped, only rerun."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None):
        logits = nn.functional.one_hot((input_ids + 1) % 11, 11).float() * 5 + self.weight
        return SimpleNamespace(logits=logits)


# ---- models that behave like outside families the generation checks once misjudged -------------

class OffsetPositions(nn.Module):
    """A one-layer causal LM under the Hugging Face call convention that numbers positions as
    RoBERTa's family does (fairseq's make_positions): from PAD + 1, and, given no position_ids,
    from `input_ids != PAD` itself (pads keep position PAD), a cached call continuing from the
    cache length. Its learned position table makes a wrong origin change every logit; it is
    correct under padding when driven with position_ids from PAD + 1. `reads_mask=False` drops
    the attention_mask: the pads become keys (a genuine padding defect)."""

    PAD = 1
    FACTS = {"vocab_size": 23, "max_seq_len": 20, "pad_token_id": PAD}

    def __init__(self, reads_mask: bool = True, width: int = 16) -> None:
        super().__init__()
        vocab, length = self.FACTS["vocab_size"], self.FACTS["max_seq_len"]
        self.reads_mask = reads_mask
        self.config = SimpleNamespace(pad_token_id=self.PAD)  # where generate reads it (HF)
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(length + self.PAD + 1, width)  # rows 0..PAD never real
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)
        randomise(self, seed=5, std=0.4)
        with torch.no_grad():  # like a trained model it never predicts its padding id, which
            self.head.bias[self.PAD] = -30.0  # its own numbering would then skip as a pad

    def get_input_embeddings(self) -> nn.Module:
        return self.tokens

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None):
        cached = 0 if past_key_values is None else past_key_values[0].shape[1]
        if input_ids.shape[1] + cached > self.FACTS["max_seq_len"]:
            raise ValueError(f"{input_ids.shape[1] + cached} tokens exceed max_seq_len=20")
        if position_ids is None:  # RoBERTa's rule: real tokens counted from PAD + 1
            real = (input_ids != self.PAD).long()
            position_ids = (real.cumsum(-1) + cached) * real + self.PAD  # (B, T)
        h = self.tokens(input_ids) + self.positions(position_ids)  # (B, T, D)
        q, k, v = self.qkv(h).chunk(3, -1)  # each (B, T, D)
        if past_key_values is not None:
            k, v = torch.cat([past_key_values[0], k], 1), torch.cat([past_key_values[1], v], 1)
        seq_len, keys = input_ids.shape[1], k.shape[1]
        query_at = torch.arange(cached, cached + seq_len)[:, None]  # (T, 1)
        allowed = (torch.arange(keys)[None] <= query_at)[None]  # (1, T, S)
        if attention_mask is not None and self.reads_mask:
            allowed = allowed & attention_mask[:, None, -keys:].bool()  # (B, T, S)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])  # (B, T, S)
        weights = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1)
        logits = self.head(h + self.out(weights @ v))  # (B, T, V)
        return SimpleNamespace(logits=logits, past_key_values=(k, v) if use_cache else None)


class ConvOverPads(nn.Module):
    """RecurrentGemma's temporal convolution in small: a causal depthwise convolution of width
    4 over the token embeddings, then a linear readout. `masks_conv=True` zeroes the pad slots
    before the convolution, so a left-padded row sees exactly the zeros its own start sees;
    False (RecurrentGemma's recurrent block) lets the convolution read the pads: a genuine
    left-padding defect no attention_mask of an attention layer can cure."""

    WIDTH = 4
    FACTS = {"vocab_size": 19, "max_seq_len": 16}

    def __init__(self, masks_conv: bool, width: int = 12) -> None:
        super().__init__()
        self.masks_conv = masks_conv
        self.tokens = nn.Embedding(self.FACTS["vocab_size"], width)
        self.conv = nn.Conv1d(width, width, self.WIDTH, groups=width, padding=self.WIDTH - 1)
        self.head = nn.Linear(width, self.FACTS["vocab_size"])
        randomise(self, seed=6, std=0.5)

    def forward(self, input_ids, attention_mask=None):
        if input_ids.shape[1] > self.FACTS["max_seq_len"]:
            raise ValueError(f"{input_ids.shape[1]} tokens exceed max_seq_len=16")
        x = self.tokens(input_ids)  # (B, T, D)
        if attention_mask is not None and self.masks_conv:
            x = x * attention_mask[..., None].to(x.dtype)  # pads enter as zeros
        mixed = self.conv(x.transpose(1, 2))[..., :input_ids.shape[1]]  # (B, D, T): causal
        return self.head(torch.tanh(mixed.transpose(1, 2)))  # (B, T, V)


class RefusesEvalBackward(torch.autograd.Function):
    """The identity whose backward asserts training mode, as Reformer's reversible layers do
    (they recompute activations in backward and insist on model.train())."""

    @staticmethod
    def forward(ctx, x, training):
        ctx.training = training
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        assert ctx.training, "make sure to use `model.train()` to put the model into training mode"
        return grad, None


class BackwardRaises(torch.autograd.Function):
    """The identity whose backward raises for a reason that is not the mode (an in-place write
    autograd rejects, as RWKV's backward does in eval mode): a defect, never excused."""

    @staticmethod
    def forward(ctx, x, training):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("one of the variables needed for gradient computation has been "
                           "modified by an inplace operation")


def backward_through(function: type[torch.autograd.Function]) -> da.Decoder:
    """tiny-368 whose final norm's output passes through `function` (the forward unchanged)."""
    model = decoder(TINY)

    class Norm(LayerNorm):
        def forward(self, x):
            return function.apply(super().forward(x), model.training)

    model.ln_final.__class__ = Norm
    return model


BLACKBOX = {"vocab_size": TINY.vocab_size, "max_seq_len": TINY.max_seq_len}

GENERATION_CHECKS = ["kv_cache", "padding", "grad_causal"]

MUTANTS = [
    Case("positions_restart_after_prefill", lambda: decoder(LEARNED, PositionsRestart),
         "kv_cache", defect="H25/D19", says="a one-token step after 2 cached"),
    Case("cache_drops_last_entry", lambda: decoder(ROPE, DropsLastEntry), "kv_cache",
         defect="H25", says="a one-token step after 3 cached"),
    Case("rope_offset_ignored_in_cached_steps", lambda: decoder(ROPE, RopeOffsetIgnored),
         "kv_cache", defect="H25/D19", says="a one-token step after 3 cached"),
    # The window only differs once more than WINDOW keys are cached: position 12 first.
    Case("sliding_window_off_by_one_in_cache", lambda: decoder(LONG, SlidingWindowOffByOne),
         "kv_cache", defect="H25", only=True, says="position 12 (a one-token step after 12"),
    Case("attention_mask_ignored", lambda: decoder(LEARNED, MaskIgnored), "padding",
         defect="H26/B12", only=True, says="pads' content reaches the real tokens"),
    # Learned positions: RoPE only sees relative positions, so a shift by k changes nothing.
    Case("pad_positions_counted", lambda: decoder(LEARNED, PadPositionsCounted), "padding",
         defect="H26/B12", only=True, says="the pads' content does not matter but their "
         "number does"),
    # White-box, the oracle's gradient comparison sees the leak first; grad_causal names it.
    Case("backward_mixes_positions", leaky_backward, "grad_causal", first=False, defect="H27",
         says="reaches later inputs [1]"),
    # Behind a black box nothing else can see it.
    Case("backward_mixes_positions_black_box", lambda: BlackBox(leaky_backward()), "grad_causal",
         defect="H27", only=True, says="reaches later inputs [1]", kwargs=BLACKBOX),
    # RoBERTa-like numbering, but the attention_mask dropped: the pads are read as keys.
    Case("offset_positions_mask_ignored", lambda: OffsetPositions(reads_mask=False), "padding",
         defect="H26/B12", says="pads' content reaches", kwargs=OffsetPositions.FACTS),
    # RecurrentGemma's convolution reading the pads.
    Case("convolution_reads_pads", lambda: ConvOverPads(masks_conv=False), "padding",
         defect="H26", says="pads' content reaches", kwargs=ConvOverPads.FACTS),
]
