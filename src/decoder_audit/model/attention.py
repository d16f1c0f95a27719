"""Grouped-query causal self-attention, and the rotary position embedding (RoPE) it applies.

Two paths through the same weights compute the same function: the fused one
(`F.scaled_dot_product_attention`, the plain forward and the generation path with its mask and
KV cache) and the eager one (explicit scores, mask, softmax and pattern: what `run_with_trace`
records and a person can inspect).

Latent attention (`LatentAttention`, DeepSeek's MLA) makes q, k and v another way and shares
the rest.

Shape letters: B batch, T sequence, D d_model, H query heads, Hkv KV heads, Dh head width, Dv
value head width (Dh but in latent attention), C the key/value latent, R the rotary part.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig
from .cache import KVCache, bottom_right_causal
from .layers import INIT_STD, LayerNorm, Linear, RMSNorm
from .trace import Trace


def rope_frequencies(cfg: DecoderConfig, seq_len: int, device: torch.device,
                     windowed: bool = False) -> tuple[torch.Tensor, float]:
    """(the angle per position of each rotated pair (R/2,) in float64, the factor q and k are
    scaled by): theta^(-2j/R), stretched as cfg.rope_scaling says for a call whose longest
    position is seq_len - 1 (only "dynamic" depends on it). `windowed`: for a windowed layer,
    which turns by window_rope_theta, unscaled, where the config gives one."""
    rotated = cfg.rope_dim
    exponents = torch.arange(0, rotated, 2, device=device, dtype=torch.float64) / rotated
    kind, get = (cfg.rope_scaling or {}).get("type"), cfg.rope_parameter
    if windowed and cfg.window_rope_theta is not None:
        return cfg.window_rope_theta ** -exponents, 1.0
    if kind == "dynamic" and seq_len > get("original_max_seq_len"):
        # NTK-aware: the base grows so the longest wavelength spans the longer context
        stretch = get("factor") * seq_len / get("original_max_seq_len") - (get("factor") - 1)
        return (cfg.rope_theta * stretch ** (rotated / (rotated - 2))) ** -exponents, 1.0
    inv_freq = cfg.rope_theta ** -exponents  # (R/2,)
    if kind == "linear":
        return inv_freq / get("factor"), 1.0
    if kind == "llama3":
        wavelength = 2 * math.pi / inv_freq
        original, factor = get("original_max_seq_len"), get("factor")
        low, high = get("low_freq_factor"), get("high_freq_factor")
        smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
        # wavelengths longer than original / low: divided; shorter than original / high: kept
        return (1 - smooth) * inv_freq / factor + smooth * inv_freq, 1.0
    if kind == "yarn":
        ramp = _yarn_ramp(cfg, rotated, device)  # 0: kept (extrapolated) .. 1: divided
        factor = get("factor")
        attention = get("attention_factor")
        if attention is None:
            attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return inv_freq * (1 - ramp) + inv_freq / factor * ramp, attention
    return inv_freq, 1.0


def _yarn_ramp(cfg: DecoderConfig, rotated: int, device: torch.device) -> torch.Tensor:
    """YaRN's blend per pair (R/2,): 0 for the pairs that turn more than beta_fast times over
    the original context (kept), 1 below beta_slow turns (divided by factor), linear between."""
    get = cfg.rope_parameter

    def pair_turning(turns: float) -> float:  # the pair index that turns `turns` times
        return rotated * math.log(get("original_max_seq_len") / (turns * 2 * math.pi)) / (
            2 * math.log(cfg.rope_theta))

    low, high = pair_turning(get("beta_fast")), pair_turning(get("beta_slow"))
    if get("truncate"):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotated - 1)
    if low == high:
        high += 0.001  # a ramp of width zero would divide by zero
    pairs = torch.arange(rotated // 2, device=device, dtype=torch.float64)
    return ((pairs - low) / (high - low)).clamp(0.0, 1.0)


def rope_rotations(cfg: DecoderConfig, seq_len: int, device: torch.device,
                   dtype: torch.dtype, positions: torch.Tensor | None = None,
                   windowed: bool = False) -> torch.Tensor:
    """a * exp(i * pos * freq_j) as a complex table (T, R/2), built once per forward, for
    pos = 0..T-1, or for the given `positions` (..., T) -> (..., T, R/2); freq and the
    attention factor a from `rope_frequencies` (a = 1 unless YaRN).

    The angles are computed in float64 on every call and only then rounded to the compute dtype
    (complex64 at least), so a model cast to bf16 never rotates by low-precision angles."""
    real_dtype = torch.promote_types(dtype, torch.float32)
    dynamic = (cfg.rope_scaling or {}).get("type") == "dynamic"
    # the longest position of the call (only dynamic scaling reads it: no sync otherwise)
    longest = int(positions.max()) + 1 if dynamic and positions is not None else seq_len
    inv_freq, attention = rope_frequencies(cfg, longest, device, windowed)  # (R/2,)
    positions = (torch.arange(seq_len, device=device, dtype=torch.float64) if positions is None
                 else positions.to(torch.float64))  # (..., T)
    angles = positions[..., None] * inv_freq  # (..., T, R/2)
    return torch.complex((attention * angles.cos()).to(real_dtype),
                         (attention * angles.sin()).to(real_dtype))


def query_scales(cfg: DecoderConfig, seq_len: int, device: torch.device, dtype: torch.dtype,
                 positions: torch.Tensor | None = None) -> torch.Tensor:
    """query_position_scale's multiplier 1 + beta * ln(1 + floor((pos + offset) / length)) of
    each query, (T, 1) for pos = 0..T-1 or (..., 1, T, 1) for the given `positions` (..., T),
    broadcast over heads and features: the floor in integers, the logarithm in float64, then
    rounded to `dtype` (as the rotation table is)."""
    scale = cfg.query_position_scale
    beta, length, offset = scale["beta"], scale["length"], scale.get("offset", 0)
    positions = (torch.arange(seq_len, device=device) if positions is None
                 else positions.to(device=device, dtype=torch.long))  # (..., T)
    steps = torch.div(positions + offset, length, rounding_mode="floor").to(torch.float64)
    factor = (1.0 + beta * torch.log1p(steps)).to(dtype)  # (..., T)
    return factor[..., None] if factor.dim() == 1 else factor[..., None, :, None]


def apply_rope(x: torch.Tensor, rotations: torch.Tensor, layout: str = "interleaved"
               ) -> torch.Tensor:
    """Rotate the pairs of x (..., T, Dh) by the tabled angles (..., T, R/2), one complex
    multiply per pair: (x[2j] + i x[2j+1]) * exp(i angle) for "interleaved" pairs (the CS336 /
    original-Llama layout), (x[j] + i x[j + R/2]) * exp(i angle) for "rotate_half" (Hugging Face
    Llama's); features R.. of a partial rotary pass through. The complex form is one kernel
    instead of the eight a real-valued rotation takes (~10x faster on CPU)."""
    real_dtype = rotations.real.dtype
    rotated = 2 * rotations.shape[-1]  # R
    x_rot = x[..., :rotated].to(real_dtype)  # (..., T, R)
    if layout == "rotate_half":
        first, second = x_rot.chunk(2, dim=-1)  # (..., T, R/2) each
        turned = torch.complex(first, second) * rotations
        out = torch.cat((turned.real, turned.imag), dim=-1).to(x.dtype)  # (..., T, R)
    else:
        pairs = torch.view_as_complex(x_rot.unflatten(-1, (-1, 2)))  # (..., T, R/2)
        out = torch.view_as_real(pairs * rotations).flatten(-2).to(x.dtype)  # (..., T, R)
    return out if rotated == x.shape[-1] else torch.cat((out, x[..., rotated:]), dim=-1)


class CausalSelfAttention(nn.Module):
    """Grouped-query causal attention. Head h owns rows h*Dh..(h+1)*Dh-1 of q_proj and reads
    KV head h // group, e.g. H=4, Hkv=2: query heads 0,1 -> KV head 0; 2,3 -> KV head 1."""

    def __init__(self, cfg: DecoderConfig, *, residual_std: float, layer: int = 0,
                 **factory) -> None:
        super().__init__()
        self._settings(cfg, layer)
        d_q, d_kv = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        bias = cfg.has_bias  # per projection: any of q, k, v and the output may have one
        self.q_proj = Linear(cfg.d_model, d_q, bias("q_proj"), init_std=INIT_STD, **factory)
        self.k_proj = Linear(cfg.d_model, d_kv, bias("k_proj"), init_std=INIT_STD, **factory)
        self.v_proj = Linear(cfg.d_model, d_kv, bias("v_proj"), init_std=INIT_STD, **factory)
        # writes into the residual stream
        self.output_proj = Linear(d_q, cfg.d_model, bias("output_proj"), init_std=residual_std,
                                  **factory)
        # RMSNorm (or LayerNorm) of q and k before RoPE: per head (a gain of Dh shared by the
        # heads) or over the whole projection (H*Dh and Hkv*Dh)
        norm = dict(eps=cfg.norm_eps, offset=cfg.norm_offset, **factory)
        if cfg.qk_norm_kind == "layernorm":  # Persimmon's: a LayerNorm, its shift as norm_bias
            norm["bias"] = cfg.norm_bias
        kind = LayerNorm if cfg.qk_norm_kind == "layernorm" else RMSNorm
        self.norm_whole = cfg.qk_norm_scope == "projection"
        widths = (d_q, d_kv) if self.norm_whole else (cfg.head_dim, cfg.head_dim)
        self.q_norm = kind(widths[0], **norm) if cfg.qk_norm else None
        self.k_norm = kind(widths[1], **norm) if cfg.qk_norm else None
        # Hunyuan: the norms act on the rotated heads instead
        self.norm_after_rope = cfg.qk_norm_position == "after_rope"
        # a learned logit per head in every softmax row's denominator (GPT-OSS); zero at init,
        # where it still takes exp(0) of each row's mass
        self.sinks = nn.Parameter(torch.empty(cfg.n_heads, **factory)) if cfg.attn_sinks \
            else None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.sinks is not None:
            self.sinks.zero_()

    def _settings(self, cfg: DecoderConfig, layer: int) -> None:
        """What the attention core reads, the same for every way of making q, k and v."""
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.group, self.rope_layout = cfg.kv_group_size, cfg.rope_layout
        self.rotates = cfg.rotates(layer)  # False in a NoPE layer of a RoPE model
        # Ministral 3: queries scaled by their position (the table comes with the call)
        self.scales_queries = cfg.scales_queries(layer)
        self.sinks: nn.Parameter | None = None  # attention sinks (CausalSelfAttention's own)
        # W (None: every earlier token), the score multiplier (None: 1/sqrt(Dh)), the soft cap
        self.window, self.score_scale, self.score_softcap = (cfg.window(layer), cfg.attn_scale,
                                                           cfg.attn_softcap)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None,
                trace: Trace | None = None, prefix: str = "",
                bias: torch.Tensor | None = None,
                query_scale: torch.Tensor | None = None) -> torch.Tensor:
        """The full causal square: x (B, T, D) -> (B, T, D), fused or traced (eager); `bias`
        (1|B, H, T, T) is added to the scores (ALiBi); `query_scale` (T, 1): each position's
        query multiplier (query_position_scale)."""
        q, k, v = self._project(x, rope)
        q = self._position_scaled(q, query_scale)
        if trace is None and not self._needs_eager:
            band = self._band(q.shape[-2], q.device)  # None: plain causal
            if bias is not None:  # a float mask: the bias where a key is read, -inf elsewhere
                allowed = band if band is not None else _causal(q.shape[-2], q.device)
                band = bias.masked_fill(~allowed, float("-inf"))
            z = F.scaled_dot_product_attention(
                q, k, v, attn_mask=band, is_causal=band is None, scale=self.score_scale,
                enable_gqa=self.kv_heads != self.n_heads)
        else:  # SDPA cannot soft-cap scores nor take a sink: the explicit path
            z = self._eager(q, k, v, trace, prefix, bias)
        return self._merge(z)

    def _position_scaled(self, q: torch.Tensor, query_scale: torch.Tensor | None
                         ) -> torch.Tensor:
        """q (B, H, T, Dh) times each position's multiplier (T, 1) or (B|1, 1, T, 1) in a layer
        whose queries query_position_scale scales (after RoPE and the q/k norms)."""
        return q if query_scale is None or not self.scales_queries else q * query_scale

    @property
    def _needs_eager(self) -> bool:
        """Scores SDPA cannot compute: soft-capped, or a softmax with a sink."""
        return self.score_softcap is not None or self.sinks is not None

    def _band(self, seq_len: int, device: torch.device) -> torch.Tensor | None:
        """(T, T) True where query t may read key s: s <= t and t - s < W; None where the
        window does not bite (no window, or T <= W): then it is the plain causal square."""
        if self.window is None or seq_len <= self.window:
            return None
        offset = torch.arange(seq_len, device=device)[:, None] - torch.arange(seq_len,
                                                                              device=device)
        return (offset >= 0) & (offset < self.window)  # (T, T)

    def attend(self, x: torch.Tensor, rope: torch.Tensor | None, allowed: torch.Tensor | None,
               cache: KVCache | None = None, layer: int = 0,
               bias: torch.Tensor | None = None,
               query_scale: torch.Tensor | None = None) -> torch.Tensor:
        """The generation path: x (B, T, D) holds new tokens; with a cache they read every key
        it holds too. `allowed` (B|1, 1, T, S) says which keys each query reads; None means
        is_causal for a square (no cache yet) or no mask for one new token (cache.py). `bias`
        (B|1, H, T, S): ALiBi's, for the keys the cache holds and the new ones."""
        q, k, v = self._project(x, rope)
        q = self._position_scaled(q, query_scale)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, Hkv, S, Dh): every filled slot
        if bias is not None and allowed is None:
            allowed = bottom_right_causal(q.shape[-2], k.shape[-2], q.device)
        if not self._needs_eager:
            mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
            z = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and q.shape[-2] > 1,
                scale=self.score_scale, enable_gqa=self.kv_heads != self.n_heads)
        else:
            if allowed is None:
                allowed = bottom_right_causal(q.shape[-2], k.shape[-2], q.device)
            z, _, _ = eager_attention(q, k.repeat_interleave(self.group, dim=1),
                                      v.repeat_interleave(self.group, dim=1), allowed,
                                      self.score_scale, self.score_softcap, bias, self.sinks)
        return self._merge(z)

    def _project(self, x: torch.Tensor, rope: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.shape
        q, k = self.q_proj(x), self.k_proj(x)  # (B, T, H*Dh), (B, T, Hkv*Dh)
        if self.q_norm is not None and self.norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(batch, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)
        # q (B, H, T, Dh); k, v (B, Hkv, T, Dh)
        per_head = self.q_norm is not None and not self.norm_whole
        if per_head and not self.norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None and self.rotates:
            q, k = apply_rope(q, rope, self.rope_layout), apply_rope(k, rope, self.rope_layout)
        if per_head and self.norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _merge(self, z: torch.Tensor) -> torch.Tensor:
        # z (B, H, T, Dh) -> (B, T, H*Dh): heads side by side, in head order
        batch, _, seq_len, _ = z.shape
        return self.output_proj(z.transpose(1, 2).reshape(batch, seq_len, -1))

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trace: Trace | None,
               prefix: str, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The inspectable path: explicit scores (plus ALiBi's bias), -inf strictly above the
        diagonal (and outside the window), softmax; recorded into `trace` when one is given."""
        group = self.group
        # repeat_interleave gives KV order [k0, k0, k1, k1] for group 2: query head h -> h // group
        k = k.repeat_interleave(group, dim=1)  # (B, H, T, Dh)
        v = v.repeat_interleave(group, dim=1)  # (B, H, T, Dh)
        seq_len = q.shape[-2]
        band = self._band(seq_len, q.device)
        allowed = band if band is not None else _causal(seq_len, q.device)  # (T, T)
        z, scores, pattern, sink = attention_rows(q, k, v, allowed, self.score_scale,
                                                  self.score_softcap, bias, self.sinks)
        if trace is not None:
            for name, value in (("q", q), ("k", k[:, ::group]), ("v", v[:, ::group]),
                                ("scores", scores), ("pattern", pattern), ("z", z)):
                trace.record(f"{prefix}.{name}", value)
            if sink is not None:  # the share of each row the sink took (B, H, T)
                trace.record(f"{prefix}.sink", sink)
        return z


class LatentAttention(CausalSelfAttention):
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values are made from a latent of
    kv_latent_rank features, and each query and key head is a non-rotary part (Dn features, its
    first) and a rotary part (R, its last); the rotary key is one for all heads.

        q            = q_b_proj(q_a_norm(q_a_proj(x)))   (or q_proj(x))      H x (Dn + R)
        [c, k_rot]   = kv_a_proj(x)                                          C + R
        [k_pass, v]  = kv_b_proj(kv_a_norm(c)), per head                     H x (Dn + Dv)
        k_h          = [k_pass_h, RoPE(k_rot)],  q_h = [q_pass_h, RoPE(q_rot_h)]

    Then the attention core of CausalSelfAttention, every head reading its own k and v (Dv
    wide). The KV cache holds the decompressed k (B, H, S, Dn + R) and v (B, H, S, Dv): the
    same cache as every other attention, the memory DeepSeek's latent cache saves given up for
    one code path (docs/experts.md)."""

    def __init__(self, cfg: DecoderConfig, *, residual_std: float, layer: int = 0,
                 **factory) -> None:
        nn.Module.__init__(self)
        self._settings(cfg, layer)
        D, H = cfg.d_model, cfg.n_heads
        self.nope, self.rope, self.value = cfg.nope_head_width, cfg.rope_head_width, cfg.value_dim
        norm = dict(eps=cfg.latent_eps, offset=cfg.norm_offset, **factory)
        d_q, rank = H * cfg.head_dim, cfg.q_latent_rank
        if rank is None:
            self.q_proj = Linear(D, d_q, False, init_std=INIT_STD, **factory)
        else:
            self.q_a_proj = Linear(D, rank, False, init_std=INIT_STD, **factory)
            self.q_a_norm = RMSNorm(rank, **norm)
            self.q_b_proj = Linear(rank, d_q, False, init_std=INIT_STD, **factory)
        latent = cfg.kv_latent_rank
        self.kv_a_proj = Linear(D, latent + self.rope, False, init_std=INIT_STD, **factory)
        self.kv_a_norm = RMSNorm(latent, **norm)
        self.kv_b_proj = Linear(latent, H * (self.nope + self.value), False, init_std=INIT_STD,
                                **factory)
        self.output_proj = Linear(H * self.value, D, False, init_std=residual_std, **factory)

    def _project(self, x: torch.Tensor, rope: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.shape
        H, Dn, R = self.n_heads, self.nope, self.rope
        q = (self.q_proj(x) if hasattr(self, "q_proj")
             else self.q_b_proj(self.q_a_norm(self.q_a_proj(x))))  # (B, T, H*Dh)
        q = q.view(batch, seq_len, H, Dn + R).transpose(1, 2)  # (B, H, T, Dh)
        compressed, k_rot = self.kv_a_proj(x).split([self.kv_a_norm.shape[0], R], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(compressed))  # (B, T, H*(Dn+Dv))
        kv = kv.view(batch, seq_len, H, Dn + self.value).transpose(1, 2)  # (B, H, T, Dn+Dv)
        k_pass, v = kv.split([Dn, self.value], dim=-1)  # (B, H, T, Dn), (B, H, T, Dv)
        k_rot = k_rot.view(batch, 1, seq_len, R)  # one rotary key for every head
        q_pass, q_rot = q.split([Dn, R], dim=-1)
        if rope is not None:  # contiguous: an interleaved pair is a complex number in memory
            q_rot = apply_rope(q_rot.contiguous(), rope, self.rope_layout)
            k_rot = apply_rope(k_rot.contiguous(), rope, self.rope_layout)
        q = torch.cat((q_pass, q_rot), dim=-1)  # (B, H, T, Dh)
        k = torch.cat((k_pass, k_rot.expand(batch, H, seq_len, R)), dim=-1)  # (B, H, T, Dh)
        return q, k, v


def _causal(seq_len: int, device: torch.device) -> torch.Tensor:
    """(T, T) True on and below the diagonal: query t reads keys 0..t."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                    scale: float | None = None, softcap: float | None = None,
                    bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale, masked) v for q (..., Tq, Dh), k and v (..., Tk, Dh), and a
    boolean `allowed` (..., Tq, Tk) where True means "may attend" (SDPA's convention, the
    opposite of nn.MultiheadAttention's); scale None is 1/sqrt(Dh); a `bias` (..., Tq, Tk) is
    added to the scaled scores (ALiBi), and a `softcap` c turns the scores into
    c * tanh(scores / c) after it; `sinks` (H,): a logit per head joins each row's denominator
    (`attention_rows`). Returns (z, scores, pattern); a disallowed key gets -inf, hence exactly
    zero probability. Every query row must allow at least one key."""
    z, scores, pattern, _ = attention_rows(q, k, v, allowed, scale, softcap, bias, sinks)
    return z, scores, pattern


def attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                   scale: float | None = None, softcap: float | None = None,
                   bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`eager_attention`'s (z, scores, pattern) and the sink's share of each row (..., Tq), None
    without sinks. With sinks (H,) for q (B, H, Tq, Dh), head h's rows are softmaxed over their
    keys and one more logit, sinks[h], whose column is then dropped (it has no value): the
    pattern over the keys sums to 1 minus the sink's share."""
    products = q @ k.transpose(-2, -1)  # (..., Tq, Tk)
    scores = products / math.sqrt(q.shape[-1]) if scale is None else products * scale
    if bias is not None:
        scores = scores + bias
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    masked = scores.masked_fill(~allowed, float("-inf"))
    # softmax in at least float32 so low-precision models still sum to one
    wide = torch.promote_types(q.dtype, torch.float32)
    if sinks is None:
        pattern = masked.softmax(-1, dtype=wide).to(q.dtype)
        return pattern @ v, scores, pattern, None  # z (..., Tq, Dh)
    column = sinks.to(masked.dtype)[:, None, None].expand(*masked.shape[:-1], 1)  # (.., Tq, 1)
    rows = torch.cat((masked, column), dim=-1).softmax(-1, dtype=wide)  # (..., Tq, Tk + 1)
    pattern = rows[..., :-1].to(q.dtype)
    return pattern @ v, scores, pattern, rows[..., -1].to(q.dtype)
