"""Positions that are no learned weight: the fixed sinusoidal table added to the embeddings
(pos="sinusoidal") and ALiBi's linear bias on the attention scores (pos="alibi"). RoPE, which
turns q and k, lives beside the attention that applies it (attention.py).

Both are computed in float64 for the positions of the call and only then rounded to the
model's dtype, as RoPE's angles are: a bfloat16 model never reads a position through
low-precision arithmetic.

Shape letters: B batch, T queries, S keys, D d_model, H query heads.
"""

from __future__ import annotations

import math

import torch

from ..config import DecoderConfig


def sinusoids(cfg: DecoderConfig, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The sinusoidal table's `rows` (..., T) -> (..., T, D) (position t's row is t +
    position_offset): row p holds [sin(p f_i) for i < n] then [cos(p f_i) for i < n], n = D // 2,
    f_i = 10000^(-i / (n - 1)) (fairseq's and tensor2tensor's layout: the sines, then the
    cosines, not interleaved); an odd D gets a last column of zeros."""
    half = cfg.d_model // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float64, device=rows.device)
                            * -(math.log(10000.0) / (half - 1)))  # (n,)
    angles = rows.to(torch.float64)[..., None] * frequencies
    rows = torch.cat((angles.sin(), angles.cos()), dim=-1)  # (..., T, 2n)
    if cfg.d_model % 2:
        rows = torch.cat((rows, torch.zeros_like(rows[..., :1])), dim=-1)
    return rows.to(dtype)


def alibi_slopes(n_heads: int, device: torch.device | None = None) -> torch.Tensor:
    """Head h's ALiBi slope (H,), float64. Press et al.'s schedule: for H a power of two the
    geometric sequence 2^(-8 (h + 1) / H); otherwise the schedule of the power of two H2 above H
    with every other slope taken, the odd-numbered ones (those of H2 / 2 heads) first:
    2^(-8 (i + 1) / H2) for i = 1, 3, 5, ..., then i = 0, 2, 4, ..., the first H of them. This
    is MPT's construction with alibi_bias_max 8, and equals BLOOM's (the schedule of the power
    of two below H, then every other slope of twice that many)."""
    above = 2 ** math.ceil(math.log2(n_heads))
    slopes = 2.0 ** (-8.0 * torch.arange(1, above + 1, dtype=torch.float64, device=device)
                     / above)  # (H2,)
    if above == n_heads:
        return slopes
    return torch.cat((slopes[1::2], slopes[0::2]))[:n_heads]


def alibi_bias(cfg: DecoderConfig, query_positions: torch.Tensor,
               key_positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive score bias -m_h * (t - s): query positions (B|1, T) and key positions
    (B|1, S) -> (B|1, H, T, S). Zero on the diagonal, more negative the further back a key
    lies (a key after its query is masked anyway)."""
    slopes = alibi_slopes(cfg.n_heads, query_positions.device)  # (H,)
    distance = (query_positions[:, :, None] - key_positions[:, None, :]).to(torch.float64)
    return (-slopes[:, None, None] * distance[:, None]).to(dtype)  # (B|1, H, T, S)
