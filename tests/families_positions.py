"""The families of the positions and norm placements (BLOOM, MPT, XGLM, GPT-1, Persimmon): a
defect of what each changes relative to Llama's block, planted in transformers' own module
(`SPECIFIC`, walked by tests/references/test_families.py).

Each plant takes a tiny model built by `conformance.build_tiny` and changes one thing its
module computes: the check named beside it must fail (where it is the oracle, `params` passes:
the weights are where the spec puts them)."""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn


def _bloom_slopes_reversed(model: nn.Module) -> None:
    """Every layer's ALiBi tensor (B*H, 1, S) handed to its heads in reverse order."""
    heads = model.config.n_head

    def reverse(_module, args, kwargs):
        alibi = kwargs["alibi"]
        kwargs["alibi"] = alibi.unflatten(0, (-1, heads)).flip(1).flatten(0, 1)
        return args, kwargs
    for block in model.transformer.h:
        block.self_attention.register_forward_pre_hook(reverse, with_kwargs=True)


def _bloom_embedding_norm_skipped(model: nn.Module) -> None:
    model.transformer.word_embeddings_layernorm.forward = lambda x: x


def _mpt_bias_max(model: nn.Module) -> None:
    """MPT's slopes built with alibi_bias_max 16 (2^(-16 i / H)), not the 8 transformers uses."""
    build = sys.modules[type(model).__module__].build_mpt_alibi_tensor
    model.transformer.build_mpt_alibi_tensor = \
        lambda heads, length, alibi_bias_max=8, device=None: build(heads, length, 16, device)


def _mpt_norm_shift(model: nn.Module) -> None:
    """Layer 0's first LayerNorm given a shift, where MPT's norms have none."""
    norm = model.transformer.blocks[0].norm_1
    norm.bias = nn.Parameter(torch.zeros_like(norm.weight))


def _xglm_offset_dropped(model: nn.Module) -> None:
    """Position t reads row t of the sinusoidal table, not row t + 2."""
    model.model.embed_positions.offset = 0


def _xglm_unscaled(model: nn.Module) -> None:
    model.model.embed_tokens.embed_scale = 1.0


def _gpt1_pre_norm(model: nn.Module) -> None:
    """Block 0 normalises each sublayer's input (pre-LN) instead of the sum after it."""
    block = model.transformer.h[0]

    def forward(x, attention_mask=None, output_attentions=False):
        attended = block.attn(block.ln_1(x), attention_mask=attention_mask,
                              output_attentions=output_attentions)
        n = x + attended[0]
        return [n + block.mlp(block.ln_2(n))] + attended[1:]
    block.forward = forward


def _gpt1_norm_of_the_sublayer(model: nn.Module) -> None:
    """Block 0 normalises the sublayers' outputs and adds them to the unnormalised stream (a
    sandwich norm's place), instead of normalising the sum."""
    block = model.transformer.h[0]

    def forward(x, attention_mask=None, output_attentions=False):
        attended = block.attn(x, attention_mask=attention_mask,
                              output_attentions=output_attentions)
        n = x + block.ln_1(attended[0])
        return [n + block.ln_2(block.mlp(n))] + attended[1:]
    block.forward = forward


def _persimmon_qk_shift_dropped(model: nn.Module) -> None:
    """Every q and k LayerNorm normalises and scales but never adds its shift (still a weight)."""
    for layer in model.model.layers:
        for norm in (layer.self_attn.q_layernorm, layer.self_attn.k_layernorm):
            norm.forward = functools.partial(
                lambda x, norm: F.layer_norm(x, norm.normalized_shape, norm.weight, None,
                                             norm.eps), norm=norm)


SPECIFIC: dict[tuple[str, str], tuple] = {
    ("bloom", "alibi slopes in reverse head order"): (_bloom_slopes_reversed, "oracle"),
    ("bloom", "embedding norm skipped"): (_bloom_embedding_norm_skipped, "oracle"),
    ("mpt", "alibi_bias_max 16"): (_mpt_bias_max, "oracle"),
    ("mpt", "a norm with a shift"): (_mpt_norm_shift, "params"),
    ("xglm", "sinusoid offset dropped"): (_xglm_offset_dropped, "oracle"),
    ("xglm", "embedding scale dropped"): (_xglm_unscaled, "oracle"),
    ("openai-gpt", "pre-norm block"): (_gpt1_pre_norm, "oracle"),
    ("openai-gpt", "norm of the sublayer, not the sum"): (_gpt1_norm_of_the_sublayer, "oracle"),
    ("persimmon", "q/k layernorm shift dropped"): (_persimmon_qk_shift_dropped, "oracle"),
}
"""(family, defect) -> (plant(model) in transformers' own module, the check that must fail)."""
