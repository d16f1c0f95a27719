"""Grouped-query causal self-attention, and the rotary position embedding (RoPE) it applies.

Two paths through the same weights compute the same function: the fused one
(`F.scaled_dot_product_attention`, the plain forward and the generation path with its mask and
KV cache) and the eager one (explicit scores, mask, softmax and pattern: what `run_with_trace`
records and a person can inspect).

Shape letters: B batch, T sequence, D d_model, H query heads, Hkv KV heads, Dh head width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig
from .cache import KVCache
from .layers import INIT_STD, Linear, RMSNorm
from .trace import Trace


def rope_rotations(cfg: DecoderConfig, seq_len: int, device: torch.device,
                   dtype: torch.dtype, positions: torch.Tensor | None = None) -> torch.Tensor:
    """exp(i * pos * theta^(-2j/Dh)) as a complex table (T, Dh/2), built once per forward, for
    pos = 0..T-1, or for the given `positions` (..., T) -> (..., T, Dh/2).

    The angles are computed in float64 on every call and only then rounded to the compute dtype
    (complex64 at least), so a model cast to bf16 never rotates by low-precision angles."""
    real_dtype = torch.promote_types(dtype, torch.float32)
    exponents = torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float64) / cfg.head_dim
    inv_freq = cfg.rope_theta ** -exponents  # (Dh/2,)
    positions = (torch.arange(seq_len, device=device, dtype=torch.float64) if positions is None
                 else positions.to(torch.float64))  # (..., T)
    angles = positions[..., None] * inv_freq  # (..., T, Dh/2)
    return torch.complex(angles.cos().to(real_dtype), angles.sin().to(real_dtype))


def apply_rope(x: torch.Tensor, rotations: torch.Tensor, layout: str = "interleaved"
               ) -> torch.Tensor:
    """Rotate the pairs of x (..., T, Dh) by the tabled angles, one complex multiply per pair:
    (x[2j] + i x[2j+1]) * exp(i angle) for "interleaved" pairs (the CS336 / original-Llama
    layout), (x[j] + i x[j + Dh/2]) * exp(i angle) for "rotate_half" (Hugging Face Llama's). The
    complex form is one kernel instead of the eight a real-valued rotation takes (~10x faster on
    CPU)."""
    real_dtype = rotations.real.dtype
    if layout == "rotate_half":
        first, second = x.to(real_dtype).chunk(2, dim=-1)  # (..., T, Dh/2) each
        turned = torch.complex(first, second) * rotations
        return torch.cat((turned.real, turned.imag), dim=-1).to(x.dtype)  # (..., T, Dh)
    pairs = torch.view_as_complex(x.to(real_dtype).unflatten(-1, (-1, 2)))  # (..., T, Dh/2)
    return torch.view_as_real(pairs * rotations).flatten(-2).to(x.dtype)  # (..., T, Dh)


class CausalSelfAttention(nn.Module):
    """Grouped-query causal attention. Head h owns rows h*Dh..(h+1)*Dh-1 of q_proj and reads
    KV head h // group, e.g. H=4, Hkv=2: query heads 0,1 -> KV head 0; 2,3 -> KV head 1."""

    def __init__(self, cfg: DecoderConfig, *, residual_std: float, **factory) -> None:
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.group, self.rope_layout = cfg.kv_group_size, cfg.rope_layout
        d_q, d_kv = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        bias = cfg.attn_bias
        self.q_proj = Linear(cfg.d_model, d_q, bias, init_std=INIT_STD, **factory)
        self.k_proj = Linear(cfg.d_model, d_kv, bias, init_std=INIT_STD, **factory)
        self.v_proj = Linear(cfg.d_model, d_kv, bias, init_std=INIT_STD, **factory)
        # writes into the residual stream
        self.output_proj = Linear(d_q, cfg.d_model, cfg.output_bias, init_std=residual_std,
                                  **factory)
        # per-head RMSNorm of q and k (a gain of Dh shared by the heads), before RoPE
        norm = dict(eps=cfg.norm_eps, offset=cfg.norm_offset, **factory)
        self.q_norm = RMSNorm(cfg.head_dim, **norm) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, **norm) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None,
                trace: Trace | None = None, prefix: str = "") -> torch.Tensor:
        """The full causal square: x (B, T, D) -> (B, T, D), fused or traced (eager)."""
        q, k, v = self._project(x, rope)
        if trace is None:
            z = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.n_heads)
        else:
            z = self._eager(q, k, v, trace, prefix)
        return self._merge(z)

    def attend(self, x: torch.Tensor, rope: torch.Tensor | None, allowed: torch.Tensor | None,
               cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        """The generation path: x (B, T, D) holds new tokens; with a cache they read every key
        it holds too. `allowed` (B|1, 1, T, S) says which keys each query reads; None means
        is_causal for a square (no cache yet) or no mask for one new token (cache.py)."""
        q, k, v = self._project(x, rope)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, Hkv, S, Dh): every filled slot
        z = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=allowed is None and q.shape[-2] > 1,
            enable_gqa=self.kv_heads != self.n_heads)
        return self._merge(z)

    def _project(self, x: torch.Tensor, rope: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)
        # q (B, H, T, Dh); k, v (B, Hkv, T, Dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope, self.rope_layout), apply_rope(k, rope, self.rope_layout)
        return q, k, v

    def _merge(self, z: torch.Tensor) -> torch.Tensor:
        # z (B, H, T, Dh) -> (B, T, H*Dh): heads side by side, in head order
        batch, _, seq_len, _ = z.shape
        return self.output_proj(z.transpose(1, 2).reshape(batch, seq_len, -1))

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trace: Trace,
               prefix: str) -> torch.Tensor:
        """The inspectable path: explicit scores, -inf strictly above the diagonal, softmax."""
        group = self.group
        # repeat_interleave gives KV order [k0, k0, k1, k1] for group 2: query head h -> h // group
        k = k.repeat_interleave(group, dim=1)  # (B, H, T, Dh)
        v = v.repeat_interleave(group, dim=1)  # (B, H, T, Dh)
        seq_len = q.shape[-2]
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()  # (T, T)
        z, scores, pattern = eager_attention(q, k, v, causal)
        for name, value in (("q", q), ("k", k[:, ::group]), ("v", v[:, ::group]),
                            ("scores", scores), ("pattern", pattern), ("z", z)):
            trace.record(f"{prefix}.{name}", value)
        return z


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(Dh), masked) v for q (..., Tq, Dh), k and v (..., Tk, Dh), and a
    boolean `allowed` (..., Tq, Tk) where True means "may attend" (SDPA's convention, the
    opposite of nn.MultiheadAttention's). Returns (z, scores, pattern); a disallowed key gets
    -inf, hence exactly zero probability. Every query row must allow at least one key."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (..., Tq, Tk)
    masked = scores.masked_fill(~allowed, float("-inf"))
    # softmax in at least float32 so low-precision models still sum to one
    pattern = masked.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    return pattern @ v, scores, pattern  # z (..., Tq, Dh)
