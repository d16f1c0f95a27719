"""The mutant zoo: one model per defect class of DEFECTS.md that a forward-only gate can see,
each with the check that must catch it, and the correct models that must pass.

Mutants are built from our `Decoder` with one component swapped for a subclass written here
(`HandAttention`, an eager attention written independently of model.py, with the knobs the
defects turn), or as small plain torch modules. `HandAttention` itself, unmutated, is in the
passing set: every mutant differs from a passing model by exactly its defect.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import decoder_audit as da
from decoder_audit.model import CausalSelfAttention, apply_rope

import configs

# A small grouped-query config: H=4 query heads over Hkv=2 KV heads (group 2; Hkv=1 would hide
# a wrong repeat order), RoPE, RMSNorm, SwiGLU, untied, odd widths and length.
GQA = configs.named("gqa-small")
TINY = da.preset("tiny-368")
# tiny-368's shape with more room: T = 6 so a cut and a prefix have rows on both sides.
SMALL = TINY.replace(max_seq_len=6, vocab_size=9)


def decoder(cfg: da.DecoderConfig = TINY, seed: int = 0, cls: type = da.Decoder) -> da.Decoder:
    torch.manual_seed(seed)
    return cls(cfg)


# ---- an eager attention written in the tests, with knobs ---------------------------------------

class HandAttention(CausalSelfAttention):
    """Explicit scores -> mask -> softmax -> pattern @ v. Query head h reads KV head h // group.
    Records the same trace sites as our model, so the white-box checks see the mutation."""

    mask_value = float("-inf")

    def visible(self, seq_len: int) -> torch.Tensor:
        """(T, T) bool: key j is visible to query i."""
        return torch.ones(seq_len, seq_len, dtype=torch.bool).tril()

    def split(self, y: torch.Tensor, n_heads: int) -> torch.Tensor:
        batch, seq_len, _ = y.shape
        return y.view(batch, seq_len, n_heads, self.head_dim).transpose(1, 2)  # (B, n, T, Dh)

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        return kv.repeat_interleave(self.n_heads // self.kv_heads, dim=1)  # (B, H, T, Dh)

    def probabilities(self, masked: torch.Tensor) -> torch.Tensor:
        return masked.softmax(-1)

    def finish(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out

    def forward(self, x, rope, trace=None, prefix=""):
        batch, seq_len, _ = x.shape
        q = self.split(self.q_proj(x), self.n_heads)
        k = self.split(self.k_proj(x), self.kv_heads)
        v = self.split(self.v_proj(x), self.kv_heads)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        scores = q @ self.expand(k).transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
        masked = scores.masked_fill(~self.visible(seq_len).to(x.device), self.mask_value)
        pattern = self.probabilities(masked)
        z = pattern @ self.expand(v)  # (B, H, T, Dh)
        if trace is not None:
            for name, value in (("q", q), ("k", k), ("v", v), ("scores", scores),
                                ("pattern", pattern), ("z", z)):
                trace.record(f"{prefix}.{name}", value)
        out = self.output_proj(z.transpose(1, 2).reshape(batch, seq_len, -1))
        return self.finish(out, x)


def with_attention(cls: type, cfg: da.DecoderConfig = TINY, seed: int = 0) -> da.Decoder:
    """Our Decoder with every layer's attention class swapped for `cls` (same weights)."""
    model = decoder(cfg, seed)
    for layer in model.layers:
        layer.attn.__class__ = cls
    return model


class NoMask(HandAttention):
    def visible(self, seq_len):
        return torch.ones(seq_len, seq_len, dtype=torch.bool)


class InvertedMask(HandAttention):  # triu where tril was meant: sees itself and the future
    def visible(self, seq_len):
        return torch.ones(seq_len, seq_len, dtype=torch.bool).triu()


class LeakOne(HandAttention):  # tril(diagonal=1): one future token visible
    def visible(self, seq_len):
        return torch.ones(seq_len, seq_len, dtype=torch.bool).tril(1)


class StrictMask(HandAttention):  # tril(-1): row 0 has no key at all -> NaN
    def visible(self, seq_len):
        return torch.ones(seq_len, seq_len, dtype=torch.bool).tril(-1)


class FiniteMask(HandAttention):  # the old "masked_bias" -1e4 constant
    mask_value = -1e4


class NoTransposeSplit(HandAttention):  # view (B, n, T, Dh) straight from (B, T, n*Dh)
    def split(self, y, n_heads):
        batch, seq_len, _ = y.shape
        return y.view(batch, n_heads, seq_len, self.head_dim)


class TiledKV(HandAttention):  # [k0, k1, k0, k1] instead of [k0, k0, k1, k1]
    def expand(self, kv):
        return kv.repeat(1, self.n_heads // self.kv_heads, 1, 1)


class DropoutInEval(HandAttention):  # attention dropout applied regardless of eval()
    def probabilities(self, masked):
        return F.dropout(masked.softmax(-1), p=0.1, training=True)


class BatchMean(HandAttention):  # a statistic over the batch axis mixes the rows
    def finish(self, out, x):
        return out + 0.1 * x.mean(dim=0, keepdim=True)


class LengthScaled(HandAttention):  # normalises by the sequence length T
    def finish(self, out, x):
        return out * (4.0 / x.shape[1])


class SelfExcluded(HandAttention):  # strict mask, row 0 patched to see key 0: still wrong
    def visible(self, seq_len):
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril(-1)
        mask[0, 0] = True
        return mask


class TinyLeak(HandAttention):  # a leak of ~1e-6: attention output nudged by the last token
    def finish(self, out, x):
        return out + 1e-6 * x[:, -1:, :]


# ---- decoder-level mutants --------------------------------------------------------------------

class SoftmaxOutput(da.Decoder):
    def forward(self, ids):
        return super().forward(ids).softmax(-1)


class LogSoftmaxOutput(da.Decoder):
    def forward(self, ids):
        return super().forward(ids).log_softmax(-1)


class CropsOverlength(da.Decoder):  # keeps the last max_seq_len tokens, silently
    def forward(self, ids):
        return super().forward(ids[:, -self.config.max_seq_len:])


class WrapsPositions(da.Decoder):  # position index t % max_seq_len, no length check
    def forward(self, ids):
        seq_len = ids.shape[1]
        x = self.token_embeddings(ids)
        x = x + self.position_embeddings.weight[torch.arange(seq_len) % self.config.max_seq_len]
        for block in self.layers:
            x = block(x, None)
        return self.lm_head(self.ln_final(x))


class ShiftedOutput(da.Decoder):  # logits row t computed from inputs < t: predicts two ahead
    def forward(self, ids):
        logits = super().forward(ids)
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


class SkipsFinalNorm(nn.Module):
    """Keeps ln_final's parameters (the ledger still reconciles) but never applies it."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight, self.bias = norm.weight, getattr(norm, "bias", None)

    def forward(self, x):
        return x


def missing_final_norm() -> da.Decoder:
    model = decoder(TINY)
    model.ln_final = SkipsFinalNorm(model.ln_final)
    return model


def extra_attention_bias() -> da.Decoder:
    model = decoder(TINY)
    model.layers[0].attn.q_proj.bias = nn.Parameter(torch.zeros(TINY.d_model))
    return model


def copied_readout() -> da.Decoder:  # rasbt/LLMs-from-scratch#822: copy, not share
    model = decoder(TINY)
    model.lm_head.weight = nn.Parameter(model.token_embeddings.weight.detach().clone())
    return model


def shared_storage_readout() -> da.Decoder:  # two Parameter objects over one storage
    model = decoder(TINY)
    model.lm_head.weight = nn.Parameter(model.token_embeddings.weight.data)
    return model


class PlainApply(da.Decoder):
    """A decoder without our re-tie in `_apply`, as most hand-written models are."""

    _apply = nn.Module._apply


def rematerialised() -> da.Decoder:
    """Built on the meta device, materialised with to_empty(), then loaded (DEFECTS.md A1):
    every parameter slot gets fresh storage, so the readout is no longer the embedding."""
    trained = decoder(TINY).state_dict()
    with torch.device("meta"):
        model = PlainApply(TINY)
    model.to_empty(device="cpu")
    model.load_state_dict(trained)
    return model


def declared_untied_but_tied() -> da.Decoder:
    model = decoder(TINY.replace(tie_embeddings=False))
    model.lm_head.weight = model.token_embeddings.weight
    return model


# ---- plain torch decoders (black-box) ---------------------------------------------------------

class TorchDecoder(nn.Module):
    """A decoder from torch.nn parts: embeddings, nn.TransformerEncoderLayer blocks under a
    causal mask (True = masked, MultiheadAttention's convention), a linear head.
    `mask="train-only"` builds the mask on the training code path only (in the spirit of
    meta-pytorch/torchtune#959, a mask built on one path); `clip_positions` clamps positions
    instead of rejecting long input."""

    def __init__(self, vocab_size: int = 13, d_model: int = 16, n_heads: int = 2,
                 n_layers: int = 2, max_seq_len: int = 9, mask: str = "bool",
                 clip_positions: bool = False) -> None:
        super().__init__()
        self.max_seq_len, self.mask, self.clip_positions = max_seq_len, mask, clip_positions
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_seq_len, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, 2 * d_model, dropout=0.0,
                                       batch_first=True, norm_first=True)
            for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"ids must be integer (B, T), got {tuple(ids.shape)} {ids.dtype}")
        seq_len = ids.shape[1]
        positions = torch.arange(seq_len, device=ids.device)
        if self.clip_positions:
            positions = positions.clamp(max=self.max_seq_len - 1)
        elif seq_len > self.max_seq_len:
            raise ValueError(f"T={seq_len} exceeds max_seq_len={self.max_seq_len}")
        x = self.embed(ids) + self.pos(positions)  # (B, T, D)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=ids.device).triu(1)
        if self.mask == "train-only" and not self.training:
            mask = None
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.head(self.norm(x))  # (B, T, V)


# ---- the registry -----------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    build: Callable[[], nn.Module]
    expect: str | None = None  # the check that must fail; None: every check must pass
    first: bool = True  # and it must be the first failure
    defect: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)


TORCH_BLACKBOX = {"vocab_size": 13, "max_seq_len": 9}

MUTANTS = [
    Case("no_causal_mask", lambda: with_attention(NoMask), "causal", defect="B8"),
    Case("inverted_mask_triu", lambda: with_attention(InvertedMask), "causal", defect="B7/B9"),
    Case("mask_leaks_one_ahead", lambda: with_attention(LeakOne), "causal", defect="B9"),
    Case("strict_mask_nan", lambda: with_attention(StrictMask, SMALL), "attention_rows",
         first=False, defect="B9/C14"),
    Case("finite_mask_1e4", lambda: with_attention(FiniteMask), "attention_rows", defect="B10"),
    Case("softmax_in_forward", lambda: decoder(cls=SoftmaxOutput), "raw_logits", defect="seeds trap"),
    Case("log_softmax_in_forward", lambda: decoder(cls=LogSoftmaxOutput), "raw_logits",
         defect="seeds trap"),
    Case("overlength_cropped", lambda: decoder(cls=CropsOverlength), "overlength", defect="D17"),
    Case("positions_wrap", lambda: decoder(cls=WrapsPositions), "overlength", defect="D17"),
    Case("output_shifted_two_ahead", lambda: decoder(SMALL, cls=ShiftedOutput), "causal",
         defect="B9/F22"),
    Case("false_tying_copy", copied_readout, "tying", first=False, defect="A2"),
    Case("shared_storage_two_params", shared_storage_readout, "tying", first=False, defect="A2"),
    Case("tie_lost_to_empty", rematerialised, "tying", first=False, defect="A1"),
    Case("declared_untied_but_tied", declared_untied_but_tied, "tying", first=False, defect="A5"),
    Case("extra_bias_breaks_ledger", extra_attention_bias, "params", defect="A6"),
    Case("heads_split_without_transpose", lambda: with_attention(NoTransposeSplit, SMALL), "causal",
         defect="E20"),
    Case("gqa_tiled_not_interleaved", lambda: with_attention(TiledKV, GQA), "oracle", defect="E21"),
    Case("batch_rows_mixed", lambda: with_attention(BatchMean), "batch_independence", defect="B12"),
    Case("dropout_in_eval", lambda: with_attention(DropoutInEval), "determinism", defect="nondeterminism"),
    Case("final_norm_skipped", missing_final_norm, "oracle", defect="seeds: final norm"),
    Case("normalised_by_length", lambda: with_attention(LengthScaled, SMALL), "prefix",
         defect="seeds: cross-token normalisation"),
    Case("self_excluded_mask", lambda: with_attention(SelfExcluded, SMALL), "oracle", defect="B9"),
    Case("leak_of_1e-6", lambda: with_attention(TinyLeak, SMALL), "causal", defect="B8 (tiny)"),
    Case("torch_mask_on_training_path_only", lambda: TorchDecoder(mask="train-only"), "causal",
         defect="B8", kwargs=TORCH_BLACKBOX),
    Case("torch_positions_clipped", lambda: TorchDecoder(clip_positions=True), "overlength",
         defect="D17", kwargs=TORCH_BLACKBOX),
]
