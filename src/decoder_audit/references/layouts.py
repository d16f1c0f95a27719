"""Where a decoder someone else wrote keeps each weight of its declared architecture.

A spec (a `DecoderConfig` the user declares for their module) names every weight the
architecture has by our canonical names (DESIGN.md: `token_embeddings.weight`,
`layers.{i}.attn.q_proj.weight`, ..., `lm_head.weight`). A `Placement` says where each of them
lies in the module's own state dict: which parameter, transposed or not (a Conv1D stores
(in, out)), and which rows of it (a fused q/k/v matrix). `Placement.canonical(state)` turns the
module's state dict into canonical tensors that are *views* of the module's tensors, so the
oracle can read them, the gate can write stress weights through them, and a gradient flows back
to the module's own parameters.

Layouts detected from the parameter names (`detect`):
    decoder-audit       token_embeddings, layers.{i}.attn.q_proj, ffn.w1 ... (our names)
    nanoGPT / GPT-2     transformer.wte, transformer.h.{i}.attn.c_attn (q, k, v fused), mlp.c_fc;
                        nn.Linear (out, in) or GPT-2's Conv1D (in, out), decided from the shapes
    litgpt              transformer.wte, transformer.h.{i}.norm_1, attn.qkv (q, k, v stacked: all
                        query heads, then the key heads, then the value heads, as litgpt 0.5
                        splits them), mlp.fc_1/fc_2/proj (LLaMAMLP) or mlp.fc/proj (GptNeoxMLP)
    Hugging Face Llama  model.embed_tokens, model.layers.{i}.self_attn.q_proj, mlp.gate_proj ...
                        (Llama, Mistral, Qwen2, Qwen3, Gemma, StableLM and every class with these
                        names)
    Hugging Face MoE    the same, with the router mlp.gate, the experts mlp.experts.{e}.gate_proj
                        ... (transformers 4) or mlp.experts.gate_up_proj (E, 2 Fe, D) and
                        down_proj (E, D, Fe) (transformers 5), Qwen2-MoE's mlp.shared_expert and
                        shared_expert_gate; Mixtral's block_sparse_moe.experts.{e}.w1 before 5
    Hugging Face        latent attention (self_attn.q_a_proj, q_a_layernorm, q_b_proj or q_proj,
      DeepSeek          kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), the router
                        mlp.gate (V3's selection bias its buffer e_score_correction_bias),
                        mlp.shared_experts, the experts fused as transformers 5 keeps them
    Hugging Face        the same names, with pre_feedforward_layernorm and the sandwich norms
      Gemma 2 / OLMo 2  (post_attention_layernorm on the attention output)
    Hugging Face Phi-3  the same names, with q/k/v fused in self_attn.qkv_proj and the gate and
                        up projections in mlp.gate_up_proj
    Hugging Face        gpt_neox.embed_in, gpt_neox.layers.{i}.attention.query_key_value (q, k,
      GPT-NeoX          v fused head by head), mlp.dense_h_to_4h, lm_head (embed_out before
                        transformers 5)
    torchtune           tok_embeddings, layers.{i}.attn.q_proj, sa_norm.scale, mlp.w1, output
    LLMs-from-scratch   tok_emb, trf_blocks.{i}.att.W_query, norm1.scale/shift, ff.layers.0
                        (its GPTModel), ff.fc1/fc2/fc3 with norm1.weight (its Llama models), and
                        with norm1.scale and att.q_norm/k_norm.scale (its Qwen3Model)
    Hugging Face        Llama's names with a plain MLP (mlp.up_proj, mlp.down_proj)
      Nemotron
    torchtitan Llama 3  tok_embeddings, layers.{i}.attention.qkv_linear.wq/wk/wv or the fused
                        wqkv (rows KV group by KV group), attention.wo, attention_norm,
                        feed_forward.w1/w2/w3, ffn_norm, norm, lm_head (torchtitan 0.3)
    TransformerLens     embed.W_E, blocks.{i}.attn.W_Q (H, D, Dh), W_O (H, Dh, D), b_Q (H, Dh),
                        mlp.W_in (D, F), unembed.W_U (D, V) and its bias b_U (HookedTransformer)
    Hugging Face MoE    Llama's attention names with DeepSeek's MoE names (mlp.gate and its
      (DeepSeek's       e_score_correction_bias, mlp.shared_experts, fused experts); variants
      names), ...       with the selection bias held by the block (MiniMax-M2, HY-V3) or as
                        Ernie 4.5's (1, E) mlp.gate.moe_statics Parameter, GLM-4's sandwich
                        norms (Kolibri 1), OLMo 2's norms (FlexOlmo), Aria's router mlp.router
                        and its experts stored in -> out, GraniteMoE's block_sparse_moe router
                        and experts with the shared MLP's gate and up fused in input_linear
    Hugging Face        Llama's attention and norms with a plain MLP mlp.c_fc -> mlp.c_proj
      Starcoder2
    Hugging Face GLM    Llama's attention and norms, gate and up fused in mlp.gate_up_proj
    Hugging Face GLM-4  GLM's, with post_self_attn_layernorm and post_mlp_layernorm after the
                        sublayers (post_attention_layernorm stays the MLP's input norm)
    Hugging Face        Llama's names with post_norm1 and post_norm2 after the sublayers
      HyperCLOVAX
    Hugging Face        Llama's attention, attention_layernorm and feedforward_layernorm, a plain
      Apertus           MLP up_proj -> down_proj whose xIELU learns mlp.act_fn.alpha_p, alpha_n
    Hugging Face BLOOM  transformer.word_embeddings and its word_embeddings_layernorm,
                        h.{i}.self_attention.query_key_value (q, k, v fused head by head)
    Hugging Face MPT    transformer.wte, blocks.{i}.attn.Wqkv (q, k, v stacked), norm_1 (no shift)
    Hugging Face XGLM   model.embed_tokens, layers.{i}.self_attn_layer_norm, fc1, fc2
    Hugging Face        transformer.tokens_embed, positions_embed, h.{i}.attn.c_attn (Conv1D),
      OpenAI GPT        ln_1 and ln_2 after the adds, no final norm
    Hugging Face        model.layers.{i}.self_attn.query_key_value (head by head),
      Persimmon         q_layernorm, k_layernorm, mlp.dense_h_to_4h
each possibly under a wrapper's prefix (`model.`, `net.`), and each also without its root module
(`embed_tokens`, `layers.{i}.self_attn.q_proj`, `norm`, `lm_head` at the top: `rootless`). Anything else takes a user function
(`weights_map=`): state dict -> {canonical name: tensor}.

Nothing is guessed: a weight the spec expects that the layout does not find, a weight found
with another shape, and a parameter of the module no canonical name takes are listed in
`Placement.problems` / `Placement.leftover`; the gate's `params` check reports them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..config import UNROUTED, DecoderConfig
from ..errors import ConfigError

WeightsMap = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
"""A user's mapping: the module's state dict (its names) -> {canonical name: tensor}."""


def expected_weights(spec: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical weight the spec's architecture has, with its shape (out, in for a
    matrix). lm_head.weight is listed tied or not: tied, it must be the embedding's Parameter."""
    v, d, t = spec.vocab_size, spec.d_model, spec.max_seq_len
    d_q, d_kv = spec.n_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    norm = ("weight", "bias") if spec.norm == "layernorm" and spec.norm_bias else ("weight",)
    norm = norm if spec.norm_affine else ()  # OLMo's norms learn nothing
    shapes: dict[str, tuple[int, ...]] = {"token_embeddings.weight": (v, d)}
    if spec.pos == "learned":  # OPT's keeps position_offset rows before position 0's
        shapes["position_embeddings.weight"] = (spec.position_offset + t, d)
    if spec.embedding_norm:  # BLOOM's norm of the embeddings
        shapes.update({f"embedding_norm.{part}": (d,) for part in norm})
    matrices = {"attn.q_proj": (d_q, d), "attn.k_proj": (d_kv, d), "attn.v_proj": (d_kv, d),
                "attn.output_proj": (d, d_q)}
    if spec.latent_attention:
        matrices = {}
    for i in range(spec.n_layers):
        p = f"layers.{i}"
        for name in block_norms(spec):
            shapes.update({f"{p}.{name}.{part}": (d,) for part in norm})
        for name, shape in {**matrices, **_mlp_matrices(spec, i)}.items():
            shapes[f"{p}.{name}.weight"] = shape
            # each projection's own (attn_bias, mlp_bias); a routed expert's, expert_bias
            biased = spec.expert_bias if name.startswith("ffn.experts.") else \
                spec.has_bias(name.split(".")[-1])
            if biased:
                shapes[f"{p}.{name}.bias"] = shape[:1]
        if spec.attn_sinks:
            shapes[f"{p}.attn.sinks"] = (spec.n_heads,)
        if spec.latent_attention:
            shapes.update({f"{p}.{name}": shape for name, shape in _latent_weights(spec).items()})
        shapes.update(_activation_weights(spec, i))
        if spec.routes(i):
            shapes[f"{p}.ffn.router.weight"] = (spec.n_experts, d)
            if spec.router_bias:
                shapes[f"{p}.ffn.router.bias"] = (spec.n_experts,)
            if spec.router_selection_bias:
                shapes[f"{p}.ffn.router.selection_bias"] = (spec.n_experts,)
            if spec.shared_expert_gate:
                shapes[f"{p}.ffn.shared_gate.weight"] = (1, d)
        if spec.qk_norm:
            whole = spec.qk_norm_scope == "projection"  # OLMo 2: over the whole projection
            # a q/k LayerNorm (Persimmon) has a shift where the config's norms have one
            parts = ("weight", "bias") if spec.qk_norm_kind == "layernorm" and spec.norm_bias \
                else ("weight",)
            for which, width in (("q_norm", d_q), ("k_norm", d_kv)):
                shapes.update({f"{p}.attn.{which}.{part}": (width if whole else spec.head_dim,)
                               for part in parts})
    if spec.final_norm:  # GPT-1's post-norm blocks have none
        shapes.update({f"ln_final.{part}": (d,) for part in norm})
    shapes["lm_head.weight"] = (v, d)
    if spec.readout_bias:
        shapes["lm_head.bias"] = (v,)
    return shapes


def _mlp_matrices(spec: DecoderConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """The MLP matrices of a layer (out, in): one dense MLP of width F, or a routed layer's E
    experts of width Fe and its shared experts (their total width), each w1, (w3,) w2."""
    d = spec.d_model
    if not spec.routes(layer):
        mlps = {"ffn": spec.d_ff}
    else:
        mlps = {f"ffn.experts.{e}": spec.expert_dim for e in range(spec.n_experts)}
        if spec.n_shared_experts:
            mlps["ffn.shared"] = spec.shared_dim
    out = {}
    for name, width in mlps.items():
        out.update({f"{name}.w1": (width, d), f"{name}.w2": (d, width)})
        if spec.gated:
            out[f"{name}.w3"] = (width, d)
    return out


def _activation_weights(spec: DecoderConfig, layer: int, *, every: bool = False
                        ) -> dict[str, tuple[int, ...]]:
    """A learned activation's parameters in a dense layer (xIELU's two numbers); `every`: those
    a module might hold whatever the spec's activation (so an extra one is found and named)."""
    if not every and (spec.mlp != "xielu" or spec.routes(layer)):
        return {}
    return {f"layers.{layer}.ffn.act.alpha_p": (1,), f"layers.{layer}.ffn.act.alpha_n": (1,)}


def _latent_weights(spec: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Latent attention's weights (DeepSeek's MLA) by their names under the block."""
    d, heads, rank, latent = spec.d_model, spec.n_heads, spec.q_latent_rank, spec.kv_latent_rank
    d_q = heads * spec.head_dim
    query = {"attn.q_proj.weight": (d_q, d)} if rank is None else {
        "attn.q_a_proj.weight": (rank, d), "attn.q_a_norm.weight": (rank,),
        "attn.q_b_proj.weight": (d_q, rank)}
    return {**query, "attn.kv_a_proj.weight": (latent + spec.rope_head_width, d),
            "attn.kv_a_norm.weight": (latent,),
            "attn.kv_b_proj.weight": (heads * (spec.nope_head_width + spec.value_dim), latent),
            "attn.output_proj.weight": (d, heads * spec.value_dim)}


def block_norms(spec: DecoderConfig) -> tuple[str, ...]:
    """The norms of a block: ln1, ln2 before the sublayers (pre_norm; ln1 alone where one norm
    feeds both, shared_norm) or after the residual adds (post_norm), ln1_post, ln2_post after
    the sublayers (sandwich_norm)."""
    normed = spec.pre_norm or spec.post_norm
    return (("ln1",) if normed else ()) + (
        ("ln2",) if normed and not spec.shared_norm else ()) + (
        ("ln1_post", "ln2_post") if spec.sandwich_norm else ())


@dataclass(frozen=True)
class Layout:
    """One way of naming a decoder's weights. Module names are relative to the block
    (`block` with {i}) or to the model; `parts` maps our in-block module names to the layout's."""

    name: str
    embedding: str
    positions: str | None
    block: str
    final_norm: str | None
    head: str
    parts: dict[str, str]
    fused_qkv: str | None = None
    """The in-block module whose weight stacks q, k and v rows (in that order)."""
    qkv_per_head: bool = False
    """The fused q/k/v rows are grouped by key/value head, each group's query heads, then its k
    and v rows ((Hkv, H/Hkv + 2, Dh) rows: GPT-NeoX's (H, 3, Dh) without grouped queries,
    torchtitan's fused wqkv), instead of all q rows, then all k rows, then all v rows."""
    fused_gate_up: str | None = None
    """The in-block module whose weight stacks the gated MLP's w1 (gate) rows, then w3 (up)."""
    norm_params: tuple[str, str | None] = ("weight", "bias")
    """The layout's names for a norm's gain and shift (None: its norms have no shift)."""
    head_aliases: tuple[str, ...] = ()
    """Other names of the head's module, used where the module has no `head` (GPT-NeoX's
    embed_out before transformers 5)."""
    fused_experts: tuple[str, str] | None = None
    """The in-block parameters that hold every routed expert's matrices at once (transformers
    5): (gate_up (E, 2 Fe, D): each expert's w1 rows then its w3 rows, down (E, D, Fe): w2)."""
    gate_up_interleaved: bool = False
    """The fused gate_up's units alternate, gate, up, gate, up (GPT-OSS: w1 the even units, w3
    the odd ones), instead of every gate unit, then every up unit."""
    fused_expert_biases: tuple[str, str] | None = None
    """The in-block parameters that hold every routed expert's biases (expert_bias): gate_up
    (E, 2 Fe), laid out as the fused gate_up's units, and down (E, D) (GPT-OSS)."""
    selection_bias: str | None = None
    """The router module's name for the selection bias (ffn.router.selection_bias), where it
    is a buffer rather than a Parameter (DeepSeek-V3's e_score_correction_bias, updated by a
    balancing rule, never by gradients): `placeable` adds such buffers to what is placed."""
    selection_bias_at: str | None = None
    """The selection bias's in-block name where it is no tensor of the router module's own
    (MiniMax-M2's and HY-V3's buffer mlp.e_score_correction_bias, held by the block and handed
    to the router; Ernie 4.5's (1, E) Parameter mlp.gate.moe_statics.e_score_correction_bias,
    read flattened)."""
    experts_transposed: bool = False
    """The fused experts are stored in -> out (Aria, GPT-OSS): gate_up (E, D, 2 Fe) whose
    first Fe columns are an expert's w1 (or its even ones, gate_up_interleaved), down
    (E, Fe, D); each expert's matrix is read transposed."""
    fused_shared_gate_up: str | None = None
    """The in-block module whose weight stacks the shared experts' w1 (gate) rows, then their w3
    (up) rows (GraniteMoeShared's shared_mlp.input_linear)."""
    qkv_shards: int = 1
    """The fused q/k/v rows are split in this many equal shards, each holding its share of q, k
    and v (in `qkv_order`): CodeGen's qkv_proj is 4 shards (its mp_num) of q, v, k rows."""
    qkv_order: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")
    """The order of q, k and v rows in a fused matrix (in each shard)."""
    detected: bool = True
    """False: placed only where a family's entry names it (`families.Family.layout`), never
    detected from the names, which are another layout's with the same shapes in another row
    order (GPT-BigCode's c_attn is GPT-2's name and shape, its rows per KV group)."""
    embedding_norm: str | None = None
    """The module of the norm on the embeddings (BLOOM's word_embeddings_layernorm)."""

    def module_name(self, canonical: str) -> tuple[str, str] | None:
        """(the layout's module name, parameter kind) for a canonical weight name."""
        module, _, kind = canonical.rpartition(".")
        if module.startswith("layers."):
            _, i, part = module.split(".", 2)
            expert = re.fullmatch(r"ffn\.experts\.(\d+)\.(.+)", part)  # one pattern for all E
            inner = (self.parts.get(part) if expert is None else
                     self.parts.get(f"ffn.experts.{{e}}.{expert[2]}", "").format(e=expert[1]))
            return None if not inner else (f"{self.block.format(i=i)}.{inner}", kind)
        top = {"token_embeddings": self.embedding, "position_embeddings": self.positions,
               "embedding_norm": self.embedding_norm, "ln_final": self.final_norm,
               "lm_head": self.head}.get(module)
        if top is None:  # a layout without such a weight (no position table, say)
            return None
        return top, kind


_OURS = {part: part for part in ("ln1", "ln2", "ln1_post", "ln2_post", "attn", "attn.q_proj",
                                 "attn.k_proj", "attn.v_proj",
                                 "attn.output_proj", "attn.q_norm", "attn.k_norm", "ffn.w1",
                                 "ffn.w2", "ffn.w3",
                                 # routed experts (expert {e}) and latent attention
                                 "ffn.router", "ffn.shared_gate", "ffn.experts.{e}.w1",
                                 "ffn.experts.{e}.w2", "ffn.experts.{e}.w3", "ffn.shared.w1",
                                 "ffn.shared.w2", "ffn.shared.w3", "attn.q_a_proj", "attn.q_a_norm",
                                 "attn.q_b_proj", "attn.kv_a_proj", "attn.kv_a_norm",
                                 "attn.kv_b_proj", "ffn.act")}
_HF_LLAMA = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
             "attn": "self_attn",  # the attention module's own parameters: sinks
             "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
             "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.o_proj",
             "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
             "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj", "ffn.w2": "mlp.down_proj"}
# Llama's norms and attention without its MLP (families whose MLP is named otherwise)
_HF_LLAMA_ATTN = {k: v for k, v in _HF_LLAMA.items() if not k.startswith("ffn.")}
# transformers' routed layers (Mixtral from 5.0, Qwen2-MoE, Qwen3-MoE, OLMoE): the router in
# mlp.gate, Qwen2-MoE's shared expert and its gate; each expert a module of its own before
# transformers 5, all of them in two tensors from it (Layout.fused_experts)
_HF_MOE = {**_HF_LLAMA, "ffn.router": "mlp.gate", "ffn.shared.w1": "mlp.shared_expert.gate_proj",
           "ffn.shared.w3": "mlp.shared_expert.up_proj",
           "ffn.shared.w2": "mlp.shared_expert.down_proj",
           "ffn.shared_gate": "mlp.shared_expert_gate",
           "ffn.experts.{e}.w1": "mlp.experts.{e}.gate_proj",
           "ffn.experts.{e}.w3": "mlp.experts.{e}.up_proj",
           "ffn.experts.{e}.w2": "mlp.experts.{e}.down_proj"}
# DeepSeek-V2 and V3 (transformers 5): latent attention, the dense first layers' MLP in mlp.*,
# the routed layers' router in mlp.gate (V3's selection bias its buffer e_score_correction_bias),
# their shared experts as one MLP in mlp.shared_experts, the experts fused (Layout.fused_experts)
_HF_DEEPSEEK = {**{k: v for k, v in _HF_LLAMA.items() if not k.startswith("attn.")},
                "attn.q_proj": "self_attn.q_proj", "attn.q_a_proj": "self_attn.q_a_proj",
                "attn.q_a_norm": "self_attn.q_a_layernorm", "attn.q_b_proj": "self_attn.q_b_proj",
                "attn.kv_a_proj": "self_attn.kv_a_proj_with_mqa",
                "attn.kv_a_norm": "self_attn.kv_a_layernorm",
                "attn.kv_b_proj": "self_attn.kv_b_proj", "attn.output_proj": "self_attn.o_proj",
                "ffn.router": "mlp.gate", "ffn.shared.w1": "mlp.shared_experts.gate_proj",
                "ffn.shared.w3": "mlp.shared_experts.up_proj",
                "ffn.shared.w2": "mlp.shared_experts.down_proj",
                # releases whose experts are one module each, as _HF_MOE names them
                **{k: v for k, v in _HF_MOE.items() if k.startswith("ffn.experts.")}}
# ---- routed families (helper fam-moe) ----
_FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# Llama's attention (and q/k norms) with DeepSeek's MoE names: the router mlp.gate, the shared
# experts as one MLP in mlp.shared_experts, a dense layer's MLP in mlp.*, the experts fused
_HF_SHARED_EXPERTS = {**_HF_LLAMA, "ffn.router": "mlp.gate",
                      **{k: v for k, v in _HF_DEEPSEEK.items() if k.startswith("ffn.shared.")}}
_FROM_SCRATCH_ATTN = {"ln1": "norm1", "ln2": "norm2", "attn.q_proj": "att.W_query",
                      "attn.k_proj": "att.W_key", "attn.v_proj": "att.W_value",
                      "attn.output_proj": "att.out_proj"}

_LITGPT_ATTN = {"ln1": "norm_1", "ln2": "norm_2", "attn.output_proj": "attn.proj",
                "attn.q_norm": "attn.norm_q", "attn.k_norm": "attn.norm_k"}

# ---- GPT-style families (helper fam-gpt) ----
# fairseq's decoder layer (OPT, BioGPT): self_attn_layer_norm before attention,
# final_layer_norm before the MLP fc1 -> fc2
_FAIRSEQ = {"ln1": "self_attn_layer_norm", "ln2": "final_layer_norm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
            "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.out_proj",
            "ffn.w1": "fc1", "ffn.w2": "fc2"}
_GPTJ = {"ln1": "ln_1", "attn.output_proj": "attn.out_proj", "ffn.w1": "mlp.fc_in",
         "ffn.w2": "mlp.fc_out"}
_FALCON = {"attn.output_proj": "self_attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
           "ffn.w2": "mlp.dense_4h_to_h"}

LAYOUTS: tuple[Layout, ...] = (
    Layout("decoder-audit", "token_embeddings", "position_embeddings", "layers.{i}", "ln_final",
           "lm_head", _OURS),
    Layout("nanoGPT / GPT-2", "transformer.wte", "transformer.wpe", "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.output_proj": "attn.c_proj",
            "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}, fused_qkv="attn.c_attn"),
    Layout("litgpt (LLaMAMLP)", "transformer.wte", None, "transformer.h.{i}", "transformer.ln_f",
           "lm_head", _LITGPT_ATTN | {"ffn.w1": "mlp.fc_1", "ffn.w3": "mlp.fc_2",
                                      "ffn.w2": "mlp.proj"}, fused_qkv="attn.qkv"),
    Layout("litgpt (GptNeoxMLP)", "transformer.wte", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head", _LITGPT_ATTN | {"ffn.w1": "mlp.fc", "ffn.w2": "mlp.proj"},
           fused_qkv="attn.qkv"),
    Layout("Hugging Face Llama", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", _HF_LLAMA),
    Layout("Hugging Face MoE", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", _HF_MOE, fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
    Layout("Hugging Face DeepSeek", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", _HF_DEEPSEEK,
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
           selection_bias="e_score_correction_bias"),
    # Mixtral before transformers 5: block_sparse_moe, experts.{e}.w1 (gate), w3 (up), w2 (down)
    Layout("Hugging Face Mixtral (transformers 4)", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_LLAMA, "ffn.router": "block_sparse_moe.gate",
            **{f"ffn.experts.{{e}}.{w}": f"block_sparse_moe.experts.{{e}}.{w}"
               for w in ("w1", "w2", "w3")}}),
    # Gemma 2 and 3, OLMo 2: post_attention_layernorm is the attention output's norm
    # (ln1_post), not the MLP's input norm as in Llama
    Layout("Hugging Face Gemma 2 / OLMo 2", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA, "ln1_post": "post_attention_layernorm",
                       "ln2": "pre_feedforward_layernorm",
                       "ln2_post": "post_feedforward_layernorm"}),
    Layout("Hugging Face Phi-3", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
                       "attn.output_proj": "self_attn.o_proj", "ffn.w2": "mlp.down_proj"},
           fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj"),
    Layout("Hugging Face GPT-NeoX", "gpt_neox.embed_in", None, "gpt_neox.layers.{i}",
           "gpt_neox.final_layer_norm", "lm_head",
           {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
            "attn.output_proj": "attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
            "ffn.w2": "mlp.dense_4h_to_h"}, fused_qkv="attention.query_key_value",
           qkv_per_head=True, head_aliases=("embed_out",)),  # its head before transformers 5
    Layout("torchtune", "tok_embeddings", None, "layers.{i}", "norm", "output",
           {"ln1": "sa_norm", "ln2": "mlp_norm", "attn.q_proj": "attn.q_proj",
            "attn.k_proj": "attn.k_proj", "attn.v_proj": "attn.v_proj",
            "attn.output_proj": "attn.output_proj", "attn.q_norm": "attn.q_norm",
            "attn.k_norm": "attn.k_norm", "ffn.w1": "mlp.w1", "ffn.w2": "mlp.w2",
            "ffn.w3": "mlp.w3"}, norm_params=("scale", None)),
    Layout("LLMs-from-scratch GPT", "tok_emb", "pos_emb", "trf_blocks.{i}", "final_norm",
           "out_head", {**_FROM_SCRATCH_ATTN, "ffn.w1": "ff.layers.0", "ffn.w2": "ff.layers.2"},
           norm_params=("scale", "shift")),
    Layout("LLMs-from-scratch Llama", "tok_emb", None, "trf_blocks.{i}", "final_norm",
           "out_head", {**_FROM_SCRATCH_ATTN, "ffn.w1": "ff.fc1", "ffn.w3": "ff.fc2",
                        "ffn.w2": "ff.fc3"}, norm_params=("weight", None)),
    # its Qwen3Model: the Llama names, with its own RMSNorm (scale, and a shift it may have) and
    # the per-head q/k norms att.q_norm, att.k_norm
    Layout("LLMs-from-scratch Qwen3", "tok_emb", None, "trf_blocks.{i}", "final_norm",
           "out_head", {**_FROM_SCRATCH_ATTN, "attn.q_norm": "att.q_norm",
                        "attn.k_norm": "att.k_norm", "ffn.w1": "ff.fc1", "ffn.w3": "ff.fc2",
                        "ffn.w2": "ff.fc3"}, norm_params=("scale", "shift")),
    # Nemotron: Llama's names with a plain MLP, up_proj -> down_proj (no gate), and LayerNorm1P
    # norms (gain 1 + w: norm_offset 1)
    Layout("Hugging Face Nemotron", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**{k: v for k, v in _HF_LLAMA.items() if k != "ffn.w3"},
                       "ffn.w1": "mlp.up_proj"}),
    # torchtitan 0.3's Llama 3 (models/common/decoder.py): q/k/v in attention.qkv_linear, three
    # Linears (wq, wk, wv) or one fused wqkv whose rows go KV group by KV group (the group's
    # query heads, its key head, its value head); the head is lm_head (`output` before 0.3)
    Layout("torchtitan Llama 3", "tok_embeddings", None, "layers.{i}", "norm", "lm_head",
           {"ln1": "attention_norm", "ln2": "ffn_norm", "attn.q_proj": "attention.qkv_linear.wq",
            "attn.k_proj": "attention.qkv_linear.wk", "attn.v_proj": "attention.qkv_linear.wv",
            "attn.output_proj": "attention.wo", "attn.q_norm": "attention.q_norm",
            "attn.k_norm": "attention.k_norm", "ffn.w1": "feed_forward.w1",
            "ffn.w2": "feed_forward.w2", "ffn.w3": "feed_forward.w3"},
           fused_qkv="attention.qkv_linear.wqkv", qkv_per_head=True, norm_params=("weight", None)),
    # ---- GPT-style families (helper fam-gpt) ----
    # GPT-BigCode: GPT-2's names and c_attn's shape (an nn.Linear), its rows KV group by KV
    # group: with multi_query every q row then one k and one v head (GPT-2's order), without it
    # head by head (q, k, v of head 0, then head 1, ...). Named by its family's entry, never
    # detected: the names and shapes are GPT-2's, whose rows are q, k, v whole
    Layout("Hugging Face GPT-BigCode", "transformer.wte", "transformer.wpe", "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.output_proj": "attn.c_proj",
            "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}, fused_qkv="attn.c_attn",
           qkv_per_head=True, detected=False),
    Layout("Hugging Face GPT-Neo", "transformer.wte", "transformer.wpe", "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.q_proj": "attn.attention.q_proj",
            "attn.k_proj": "attn.attention.k_proj", "attn.v_proj": "attn.attention.v_proj",
            "attn.output_proj": "attn.attention.out_proj", "ffn.w1": "mlp.c_fc",
            "ffn.w2": "mlp.c_proj"}),
    # OPT and BioGPT: fairseq's names (their position tables keep two rows before position 0's:
    # the spec's position_offset)
    Layout("Hugging Face OPT", "model.decoder.embed_tokens", "model.decoder.embed_positions",
           "model.decoder.layers.{i}", "model.decoder.final_layer_norm", "lm_head", _FAIRSEQ),
    Layout("Hugging Face BioGPT", "biogpt.embed_tokens", "biogpt.embed_positions",
           "biogpt.layers.{i}", "biogpt.layer_norm", "output_projection", _FAIRSEQ),
    # GPT-J and CodeGen: one norm ln_1 in front of a parallel block; CodeGen fuses q, k, v in
    # qkv_proj as 4 shards (its mp_num) of q, v, k rows
    Layout("Hugging Face GPT-J", "transformer.wte", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head", {**_GPTJ, "attn.q_proj": "attn.q_proj",
                                           "attn.k_proj": "attn.k_proj",
                                           "attn.v_proj": "attn.v_proj"}),
    Layout("Hugging Face CodeGen", "transformer.wte", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head", _GPTJ, fused_qkv="attn.qkv_proj", qkv_shards=4,
           qkv_order=("q_proj", "v_proj", "k_proj")),
    Layout("Hugging Face Phi", "model.embed_tokens", None, "model.layers.{i}",
           "model.final_layernorm", "lm_head",
           {"ln1": "input_layernorm", "attn.q_proj": "self_attn.q_proj",
            "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
            "attn.output_proj": "self_attn.dense", "attn.q_norm": "self_attn.q_layernorm",
            "attn.k_norm": "self_attn.k_layernorm", "ffn.w1": "mlp.fc1", "ffn.w2": "mlp.fc2"}),
    # Falcon: query_key_value KV group by KV group (the new architecture's (Hkv, H/Hkv + 2, Dh);
    # multi_query's q, k, v is one group, the MHA's (H, 3, Dh) one group a head); its norms
    # input_layernorm (the only one of a parallel block that shares it) and
    # post_attention_layernorm, or ln_attn and ln_mlp beside each other (the new architecture's)
    Layout("Hugging Face Falcon", "transformer.word_embeddings", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {**_FALCON, "ln1": "input_layernorm", "ln2": "post_attention_layernorm"},
           fused_qkv="self_attention.query_key_value", qkv_per_head=True),
    Layout("Hugging Face Falcon (two parallel norms)", "transformer.word_embeddings", None,
           "transformer.h.{i}", "transformer.ln_f", "lm_head",
           {**_FALCON, "ln1": "ln_attn", "ln2": "ln_mlp"},
           fused_qkv="self_attention.query_key_value", qkv_per_head=True),
    # ---- routed families (helper fam-moe) ----
    # DeepSeek's MoE names behind Llama's attention (Dots1, GLM-4.5, Solar Open, EXAONE MoE)
    Layout("Hugging Face MoE, DeepSeek's names", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head", _HF_SHARED_EXPERTS, fused_experts=_FUSED_EXPERTS,
           selection_bias="e_score_correction_bias"),
    # MiniMax-M2 and HY-V3: the selection bias a buffer of the block, handed to its router
    Layout("Hugging Face MoE, the selection bias on the block", "model.embed_tokens", None,
           "model.layers.{i}", "model.norm", "lm_head", _HF_SHARED_EXPERTS,
           fused_experts=_FUSED_EXPERTS, selection_bias_at="mlp.e_score_correction_bias"),
    # Ernie 4.5 MoE: the selection bias a (1, E) Parameter of the router's moe_statics
    Layout("Hugging Face Ernie 4.5 MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head", _HF_SHARED_EXPERTS, fused_experts=_FUSED_EXPERTS,
           selection_bias_at="mlp.gate.moe_statics.e_score_correction_bias"),
    # Kolibri 1: GLM-4's sandwich block (post_self_attn_layernorm on the attention output,
    # post_attention_layernorm the MLP's input norm, post_mlp_layernorm on its output)
    Layout("Hugging Face GLM-4 sandwich MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_SHARED_EXPERTS, "ln1_post": "post_self_attn_layernorm",
            "ln2_post": "post_mlp_layernorm"}, fused_experts=_FUSED_EXPERTS,
           selection_bias="e_score_correction_bias"),
    # FlexOlmo: OLMo 2's norms after the sublayers, OLMoE's router and experts
    Layout("Hugging Face OLMo 2 MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_MOE, "ln1_post": "post_attention_layernorm", "ln2": "pre_feedforward_layernorm",
            "ln2_post": "post_feedforward_layernorm"}, fused_experts=_FUSED_EXPERTS),
    # Aria's text model: the router mlp.router, the experts stored in -> out
    Layout("Hugging Face Aria", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_SHARED_EXPERTS, "ffn.router": "mlp.router"},
           fused_experts=_FUSED_EXPERTS, experts_transposed=True),
    # GraniteMoE (and GraniteMoeShared): block_sparse_moe's router and fused experts, the shared
    # MLP's gate and up rows fused in shared_mlp.input_linear
    Layout("Hugging Face GraniteMoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_LLAMA, "ffn.router": "block_sparse_moe.router",
            "ffn.shared.w2": "shared_mlp.output_linear"},
           fused_experts=("block_sparse_moe.experts.gate_up_proj",
                          "block_sparse_moe.experts.down_proj"),
           fused_shared_gate_up="shared_mlp.input_linear"),
    # ---- dense Llama-named families (helper fam-llama) ----
    # Starcoder2: Llama's attention, a plain MLP c_fc -> c_proj, LayerNorms with a shift
    Layout("Hugging Face Starcoder2", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}),
    # GLM: Llama's attention, Phi-3's MLP (gate rows then up rows in mlp.gate_up_proj)
    Layout("Hugging Face GLM", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ffn.w2": "mlp.down_proj"},
           fused_gate_up="mlp.gate_up_proj"),
    # GLM-4: GLM's with sandwich norms; post_attention_layernorm keeps Llama's meaning (the
    # MLP's input norm), the sublayers' outputs normalised by post_self_attn / post_mlp
    Layout("Hugging Face GLM-4", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ffn.w2": "mlp.down_proj",
                       "ln1_post": "post_self_attn_layernorm", "ln2_post": "post_mlp_layernorm"},
           fused_gate_up="mlp.gate_up_proj"),
    # HyperCLOVAX: Llama's names with its post norms (post_norm1 after attention, post_norm2
    # after the MLP)
    Layout("Hugging Face HyperCLOVAX", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head", {**_HF_LLAMA, "ln1_post": "post_norm1",
                                     "ln2_post": "post_norm2"}),
    # Apertus: Llama's attention (q/k norms), its own norms' names, a plain MLP whose xIELU
    # learns alpha_p and alpha_n
    Layout("Hugging Face Apertus", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA_ATTN, "ln1": "attention_layernorm",
                       "ln2": "feedforward_layernorm", "ffn.w1": "mlp.up_proj",
                       "ffn.w2": "mlp.down_proj", "ffn.act": "mlp.act_fn"}),
    # ---- position and norm placements (helper fam-positions) ----
    # BLOOM: q, k, v fused head by head ((H, 3, Dh) rows, as GPT-NeoX), its embedding norm
    Layout("Hugging Face BLOOM", "transformer.word_embeddings", None, "transformer.h.{i}",
           "transformer.ln_f", "lm_head",
           {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
            "attn.output_proj": "self_attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
            "ffn.w2": "mlp.dense_4h_to_h"}, fused_qkv="self_attention.query_key_value",
           qkv_per_head=True, embedding_norm="transformer.word_embeddings_layernorm"),
    # MPT: q, k, v stacked in Wqkv (all q rows, then k, then v: its chunk(3)); norms without a
    # shift (their bias set to None)
    Layout("Hugging Face MPT", "transformer.wte", None, "transformer.blocks.{i}",
           "transformer.norm_f", "lm_head",
           {"ln1": "norm_1", "ln2": "norm_2", "attn.output_proj": "attn.out_proj",
            "ffn.w1": "ffn.up_proj", "ffn.w2": "ffn.down_proj"}, fused_qkv="attn.Wqkv"),
    # XGLM (fairseq's names): the norms before attention and the MLP, fc1 / fc2
    Layout("Hugging Face XGLM", "model.embed_tokens", None, "model.layers.{i}", "model.layer_norm",
           "lm_head",
           {"ln1": "self_attn_layer_norm", "ln2": "final_layer_norm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
            "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.out_proj",
            "ffn.w1": "fc1", "ffn.w2": "fc2"}),
    # GPT-1: GPT-2's block names and Conv1D weights, its own embedding names, no final norm
    Layout("Hugging Face OpenAI GPT", "transformer.tokens_embed", "transformer.positions_embed",
           "transformer.h.{i}", None, "lm_head",
           {"ln1": "ln_1", "ln2": "ln_2", "attn.output_proj": "attn.c_proj",
            "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}, fused_qkv="attn.c_attn"),
    # Persimmon: Llama's norm names, q, k, v fused head by head, per-head q/k LayerNorms
    Layout("Hugging Face Persimmon", "model.embed_tokens", None, "model.layers.{i}",
           "model.final_layernorm", "lm_head",
           {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
            "attn.output_proj": "self_attn.dense", "attn.q_norm": "self_attn.q_layernorm",
            "attn.k_norm": "self_attn.k_layernorm", "ffn.w1": "mlp.dense_h_to_4h",
            "ffn.w2": "mlp.dense_4h_to_h"}, fused_qkv="self_attn.query_key_value",
           qkv_per_head=True),
    # ---- GPT-OSS, Hunyuan, Cohere 2 MoE (helper fam-sinks) ----
    # GPT-OSS: the router mlp.router (weight and bias), the experts fused in -> out with
    # interleaved gate/up units and their biases; sinks under self_attn (as _HF_LLAMA's)
    Layout("Hugging Face GPT-OSS", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA, "ffn.router": "mlp.router"},
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
           experts_transposed=True, gate_up_interleaved=True,
           fused_expert_biases=("mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias")),
    # Hunyuan: per-head q/k norms named query_layernorm / key_layernorm; its MoE layers' router
    # mlp.gate.wg, shared MLP mlp.shared_mlp, experts fused as transformers 5 keeps them
    Layout("Hugging Face Hunyuan", "model.embed_tokens", None, "model.layers.{i}", "model.norm",
           "lm_head", {**_HF_LLAMA, "attn.q_norm": "self_attn.query_layernorm",
                       "attn.k_norm": "self_attn.key_layernorm", "ffn.router": "mlp.gate.wg",
                       "ffn.shared.w1": "mlp.shared_mlp.gate_proj",
                       "ffn.shared.w3": "mlp.shared_mlp.up_proj",
                       "ffn.shared.w2": "mlp.shared_mlp.down_proj"},
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
    # Cohere 2 MoE: Llama's attention names, one norm (input_layernorm), the router mlp.gate,
    # the shared experts as one MLP in mlp.shared_experts, the experts fused
    Layout("Hugging Face Cohere 2 MoE", "model.embed_tokens", None, "model.layers.{i}",
           "model.norm", "lm_head",
           {**_HF_LLAMA, "ffn.router": "mlp.gate",
            "ffn.shared.w1": "mlp.shared_experts.gate_proj",
            "ffn.shared.w3": "mlp.shared_experts.up_proj",
            "ffn.shared.w2": "mlp.shared_experts.down_proj"},
           fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
)


@dataclass(frozen=True)
class Spot:
    """Where one canonical weight lies: module parameter `source`, transposed first or not, then
    rows [start, stop) of it (None: every row), or of each of its `groups` equal row groups,
    concatenated (GPT-NeoX's fused q/k/v: head h's q rows are rows [0, Dh) of group h)."""

    source: str
    transposed: bool = False
    rows: tuple[int, int] | None = None
    groups: int = 1
    heads: str = ""
    """A weight stored head by head (TransformerLens): "in" for (heads, in, Dh) -> (heads * Dh,
    in) (W_Q, W_K, W_V), "out" for (heads, Dh, out) -> (out, heads * Dh) (W_O), "bias" for
    (heads, Dh) -> (heads * Dh,) (b_Q, b_K, b_V)."""
    expert: int | None = None
    """A weight stored with every expert's in one tensor (E, out, in) (transformers 5's
    gate_up_proj and down_proj): this expert's matrix, tensor[expert], before the rows."""
    step: int = 1
    """Every step-th row of [start, stop) (GPT-OSS's interleaved gate and up units: step 2)."""
    flat: bool = False
    """A vector stored with unit axes around it (Ernie 4.5's (1, E) selection bias): read
    flattened."""

    def _target(self, tensor: torch.Tensor) -> torch.Tensor:
        """A view of the weight's place in `tensor`: (rows, ...), or (groups, rows, ...) whose
        first two axes flattened give the canonical weight."""
        if self.expert is not None:
            tensor = tensor[self.expert]  # (out, in): a view
        if self.flat:
            return tensor.flatten()  # (1, E) -> (E,): a view of a contiguous tensor
        if self.heads == "in":
            return tensor.transpose(1, 2)  # (heads, Dh, in)
        if self.heads == "out":
            return tensor.flatten(0, 1).T  # (out, heads * Dh): a view, the heads contiguous
        if self.heads == "bias":
            return tensor.flatten()
        out = tensor.T if self.transposed else tensor
        if self.rows is None:
            return out
        start, stop = self.rows
        if self.groups == 1:
            return out[start:stop:self.step]
        return out.unflatten(0, (self.groups, -1))[:, start:stop]

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The canonical weight: a view of `tensor`, or for grouped rows (and TransformerLens'
        per-head matrices) a differentiable copy (its rows are not evenly spaced in memory)."""
        target = self._target(tensor)
        return target.flatten(0, 1) if self.groups > 1 or self.heads == "in" else target

    def write(self, tensor: torch.Tensor, value: torch.Tensor) -> None:
        """Write the canonical weight's `value` into its place in `tensor` (no autograd)."""
        target = self._target(tensor)
        target.copy_(value.view(target.shape))


@dataclass(frozen=True)
class Placement:
    """The module's weights placed on the spec's canonical names (see the module docstring)."""

    layout: str
    spots: dict[str, Spot] = field(default_factory=dict)
    """canonical name -> where it lies (empty for a user's weights_map)."""
    user_map: WeightsMap | None = None
    problems: tuple[str, ...] = ()
    """What does not fit the spec: expected and not found, found with another shape, found
    although the spec has no such weight (an extra bias)."""
    leftover: tuple[str, ...] = ()
    """The module's parameters no canonical name takes (an extra Linear, a q/k norm)."""
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """canonical name -> the module parameters it is made of (one, or several that a
    weights_map concatenates)."""
    map_error: str = ""
    """What the weights_map did instead of mapping (raised, exited, edited its input, returned
    no dict of tensors), naming it; the params and oracle checks fail with it."""

    def canonical(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{canonical name: tensor} from the module's state dict (its names), as views (a
        weights_map's tensors are what it returns). WeightsMapError when the map misbehaves."""
        if self.user_map is not None:
            return run_weights_map(self.user_map, state)
        return {name: spot.view(state[spot.source]) for name, spot in self.spots.items()}


class WeightsMapError(ConfigError):
    """A weights_map that raised, exited, edited the module's parameters in place, or returned
    something other than {canonical name: tensor}; the message names the map and what it did."""


class WeightsMapReturnError(WeightsMapError):
    """A weights_map that returned something other than {canonical name: tensor} (a list,
    None, a dict holding a non-tensor or a key that is not a name). What a map returns is
    input, checked as an argument is: `audit()` raises this (the command line exits 2 with its
    one line), where what the map does when run (raises, exits, edits the module) is
    evidence, a failing params and oracle."""


class _Exited(BaseException):
    """os._exit called inside a weights_map (a BaseException: the map's own `except Exception`
    does not swallow it)."""


def map_label(weights_map: WeightsMap) -> str:
    """The map as a report names it: its function's name, or a callable object's class."""
    return getattr(weights_map, "__qualname__", type(weights_map).__name__)


def run_weights_map(weights_map: WeightsMap, state: Mapping[str, torch.Tensor],
                    where: str = "") -> dict[str, torch.Tensor]:
    """The map's {canonical name: tensor} for `state`, or WeightsMapError naming the map and
    what it did instead (`where` says what it was given). The map is user code: an exception,
    sys.exit or os._exit inside it, or an in-place edit of the tensors it was given (the
    module's own parameters), is its failure, reported; none of them ends the process or
    decides its exit status."""
    label = f"weights_map {map_label(weights_map)}"
    versions = {name: t._version for name, t in state.items()}
    try:
        with _exit_refused():
            mapped = weights_map(state)
    except _Exited as exc:
        raise WeightsMapError(f"{label} called os._exit({exc.args[0]}){where}: a map returns "
                              "{canonical name: tensor}; the exit was refused, and the gate's "
                              "verdict decides the exit status") from None
    except SystemExit as exc:
        raise WeightsMapError(f"{label} called sys.exit({exc.code!r}){where}: a map returns "
                              "{canonical name: tensor}; the exit was refused, and the gate's "
                              "verdict decides the exit status") from None
    except Exception as exc:  # noqa: BLE001 - the map's failure is its evidence
        raise WeightsMapError(f"{label} raised {type(exc).__name__}{where}: {exc}") from None
    edited = [name for name, t in state.items() if t._version != versions[name]]
    if edited:
        raise WeightsMapError(f"{label} changed {len(edited)} of the module's parameters in "
                              f"place (first {edited[0]}){where}: a map reads the state dict and "
                              "returns tensors made from it, never writing into it")
    return _tensors_of(label, mapped)


def _tensors_of(label: str, mapped) -> dict[str, torch.Tensor]:
    """A map's output as {canonical name: tensor}, or WeightsMapReturnError naming what it
    is."""
    if not isinstance(mapped, Mapping):
        what = "None (no return statement?)" if mapped is None else \
            f"a {type(mapped).__name__}"
        raise WeightsMapReturnError(f"{label} returned {what}, not a dict "
                                    "{canonical name: tensor}")
    keys = [key for key in mapped if not isinstance(key, str)]
    if keys:
        raise WeightsMapReturnError(f"{label} returned keys that are not names: {keys[:3]!r}")
    bad = [(key, value) for key, value in mapped.items() if not isinstance(value, torch.Tensor)]
    if bad:
        key, value = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise WeightsMapReturnError(
            f"{label} returned a {type(value).__name__} for {key!r}{more}: each value must be a "
            "torch.Tensor computed from the state dict's tensors (a list or a numpy array has "
            "left torch: the gate can neither follow it to the module's parameters nor write "
            "through it)")
    return dict(mapped)


@contextmanager
def _exit_refused() -> Iterator[None]:
    """Within the block, os._exit raises _Exited instead of ending the process at once (it
    cannot be caught otherwise); restored after."""
    real = os._exit

    def refused(status: int = 0) -> None:
        raise _Exited(status)

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real


# The buffers a layout places (`Layout.selection_bias`, `selection_bias_at`), by the last part
# of their names.
PLACED_BUFFERS = frozenset(
    name.rpartition(".")[2] for layout in LAYOUTS
    for name in (layout.selection_bias, layout.selection_bias_at) if name)


def placeable(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a layout places: every Parameter under each of its names
    (`named_parameters(remove_duplicate=False)`), and the buffers that hold a canonical weight
    (PLACED_BUFFERS: DeepSeek-V3's e_score_correction_bias, the selection bias our Decoder keeps
    as a Parameter that requires no grad). Every other buffer (RoPE's inverse frequencies, a
    causal mask) is no weight and stays out."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update({name: buffer for name, buffer in model.named_buffers(remove_duplicate=False)
                  if name.rpartition(".")[2] in PLACED_BUFFERS})
    return named


def place(model: nn.Module, spec: DecoderConfig, weights_map: WeightsMap | None,
          layout: str | None = None) -> tuple[Placement | None, str]:
    """(where the module's weights lie on the spec's names, "") or (None, why not). `layout`:
    the name of the layout its weights lie in (a Hugging Face family's own, where its names
    alone would not tell), instead of the one detected from the names."""
    named = placeable(model)
    if weights_map is not None:
        if not callable(weights_map):
            raise ConfigError(f"weights_map={weights_map!r} must be a function from the module's "
                              "state dict to {canonical name: tensor}")
        detached = {name: tensor.detach() for name, tensor in named.items()}
        return user_placement(weights_map, detached, spec), ""
    among = named_layouts(layout) if layout is not None else None
    placement = detect(named, spec, among)
    if placement is None:
        looked = sorted({f"{layout.embedding}.weight" for layout in (among or DETECTED)}
                        | ({"embed.W_E"} if among is None else set()))
        return None, (f"token_embeddings.weight not found: no known layout's embedding is among "
                      f"{type(model).__name__}'s parameter names (first: {list(named)[:3]}; "
                      f"looked for {', '.join(looked)}, at the root or under a prefix): pass "
                      "weights_map= (--weights-map FILE.py:FN), a function from its state dict "
                      "to the canonical names")
    return placement, ""


# TransformerLens (HookedTransformer, 3.x): (module, parameter) of each canonical weight, within
# a block (blocks.{i}.) or at the top; W_in is the MLP's input matrix, or its up projection (w3)
# beside W_gate in a gated MLP; a grouped-query block names its K and V _W_K, _W_V.
_LENS_BLOCK = {"ln1.weight": "ln1.w", "ln1.bias": "ln1.b", "ln2.weight": "ln2.w",
               "ln2.bias": "ln2.b", "attn.output_proj.weight": "attn.W_O",
               "attn.output_proj.bias": "attn.b_O", "ffn.w2.weight": "mlp.W_out",
               "ffn.w2.bias": "mlp.b_out"}
_LENS_TOP = {"token_embeddings.weight": "embed.W_E", "position_embeddings.weight": "pos_embed.W_pos",
             "ln_final.weight": "ln_final.w", "ln_final.bias": "ln_final.b",
             "lm_head.weight": "unembed.W_U", "lm_head.bias": "unembed.b_U"}


def _lens_spot(prefix: str, canonical: str, shapes: Mapping[str, tuple[int, ...]]
               ) -> Spot | None:
    """Where a canonical weight lies in a TransformerLens HookedTransformer, or None."""
    module = canonical.split(".")
    if module[0] != "layers":
        name = _LENS_TOP.get(canonical)
        if name is None:  # a weight TransformerLens has no place for (an embedding norm)
            return None
        transposed = canonical == "lm_head.weight"  # W_U is (D, V)
        return Spot(prefix + name, transposed) if prefix + name in shapes else None
    block, part = f"{prefix}blocks.{module[1]}.", ".".join(module[2:])
    which = module[3] if module[2] == "attn" else ""
    if which in ("q_proj", "k_proj", "v_proj"):
        letter = which[0].upper()
        kind = "W" if module[-1] == "weight" else "b"
        for name in (f"attn.{kind}_{letter}", f"attn._{kind}_{letter}"):
            if block + name in shapes:
                return Spot(block + name, heads="in" if kind == "W" else "bias")
        return None
    gated = f"{block}mlp.W_gate" in shapes
    mlp = {"ffn.w1.weight": "mlp.W_gate" if gated else "mlp.W_in",
           "ffn.w1.bias": None if gated else "mlp.b_in",
           "ffn.w3.weight": "mlp.W_in" if gated else None, "ffn.w3.bias": "mlp.b_in" if gated
           else None}
    name = mlp[part] if part in mlp else _LENS_BLOCK.get(part)
    if name is None or block + name not in shapes:
        return None
    return Spot(block + name, heads="out" if name == "attn.W_O" else "",
                transposed=name.startswith("mlp.W_"))  # W_in, W_gate, W_out: (in, out)


def _lens_placement(prefix: str, named: Mapping[str, torch.Tensor],
                    spec: DecoderConfig) -> Placement:
    shapes = {name: tuple(tensor.shape) for name, tensor in named.items()}
    spots = {canonical: spot for canonical in _every_canonical(spec)
             if (spot := _lens_spot(prefix, canonical, shapes)) is not None}
    return _placement("TransformerLens", prefix, spots, named, spec)


def rootless(layout: Layout) -> Layout | None:
    """`layout` without the root module its embedding, blocks and final norm share (Hugging
    Face's `model.`, nanoGPT's `transformer.`, GPT-NeoX's `gpt_neox.`), the head staying where
    it is: the same names a hand-written model keeps at its top (`embed_tokens`,
    `layers.{i}.self_attn.q_proj`, `norm`, `lm_head`). None for a layout without such a root."""
    inner = [name for name in (layout.embedding, layout.positions, layout.block,
                               layout.final_norm, layout.embedding_norm) if name is not None]
    root = inner[0].split(".")[0] + "."
    if "." not in inner[0] or not all(name.startswith(root) for name in inner):
        return None
    strip = lambda name: None if name is None else name[len(root):]  # noqa: E731
    return replace(layout, name=f"{layout.name}, without its {root.rstrip('.')!r} root",
                   embedding=strip(layout.embedding), positions=strip(layout.positions),
                   block=strip(layout.block), final_norm=strip(layout.final_norm),
                   embedding_norm=strip(layout.embedding_norm))


def _with_rootless(layouts: tuple[Layout, ...]) -> tuple[Layout, ...]:
    return layouts + tuple(bare for layout in layouts if (bare := rootless(layout)) is not None)


# Every layout detect() looks for: as its library names it, and rootless (see `rootless`).
DETECTED: tuple[Layout, ...] = _with_rootless(tuple(layout for layout in LAYOUTS
                                                    if layout.detected))
BY_NAME: Mapping[str, Layout] = {layout.name: layout for layout in LAYOUTS}


def named_layouts(name: str) -> tuple[Layout, ...]:
    """The layout of this name and its rootless form (ConfigError for a name no layout has)."""
    if name not in BY_NAME:
        raise ConfigError(f"layout {name!r} is not one of {sorted(BY_NAME)}")
    return _with_rootless((BY_NAME[name],))


def detect(named: Mapping[str, torch.Tensor], spec: DecoderConfig,
           among: tuple[Layout, ...] | None = None) -> Placement | None:
    """The layout of a module with these parameters (every name, `named_parameters(
    remove_duplicate=False)`: a tied weight under each of its names), placed on the spec; None
    when no known layout's embedding is among them, at the root or under any prefix. Where
    several layouts find the embedding, the one that leaves the fewest problems wins
    (LLMs-from-scratch's GPT and Llama share their names). `among`: only these layouts (a
    family's own, `named_layouts`), instead of every detected one and TransformerLens'."""
    found = [_place(layout, prefix, named, spec) for layout in (among or DETECTED)
             for prefix in _prefixes(named, f"{layout.embedding}.weight")]
    if among is None:
        found += [_lens_placement(prefix, named, spec)
                  for prefix in _prefixes(named, "embed.W_E")]
    if not found:
        return None
    return min(found, key=lambda p: len(p.problems) + len(p.leftover))


def user_placement(weights_map: WeightsMap, named: Mapping[str, torch.Tensor],
                   spec: DecoderConfig) -> Placement:
    """A user's weights_map, run once on shape-only (meta) stand-ins of the module's parameters
    to find what each canonical tensor is made of (by autograd, so a map that slices, transposes
    or concatenates is followed) and what it does not fit: the same problems a detected layout
    reports."""
    leaves = {id(t): torch.empty(t.shape, dtype=t.dtype, device="meta").requires_grad_()
              for t in named.values()}  # a tied weight: one stand-in under each of its names
    stand_ins = {name: leaves[id(t)] for name, t in named.items()}
    label = f"weights_map {map_label(weights_map)}"
    try:
        mapped = run_weights_map(weights_map, stand_ins, where=(
            " on shape-only (meta) stand-ins of the module's parameters, which it is first run "
            "on to follow what each canonical weight is made of (a map computes with tensor "
            "operations; it reads no values)"))
    except WeightsMapReturnError:
        raise  # what it returned is input: refused as a bad argument is (audit raises it)
    except WeightsMapError as exc:
        return Placement(label, user_map=weights_map, problems=(str(exc),), map_error=str(exc))
    first_name = {}
    for name, tensor in named.items():
        first_name.setdefault(id(leaves[id(tensor)]), name)
    sources = {}
    inputs = list(leaves.values())
    for canonical, tensor in mapped.items():
        grads = torch.autograd.grad(tensor.sum(), inputs, allow_unused=True) \
            if tensor.requires_grad else [None] * len(inputs)
        sources[canonical] = tuple(first_name[id(leaf)] for leaf, g in zip(inputs, grads)
                                   if g is not None)
    used = {name for names in sources.values() for name in names}
    return Placement(label, user_map=weights_map,
                     problems=tuple(_misfits({n: tuple(t.shape) for n, t in mapped.items()},
                                             spec)),
                     leftover=_unused(named, used.__contains__), sources=sources)


def _prefixes(named: Mapping[str, torch.Tensor], suffix: str) -> list[str]:
    return [name[:-len(suffix)] for name in named
            if name == suffix or name.endswith("." + suffix)]


def _unused(named: Mapping[str, torch.Tensor], used: Callable[[str], bool]) -> tuple[str, ...]:
    """The first name of each Parameter none of whose names (or storage) is used."""
    by_param: dict[int, list[str]] = {}
    for name, tensor in named.items():
        by_param.setdefault(id(tensor), []).append(name)
    return tuple(names[0] for names in by_param.values()
                 if not any(used(n) for n in names))


def _place(layout: Layout, prefix: str, named: Mapping[str, torch.Tensor],
           spec: DecoderConfig) -> Placement:
    shapes = {name: tuple(tensor.shape) for name, tensor in named.items()}
    if f"{prefix}{layout.head}.weight" not in shapes:
        alias = next((a for a in layout.head_aliases if f"{prefix}{a}.weight" in shapes), None)
        layout = replace(layout, head=alias) if alias else layout
    conv1d = _conv1d(layout, prefix, shapes, spec)
    spots: dict[str, Spot] = {}
    for canonical in _every_canonical(spec):
        spot = _spot(layout, prefix, canonical, shapes, spec, conv1d)
        if spot is not None:
            spots[canonical] = spot
    return _placement(layout.name, prefix, spots, named, spec)


def placed_on(layout_name: str, spots: dict[str, Spot], named: Mapping[str, torch.Tensor],
              spec: DecoderConfig) -> Placement:
    """The placement of spots a reader found itself (`peer_xtransformers`: names no layout of
    this table has), with the same problems and leftovers a detected layout reports."""
    return _placement(layout_name, "", spots, named, spec)


def _placement(layout_name: str, prefix: str, spots: dict[str, Spot],
               named: Mapping[str, torch.Tensor], spec: DecoderConfig) -> Placement:
    """The placement of these spots: the tied head where the spec ties and the module has no
    head of its own, the problems, and the module's parameters no spot takes."""
    shapes = {n: tuple(tensor.shape) for n, tensor in named.items()}
    if "lm_head.weight" not in spots and spec.tie_embeddings and "token_embeddings.weight" in spots:
        spots["lm_head.weight"] = spots["token_embeddings.weight"]  # the forward reuses it
    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    problems = _misfits({name: tuple(spot.view(meta[spot.source]).shape)
                         for name, spot in spots.items()}, spec)
    sources = {spot.source for spot in spots.values()}
    leftover = _unused({n: t for n, t in named.items() if n.startswith(prefix)},
                       sources.__contains__)
    label = layout_name + (f" (under {prefix.rstrip('.')!r})" if prefix else "")
    return Placement(label, spots, problems=tuple(problems), leftover=leftover,
                     sources={name: (spot.source,) for name, spot in spots.items()})


def _every_canonical(spec: DecoderConfig) -> list[str]:
    """Every canonical name a module of this family might hold: the spec's, and every bias,
    shift, gate and position table it might have although the spec says not (so an extra one
    is found and named, not left over)."""
    every = dict(attn_bias=True, attn_output_bias=True, mlp_bias=True, norm="layernorm",
                 mlp="swiglu", pos="learned", qk_norm=True, rotary_dim=None, rope_scaling=None,
                 window_rope_theta=None, sandwich_norm=True, pre_norm=True, norm_affine=True,
                 norm_bias=True, readout_bias=True, shared_norm=False, parallel_residual=False,
                 nope_layers=None, embedding_norm=True, final_norm=True, post_norm=False,
                 qk_norm_kind="layernorm", position_offset=0, attn_sinks=True,
                 swiglu_alpha=1.702, swiglu_limit=7.0)
    if spec.routed:  # the dense MLP without biases; the experts' and the router's
        every.update(mlp_bias=False, expert_bias=True, router_bias=True)
    if spec.latent_attention:  # latent attention's RoPE, and neither biases, q/k norms nor sinks
        every.update(attn_bias=False, attn_output_bias=None, qk_norm=False, pos="rope",
                     qk_norm_kind="rmsnorm", attn_sinks=False)
    names = expected_weights(spec.replace(**every))
    for layer in range(spec.n_layers):
        names.update(_activation_weights(spec, layer, every=True))
    if spec.routed:  # a dense MLP where the spec routes, or the reverse, is found and named
        names.update(expected_weights(spec.replace(**{**every, "n_experts": None, **UNROUTED})))
        names.update(expected_weights(spec.replace(**every, router_selection_bias=True,
                                                   first_dense_layers=0, moe_every=1,
                                                   n_shared_experts=max(1, spec.n_shared_experts),
                                                   shared_expert_gate=True)))
    return list(names)


def _qkv_rows(spec: DecoderConfig) -> dict[str, tuple[int, int]]:
    """Rows of q, k and v in a fused matrix that stacks them in this order."""
    d_q, d_kv = spec.n_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    return {"q_proj": (0, d_q), "k_proj": (d_q, d_q + d_kv), "v_proj": (d_q + d_kv, d_q + 2 * d_kv)}


def _fused_qkv_rows(layout: Layout, spec: DecoderConfig, which: str
                    ) -> tuple[tuple[int, int], int]:
    """(rows, groups) of q, k or v (`which`) in the layout's fused matrix: rows [start, stop)
    of each of `groups` equal row groups (Spot). Per KV group (qkv_per_head): the group's query
    heads, its key head, its value head; else `qkv_shards` shards each holding its share of q,
    k and v in `qkv_order` (one shard: every q row, then every k row, then every v row)."""
    if layout.qkv_per_head:  # each KV group's q heads, k and v rows together
        per, width = spec.n_heads // spec.kv_heads, spec.head_dim
        start = {"q_proj": 0, "k_proj": per, "v_proj": per + 1}[which]
        stop = start + (per if which == "q_proj" else 1)
        return (start * width, stop * width), spec.kv_heads
    shards = layout.qkv_shards
    d_q, d_kv = spec.n_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    widths = {"q_proj": d_q // shards, "k_proj": d_kv // shards, "v_proj": d_kv // shards}
    start = sum(widths[name] for name in layout.qkv_order[:layout.qkv_order.index(which)])
    return (start, start + widths[which]), shards


def _conv1d(layout: Layout, prefix: str, shapes: Mapping[str, tuple[int, ...]],
            spec: DecoderConfig) -> bool:
    """A fused layout's matrices are stored (in, out) (GPT-2's Conv1D) when its first fused
    q/k/v weight is (D, 3 rows) rather than (3 rows, D): decided once, so a square matrix
    (c_proj, D x D) is read the same way as the rest."""
    if layout.fused_qkv is None:
        return False
    shape = shapes.get(f"{prefix}{layout.block.format(i=0)}.{layout.fused_qkv}.weight")
    rows = _qkv_rows(spec)["v_proj"][1]
    return shape == (spec.d_model, rows) and rows != spec.d_model


def _spot(layout: Layout, prefix: str, canonical: str, shapes: Mapping[str, tuple[int, ...]],
          spec: DecoderConfig, conv1d: bool) -> Spot | None:
    """Where `canonical` lies in this layout, or None when the layout has no such weight."""
    module, _, kind = canonical.rpartition(".")
    part = module.split(".", 2)[2] if module.startswith("layers.") else module
    if part in ("ln1", "ln2", "ln1_post", "ln2_post", "ln_final", "attn.q_norm", "attn.k_norm",
                "embedding_norm"):
        kind = layout.norm_params[0 if kind == "weight" else 1]
        if kind is None:  # the layout's norms have no shift
            return None
    if kind == "selection_bias" and layout.selection_bias_at:  # held beside the router
        source = f"{prefix}{layout.block.format(i=module.split('.')[1])}.{layout.selection_bias_at}"
        return Spot(source, flat=len(shapes[source]) > 1) if source in shapes else None
    if kind == "selection_bias" and layout.selection_bias:  # the router's own name for it
        kind = layout.selection_bias
    matrix = kind == "weight" and part.startswith(("attn.", "ffn."))
    located = layout.module_name(canonical)
    if located is not None:
        source = f"{prefix}{located[0]}.{kind}"
        if source in shapes:
            return Spot(source, conv1d and matrix)
    which = part.split(".")[-1]
    fused, rows, groups = None, None, 1
    if layout.fused_qkv and part.startswith("attn.") and which in ("q_proj", "k_proj", "v_proj"):
        fused, (rows, groups) = layout.fused_qkv, _fused_qkv_rows(layout, spec, which)
    elif layout.fused_gate_up and part in ("ffn.w1", "ffn.w3"):
        fused = layout.fused_gate_up
        rows = (0, spec.d_ff) if part == "ffn.w1" else (spec.d_ff, 2 * spec.d_ff)
    elif layout.fused_shared_gate_up and part in ("ffn.shared.w1", "ffn.shared.w3"):
        fused, width = layout.fused_shared_gate_up, spec.shared_dim
        rows = (0, width) if part == "ffn.shared.w1" else (width, 2 * width)
    expert = re.fullmatch(r"ffn\.experts\.(\d+)\.(w[123])", part)
    if layout.fused_experts and expert:
        return _fused_expert_spot(layout, f"{prefix}{layout.block.format(i=module.split('.')[1])}.",
                                  int(expert[1]), expert[2], kind, shapes, spec)
    if fused is not None:
        layer = module.split(".")[1]
        source = f"{prefix}{layout.block.format(i=layer)}.{fused}.{kind}"
        if source in shapes and (groups == 1 or shapes[source][0] % groups == 0):
            return Spot(source, conv1d and matrix, rows, groups)
    return None


def _fused_expert_spot(layout: Layout, block: str, expert: int, which: str, kind: str,
                       shapes: Mapping[str, tuple[int, ...]], spec: DecoderConfig
                       ) -> Spot | None:
    """Where routed expert `expert`'s matrix `which` (w1, w3, w2) or its bias lies in the
    tensors that hold every expert's at once (`block`: the layer's prefix), or None."""
    names = layout.fused_experts if kind == "weight" else layout.fused_expert_biases
    if names is None or kind not in ("weight", "bias"):
        return None
    E, D, width = spec.n_experts, spec.d_model, spec.expert_dim
    source = block + (names[1] if which == "w2" else names[0])
    if kind == "bias":
        whole = (E, D) if which == "w2" else (E, 2 * width)
    elif layout.experts_transposed:
        whole = (E, width, D) if which == "w2" else (E, D, 2 * width)
    else:
        whole = (E, D, width) if which == "w2" else (E, 2 * width, D)
    if shapes.get(source) != whole:  # another E or Fe: no expert's rows are known, and the
        return None                  # tensor is named as left over beside the missing ones
    if which == "w2":
        rows, step = None, 1
    elif layout.gate_up_interleaved:  # gate, up, gate, up, ...
        rows, step = (0 if which == "w1" else 1, 2 * width), 2
    else:  # every gate unit, then every up unit
        rows, step = ((0, width) if which == "w1" else (width, 2 * width)), 1
    return Spot(source, transposed=kind == "weight" and layout.experts_transposed, rows=rows,
                step=step, expert=expert)


def _misfits(found: Mapping[str, tuple[int, ...]], spec: DecoderConfig) -> list[str]:
    """The differences between the canonical weights found and the spec's."""
    want = expected_weights(spec)
    problems = [f"{name} {list(shape)}: the spec expects it, the module has no such weight"
                for name, shape in want.items() if name not in found]
    problems += [f"{name} {list(found[name])}: the spec expects {list(shape)}"
                 for name, shape in want.items() if name in found and found[name] != shape]
    problems += [f"{name} {list(shape)}: the module has it, the spec ({_why_not(name, spec)}) "
                 "does not" for name, shape in found.items() if name not in want]
    return problems


def _why_not(name: str, spec: DecoderConfig) -> str:
    if name.endswith(".bias") and ".attn.output_proj" in name and \
            not isinstance(spec.attn_bias, tuple):
        return f"attn_output_bias={spec.attn_output_bias}, attn_bias={spec.attn_bias}"
    if name.endswith(".bias") and ".attn." in name:
        return f"attn_bias={_flag(spec.attn_bias)}"
    if name.startswith("embedding_norm."):
        return f"embedding_norm={spec.embedding_norm}"
    if name.startswith("ln_final.") and not spec.final_norm:
        return "final_norm=False"
    if "_norm.bias" in name and spec.qk_norm:
        return f"qk_norm_kind={spec.qk_norm_kind!r}, norm_bias={spec.norm_bias}"
    if "_norm." in name:
        return f"qk_norm={spec.qk_norm}"
    if name.endswith(".attn.sinks"):
        return f"attn_sinks={spec.attn_sinks}"
    if name.endswith(".router.bias"):
        return f"router_bias={spec.router_bias}"
    if name.endswith(".bias") and ".ffn.experts." in name:
        return f"expert_bias={spec.expert_bias}"
    if "_post." in name:
        return f"sandwich_norm={spec.sandwich_norm}"
    if name.endswith(".bias") and ".ffn." in name:
        return f"mlp_bias={_flag(spec.mlp_bias)}"
    if name.split(".")[-2].startswith("ln") and not spec.norm_affine:
        return "norm_affine=False"
    if name.split(".")[-2] in ("ln1", "ln2") and not (spec.pre_norm or spec.post_norm):
        return "pre_norm=False"
    if name.split(".")[-2] == "ln2" and spec.shared_norm:
        return "shared_norm=True"
    if name.endswith(".bias"):
        return f"norm={spec.norm!r}, norm_bias={spec.norm_bias}"
    if "w3" in name:
        return f"mlp={spec.mlp!r}"
    if name == "lm_head.bias":
        return f"readout_bias={spec.readout_bias}"
    if name.startswith("position_embeddings"):
        return f"pos={spec.pos!r}"
    return "its architecture"


def _flag(value: bool | tuple[str, ...]) -> str:
    """A bias field as a spec file spells it: False, or ['q_proj', 'v_proj']."""
    return str(list(value)) if isinstance(value, tuple) else str(value)
