"""The GPT-style families of the families table (GPT-Neo, GPT-BigCode, OPT, BioGPT, GPT-J,
CodeGen, Phi, Falcon): a defect of what each changes relative to Llama's block, planted in
transformers' own module (`SPECIFIC`, walked by tests/references/test_families.py), and the forms
their configs choose (`VARIANTS`: GPT-BigCode without multi_query, Falcon's new architecture and
its sequential block), each a correct model that must pass.

Each plant takes a tiny model built by `conformance.build_tiny` and changes one thing its
module computes, never a weight's place: the check named beside it must fail while `params`
passes (the weights are where the spec puts them)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _hooked_output(module: nn.Module, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """`module`'s output replaced by change(output)."""
    module.register_forward_hook(lambda _m, _args, out: change(out))


# ---- GPT-Neo: unscaled scores, windowed local layers ------------------------------------------

def _neo_scaled_scores(model: nn.Module) -> None:
    """Every layer's scores divided by sqrt(Dh), which GPT-Neo's attention never does."""
    for block in model.transformer.h:
        attention = block.attn.attention
        scores = attention._attn
        scale = attention.head_dim ** -0.5
        attention._attn = lambda q, k, v, mask=None, f=scores, s=scale: f(q * s, k, v, mask)


def _neo_window_dropped(model: nn.Module) -> None:
    """The local layers' mask made the global one: they read every earlier token."""
    for block in model.transformer.h:
        attention = block.attn.attention
        if attention.attention_type == "local":
            attention.bias.copy_(torch.tril(torch.ones_like(attention.bias)))


# ---- GPT-BigCode: multi-query c_attn, scaled scores -------------------------------------------

def _bigcode_unscaled(model: nn.Module) -> None:
    """Scores left unscaled although scale_attn_weights is on."""
    for block in model.transformer.h:
        block.attn.scaling = 1.0


def _bigcode_kv_swapped(model: nn.Module) -> None:
    """c_attn's one key head read as the value and the reverse (its rows q | k | v split as
    q | v | k)."""
    for block in model.transformer.h:
        d, kv = block.attn.embed_dim, block.attn.kv_dim
        _hooked_output(block.attn.c_attn, lambda out, d=d, kv=kv: torch.cat(
            [out[..., :d], out[..., d + kv:], out[..., d:d + kv]], dim=-1))


# ---- OPT and BioGPT: positions from row 2, a scaled embedding ----------------------------------

def _positions_from_row_0(model: nn.Module) -> None:
    """The position table read from row 0: position t gets the row of t - 2."""
    for module in model.modules():
        if type(module).__name__.endswith("LearnedPositionalEmbedding"):
            module.offset = 0


def _opt_queries_unscaled(model: nn.Module) -> None:
    """OPT's queries not multiplied by 1/sqrt(Dh) before the scores."""
    for layer in model.model.decoder.layers:
        layer.self_attn.scaling = 1.0


def _biogpt_embedding_unscaled(model: nn.Module) -> None:
    """BioGPT's token embedding not multiplied by sqrt(D) (scale_embedding=True)."""
    model.biogpt.embed_tokens.embed_scale = 1.0


# ---- GPT-J, CodeGen, Phi, Falcon: one norm in front of a parallel block ----------------------

def _in_series(norm: str, attention: str) -> Callable[[nn.Module], None]:
    """The block's MLP reads its norm of the stream after attention (x + Attn), not of the
    block's input: a parallel block with one norm run as a sequential one."""
    def plant(model: nn.Module) -> None:
        for block in _layers(model):
            seen: dict[str, torch.Tensor] = {}

            def block_input(_m, args, kwargs, seen=seen):
                seen["x"] = args[0] if args else kwargs["hidden_states"]

            block.register_forward_pre_hook(block_input, with_kwargs=True)
            getattr(block, attention).register_forward_hook(
                lambda _m, _a, out, seen=seen: seen.update(a=out[0]))
            block.mlp.register_forward_pre_hook(
                lambda _m, _a, seen=seen, ln=getattr(block, norm): (ln(seen["x"] + seen["a"]),))
    return plant


def _readout_bias_dropped(model: nn.Module) -> None:
    """The logits' bias (lm_head.bias, always built) left out of the readout."""
    head = model.lm_head
    head.forward = lambda x: F.linear(x, head.weight)


def _rotary_table_band(model: nn.Module) -> None:
    """GPT-J's and CodeGen's sin/cos table of 1.5x the frequencies (a wrong base or band: the
    families keep no inv_freq, so the generic RoPE band finds no table)."""
    rotary = model.transformer.rotary_emb
    dim = rotary.pos_embd_dim
    inv_freq = 1.5 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.arange(rotary.max_positions, dtype=torch.float64)[:, None] * inv_freq
    rotary.embed_positions.copy_(torch.cat((angles.sin(), angles.cos()), dim=1))


def _codegen_shards_q_k_v(model: nn.Module) -> None:
    """qkv_proj's 4 shards split as q, k, v where they hold q, v, k."""
    for block in model.transformer.h:
        attention = block.attn
        local = attention.embed_dim // attention.mp_num

        def reorder(out, local=local, shards=attention.mp_num):
            parts = out.unflatten(-1, (shards, 3, local))  # (..., shard, q|v|k, D/4)
            return parts[..., [0, 2, 1], :].flatten(-3)
        _hooked_output(attention.qkv_proj, reorder)


def _falcon_kv_swapped(model: nn.Module) -> None:
    """query_key_value's key and value heads exchanged (multi_query: its last two heads)."""
    for block in model.transformer.h:
        width = block.self_attention.head_dim
        _hooked_output(block.self_attention.query_key_value, lambda out, w=width: torch.cat(
            [out[..., :-2 * w], out[..., -w:], out[..., -2 * w:-w]], dim=-1))


def _layers(model: nn.Module) -> nn.ModuleList:
    layers = model.config.num_hidden_layers
    return next(m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == layers)


SPECIFIC: dict[tuple[str, str], tuple] = {
    ("gpt_neo", "scores scaled by 1/sqrt(Dh)"): (_neo_scaled_scores, "oracle"),
    ("gpt_neo", "local window dropped"): (_neo_window_dropped, "window"),
    ("gpt_bigcode", "scores unscaled"): (_bigcode_unscaled, "oracle"),
    ("gpt_bigcode", "key and value head swapped"): (_bigcode_kv_swapped, "oracle"),
    ("opt", "positions from row 0"): (_positions_from_row_0, "oracle"),
    ("opt", "queries unscaled"): (_opt_queries_unscaled, "oracle"),
    ("biogpt", "positions from row 0"): (_positions_from_row_0, "oracle"),
    ("biogpt", "embedding unscaled"): (_biogpt_embedding_unscaled, "oracle"),
    ("gptj", "parallel block run in series"): (_in_series("ln_1", "attn"), "oracle"),
    ("gptj", "readout bias dropped"): (_readout_bias_dropped, "oracle"),
    ("gptj", "RoPE band"): (_rotary_table_band, "oracle"),
    ("codegen", "qkv shards read q, k, v"): (_codegen_shards_q_k_v, "oracle"),
    ("codegen", "RoPE band"): (_rotary_table_band, "oracle"),
    ("phi", "parallel block run in series"): (_in_series("input_layernorm", "self_attn"),
                                              "oracle"),
    ("phi", "readout bias dropped"): (_readout_bias_dropped, "oracle"),
    ("falcon", "parallel block run in series"): (_in_series("input_layernorm", "self_attention"),
                                                 "oracle"),
    ("falcon", "key and value head swapped"): (_falcon_kv_swapped, "oracle"),
}
"""(family, defect) -> (plant(model) in transformers' own module, the check that must fail)."""


VARIANTS: dict[str, tuple[str, dict]] = {
    # each family as the conformance sweep builds it (its config's defaults, shrunk)
    **{f"{family} as built": (family, {}) for family in (
        "gpt_neo", "gpt_bigcode", "opt", "biogpt", "gptj", "codegen", "phi", "falcon")},
    # c_attn's rows head by head (q, k, v of each), GPT-2's name and shape
    "gpt_bigcode multi-head": ("gpt_bigcode", {"multi_query": False}),
    "gpt_bigcode unscaled": ("gpt_bigcode", {"scale_attn_weights": False}),
    # Falcon-40B / 180B: ln_attn, ln_mlp beside each other, KV groups of query_key_value
    "falcon new architecture": ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    # Falcon-11B: the new architecture with one norm
    "falcon new architecture one norm": ("falcon", {"new_decoder_architecture": True,
                                                    "num_kv_heads": 2,
                                                    "num_ln_in_parallel_attn": 1}),
    # the sequential block: per-head (H, 3, Dh) rows, or one KV head, biases
    "falcon sequential": ("falcon", {"parallel_attn": False, "multi_query": False,
                                     "bias": True}),
    "falcon sequential multi-query": ("falcon", {"parallel_attn": False}),
    "gpt_neo every layer local": ("gpt_neo", {"attention_types": [[["local"], 2]]}),
    "gptj every feature rotated": ("gptj", {"rotary_dim": 8}),
    "opt without affine norms": ("opt", {"layer_norm_elementwise_affine": False}),
    "biogpt unscaled embedding": ("biogpt", {"scale_embedding": False}),
}
"""name -> (family, config fields beside the tiny shrink): a form the config chooses, each a
correct model that must pass params and oracle."""
