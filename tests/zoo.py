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

import configs
import torch
import torch.nn.functional as F
from torch import nn

import decoder_audit as da
from decoder_audit.model.attention import CausalSelfAttention, apply_rope
from decoder_audit.model.layers import Embedding, Linear, make_norm

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

    def scale(self, traced: bool) -> float:
        """The score scale 1/sqrt(Dh), on the traced (eager) path and the untraced one alike."""
        return 1.0 / math.sqrt(self.head_dim)

    def probabilities(self, masked: torch.Tensor) -> torch.Tensor:
        return masked.softmax(-1)

    def combine(self, pattern: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """z = pattern @ v: (B, H, T, T) x (B, H, T, Dh) -> (B, H, T, Dh)."""
        return pattern @ v

    def sites(self, q, k, v, scores, pattern, z) -> tuple[tuple[str, torch.Tensor], ...]:
        """What the trace records: k and v per KV head (B, Hkv, T, Dh), as declared."""
        return (("q", q), ("k", k), ("v", v), ("scores", scores), ("pattern", pattern), ("z", z))

    def finish(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out

    def forward(self, x, rope, trace=None, prefix=""):
        batch, seq_len, _ = x.shape
        q = self.split(self.q_proj(x), self.n_heads)
        k = self.split(self.k_proj(x), self.kv_heads)
        v = self.split(self.v_proj(x), self.kv_heads)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        scale = self.scale(trace is not None)
        scores = q @ self.expand(k).transpose(-2, -1) * scale  # (B, H, T, T)
        masked = scores.masked_fill(~self.visible(seq_len).to(x.device), self.mask_value)
        pattern = self.probabilities(masked)
        z = self.combine(pattern, self.expand(v))  # (B, H, T, Dh)
        if trace is not None:
            for name, value in self.sites(q, k, v, scores, pattern, z):
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


class TracedPathDiffers(HandAttention):
    """The traced (eager) path divides scores by Dh, the untraced (fast) path by sqrt(Dh): the
    trace, and every picture drawn from it, describes another model than the one that runs. Its
    patterns are still proper (rows sum to 1, nothing on the future)."""

    def scale(self, traced):
        return 1.0 / self.head_dim if traced else 1.0 / math.sqrt(self.head_dim)


class PatternLeaksUnused(HandAttention):
    """The recorded pattern is a softmax under tril(1), with mass on key t + 1, while the output
    is computed from the correct causal pattern: the logits (and their gradients) are the correct
    model's; only the pattern the trace shows is wrong."""

    def sites(self, q, k, v, scores, pattern, z):
        seq_len = scores.shape[-1]
        one_ahead = torch.ones(seq_len, seq_len, dtype=torch.bool, device=scores.device).tril(1)
        shown = scores.masked_fill(~one_ahead, float("-inf")).softmax(-1)
        return (("q", q), ("k", k), ("v", v), ("scores", scores), ("pattern", shown), ("z", z))


class TraceRecordsExpandedKV(HandAttention):
    """Records k and v after the GQA repeat (B, H, T, Dh) instead of per KV head
    (B, Hkv, T, Dh): the computation is right, the shape ledger is not."""

    def sites(self, q, k, v, scores, pattern, z):
        return (("q", q), ("k", self.expand(k)), ("v", self.expand(v)), ("scores", scores),
                ("pattern", pattern), ("z", z))


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


class DetachedTable(Embedding):
    """An embedding whose table is read `.detach()`ed: same values, no gradient to the table.
    The Parameter stays registered under `weight` (the ledger and the weight names are intact)."""

    @property
    def weight(self):
        return self._parameters["weight"].detach()


def detached_positions() -> da.Decoder:
    """The position table added `.detach()`ed: identical logits, but training never moves it."""
    model = decoder(SMALL)
    model.position_embeddings.__class__ = DetachedTable
    return model


class DetachedReadout(Linear):
    """A readout that reads its (shared) weight `.detach()`ed: the tied weight is one Parameter,
    but only the lookup path reaches its gradient."""

    def forward(self, x):
        return F.linear(x, self.weight.detach(), self.bias)


def detached_readout() -> da.Decoder:
    model = decoder(TINY)
    model.lm_head.__class__ = DetachedReadout
    return model


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

    apply_final_norm = True

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
        x = self.norm(x) if self.apply_final_norm else x
        return self.finish(self.head(x), ids)  # (B, T, V)

    def finish(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The last step of the forward: nothing here; the black-box mutants below plant theirs."""
        return logits


class ReadsRowZero(TorchDecoder):
    """Every row's logits are biased towards batch row 0's token at the same position (a
    lookup, mask or position table computed from `ids[0]` and broadcast over the batch). Row 0
    reads only itself, so changing the other rows or running row 0 alone moves nothing; only a
    reordering, which puts another sequence first, shows it."""

    def finish(self, logits, ids):
        return logits + F.one_hot(ids[:1], logits.shape[-1]).to(logits.dtype)  # (1, T, V)


class ScalesByBatch(TorchDecoder):
    """Logits divided by the batch size (a mean over the batch where a sum per row was meant).
    Changing or reordering rows keeps B; only the row run alone (B = 1) shows it."""

    def finish(self, logits, ids):
        return logits * (2.0 / logits.shape[0])


class ClampsIds(TorchDecoder):
    """Out-of-range ids are clamped into [0, V) instead of rejected (DEFECTS.md D-class: nothing
    is clipped silently)."""

    def forward(self, ids):
        return super().forward(ids.clamp(0, self.embed.num_embeddings - 1))


class LeaksLastToken(TorchDecoder):
    """Every row's logit for the last token's id is raised by `leak`: when the last token
    changes, every earlier row moves by exactly `leak` (two logits, by -leak and +leak), and
    nothing else changes. Built in `dtype`; a float32 one refuses to run in float64, so the gate
    audits it in float32 whatever it does with models that allow float64."""

    def __init__(self, leak: float, dtype: torch.dtype = torch.float64) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.leak = leak
        self.to(dtype)
        self.float32_only = dtype == torch.float32

    def forward(self, ids):
        if self.float32_only and self.head.weight.dtype == torch.float64:
            raise TypeError("this model only runs in float32")
        return super().forward(ids)

    def finish(self, logits, ids):
        last = F.one_hot(ids[:, -1:], logits.shape[-1]).to(logits.dtype)  # (B, 1, V)
        return logits + self.leak * last


class UnusedLinear(TorchDecoder):
    """An nn.Linear created in __init__ and never called: the optimizer steps it, the loss never
    reads it (a refactor that left an old projection behind)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.old_proj = nn.Linear(16, 16)


class NormNeverApplied(TorchDecoder):
    """A final norm's scale and shift created but the forward skips the norm (DEFECTS.md: a
    missing final norm), so its parameters get no gradient."""

    apply_final_norm = False


# ---- the registry -----------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    build: Callable[[], nn.Module]
    expect: str | None = None  # the check that must fail; None: every check must pass
    first: bool = True  # and it must be the first failure
    defect: str = ""
    only: bool = False  # and every other check must pass: no other check can see the defect
    says: str = ""  # words of the check's detail naming this defect (a check fails several ways)
    kwargs: dict[str, Any] = field(default_factory=dict)


TORCH_BLACKBOX = {"vocab_size": 13, "max_seq_len": 9}

MUTANTS = [
    Case("no_causal_mask", lambda: with_attention(NoMask), "causal", defect="B8",
         says="reads future tokens"),
    Case("inverted_mask_triu", lambda: with_attention(InvertedMask), "causal", defect="B7/B9",
         says="reads future tokens"),
    Case("mask_leaks_one_ahead", lambda: with_attention(LeakOne), "causal", defect="B9",
         says="reads future tokens"),
    Case("strict_mask_nan", lambda: with_attention(StrictMask, SMALL), "attention_rows",
         first=False, defect="B9/C14", says="non-finite probabilities"),
    Case("finite_mask_1e4", lambda: with_attention(FiniteMask), "attention_rows", defect="B10",
         says="under scaled-up Q/K"),
    Case("softmax_in_forward", lambda: decoder(cls=SoftmaxOutput), "raw_logits",
         defect="seeds trap", says="returns probabilities"),
    Case("log_softmax_in_forward", lambda: decoder(cls=LogSoftmaxOutput), "raw_logits",
         defect="seeds trap", says="returns log-probabilities"),
    Case("overlength_cropped", lambda: decoder(cls=CropsOverlength), "overlength", defect="D17",
         says="cropped silently"),
    Case("positions_wrap", lambda: decoder(cls=WrapsPositions), "overlength", defect="D17",
         says="was accepted"),
    Case("output_shifted_two_ahead", lambda: decoder(SMALL, cls=ShiftedOutput), "causal",
         defect="B9/F22", says="does not read its own position"),
    Case("false_tying_copy", copied_readout, "tying", first=False, defect="A2",
         says="separate Parameter"),
    Case("shared_storage_two_params", shared_storage_readout, "tying", first=False, defect="A2",
         says="one storage"),
    Case("tie_lost_to_empty", rematerialised, "tying", first=False, defect="A1",
         says="separate Parameter"),
    Case("declared_untied_but_tied", declared_untied_but_tied, "tying", first=False, defect="A5",
         says="declared untied"),
    Case("unused_linear", UnusedLinear, "dead_parameters", only=True, kwargs=TORCH_BLACKBOX,
         says="old_proj.weight"),
    Case("final_norm_never_applied", NormNeverApplied, "dead_parameters", only=True,
         kwargs=TORCH_BLACKBOX, says="norm.weight"),
    Case("extra_bias_breaks_ledger", extra_attention_bias, "params", defect="A6",
         says="analytic 64 vs measured 68"),
    Case("heads_split_without_transpose", lambda: with_attention(NoTransposeSplit, SMALL), "causal",
         defect="E20", says="reads future tokens"),
    Case("gqa_tiled_not_interleaved", lambda: with_attention(TiledKV, GQA), "oracle", defect="E21",
         says="differ from the slow oracle"),
    Case("batch_rows_mixed", lambda: with_attention(BatchMean), "batch_independence", defect="B12",
         says="other rows changed"),
    Case("dropout_in_eval", lambda: with_attention(DropoutInEval), "determinism",
         defect="nondeterminism", says="different logits twice"),
    Case("final_norm_skipped", missing_final_norm, "oracle", defect="seeds: final norm",
         says="differ from the slow oracle"),
    Case("normalised_by_length", lambda: with_attention(LengthScaled, SMALL), "prefix",
         defect="seeds: cross-token normalisation", says="prefix of length"),
    Case("self_excluded_mask", lambda: with_attention(SelfExcluded, SMALL), "oracle", defect="B9",
         says="differ from the slow oracle"),
    Case("leak_of_1e-6", lambda: with_attention(TinyLeak, SMALL), "causal", defect="B8 (tiny)",
         says="reads future tokens"),
    Case("torch_mask_on_training_path_only", lambda: TorchDecoder(mask="train-only"), "causal",
         defect="B8", kwargs=TORCH_BLACKBOX, says="reads future tokens"),
    Case("torch_positions_clipped", lambda: TorchDecoder(clip_positions=True), "overlength",
         defect="D17", kwargs=TORCH_BLACKBOX, says="was accepted"),
    # Defects only one check (or one part of a check) can see; each was a surviving mutation of
    # the gate (issue 16) until it had a mutant here.
    Case("ids_clamped_into_range", ClampsIds, "inputs", defect="D17 (ids)", only=True,
         kwargs=TORCH_BLACKBOX, says="accepted silently"),
    Case("trace_records_expanded_kv", lambda: with_attention(TraceRecordsExpandedKV, GQA),
         "shapes", defect="shape ledger", only=True, says="declared (B, Hkv, T, Dh)"),
    Case("batch_rows_read_row_0", ReadsRowZero, "batch_independence", defect="B12 (reorder)",
         only=True, kwargs=TORCH_BLACKBOX, says="batch order reversed"),
    Case("scaled_by_batch_size", ScalesByBatch, "batch_independence", defect="B12 (B=1)",
         only=True, kwargs=TORCH_BLACKBOX, says="row run alone (B=1)"),
    # 1e-8 is 10^5 above float64 rounding and 100x below the shape-change tolerance: only the
    # same-shape causal intervention at INVARIANCE_FP64 can see it.
    Case("leak_of_1e-8_float64", lambda: LeaksLastToken(1e-8), "causal", defect="B8 (tiny)",
         only=True, kwargs=TORCH_BLACKBOX, says="reads future tokens"),
    # 1e-3 is 10^4 above float32 rounding: the prefix check (same tolerance in float32) sees it too.
    Case("leak_of_1e-3_float32", lambda: LeaksLastToken(1e-3, torch.float32), "causal",
         defect="B8 (tiny)", kwargs=TORCH_BLACKBOX, says="reads future tokens"),
    Case("pattern_mass_on_next_key_unused", lambda: with_attention(PatternLeaksUnused, SMALL),
         "attention_rows", defect="B9 (pattern only)", only=True, says="on a future key"),
    Case("readout_detached_from_tied_weight", detached_readout, "tying_grad",
         defect="A: one path of the tied gradient lost", says="only the lookup path"),
    # a detached table gets no gradient at all: dead_parameters names it too
    Case("position_table_detached", detached_positions, "oracle", defect="gradient",
         says="gradient of position_embeddings.weight"),
    Case("traced_path_differs_from_fast", lambda: with_attention(TracedPathDiffers, SMALL),
         "oracle", defect="eager vs fused", only=True, says="eager (traced) path differs"),
]


# ---- the spec's variants, each ignored by one module of our own Decoder ------------------------

def _variant_mutant(config: str, plant: Callable[[da.Decoder], None]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        model = decoder(configs.named(config), seed=3)
        plant(model)
        return model
    return build


def _oracle_mutant(name: str, config: str, plant: Callable[[da.Decoder], None],
                   defect: str) -> Case:
    """A defect planted in a grid config's model that the slow oracle sees (among other
    checks, so not necessarily the first failure): the numerics of a declared field."""
    return Case(name, _variant_mutant(config, plant), "oracle", first=False, defect=defect,
                says="differ from the slow oracle")


def _set(path: str, value: Any) -> Callable[[da.Decoder], None]:
    """Set the attribute `path` (e.g. "layers.0.attn.window") of a model to `value`."""
    def plant(model: da.Decoder) -> None:
        owner, _, name = path.rpartition(".")
        setattr(model.get_submodule(owner), name, value)
    return plant


def _xielu_raw_alphas(model: da.Decoder) -> None:
    """Layer 0's xIELU takes alpha_p and alpha_n as its coefficients, without the softplus
    that keeps them positive (a fresh layer's 0.8 becomes 0.19 and 0.35)."""
    act = model.layers[0].ffn.act

    def forward(x: torch.Tensor) -> torch.Tensor:
        negative = (torch.expm1(torch.clamp(x, max=act.EPS)) - x) * (act.BETA + act.alpha_n)
        return torch.where(x > 0, act.alpha_p * x * x, negative) + act.BETA * x

    act.forward = forward


def _softcap_dropped_at_scale(model: da.Decoder) -> None:
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.q_proj.weight.mul_(30.0)
    model.layers[1].attn.score_softcap = None


def _logits_unscaled(model: da.Decoder) -> None:
    """The readout's output divided by the config's logit_scale: the scale is never applied."""
    readout, scale = model.lm_head.forward, model.config.logit_scale
    model.lm_head.forward = lambda x: readout(x) / scale


# ---- position and norm placements (helper fam-positions) ----

def _alibi_ignored_in_layer_1(model: da.Decoder) -> None:
    """Layer 1 drops the ALiBi bias it is handed: its scores carry no distance at all."""
    block = model.layers[1]
    forward = block.forward
    block.forward = lambda *args, bias=None, **kwargs: forward(*args, **kwargs)


def _alibi_heads_reversed(model: da.Decoder) -> None:
    """The slopes handed to the heads in reverse order: head 0 gets the gentlest slope."""
    alibi = model._alibi
    model._alibi = lambda *args: alibi(*args).flip(1)  # (B|1, H, T, S): heads reversed


def _embedding_norm_skipped(model: da.Decoder) -> None:
    """The embedding norm's module is there (its weights placed) but never applied."""
    model.embedding_norm.forward = lambda x: x


def _sinusoids_interleaved(model: da.Decoder) -> None:
    """The table's sines and cosines interleaved (sin f0, cos f0, sin f1, ...) instead of the
    sines, then the cosines: the other layout of "Attention is all you need"'s table."""
    rows = model._position_rows

    def interleaved(*args):
        table = rows(*args)  # (..., T, D), D odd: the last column is zeros
        half = model.config.d_model // 2
        pairs = torch.stack((table[..., :half], table[..., half:2 * half]), dim=-1)
        return torch.cat((pairs.flatten(-2), table[..., 2 * half:]), dim=-1)
    model._position_rows = interleaved


def _final_norm_added(model: da.Decoder) -> None:
    """A final norm (with learned weights) where the config declares none."""
    model.ln_final = make_norm(model.config)
    model.ln_final.reset_parameters()  # a gain of 1, a shift of 0


def _qk_layernorm_as_rmsnorm(model: da.Decoder) -> None:
    """Layer 0's q norm keeps its weights but divides by the root mean square, never
    subtracting the mean: an RMSNorm where the config declares a LayerNorm."""
    norm = model.layers[0].attn.q_norm
    norm.forward = lambda x: F.rms_norm(x, norm.shape, norm.weight, norm.eps) + norm.bias


# ---- attention sinks, the clamped SwiGLU, router and expert biases, q/k norms after RoPE,
# position-scaled queries (helper fam-sinks) ----

def _unused(module: nn.Module, name: str) -> None:
    """The module keeps its Parameter `name` (the ledger and the layout still find it) but its
    forward reads None there: an instance attribute shadows the registered Parameter."""
    object.__setattr__(module, name, None)


def _sinks_ignored(model: da.Decoder) -> None:
    """Layer 1's softmax without its sink logit (the weight kept, never read)."""
    _unused(model.layers[1].attn, "sinks")


def _sink_model_reads_the_future(model: da.Decoder) -> None:
    """Layer 1 of a model with sinks attends to every key, the later ones too."""
    attn = model.layers[1].attn
    attn._band = lambda seq_len, device: torch.ones(seq_len, seq_len, dtype=torch.bool,
                                                    device=device)


def _trained(*parameters: nn.Parameter) -> None:
    """Values a trained model's biases would hold (they start at 0, where dropping one changes
    no value)."""
    with torch.no_grad():
        for parameter in parameters:
            parameter.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))


def _router_bias_ignored(model: da.Decoder) -> None:
    router = model.layers[1].ffn.router
    _trained(router.bias)
    _unused(router, "bias")


def _expert_biases_ignored(model: da.Decoder) -> None:
    for expert in model.layers[0].ffn.experts:
        _trained(expert.w1.bias, expert.w2.bias, expert.w3.bias)
        _unused(expert.w2, "bias")


def _swiglu_unclamped(model: da.Decoder) -> None:
    """Layer 0's experts compute the clamped SwiGLU without its clamps (limit infinite)."""
    for expert in model.layers[0].ffn.experts:
        expert.clamped = (expert.clamped[0], float("inf"))


def _shared_experts_unscaled(model: da.Decoder) -> None:
    """Layer 1's shared experts join the routed sum whole, their scale (0.5) never applied."""
    ffn = model.layers[1].ffn
    ffn.shared_output = lambda tokens: ffn.shared(tokens)


def _qk_norm_before_rope(model: da.Decoder) -> None:
    """Layer 1 normalises q and k before RoPE; gains a trained model would hold (a gain of 1
    commutes with the rotation)."""
    attn = model.layers[1].attn
    _trained(attn.q_norm.weight, attn.k_norm.weight)
    attn.norm_after_rope = False


# Each runs through the white-box oracle (the model's own config is its spec); a dropped sandwich
# norm removes a weight the config declares, which the ledger names.
VARIANT_MUTANTS = [
    _oracle_mutant("window_ignored", "gemma2-like",
                   _set("layers.0.attn.window", None), "I (sliding window)"),
    _oracle_mutant("window_on_the_wrong_layer", "gemma2-like",
                   _set("layers.1.attn.window", 3), "I (window pattern)"),
    # at initialisation the scores are ~1e-3, where c * tanh(s / c) = s to 1e-8: the weights of
    # a trained model (q 30x larger, scores of order 1) are where the cap acts
    _oracle_mutant("score_softcap_dropped", "gemma2-like",
                   _softcap_dropped_at_scale, "I (soft-capping)"),
    _oracle_mutant("score_scale_of_the_head_width", "gemma2-like",
                   _set("layers.0.attn.score_scale", None), "I (attention scale)"),
    Case("sandwich_norm_dropped", _variant_mutant("gemma2-like", _set("layers.1.ln2_post", None)),
         "params", first=False, defect="I (sandwich norm)", says="layers.1.ln2_post.weight",
         kwargs={"spec": configs.named("gemma2-like")}),
    _oracle_mutant("parallel_block_run_in_series", "neox-like",
                   _set("layers.1.parallel", False), "I (parallel residual)"),
    _oracle_mutant("residual_multiplier_dropped", "granite-like",
                   _set("layers.0.residual_multiplier", 1.0), "I (residual multiplier)"),
    _oracle_mutant("logit_scale_dropped", "granite-like", _logits_unscaled, "I (logit scale)"),
    _oracle_mutant("nope_layer_rotated", "nope-layer",
                   _set("layers.1.attn.rotates", True), "I (NoPE layer)"),
    _oracle_mutant("shared_norm_not_shared", "parallel-one-norm",
                   _set("layers.1.shared_norm", False), "I (parallel block, one norm)"),
    _oracle_mutant("relu2_not_squared", "parallel-one-norm",
                   _set("layers.0.ffn.activation", torch.relu), "I (squared ReLU)"),
    # ---- GPT-style families (helper fam-gpt) ----
    # OPT's table read from row 0: position t gets the row of position t - 2
    _oracle_mutant("position_offset_ignored", "opt-like",
                   _set("position_offset", 0), "I (position table offset)"),
    # ---- routed families (helper fam-moe) ----
    _oracle_mutant("latent_norm_on_the_block_eps", "mla-latent-eps",
                   _set("layers.1.attn.kv_a_norm.eps", 1e-5), "I (norm eps)"),
    _oracle_mutant("xielu_without_softplus", "xielu-like",
                   _xielu_raw_alphas, "I (learned activation)"),
    # ---- position and norm placements (helper fam-positions) ----
    _oracle_mutant("alibi_ignored_in_a_layer", "alibi-embedding-norm",
                   _alibi_ignored_in_layer_1, "I (ALiBi)"),
    _oracle_mutant("alibi_slopes_in_reverse_head_order", "alibi-no-shift",
                   _alibi_heads_reversed, "I (ALiBi slopes)"),
    _oracle_mutant("embedding_norm_skipped", "alibi-embedding-norm",
                   _embedding_norm_skipped, "I (embedding norm)"),
    _oracle_mutant("sinusoids_interleaved", "sinusoidal-offset",
                   _sinusoids_interleaved, "I (sinusoidal positions)"),
    # XGLM's table read from row t, not t + 2
    _oracle_mutant("sinusoid_offset_dropped", "sinusoidal-offset",
                   _set("position_offset", 0), "I (sinusoidal position offset)"),
    _oracle_mutant("post_norm_run_as_pre_norm", "post-norm-no-final",
                   _set("layers.1.post_norm", False), "I (post-norm)"),
    Case("final_norm_where_none_is_declared", _variant_mutant("post-norm-no-final",
                                                             _final_norm_added),
         "params", first=False, defect="I (no final norm)", says="ln_final"),
    _oracle_mutant("qk_layernorm_as_rmsnorm", "qk-layernorm",
                   _qk_layernorm_as_rmsnorm, "I (q/k LayerNorm)"),
    # ---- helper fam-sinks ----
    _oracle_mutant("attention_sinks_ignored", "sinks-windowed",
                   _sinks_ignored, "I (attention sinks)"),
    Case("sink_model_reads_the_future", _variant_mutant("sinks-windowed",
                                                        _sink_model_reads_the_future),
         "attention_rows", first=False, defect="B8 (attention sinks)",
         says="on a future key"),
    _oracle_mutant("router_bias_ignored", "gpt-oss-like", _router_bias_ignored, "I (router bias)"),
    _oracle_mutant("expert_biases_ignored", "gpt-oss-like",
                   _expert_biases_ignored, "I (expert biases)"),
    _oracle_mutant("swiglu_clamp_dropped", "gpt-oss-like",
                   _swiglu_unclamped, "I (clamped SwiGLU)"),
    _oracle_mutant("qk_norm_before_rope", "qk-norm-after-rope",
                   _qk_norm_before_rope, "I (q/k norm after RoPE)"),
    _oracle_mutant("shared_expert_scale_dropped", "cohere2-moe-like",
                   _shared_experts_unscaled, "I (shared experts' scale)"),
    _oracle_mutant("query_position_scale_dropped", "query-position-scale",
                   _set("layers.0.attn.scales_queries", False), "I (position-scaled queries)"),
]
