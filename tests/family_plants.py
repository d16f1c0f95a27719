"""Defects planted in transformers' own modules of a family (tests/references/test_families.py's
SPECIFIC): each changes what the family computes, on one model instance only, never on the
class or the modeling file (the other tests build the same classes).

    layer(model, i)                   block i of the decoder stack
    rope_on_halves(attention)         the attention's RoPE rotates halves where its family pairs
                                      features interleaved
    window_dropped(block)             a windowed block attends to every earlier token
    bias_dropped(linear)              a Linear computes without its bias
    norm_skipped(norm)                a norm module passes its input through
    scaled_output(module, factor)     a module's output multiplied by `factor`

They hold the model's weights where they were: a numerics defect fails `oracle` with `params`
passing.
"""

from __future__ import annotations

import inspect
import types

import torch
import torch.nn.functional as F


def layer(model: torch.nn.Module, index: int) -> torch.nn.Module:
    """Block `index` of the decoder stack (the ModuleList of as many blocks as the config's
    layers)."""
    layers = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == layers:
            return module[index]
    raise AssertionError(f"{type(model).__name__}: no list of {layers} layers")


def _with_globals(module: torch.nn.Module, **names) -> None:
    """The module's forward, as its modeling file defines it, run with some of that file's
    functions replaced: on this instance only (the class and the file are untouched)."""
    inner = inspect.unwrap(type(module).forward)  # under transformers' kwarg-renaming wrapper
    patched = types.FunctionType(inner.__code__, {**inner.__globals__, **names}, inner.__name__,
                                 inner.__defaults__, inner.__closure__)
    patched.__kwdefaults__ = inner.__kwdefaults__
    module.forward = types.MethodType(patched, module)


def _halves(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_on_halves(q, k, cos, sin, unsqueeze_dim=1):
    """Llama's RoPE (pair j = features j and j + R/2) over the first R features, R the rotary
    table's width; the rest pass through. cos and sin are the family's own (B, T, R) tables
    built as cat(freqs, freqs), what Llama's rotate-half RoPE reads."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    width = cos.shape[-1]

    def turn(x):
        rot, rest = x[..., :width], x[..., width:]
        return torch.cat((rot * cos + _halves(rot) * sin, rest), dim=-1)

    return turn(q), turn(k)


def rope_on_halves(attention: torch.nn.Module) -> None:
    """The attention's RoPE pairs feature j with j + R/2 (Llama's rotated halves) where its
    family pairs 2j with 2j + 1 (GLM, Helium, ERNIE 4.5): the checkpoint-conversion bug of a
    family read as Llama's. Only for families whose rotary table is cat(freqs, freqs)."""
    _with_globals(attention, apply_rotary_pos_emb=_rope_on_halves)


def window_dropped(block: torch.nn.Module) -> None:
    """The block's attention reads every earlier token: the windowed mask its model built is
    replaced by the plain causal one (of the same shape and kind) before the block runs."""
    forward = block.forward

    def full(*args, attention_mask=None, **kwargs):
        if isinstance(attention_mask, torch.Tensor):
            rows, cols = attention_mask.shape[-2:]
            causal = torch.ones(rows, cols, dtype=torch.bool,
                                device=attention_mask.device).tril(cols - rows)
            attention_mask = causal.expand_as(attention_mask) if attention_mask.dtype == torch.bool \
                else torch.zeros_like(attention_mask).masked_fill(
                    ~causal, torch.finfo(attention_mask.dtype).min)
        return forward(*args, attention_mask=attention_mask, **kwargs)

    block.forward = full


def bias_dropped(linear: torch.nn.Linear) -> None:
    """The Linear computes x W^T, its bias (still a Parameter of the module) left out."""
    linear.forward = lambda x: F.linear(x, linear.weight)


def norm_skipped(norm: torch.nn.Module) -> None:
    """The norm passes its input through (its weight still a Parameter of the module)."""
    norm.forward = lambda x: x


def scaled_output(module: torch.nn.Module, factor: float) -> None:
    """The module's output multiplied by `factor` (a readout scaled twice, or not at all)."""
    forward = module.forward
    module.forward = lambda *args, **kwargs: forward(*args, **kwargs) * factor
