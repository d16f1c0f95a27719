"""The parameterised primitives the Decoder is built from, each owning its initialisation:
`Linear` and `Embedding` draw N(0, init_std) with the std they were given at construction (the
Decoder hands the residual projections a smaller one, see decoder.py), norms start at gain 1 and
bias 0. Each is `nn.Parameter` plus one functional op, so the weights are exactly what DESIGN.md
names and nothing is hidden in a library module.

Shape letters as in decoder.py: D d_model, V vocabulary; `(out, in)` for a projection's weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig

# GPT-2's std for every matrix and embedding (the residual projections get less: decoder.py).
INIT_STD = 0.02


class Linear(nn.Module):
    """y = x W^T (+ b) with W (out, in), initialised W ~ N(0, init_std), b = 0. `weight` may be
    passed in to share a Parameter (tying); its owner initialises it (init_std None)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, *,
                 init_std: float | None, weight: nn.Parameter | None = None, **factory) -> None:
        super().__init__()
        self.init_std = init_std
        self.weight = weight if weight is not None else nn.Parameter(
            torch.empty(out_features, in_features, **factory))  # (out, in)
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.init_std is not None:
            self.weight.normal_(0.0, self.init_std)
        if self.bias is not None:
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """Row lookup E[ids]; E is (num_embeddings, D), initialised ~ N(0, init_std)."""

    def __init__(self, num_embeddings: int, dim: int, *, init_std: float, **factory) -> None:
        super().__init__()
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim, **factory))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.weight.normal_(0.0, self.init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * (offset + w) + b over the last axis (biased variance);
    offset 1 is Megatron's LayerNorm1P (Nemotron), its w stored around 0."""

    def __init__(self, dim: int, eps: float, bias: bool = True, affine: bool = True,
                 offset: float = 0.0, **factory) -> None:
        super().__init__()
        self.eps, self.offset, self.shape = eps, offset, (dim,)
        self.weight = nn.Parameter(torch.empty(dim, **factory)) if affine else None
        self.bias = nn.Parameter(torch.empty(dim, **factory)) if bias and affine else None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.weight is not None:
            self.weight.fill_(1.0 - self.offset)  # a gain of 1
        if self.bias is not None:
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = self.weight if self.weight is None or not self.offset else self.weight + self.offset
        return F.layer_norm(x, self.shape, gain, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (offset + w), normalised in at least float32 (CS336's
    convention; Gemma's offset is 1, its w stored around 0)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0, affine: bool = True,
                 **factory) -> None:
        super().__init__()
        self.eps, self.offset, self.shape = eps, offset, (dim,)
        self.weight = nn.Parameter(torch.empty(dim, **factory)) if affine else None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.weight is not None:
            self.weight.fill_(1.0 - self.offset)  # a gain of 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused kernel computes the same formula; its backward is ~4x faster on CPU than
        # the five-op composition.
        x_wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = F.rms_norm(x_wide, self.shape, eps=self.eps).to(x.dtype)
        if self.weight is None:
            return normed
        return normed * (self.weight if not self.offset else self.weight + self.offset)


def make_norm(cfg: DecoderConfig, **factory) -> nn.Module:
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.d_model, cfg.norm_eps, cfg.norm_bias, cfg.norm_affine,
                         cfg.norm_offset, **factory)
    return RMSNorm(cfg.d_model, cfg.norm_eps, cfg.norm_offset, cfg.norm_affine, **factory)
