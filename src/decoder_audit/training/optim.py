"""The optimizer's view of a model: AdamW over the unique Parameters, warmup + cosine learning
rate, and gradient clipping.

A tied readout is the embedding Parameter itself, so it appears once, in the embedding's group,
and gets one optimizer state; the sum of its two gradient paths is what Adam sees.

AdamW runs torch's fused kernel wherever torch has one for the weights' device (CPU, CUDA, MPS,
XPU): one pass over each weight's four tensors, where the default implementation makes eight
float32 passes one tensor at a time (on a CPU it cost a quarter of a GPT-2 small bf16 step; the
fused step was 4.6x faster, benchmarks/README.md). It computes the same update; only the
order of float32 roundings differs (tests/training/test_optim.py). A checkpoint carries the
implementation in its param_groups, and `load_state_dict` restores it, so a run resumes on the
implementation it started with: bit-exact, also for checkpoints written before this choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..model.layers import Embedding
from .settings import TrainConfig


def param_groups(model: nn.Module, weight_decay: float, *, decay_embeddings: bool = False
                 ) -> list[dict[str, Any]]:
    """AdamW groups over the model's *unique* Parameters: matrices decay; norms, biases and
    (unless `decay_embeddings`) embeddings do not. A tied readout is the embedding Parameter, so
    it appears once, in the embedding's group."""
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, (nn.Embedding, Embedding))
                     for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # duplicates (the tie) removed by identity
        if not param.requires_grad:
            continue
        is_embedding = id(param) in embedding_ids
        if param.dim() < 2 or name.endswith("bias") or (is_embedding and not decay_embeddings):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # One optimizer state per unique Parameter: nothing listed twice, nothing left out.
    listed = [id(p) for g in groups for p in g["params"]]
    unique = {id(p) for p in model.parameters() if p.requires_grad}
    assert len(listed) == len(set(listed)) == len(unique), "a Parameter is in two groups or none"
    return groups


def lr_lambda(steps: int, warmup: int, min_lr_ratio: float) -> Callable[[int], float]:
    """Multiplier of the peak lr before optimizer step s (0-based): linear warmup over `warmup`
    steps, then a half cosine from 1 down to min_lr_ratio at the last step."""

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - 1 - warmup))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def adamw_implementation(params: list[torch.Tensor]) -> dict[str, bool]:
    """The AdamW keyword that picks torch's fastest exact implementation for these weights:
    {"fused": True} when every one is a floating-point tensor on a device torch has the fused
    kernel for, {"foreach": True} where it has only the multi-tensor one, else {} (the default
    loop). torch itself defaults to foreach on CUDA only and never to fused."""
    try:  # torch's own list of the devices its optimizer kernels exist for (private, stable
        # since 2.1); without it the default loop, which every device runs
        from torch.utils._foreach_utils import (
            _get_foreach_kernels_supported_devices,
            _get_fused_kernels_supported_devices,
        )
    except ImportError:
        return {}
    devices = {p.device.type for p in params}
    if params and all(p.is_floating_point() for p in params) \
            and devices <= set(_get_fused_kernels_supported_devices()):
        return {"fused": True}
    if params and devices <= set(_get_foreach_kernels_supported_devices()):
        return {"foreach": True}
    return {}


def make_optimizer(model: nn.Module, cfg: TrainConfig
                   ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    groups = param_groups(model, cfg.weight_decay, decay_embeddings=cfg.decay_embeddings)
    params = [p for g in groups for p in g["params"]]
    optimizer = torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=cfg.betas,
                                  **adamw_implementation(params))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.steps, cfg.warmup, cfg.min_lr_ratio))
    return optimizer, scheduler


def clip_gradients(model: nn.Module, max_norm: float) -> float:
    """Scale the gradients so their global L2 norm is at most `max_norm` (0: leave them) and
    return the norm they had *before* clipping (NaN when clipping is off: not computed)."""
    if max_norm <= 0:
        return float("nan")
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
