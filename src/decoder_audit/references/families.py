"""The Hugging Face families whose config is read as a spec: one entry each, saying what the
family's decoder changes relative to Llama's block, read by one reader (`hf_config.
config_from_hf`), placed by one layout table (`layouts.LAYOUTS`), written back by one writer
(`hf_families.hf_model_for`).

An entry is data, as litgpt's `config.py` writes every model and transformers' `modular_*.py`
write a family as its diff from Llama:

    Family("qwen3", "Qwen3ForCausalLM", fixed={"qk_norm": True})

says that Qwen3's decoder is Llama's with a per-head RMSNorm of q and k, and that its config's
sliding window applies. The reader starts from Llama's block (RMSNorm, a SiLU-gated MLP, RoPE on
rotated halves, no biases unless `attention_bias` / `mlp_bias` say so), then takes

    fixed        DecoderConfig fields the family's modules always compute with, whatever the
                 config says (OLMo's norms learn nothing: norm_affine=False);
    read         DecoderConfig fields read from the config: the attribute that holds each (a
                 name, or names tried in order until one is set), or a function of the config
                 where the family derives it (Gemma's embedding scale sqrt(D)); a RoPE field
                 read here (Granite SWA's per-layer bases) takes the place of the RoPE reader's
                 where it is not None;
    activations  the config's activation names the family's MLP computes, each as our `mlp`;
    refused      config attributes the family's modules read that no DecoderConfig expresses,
                 each with why: set (truthy), the config is refused naming it, and the model is
                 audited black-box, never against a spec that leaves the option out;
    experts      how its routed experts are declared (a label of the router's form:
                 "mixtral", "qwen_moe", "olmoe", "deepseek_v3", ..., or None for a dense MLP;
                 the router's fields themselves are `fixed` and `read`, but for a latent
                 block, whose "deepseek_v3" / "deepseek_v2" router `hf_latent` reads);
                 `block` the reader of a block unlike Llama's ("gpt2", "gpt_neox", "latent":
                 DeepSeek's latent attention, before routed experts or dense MLPs);
    rope_config  False where its modules fix RoPE and the entry says it (GPT-J's base 10000);
    layout       the layout its weights lie in where the names alone do not tell it
                 (GPT-BigCode's c_attn: GPT-2's name and shape, its rows by KV group).

Adding a family is one entry here, a correct tiny model that passes and a planted defect that
fails (tests/references/test_families.py walks the table). Nothing in this module imports
transformers: the classes are named, and looked up in the release at hand (`present`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .family_errors import InvalidHFConfig, Unexpressed
from .family_reads import (SWA_READ, cohere2_moe_average, cohere2_moe_dense_width,
                           cohere2_moe_nope, cohere2_moe_prefix, cohere2_moe_scoring,
                           cohere2_moe_write, hunyuan_experts, hunyuan_topk,
                           ministral3_query_scale, ministral3_write, ntk_alpha, swa_write,
                           windowed_rope_only)
from .hf_windows import layer_kinds


Source = str | tuple[str, ...] | Callable[[Any], Any]
"""Where a DecoderConfig field's value lies in a family's config: an attribute, attributes
tried in order (the first that is set), or a function of the config."""

# Llama's block as its config declares it: the fields every Llama-derived family reads the same
LLAMA_READ: Mapping[str, Source] = MappingProxyType({
    "norm_eps": "rms_norm_eps", "attn_bias": "attention_bias", "mlp_bias": "mlp_bias"})
LLAMA_FIXED: Mapping[str, Any] = MappingProxyType({"norm": "rmsnorm", "pos": "rope"})
SILU_GATED = MappingProxyType({"silu": "swiglu"})
# Gemma's gate: tanh GELU (gelu_new is the same function written out)
TANH_GATED = MappingProxyType({"gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"})


@dataclass(frozen=True)
class Family:
    """One family: its config's model_type, its causal-LM class, and what its decoder changes
    relative to Llama's block (see the module docstring for each field)."""

    model_type: str
    model_class: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    read: Mapping[str, Source] = field(default_factory=dict)
    activation: tuple[str, ...] = ("hidden_act",)
    """The config attributes naming the activation, tried in order (the first that is set)."""
    activations: Mapping[str, str] = field(default_factory=lambda: SILU_GATED)
    partial_rotary: bool = False
    """Its attention rotates only the first partial_rotary_factor of each head's features
    (Llama's rotates them all, so a Llama config with a factor is refused)."""
    windows: bool = True
    """The config's sliding window (sliding_window, layer_types) is read as declared: the
    family's attention applies it, or a window it declares and ignores is a defect to find."""
    experts: str | None = None
    """How its routed experts are declared: "mixtral", "qwen_moe", "olmoe", "deepseek_v3",
    "deepseek_v2", "ernie", "kolibri", "gpt_oss", "hunyuan", "granitemoe", "cohere2_moe"
    (the router's form, a label: its fields are `fixed` and `read`, but in a latent block,
    where "deepseek_v3" / "deepseek_v2" choose `hf_latent`'s reading), None for a dense MLP."""
    refused: tuple[tuple, ...] = ()
    """(config attribute, why[, rule]): the option the family's modules read and no
    DecoderConfig expresses, refused where rule(value) holds (default: the value is truthy)."""
    grouped: bool = True
    """Its attention reads num_key_value_heads and head_dim (grouped-query heads of their own
    width); False: every head is D / H wide with its own keys and values, whatever the config
    carries (GPT-2, GPT-NeoX)."""
    block: str = "llama"
    converter: bool = False
    """Written by the converter's rename tables (GPT-2, Llama, Mistral: `hf_weights`), whose
    Llama path permutes RoPE rows into our interleaved pairs; every other family is written by
    `hf_families` with its own layout kept."""
    write: Callable[[Any, type], dict[str, Any]] | None = None
    """The config fields for what the entry reads through a function of the config, from a
    DecoderConfig and the config class (the inverse of those functions, for the writer); a dict
    it gives for a field the writer fills too (rope_parameters) adds the keys that one lacks."""
    layout_written: bool = True
    """Written by `hf_families` with the layouts (False: only the rename tables write it,
    GPT-2 and a plain Llama; Mistral is both, the tables for a windowless config)."""
    legacy_rope: Mapping[str, str] = field(default_factory=dict)
    """transformers 4's names for RoPE fields this family spelled its own way (rope_theta,
    partial_rotary_factor, window_rope_theta: the windowed layers' base)."""
    rope_config: bool = True
    """Its RoPE is read from the config's RoPE fields (rope_parameters, or rope_theta and
    rope_scaling); False: its modules fix the base and the entry fixes or reads every RoPE
    field itself (GPT-J and CodeGen: base 10000, never scaled, rotary_dim features)."""
    layout: str | None = None
    """The name of the layout (`layouts.LAYOUTS`) its weights lie in, where the names alone do
    not tell it from another's (GPT-BigCode's c_attn is GPT-2's name and shape, its rows in
    another order); None: detected from the names."""
    rope_form: Callable[[dict, Any], dict] | None = None
    """The family's own RoPE form rewritten as a standard one before it is read: (the config's
    rope_parameters, the config) -> rope_parameters (Hunyuan's "dynamic" with an alpha is a
    static base, NTK-stretched once)."""

    def fixes(self) -> dict[str, Any]:
        """Every field the family fixes: Llama's (for a Llama-derived block), then its own."""
        return {**(LLAMA_FIXED if self.block == "llama" else {}), **self.fixed}

    def reads(self) -> dict[str, Source]:
        """Every field read from the config: Llama's (for a Llama-derived block), then the
        family's own."""
        return {**(LLAMA_READ if self.block == "llama" else {}), **self.read}


def takes(config_class: type, field: str) -> bool:
    """Whether this release's config class takes `field` as an argument of its own: a field it
    does not take is an attribute its modeling code ignores (Gemma 2's `layer_types` before
    4.53, whose windowed layers are the even ones whatever the attribute says; Phi-3's
    `partial_rotary_factor` before 4.49)."""
    try:
        return field in inspect.signature(config_class.__init__).parameters
    except (TypeError, ValueError):
        return False


def llama(model_type: str, model_class: str, **changes: Any) -> Family:
    """A family written as its diff from Llama's block."""
    return Family(model_type, model_class, **changes)


def _gpt2_inner(config: Any) -> int:
    """GPT-2's MLP width: n_inner, or 4 D where it is None."""
    return config.n_inner if config.n_inner is not None else 4 * config.n_embd


def _neox_attention_bias(config: Any) -> bool:
    """GPT-NeoX's q/k/v and output biases: attention_bias, on unless a config says otherwise
    (releases before it always had them)."""
    return bool(getattr(config, "attention_bias", True))


def _gemma_scale(config: Any) -> float:
    return float(config.hidden_size) ** 0.5


def _gemma2_scale(config: Any) -> float:
    """Gemma 2's scores scaled by query_pre_attn_scalar^-0.5. A scalar that is not a finite
    number > 0 is refused: (-8) ** -0.5 is complex, and the model's softmax, dropping the
    imaginary part, attends uniformly."""
    scalar = config.query_pre_attn_scalar
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or \
            not 0 < scalar < float("inf"):
        raise InvalidHFConfig(f"query_pre_attn_scalar={scalar!r} must be a finite number > 0 "
                              "(the scores are scaled by its inverse square root)")
    return float(scalar) ** -0.5


def _qwen2_moe_qkv_bias(config: Any) -> bool:
    """Qwen2-MoE's q/k/v biases: its config's qkv_bias from transformers 5, always on before
    (a release whose config does not take qkv_bias)."""
    return not takes(type(config), "qkv_bias") or bool(config.qkv_bias)


def _gemma2_write(cfg: Any, config_class: type) -> dict[str, Any]:
    scalar = (cfg.attn_scale or cfg.head_dim ** -0.5) ** -2  # scores * scalar^-0.5
    if abs(scalar - round(scalar)) < 1e-9 * scalar:
        scalar = round(scalar)  # the config field is an integer
    return {"query_pre_attn_scalar": scalar}


def _qwen_moe_write(cfg: Any, config_class: type) -> dict[str, Any]:
    """Qwen-MoE's dense layers, and Qwen2-MoE's q/k/v biases where its release takes them."""
    fields: dict[str, Any] = {"mlp_only_layers": list(range(cfg.first_dense_layers))}
    if takes(config_class, "qkv_bias"):
        fields["qkv_bias"] = cfg.attn_bias
    return fields


def _qwen_dense_layers(config: Any) -> int:
    """Qwen-MoE's dense layers (mlp_only_layers), which must be the first ones."""
    dense = sorted(getattr(config, "mlp_only_layers", None) or [])
    if dense != list(range(len(dense))):
        raise Unexpressed(f"mlp_only_layers={dense} (the dense layers must be the first ones: "
                          "first_dense_layers)")
    return len(dense)


_CLIPPED = ("clip_qkv", "q, k and v clamped to [-clip_qkv, clip_qkv]: not expressed")
_GEMMA = dict(activation=("hidden_activation", "hidden_act"), activations=TANH_GATED,
              fixed={"norm_offset": 1.0}, read={"embedding_scale": _gemma_scale})
_GEMMA2 = dict(activation=("hidden_activation",), activations=TANH_GATED,
               write=_gemma2_write,
               read={"embedding_scale": _gemma_scale, "attn_scale": _gemma2_scale,
                     "attn_softcap": "attn_logit_softcapping",
                     "logit_softcap": "final_logit_softcapping"},
               fixed={"norm_offset": 1.0, "sandwich_norm": True})
_ROUTED = dict(fixed={"router_scoring": "softmax", "router_order": "score_topk"})
# Qwen-MoE's experts: moe_intermediate_size wide, dense layers first, then every
# decoder_sparse_step-th layer routed
_QWEN_MOE = {"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
             "normalize_topk": "norm_topk_prob", "expert_width": "moe_intermediate_size",
             "first_dense_layers": _qwen_dense_layers, "moe_every": "decoder_sparse_step"}


# ---- GPT-style families (helper fam-gpt) --------------------------------------------------------
# Their MLPs are plain (no gate), their activation named as GPT-2's activation_function names it
GPT_ACTIVATIONS = MappingProxyType({"gelu": "gelu", "gelu_new": "gelu_tanh",
                                    "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                                    "relu": "relu"})
# Not Llama's block: every field is the entry's own; each head D / H wide, the window where the
# entry reads one
_GPT_STYLE = dict(block="gpt2", windows=False, grouped=False, activations=GPT_ACTIVATIONS)


def _n_inner(config: Any) -> int:
    """GPT-2's convention for the MLP width: n_inner, or 4 D when unset."""
    return config.n_inner if config.n_inner is not None else 4 * config.hidden_size


def _neo_window(config: Any) -> int | None:
    """GPT-Neo's window: window_size keys on its "local" layers (attention_layers)."""
    return config.window_size if "local" in config.attention_layers else None


def _neo_window_layers(config: Any) -> tuple[int, ...] | None:
    local = tuple(i for i, kind in enumerate(config.attention_layers) if kind == "local")
    return local if local and len(local) < len(config.attention_layers) else None


def _neo_write(cfg: Any, config_class: type) -> dict[str, Any]:
    kinds = ["local" if cfg.window(i) is not None else "global" for i in range(cfg.n_layers)]
    return {"attention_types": [[kinds, 1]], "window_size": cfg.sliding_window or 256}


def _bigcode_kv_heads(config: Any) -> int | None:
    """GPT-BigCode's one key/value head (multi_query), or one per query head."""
    return 1 if config.multi_query and config.num_attention_heads > 1 else None


def _unscaled(config: Any) -> float | None:
    """Scores q.k unscaled where scale_attn_weights is off (GPT-BigCode), else 1/sqrt(Dh)."""
    return None if config.scale_attn_weights else 1.0


def _bigcode_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"n_inner": cfg.d_ff, "multi_query": cfg.kv_heads == 1,
            "scale_attn_weights": cfg.attn_scale is None}


def _opt_width(config: Any) -> int:
    """OPT's residual width, where its embedding has the same (OPT-350m's project_in and
    project_out map between an embedding of word_embed_proj_dim and the blocks)."""
    if config.word_embed_proj_dim != config.hidden_size:
        raise Unexpressed(f"word_embed_proj_dim={config.word_embed_proj_dim} != hidden_size="
                          f"{config.hidden_size} (project_in and project_out between the "
                          "embedding's width and the blocks': not expressed)")
    return config.hidden_size


def _opt_post_norm(config: Any) -> bool:
    """OPT's norms after each residual add (OPT-350m's do_layer_norm_before=False)."""
    return not config.do_layer_norm_before


def _opt_final_norm(config: Any) -> bool:
    """OPT's final norm: only in front of pre-norm blocks, and not where a config removes it
    (_remove_final_layer_norm, kept for old checkpoints)."""
    return bool(config.do_layer_norm_before) and not getattr(config, "_remove_final_layer_norm",
                                                                False)


def _opt_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"_remove_final_layer_norm": cfg.pre_norm and not cfg.final_norm}


def _biogpt_scale(config: Any) -> float | None:
    return float(config.hidden_size) ** 0.5 if config.scale_embedding else None


def _rotary_dim(config: Any) -> int | None:
    """GPT-J's and CodeGen's rotated width: rotary_dim features of each head (None where that
    is all of them). Unset, their table is hidden_size wide, which only one head of D fits."""
    heads, width = config.num_attention_heads, config.hidden_size
    if config.rotary_dim is None:
        if heads == 1:
            return None
        raise InvalidHFConfig(f"rotary_dim=None with num_attention_heads={heads}: the rotary "
                              f"table is hidden_size={width} wide, wider than a head of "
                              f"{width // heads} (the forward fails)")
    return None if config.rotary_dim == width // heads else config.rotary_dim


def _gptj_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"n_inner": cfg.d_ff, "rotary_dim": cfg.rotary_dim or cfg.head_dim}


_GPTJ = dict(_GPT_STYLE, rope_config=False, activation=("activation_function",), write=_gptj_write,
             # one LayerNorm feeding attention and the MLP beside each other; RoPE on
             # interleaved pairs (rotate_every_two) of the first rotary_dim features, base 10000
             fixed={"norm": "layernorm", "pos": "rope", "rope_layout": "interleaved",
                    "rope_theta": 10000.0, "parallel_residual": True, "shared_norm": True,
                    "attn_bias": False, "mlp_bias": True, "readout_bias": True},
             read={"norm_eps": "layer_norm_epsilon", "d_ff": _n_inner,
                   "rotary_dim": _rotary_dim})


def _falcon_kv_heads(config: Any) -> int | None:
    """Falcon's key/value heads: num_kv_heads in the new architecture, one with multi_query,
    else one per query head."""
    heads = config.num_attention_heads
    kv = (config.num_kv_heads if config.new_decoder_architecture else
          1 if config.multi_query else heads)
    return None if kv == heads else kv


def _falcon_parallel(config: Any) -> bool:
    """Whether Falcon's block is parallel (its MLP reads the block's input, not the stream
    after attention), for the forms its layer both builds and runs."""
    norms = config.num_ln_in_parallel_attn
    if config.new_decoder_architecture and not config.parallel_attn:
        raise Unexpressed("new_decoder_architecture=True with parallel_attn=False (its layer "
                          "builds the sequential norms and reads the parallel ones)")
    if config.new_decoder_architecture and norms not in (None, 1, 2):
        raise Unexpressed(f"num_ln_in_parallel_attn={norms} (its layer reads 1 or 2 norms)")
    if not config.new_decoder_architecture and config.parallel_attn and norms == 2:
        raise Unexpressed("num_ln_in_parallel_attn=2 without new_decoder_architecture (its "
                          "layer builds ln_attn, ln_mlp and reads input_layernorm)")
    return bool(config.parallel_attn)


def _falcon_shared_norm(config: Any) -> bool:
    """One norm in front of both sublayers: the original parallel block (Falcon-7B), or the
    new architecture's with num_ln_in_parallel_attn=1 (Falcon-11B)."""
    if not config.parallel_attn:
        return False
    return not config.new_decoder_architecture or config.num_ln_in_parallel_attn == 1


def _falcon_write(cfg: Any, config_class: type) -> dict[str, Any]:
    if cfg.parallel_residual:  # the new architecture holds any KV heads, one norm or two
        return {"new_decoder_architecture": True, "parallel_attn": True,
                "num_ln_in_parallel_attn": 1 if cfg.shared_norm else 2,
                "num_kv_heads": cfg.kv_heads}
    return {"new_decoder_architecture": False, "parallel_attn": False,
            "multi_query": cfg.kv_heads == 1, "num_kv_heads": cfg.n_heads}
# ---- position and norm placements (helper fam-positions) ----
# The plain (non-gated) MLPs' activations, by transformers' ACT2FN names: gelu_new, gelu_fast and
# gelu_pytorch_tanh are the tanh approximation written three ways
_PLAIN_ACTIVATIONS = MappingProxyType({
    "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "relu2": "relu2"})
_ALIBI_HORIZON = 2048
"""BLOOM's training length: the max_seq_len of a BLOOM spec, whose config declares none (ALiBi
runs at any length: the gate audits it with no hard limit, `facts.py`)."""


def _alibi_horizon(config: Any) -> int:
    """The length a config without one of its own is read with (BLOOM's: `_ALIBI_HORIZON`)."""
    return getattr(config, "max_position_embeddings", None) or _ALIBI_HORIZON


def _four_times(config: Any) -> int:
    """The MLP width BLOOM, MPT and GPT-1 fix at 4 D (MPT's expansion_ratio, BLOOM's n_inner
    are never read by transformers' modules)."""
    return 4 * config.hidden_size


def _mpt_scale(config: Any) -> float | None:
    """MPT's score scale: attn_config.softmax_scale, None for 1/sqrt(Dh)."""
    return config.attn_config.softmax_scale


def _xglm_scale(config: Any) -> float | None:
    """XGLM's embedding scale: sqrt(D) where scale_embedding is set."""
    return float(config.hidden_size) ** 0.5 if config.scale_embedding else None


def _qk_layernorm_kind(config: Any) -> str:
    """Persimmon's and Phi's q/k norms are LayerNorms (where qk_layernorm gives them any)."""
    return "layernorm" if config.qk_layernorm else "rmsnorm"


# transformers' BLOOM and MPT add the slopes of Press et al. (MPT's alibi_bias_max is fixed at
# 8 by transformers, whatever attn_config says: the same slopes), after the score scale
_POSITION_FAMILIES = (
    Family("bloom", "BloomForCausalLM", block="bloom", windows=False, grouped=False,
           activation=(), activations={},  # its own tanh GELU, whatever the config says
           fixed={"norm": "layernorm", "pos": "alibi", "embedding_norm": True, "attn_bias": True,
                  "mlp_bias": True, "mlp": "gelu_tanh"},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _four_times,
                 "max_seq_len": _alibi_horizon},
           refused=(("apply_residual_connection_post_layernorm",
                     "the residual taken after the norm, not before it"),)),
    Family("mpt", "MptForCausalLM", block="mpt", windows=False, grouped=False,
           activation=(), activations={},  # exact GELU, fixed
           fixed={"norm": "layernorm", "norm_bias": False, "pos": "alibi", "attn_bias": False,
                  "mlp_bias": False, "mlp": "gelu"},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _four_times,
                 "max_seq_len": "max_seq_len", "attn_scale": _mpt_scale},
           write=lambda cfg, cls: {"attn_config": {"softmax_scale": cfg.attn_scale}},
           refused=(("attn_config.clip_qkv", "q, k and v clamped to [-clip_qkv, clip_qkv]: not "
                     "expressed"),)),
    # XGLM: fairseq's sinusoidal table from row 2, the embedding scaled by sqrt(D)
    Family("xglm", "XGLMForCausalLM", block="xglm", windows=False, grouped=False,
           activation=("activation_function",), activations=_PLAIN_ACTIVATIONS,
           fixed={"norm": "layernorm", "norm_eps": 1e-5, "pos": "sinusoidal",
                  "position_offset": 2, "attn_bias": True, "mlp_bias": True},
           read={"d_ff": "ffn_dim", "embedding_scale": _xglm_scale},
           write=lambda cfg, cls: {"scale_embedding": cfg.embedding_scale is not None},
           refused=(("add_cross_attention", "a decoder-only model has no cross attention"),
                    ("pad_token_id", "its sinusoidal table's row pad_token_id is zeroed, so "
                     "position pad_token_id - 2 adds nothing",
                     lambda value: isinstance(value, int) and value >= 2))),
    # GPT-1: post-norm blocks, no final norm, learned positions, GPT-2's tanh GELU as "gelu"
    Family("openai-gpt", "OpenAIGPTLMHeadModel", block="openai-gpt", windows=False,
           grouped=False, activation=("afn",),
           activations={"gelu": "gelu_tanh", "relu": "relu"},
           fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True,
                  "pre_norm": False, "post_norm": True, "final_norm": False},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _four_times}),
    # Persimmon: per-head LayerNorms of q and k (with a shift), partial rotary, ReLU squared
    Family("persimmon", "PersimmonForCausalLM", block="persimmon", partial_rotary=True,
           windows=False, grouped=False, activations=_PLAIN_ACTIVATIONS,
           fixed={"norm": "layernorm", "pos": "rope", "attn_bias": True, "mlp_bias": True},
           read={"norm_eps": "layer_norm_eps", "qk_norm": "qk_layernorm",
                 "qk_norm_kind": _qk_layernorm_kind}),
)


# ---- routed families (helper fam-moe) ----------------------------------------------------------

def _dense_prefix(attribute: str) -> Callable[[Any], int]:
    """first_dense_layers from a per-layer list of MLP kinds ("dense" / "sparse": HY-V3's,
    Mellum's, EXAONE MoE's mlp_layer_types), whose dense layers must be the first ones."""
    def read(config: Any) -> int:
        kinds = list(getattr(config, attribute, None) or [])
        dense = kinds.count("dense")
        if kinds[:dense] != ["dense"] * dense or set(kinds[dense:]) - {"sparse"}:
            raise Unexpressed(f"{attribute}={kinds} (the dense layers must be the first ones, "
                              "every other layer sparse: first_dense_layers)")
        return dense
    return read


def _dense_prefix_write(attribute: str) -> Callable[[Any, type], dict[str, Any]]:
    def write(cfg: Any, config_class: type) -> dict[str, Any]:
        return {attribute: ["sparse" if cfg.routes(i) else "dense" for i in range(cfg.n_layers)]}
    return write


def _v3_groups(config: Any) -> int | None:
    """DeepSeek-V3's router's groups (n_group); one group of every expert limits nothing."""
    return None if config.n_group == 1 else config.n_group


def _v3_groups_per_token(config: Any) -> int | None:
    return None if config.n_group == 1 else config.topk_group


def _v3_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"n_group": cfg.expert_groups or 1, "topk_group": cfg.groups_per_token or 1}


def _first_k_dense(config: Any) -> int:
    return config.first_k_dense_replace or 0  # Dots1's may be None: no dense layer


# transformers' RMSNorm default: latent attention's norms (q_a_layernorm, kv_a_layernorm) are
# built without the config's rms_norm_eps, the block norms with it
_LATENT_NORM_EPS = 1e-6


def _latent_norm_eps(config: Any) -> float | None:
    """The latent norms' eps, where it is not the block norms' rms_norm_eps."""
    return None if float(config.rms_norm_eps) == _LATENT_NORM_EPS else _LATENT_NORM_EPS


def _unrotated_full_layers(config: Any) -> tuple[int, ...] | None:
    """EXAONE 4's attention (EXAONE MoE, Kolibri 1): where a window is set, its full layers
    rotate nothing (global NoPE); without one, every layer rotates."""
    if config.sliding_window is None:
        return None
    full = tuple(i for i, kind in enumerate(config.layer_types) if kind != "sliding_attention")
    return full or None


def _hy_v3_shared(config: Any) -> int:
    """HY-V3's shared MLP is num_shared_experts x moe_intermediate_size wide; with none, its
    `intermediate_size or config.intermediate_size` builds one of intermediate_size all the
    same (`_hy_v3_shared_width`)."""
    return config.num_shared_experts or 1


def _hy_v3_shared_width(config: Any) -> int | None:
    return None if config.num_shared_experts else config.intermediate_size


def _ernie_dense_layers(config: Any) -> int:
    """Ernie 4.5 MoE routes layer i when (i + 1) % moe_layer_interval == 0 and moe_layer_start_
    index <= i <= moe_layer_end_index: the first first_dense_layers, then every moe_every-th,
    where the routed layers run to the last one."""
    end, last = config.moe_layer_end_index, config.num_hidden_layers - 1
    if end < last:
        raise Unexpressed(f"moe_layer_end_index={end} < {last} (dense layers after the routed "
                          "ones: only first_dense_layers, dense layers first, is expressed)")
    return config.moe_layer_start_index


def _mellum_write(cfg: Any, config_class: type) -> dict[str, Any]:
    """Mellum's dense layers, and its RoPE per layer type (its rotary module reads both)."""
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    local = {"rope_type": "default", "rope_theta": cfg.window_rope_theta or cfg.rope_theta}
    return {**_dense_prefix_write("mlp_layer_types")(cfg, config_class),
            "rope_parameters": {"full_attention": full, "sliding_attention": local}}


def _minicpm3_residual(config: Any) -> float:
    """MiniCPM3's residual_scale: scale_depth / sqrt(num_hidden_layers)."""
    return config.scale_depth / config.num_hidden_layers ** 0.5


def _minicpm3_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"scale_emb": cfg.embedding_scale or 1.0,
            "scale_depth": cfg.residual_multiplier * cfg.n_layers ** 0.5,
            "dim_model_base": cfg.logit_scale * cfg.d_model}


def _granite_embedding(config: Any) -> float | None:
    """Granite's embedding_multiplier (1: no scale)."""
    return None if config.embedding_multiplier == 1 else float(config.embedding_multiplier)


def _granite_logit_scale(config: Any) -> float:
    """Granite divides the logits by logits_scaling."""
    return 1.0 / config.logits_scaling


def _granite_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {"embedding_multiplier": cfg.embedding_scale or 1.0,
            "attention_multiplier": cfg.attn_scale or cfg.head_dim ** -0.5,
            "logits_scaling": 1.0 / cfg.logit_scale}


def _granite_shared_write(cfg: Any, config_class: type) -> dict[str, Any]:
    return {**_granite_write(cfg, config_class), "shared_intermediate_size": cfg.shared_dim}


# DeepSeek-V3's router (Dots1, GLM-4.5, Solar Open, EXAONE MoE): every expert scored by a
# sigmoid, chosen by score + e_score_correction_bias within the topk_group best of n_group
# groups (each worth its two best), weighed by its score, renormalised as norm_topk_prob says,
# times routed_scaling_factor
_V3_FIXED = {"router_scoring": "sigmoid", "router_order": "score_topk",
             "router_selection_bias": True, "group_score": "top2_sum"}
_V3_READ = {"experts_per_token": "num_experts_per_tok", "expert_width": "moe_intermediate_size",
            "normalize_topk": "norm_topk_prob", "routed_scaling": "routed_scaling_factor",
            "expert_groups": _v3_groups, "groups_per_token": _v3_groups_per_token}
_V3_ROUTED = dict(experts="deepseek_v3", write=_v3_write)
# Granite's multipliers: embeddings x embedding_multiplier, scores x attention_multiplier (in
# place of 1/sqrt(Dh)), each sublayer's output x residual_multiplier, logits / logits_scaling
_GRANITE_READ = {"embedding_scale": _granite_embedding, "attn_scale": "attention_multiplier",
                 "residual_multiplier": "residual_multiplier", "logit_scale": _granite_logit_scale}
# the k largest logits, scored by a softmax among themselves (a distribution already)
_TOPK_SOFTMAX = {"router_scoring": "softmax", "router_order": "topk_score",
                 "normalize_topk": True}
def _no_shared_mlp(attribute: str) -> tuple:
    """A block that builds its shared MLP whatever: of width 0 where `attribute` is 0, its
    zero-size weights a shape no DecoderConfig has (refused, never left over in params)."""
    return (attribute, "a shared MLP of width 0 (zero-size weights; no shared experts is "
            "n_shared_experts=0 without them)", lambda value: value == 0)


_BIASED_MLPS = ("mlp_bias", "biased dense and shared MLPs beside unbiased experts: routed "
                "layers have no biases here")
# ---- dense Llama-named families (helper fam-llama) ----
# Non-gated MLPs down(act(up x)) (Nemotron's, Arcee's, Jais 2's, Starcoder2's c_fc/c_proj): the
# activation names transformers' ACT2FN computes, each as our `mlp`
PLAIN_ACTIVATIONS = MappingProxyType({
    "relu2": "relu2", "relu": "relu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"})


def _layer_kinds(config: Any) -> list[str]:
    """Each layer's attention kind as the family's modules index it (`layer_types`, or the rule
    of a release before it), every layer full where the config names none."""
    return layer_kinds(config) or ["full_attention"] * config.num_hidden_layers


def _nope(layers: Any) -> tuple[int, ...] | None:
    found = tuple(sorted(layers))
    return found or None


def _smollm3_nope(config: Any) -> tuple[int, ...] | None:
    """SmolLM3's NoPE layers: those whose no_rope_layers entry is 0 (its attention rotates q
    and k only where the entry is 1)."""
    flags, layers = list(config.no_rope_layers or []), config.num_hidden_layers
    if len(flags) < layers:
        raise InvalidHFConfig(f"no_rope_layers={flags} must hold an entry for each of the "
                              f"num_hidden_layers={layers} layers")
    return _nope(i for i in range(layers) if not flags[i])


def _smollm3_write(cfg: Any, config_class: type) -> dict[str, Any]:
    nope = set(cfg.nope_layers or ())
    return {"no_rope_layers": [int(i not in nope) for i in range(cfg.n_layers)]}


def _rope_only_where_windowed(config: Any) -> tuple[int, ...] | None:
    """EXAONE 4 and Cohere 2: once a sliding_window is set, RoPE only in the windowed layers
    (the full-attention layers are NoPE). EXAONE 4 without a window rotates every layer."""
    if config.sliding_window is None:
        return None
    return _nope(i for i, kind in enumerate(_layer_kinds(config)) if kind != "sliding_attention")


def _cohere2_nope(config: Any) -> tuple[int, ...] | None:
    """Cohere 2 rotates q and k only in a layer whose window is set: without a sliding_window
    no layer has positions."""
    if config.sliding_window is None:
        return tuple(range(config.num_hidden_layers))
    return _rope_only_where_windowed(config)


def _granite_logit_scale(config: Any) -> float:
    """Granite divides the logits by logits_scaling: a scale of its inverse."""
    scaling = config.logits_scaling
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or scaling == 0:
        raise InvalidHFConfig(f"logits_scaling={scaling!r} must be a number other than 0 (the "
                              "logits are divided by it)")
    return 1.0 / float(scaling)


_COHERE = dict(fixed={"norm": "layernorm", "norm_bias": False, "rope_layout": "interleaved",
                      "parallel_residual": True, "shared_norm": True, "mlp_bias": False},
               read={"norm_eps": "layer_norm_eps", "logit_scale": "logit_scale"})
_GRANITE = {"residual_multiplier": "residual_multiplier", "embedding_scale": "embedding_multiplier",
            "attn_scale": "attention_multiplier"}
_GLM = dict(partial_rotary=True,  # the first R features, pairs interleaved within them
            fixed={"rope_layout": "interleaved", "attn_output_bias": False, "mlp_bias": False})

LLAMA_NAMED: tuple[Family, ...] = (
    # Mistral's block under Qwen2's modules without their biases
    llama("ministral", "MinistralForCausalLM", fixed={"attn_bias": False, "mlp_bias": False}),
    llama("seed_oss", "SeedOssForCausalLM", read={"attn_output_bias": "attention_out_bias"}),
    # pairs interleaved; o_proj (D -> D) never biased
    llama("helium", "HeliumForCausalLM",
          fixed={"rope_layout": "interleaved", "attn_output_bias": False}),
    llama("ernie4_5", "Ernie4_5ForCausalLM", fixed={"rope_layout": "interleaved"},
          read={"attn_bias": "use_bias", "mlp_bias": "use_bias"}),
    # OLMo 2's block with windows, each layer kind its own RoPE (transformers 4: the windowed
    # layers unscaled on the one rope_theta)
    llama("olmo3", "Olmo3ForCausalLM",
          fixed={"pre_norm": False, "sandwich_norm": True, "qk_norm": True,
                 "qk_norm_scope": "projection", "mlp_bias": False},
          legacy_rope={"window_rope_theta": "rope_theta"}),
    # its config's attention_bias is an AttributeError instance (truthy): no attention biases
    llama("cwm", "CwmForCausalLM", fixed={"attn_bias": False}),
    llama("emu3", "Emu3ForCausalLM"),
    # Gemma 2 without the sandwich norms
    llama("vaultgemma", "VaultGemmaForCausalLM", **{**_GEMMA2, "fixed": {"norm_offset": 1.0}}),
    llama("starcoder2", "Starcoder2ForCausalLM", activations=PLAIN_ACTIVATIONS,
          fixed={"norm": "layernorm"},
          read={"norm_eps": "norm_epsilon", "attn_bias": "use_bias", "mlp_bias": "use_bias"}),
    llama("glm", "GlmForCausalLM", **_GLM),
    llama("glm4", "Glm4ForCausalLM", **{**_GLM, "fixed": {**_GLM["fixed"], "sandwich_norm": True}}),
    llama("smollm3", "SmolLM3ForCausalLM", read={"nope_layers": _smollm3_nope},
          write=_smollm3_write),
    llama("exaone4", "Exaone4ForCausalLM",
          fixed={"pre_norm": False, "sandwich_norm": True, "qk_norm": True, "attn_bias": False,
                 "mlp_bias": False},
          read={"nope_layers": _rope_only_where_windowed}),
    llama("arcee", "ArceeForCausalLM", activations=PLAIN_ACTIVATIONS),
    llama("jais2", "Jais2ForCausalLM", activations=PLAIN_ACTIVATIONS, fixed={"norm": "layernorm"},
          read={"norm_eps": "layer_norm_eps"}),
    # LayerNorm1P: gain 1 + w
    llama("nemotron", "NemotronForCausalLM", activations=PLAIN_ACTIVATIONS, partial_rotary=True,
          fixed={"norm": "layernorm", "norm_offset": 1.0}, read={"norm_eps": "norm_eps"}),
    llama("granite", "GraniteForCausalLM",
          read={**_GRANITE, "logit_scale": _granite_logit_scale},
          write=lambda cfg, cls: {"logits_scaling": 1.0 / cfg.logit_scale}),
    # Granite's block with post norms; its logits multiplied by logits_scaling
    llama("hyperclovax", "HyperCLOVAXForCausalLM",
          read={**_GRANITE, "logit_scale": "logits_scaling", "sandwich_norm": "use_post_norm"}),
    llama("cohere", "CohereForCausalLM", **_COHERE,
          refused=(("use_qk_norm", "per-head LayerNorms of q and k with a gain per head ((H, Dh) "
                                   "weights)"),)),
    llama("cohere2", "Cohere2ForCausalLM", **{**_COHERE, "read": {
        **_COHERE["read"], "nope_layers": _cohere2_nope}}),
    # per-head q/k RMSNorms before RoPE; a plain MLP, its xIELU learned per layer
    llama("apertus", "ApertusForCausalLM", activations={"xielu": "xielu", **PLAIN_ACTIVATIONS},
          fixed={"qk_norm": True, "mlp_bias": False}),
)


FAMILIES: tuple[Family, ...] = (
    # the converter's families (rename tables; Llama's RoPE rows permuted)
    Family("gpt2", "GPT2LMHeadModel", block="gpt2", converter=True, windows=False, grouped=False,
           layout_written=False,
           activation=("activation_function",),
           activations={"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "gelu": "gelu", "relu": "relu"},
           fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True},
           read={"norm_eps": "layer_norm_epsilon",
                 "d_ff": _gpt2_inner},
           refused=(("scale_attn_weights", "unscaled scores: we always scale by 1/sqrt(Dh)",
                     lambda value: not value),
                    ("scale_attn_by_inverse_layer_idx", "scores scaled per layer by 1/(i+1)"),
                    ("reorder_and_upcast_attn", "scores upcast and reordered"),
                    ("add_cross_attention", "a decoder-only model has no cross attention"))),
    llama("llama", "LlamaForCausalLM", converter=True, layout_written=False),
    # Mistral: Llama's architecture under other class names, its window applied
    llama("mistral", "MistralForCausalLM", converter=True),
    # the families the layouts place (rotate-half RoPE kept)
    llama("qwen2", "Qwen2ForCausalLM",
          fixed={"attn_bias": True, "attn_output_bias": False}),
    llama("qwen3", "Qwen3ForCausalLM", fixed={"qk_norm": True}),
    llama("phi3", "Phi3ForCausalLM", partial_rotary=True),
    llama("olmo2", "Olmo2ForCausalLM",
          fixed={"pre_norm": False, "sandwich_norm": True, "qk_norm": True,
                 "qk_norm_scope": "projection"}),
    llama("olmo", "OlmoForCausalLM", refused=(_CLIPPED,),
          # LayerNorms that learn nothing, with transformers' fixed eps
          fixed={"norm": "layernorm", "norm_eps": 1e-5, "norm_affine": False,
                 "norm_bias": False}),
    llama("stablelm", "StableLmForCausalLM", partial_rotary=True,
          fixed={"norm": "layernorm", "attn_output_bias": False},
          read={"norm_eps": "layer_norm_eps", "attn_bias": "use_qkv_bias"},
          refused=(("qk_layernorm", "per-head LayerNorms of q and k"),
                   ("use_parallel_residual", "a parallel block with one norm"))),
    llama("gemma", "GemmaForCausalLM", **_GEMMA),
    llama("gemma2", "Gemma2ForCausalLM", **_GEMMA2),
    llama("gemma3_text", "Gemma3ForCausalLM", **{**_GEMMA2, "fixed": {
        **_GEMMA2["fixed"], "qk_norm": True}}, legacy_rope={"window_rope_theta":
                                                            "rope_local_base_freq"}),
    Family("gpt_neox", "GPTNeoXForCausalLM", block="gpt_neox", partial_rotary=True,
           windows=False, grouped=False,
           activations={"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "gelu_fast": "gelu_tanh", "relu": "relu"},
           fixed={"norm": "layernorm", "mlp_bias": True},
           read={"norm_eps": "layer_norm_eps", "parallel_residual": "use_parallel_residual",
                 "attn_bias": _neox_attention_bias},
           write=lambda cfg, cls: {"attention_bias": cfg.attn_bias},
           legacy_rope={"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"}),
    # routed families: Llama's attention with a router, softmax then top k, in front of E experts
    llama("mixtral", "MixtralForCausalLM", experts="mixtral",
          fixed={**_ROUTED["fixed"], "normalize_topk": True},
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"}),
    llama("qwen2_moe", "Qwen2MoeForCausalLM", experts="qwen_moe",
          fixed={**_ROUTED["fixed"], "attn_output_bias": False, "n_shared_experts": 1,
                 "shared_expert_gate": True},
          read={**_QWEN_MOE, "attn_bias": _qwen2_moe_qkv_bias,
                "shared_expert_width": "shared_expert_intermediate_size"}, write=_qwen_moe_write),
    llama("qwen3_moe", "Qwen3MoeForCausalLM", experts="qwen_moe",
          fixed={**_ROUTED["fixed"], "qk_norm": True}, read=_QWEN_MOE, write=_qwen_moe_write),
    llama("olmoe", "OlmoeForCausalLM", experts="olmoe", refused=(_CLIPPED,),
          fixed={**_ROUTED["fixed"], "qk_norm": True, "qk_norm_scope": "projection"},
          read={"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                "normalize_topk": "norm_topk_prob"}),
    # latent attention in front of routed experts
    Family("deepseek_v3", "DeepseekV3ForCausalLM", block="latent", experts="deepseek_v3",
           windows=False, read={"first_dense_layers": _first_k_dense,
                                "latent_norm_eps": _latent_norm_eps}),
    # V2 rotates interleaved pairs (as complex numbers) whatever a rope_interleave says
    Family("deepseek_v2", "DeepseekV2ForCausalLM", block="latent", experts="deepseek_v2",
           windows=False, read={"first_dense_layers": _first_k_dense,
                                "latent_norm_eps": _latent_norm_eps},
           fixed={"rope_layout": "interleaved"}),
    # ---- GPT-style families (helper fam-gpt) ----
    # GPT-Neo: GPT-2's block with unscaled scores, a bias on the output projection only, and
    # windowed "local" layers
    Family("gpt_neo", "GPTNeoForCausalLM", **_GPT_STYLE, activation=("activation_function",),
           fixed={"norm": "layernorm", "pos": "learned", "attn_scale": 1.0,
                  "attn_bias": ("output_proj",), "mlp_bias": True},
           read={"norm_eps": "layer_norm_epsilon",
                 "d_ff": lambda c: (c.intermediate_size if c.intermediate_size is not None
                                    else 4 * c.hidden_size),
                 "sliding_window": _neo_window, "window_layers": _neo_window_layers},
           write=_neo_write),
    # GPT-BigCode (StarCoder): GPT-2's block, one key/value head with multi_query, its c_attn
    # rows KV group by KV group (its own layout: GPT-2's names and shape)
    Family("gpt_bigcode", "GPTBigCodeForCausalLM", **_GPT_STYLE,
           activation=("activation_function",), layout="Hugging Face GPT-BigCode",
           fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True},
           read={"norm_eps": "layer_norm_epsilon", "d_ff": _n_inner,
                 "n_kv_heads": _bigcode_kv_heads, "attn_scale": _unscaled},
           write=_bigcode_write,
           refused=(("add_cross_attention", "a decoder-only model has no cross attention"),)),
    # OPT: fairseq's pre-norm decoder, LayerNorms of eps 1e-5, learned positions from row 2
    Family("opt", "OPTForCausalLM", **_GPT_STYLE, activation=("activation_function",),
           fixed={"norm": "layernorm", "norm_eps": 1e-5, "pos": "learned",
                  "position_offset": 2},
           read={"d_model": _opt_width, "d_ff": "ffn_dim", "attn_bias": "enable_bias",
                 "mlp_bias": "enable_bias", "norm_affine": "layer_norm_elementwise_affine",
                 "norm_bias": "layer_norm_elementwise_affine",
                 # OPT-350m's post-norm blocks (do_layer_norm_before=False), without a final norm
                 "pre_norm": "do_layer_norm_before", "post_norm": _opt_post_norm,
                 "final_norm": _opt_final_norm},
           write=_opt_write),
    # BioGPT: OPT's block with biases everywhere and an embedding scaled by sqrt(D)
    Family("biogpt", "BioGptForCausalLM", **_GPT_STYLE,
           fixed={"norm": "layernorm", "norm_eps": 1e-5, "pos": "learned",
                  "position_offset": 2, "attn_bias": True, "mlp_bias": True},
           read={"embedding_scale": _biogpt_scale},
           write=lambda cfg, cls: {"scale_embedding": cfg.embedding_scale is not None}),
    Family("gptj", "GPTJForCausalLM", **_GPTJ),
    # CodeGen: GPT-J with q, k, v fused (qkv_proj in 4 shards of q, v, k rows: its layout)
    Family("codegen", "CodeGenForCausalLM", **_GPTJ),
    # Phi-1, Phi-2: Llama's names for q/k/v, one LayerNorm in front of a parallel block, partial
    # rotary, biases everywhere, a plain MLP fc1 -> fc2, a bias on the logits
    llama("phi", "PhiForCausalLM", partial_rotary=True, windows=False,
          activations=GPT_ACTIVATIONS,
          fixed={"norm": "layernorm", "attn_bias": True, "mlp_bias": True,
                 "parallel_residual": True, "shared_norm": True, "readout_bias": True},
          # per-head LayerNorms of q and k (with a shift) where qk_layernorm says, as Persimmon
          read={"norm_eps": "layer_norm_eps", "qk_norm": "qk_layernorm",
                "qk_norm_kind": _qk_layernorm_kind}),
    # Falcon: its new architecture (two norms beside each other, or one; grouped KV heads) and
    # the original (Falcon-7B: one norm, a parallel block, one KV head), q/k/v fused
    Family("falcon", "FalconForCausalLM", **_GPT_STYLE, activation=("activation",),
           fixed={"norm": "layernorm", "pos": "rope"},
           read={"norm_eps": "layer_norm_epsilon", "attn_bias": "bias", "mlp_bias": "bias",
                 "d_ff": "ffn_hidden_size", "n_kv_heads": _falcon_kv_heads,
                 "parallel_residual": _falcon_parallel, "shared_norm": _falcon_shared_norm},
           write=_falcon_write,
           refused=(("alibi", "ALiBi's linear distance biases on the scores instead of RoPE"),)),
    # ---- routed families (helper fam-moe) ----
    # FlexOlmo: OLMo 2's block (norms after the sublayers, q/k norms over the projections) in
    # front of OLMoE's router
    llama("flex_olmo", "FlexOlmoForCausalLM", experts="olmoe",
          fixed={**_ROUTED["fixed"], "pre_norm": False, "sandwich_norm": True, "qk_norm": True,
                 "qk_norm_scope": "projection"},
          read={"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                "normalize_topk": "norm_topk_prob"}),
    # dots.llm1: Qwen3's attention, DeepSeek-V3's router and shared experts
    llama("dots1", "Dots1ForCausalLM", **_V3_ROUTED, fixed={**_V3_FIXED, "qk_norm": True},
          refused=(_no_shared_mlp("n_shared_experts"),),
          read={**_V3_READ, "n_experts": "n_routed_experts",
                "n_shared_experts": "n_shared_experts", "first_dense_layers": _first_k_dense}),
    # GLM-4.5 (and Sarvam-MoE, whose config is read by this class): the first half of each head
    # rotated (partial_rotary_factor 0.5), q/k/v biases without an output bias, optional
    # per-head q/k norms, DeepSeek-V3's router
    llama("glm4_moe", "Glm4MoeForCausalLM", **_V3_ROUTED, partial_rotary=True,
          refused=(_no_shared_mlp("n_shared_experts"),),
          fixed={**_V3_FIXED, "attn_output_bias": False},
          read={**_V3_READ, "n_experts": "n_routed_experts", "qk_norm": "use_qk_norm",
                "n_shared_experts": "n_shared_experts", "first_dense_layers": _first_k_dense}),
    # Solar Open: Llama's attention without an output bias, every layer routed as GLM-4.5's
    llama("solar_open", "SolarOpenForCausalLM", **_V3_ROUTED,
          refused=(_no_shared_mlp("n_shared_experts"),),
          fixed={**_V3_FIXED, "attn_output_bias": False},
          read={**_V3_READ, "n_experts": "n_routed_experts", "n_shared_experts":
                "n_shared_experts", "d_ff": "moe_intermediate_size"}),  # no dense layer
    # HY-V3: per-head q/k norms, DeepSeek-V3's router without groups, always renormalised
    llama("hy_v3", "HYV3ForCausalLM", experts="deepseek_v3", refused=(_BIASED_MLPS,),
          fixed={**_V3_FIXED, "qk_norm": True, "normalize_topk": True},
          read={"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                "expert_width": "moe_intermediate_size",
                "routed_scaling": "router_scaling_factor", "n_shared_experts": _hy_v3_shared,
                "shared_expert_width": _hy_v3_shared_width,
                "first_dense_layers": _dense_prefix("mlp_layer_types")},
          write=_dense_prefix_write("mlp_layer_types")),
    # MiniMax-M2: q/k norms over the projections, partial rotary, a sigmoid router chosen with
    # a selection bias, always renormalised, every layer routed
    llama("minimax_m2", "MiniMaxM2ForCausalLM", experts="deepseek_v3", partial_rotary=True,
          fixed={**_V3_FIXED, "qk_norm": True, "qk_norm_scope": "projection",
                 "normalize_topk": True},
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"}),
    # Aria's text model: the k largest logits softmaxed, shared experts of intermediate_size
    llama("aria_text", "AriaTextForCausalLM", experts="mixtral",
          refused=(_BIASED_MLPS, _no_shared_mlp("moe_num_shared_experts")),
          fixed=_TOPK_SOFTMAX,
          read={"n_experts": "moe_num_experts", "experts_per_token": "moe_topk",
                "n_shared_experts": "moe_num_shared_experts"}),
    # Ernie 4.5 MoE: RoPE on interleaved pairs, softmax scores chosen with a selection bias,
    # renormalised, shared experts, routed from moe_layer_start_index every moe_layer_interval
    llama("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", experts="ernie",
          refused=(("use_bias", "biased attention and MLPs beside unbiased experts"),),
          fixed={**_ROUTED["fixed"], "router_selection_bias": True, "normalize_topk": True,
                 "rope_layout": "interleaved"},
          read={"n_experts": "moe_num_experts", "experts_per_token": "moe_k",
                "expert_width": "moe_intermediate_size",
                "n_shared_experts": "moe_num_shared_experts",
                "first_dense_layers": _ernie_dense_layers, "moe_every": "moe_layer_interval"}),
    # Mellum: Qwen3-MoE's attention and router, dense layers from mlp_layer_types, windows with
    # their own RoPE base
    llama("mellum", "MellumForCausalLM", experts="qwen_moe",
          fixed={**_ROUTED["fixed"], "qk_norm": True},
          read={"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                "normalize_topk": "norm_topk_prob", "expert_width": "moe_intermediate_size",
                "first_dense_layers": _dense_prefix("mlp_layer_types")},
          write=_mellum_write),
    # GraniteMoE: Granite's multipliers, the k largest logits softmaxed, every layer routed;
    # GraniteMoeShared adds one shared MLP of shared_intermediate_size (0: none)
    llama("granitemoe", "GraniteMoeForCausalLM", experts="mixtral", fixed=_TOPK_SOFTMAX,
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                **_GRANITE_READ}, write=_granite_write),
    llama("granitemoeshared", "GraniteMoeSharedForCausalLM", experts="mixtral",
          fixed=_TOPK_SOFTMAX, write=_granite_shared_write,
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                **_GRANITE_READ, "n_shared_experts": lambda c: int(bool(c.shared_intermediate_size)),
                "shared_expert_width": lambda c: c.shared_intermediate_size or None}),
    # EXAONE MoE: EXAONE 4's attention (per-head q/k norms, the full layers NoPE where a window
    # is set), DeepSeek-V3's router and shared experts, dense layers from mlp_layer_types
    llama("exaone_moe", "ExaoneMoeForCausalLM", **_V3_ROUTED, fixed={**_V3_FIXED, "qk_norm": True},
          refused=(_no_shared_mlp("num_shared_experts"),),
          read={**_V3_READ, "n_experts": "num_experts", "n_shared_experts": "num_shared_experts",
                "first_dense_layers": _dense_prefix("mlp_layer_types"),
                "nope_layers": _unrotated_full_layers}),
    # Kolibri 1: EXAONE 4's attention in GLM-4's sandwich block; the k largest biased logits
    # chosen, each weighed by its own logit's sigmoid; one shared expert; every layer routed
    llama("kolibri1", "Kolibri1ForCausalLM", experts="kolibri",
          refused=(_no_shared_mlp("shared_expert_intermediate_size"),),
          fixed={"router_scoring": "sigmoid", "router_order": "topk_score",
                 "router_selection_bias": True, "qk_norm": True, "sandwich_norm": True,
                 "n_shared_experts": 1},
          read={"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                "normalize_topk": "norm_topk_prob", "expert_width": "moe_intermediate_size",
                "shared_expert_width": "shared_expert_intermediate_size",
                "d_ff": "moe_intermediate_size",  # no dense layer
                "nope_layers": _unrotated_full_layers}),
    # Youtu: DeepSeek-V3's latent attention in front of a dense MLP in every layer
    Family("youtu", "YoutuForCausalLM", block="latent", windows=False,
           read={"latent_norm_eps": _latent_norm_eps}),
    # GLM-4.7-Flash: DeepSeek-V3's latent attention and router, dense layers from mlp_layer_types
    Family("glm4_moe_lite", "Glm4MoeLiteForCausalLM", block="latent", experts="deepseek_v3",
           refused=(_no_shared_mlp("n_shared_experts"),),
           windows=False, write=_dense_prefix_write("mlp_layer_types"),
           read={"first_dense_layers": _dense_prefix("mlp_layer_types"),
                 "latent_norm_eps": _latent_norm_eps}),
    # MiniCPM3: DeepSeek-V2's latent attention turning its rotary part on halves, dense MLPs,
    # the embeddings x scale_emb, each sublayer's output x scale_depth / sqrt(L), the final
    # hidden state divided by hidden_size / dim_model_base before the readout
    Family("minicpm3", "MiniCPM3ForCausalLM", block="latent", windows=False,
           fixed={"rope_layout": "rotate_half"}, write=_minicpm3_write,
           read={"latent_norm_eps": _latent_norm_eps, "embedding_scale": "scale_emb",
                 "residual_multiplier": _minicpm3_residual,
                 "logit_scale": lambda c: c.dim_model_base / c.hidden_size}),
    # ---- dense Llama-named families (helper fam-llama) ----
    *LLAMA_NAMED,
    *_POSITION_FAMILIES,  # helper fam-positions
    # ---- sinks, the clamped SwiGLU, biased routers and experts, q/k norms after RoPE,
    # position-scaled queries (helper fam-sinks) ----
    # GPT-OSS: sinks in every layer, alternating windows, YaRN; the router's biased logits, top
    # k of them, then their softmax; experts with biases on the clamped SwiGLU (its config's
    # hidden_act is read by no module: silu is the only value taken, the experts compute theirs)
    llama("gpt_oss", "GptOssForCausalLM", experts="gpt_oss",
          activations={"silu": "swiglu_clamped"},
          fixed={"router_scoring": "softmax", "router_order": "topk_score",
                 "normalize_topk": True, "attn_sinks": True, "router_bias": True,
                 "expert_bias": True, "mlp_bias": False},
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                "swiglu_alpha": "swiglu_alpha", "swiglu_limit": "swiglu_limit"}),
    # Hunyuan: per-head q/k RMSNorms on the rotated heads; no window (Llama's model); its
    # "dynamic" RoPE with an alpha a static NTK base; the MoE's router (softmax, top k,
    # renormalised) in front of E experts and one shared MLP, all intermediate_size wide
    llama("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", windows=False, rope_form=ntk_alpha,
          fixed={"qk_norm": True, "qk_norm_position": "after_rope", "mlp_bias": False}),
    llama("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", windows=False, rope_form=ntk_alpha,
          experts="hunyuan",
          fixed={**_ROUTED["fixed"], "qk_norm": True, "qk_norm_position": "after_rope",
                 "mlp_bias": False, "normalize_topk": True, "n_shared_experts": 1},
          read={"n_experts": hunyuan_experts, "experts_per_token": hunyuan_topk},
          write=lambda cfg, cls: {"num_experts": cfg.n_experts, "moe_topk": cfg.experts_per_token}),
    # Ministral 3: Mistral's block, each query times 1 + beta ln(1 + floor(pos / L)) after RoPE
    llama("ministral3", "Ministral3ForCausalLM", write=ministral3_write,
          read={"query_position_scale": ministral3_query_scale}),
    # Granite SWA: Granite's multipliers, sinks in every layer, windows on layer_types, a RoPE
    # base per layer (0: NoPE); GraniteMoe SWA: its routed block (top k of the logits, then
    # their softmax) and optional shared MLP
    llama("granite_swa", "GraniteSWAForCausalLM", write=swa_write,
          fixed={"attn_sinks": True}, read=SWA_READ),
    llama("granitemoe_swa", "GraniteMoeSWAForCausalLM", experts="granitemoe", write=swa_write,
          fixed={"attn_sinks": True, "router_scoring": "softmax", "router_order": "topk_score",
                 "normalize_topk": True, "mlp_bias": False},
          read={**SWA_READ, "n_experts": "num_local_experts",
                "experts_per_token": "num_experts_per_tok",
                "n_shared_experts": lambda c: 1 if c.shared_intermediate_size else 0,
                "shared_expert_width": lambda c: c.shared_intermediate_size or None}),
    # Flint: Qwen3-MoE's attention with sinks, RoPE only in its windowed layers; sigmoid
    # routing, an ungated shared expert, dense layers first
    llama("flint", "FlintForCausalLM", experts="qwen_moe", write=_qwen_moe_write,
          fixed={"qk_norm": True, "attn_sinks": True, "router_scoring": "sigmoid",
                 "router_order": "score_topk", "n_shared_experts": 1},
          read={**_QWEN_MOE, "shared_expert_width": "shared_expert_intermediate_size",
                "nope_layers": windowed_rope_only}),
    # Cohere 2 MoE: Cohere 2's parallel block with one norm (RMSNorm where rms_norm_eps is set,
    # else a LayerNorm without shift), interleaved RoPE only in the windowed and dense-prefix
    # layers, logits times logit_scale; top k of the logits, then their softmax (or sigmoids,
    # renormalised), shared experts intermediate_size wide each, averaged with the routed sum
    # (its own block: the norm's kind is read, not Llama's RMSNorm)
    Family("cohere2_moe", "Cohere2MoeForCausalLM", block="cohere", experts="cohere2_moe",
           write=cohere2_moe_write,
           fixed={"pos": "rope", "parallel_residual": True, "shared_norm": True,
                  "rope_layout": "interleaved", "router_order": "topk_score", "mlp_bias": False},
           read={"attn_bias": "attention_bias",
                 "norm": lambda c: "layernorm" if c.rms_norm_eps is None else "rmsnorm",
                 "norm_eps": lambda c: c.layer_norm_eps if c.rms_norm_eps is None
                 else c.rms_norm_eps,
                 "norm_bias": lambda c: c.rms_norm_eps is not None,
                 "logit_scale": "logit_scale", "n_experts": "num_experts",
                 "experts_per_token": "num_experts_per_tok", "expert_width": "intermediate_size",
                 "d_ff": cohere2_moe_dense_width, "first_dense_layers": cohere2_moe_prefix,
                 "router_scoring": cohere2_moe_scoring,
                 "normalize_topk": lambda c: c.expert_selection_fn == "softmax"
                 or c.norm_topk_prob,
                 "n_shared_experts": "num_shared_experts",
                 "routed_scaling": lambda c: cohere2_moe_average(c) or 1.0,
                 "shared_expert_scale": lambda c: cohere2_moe_average(c) or 1.0,
                 "nope_layers": cohere2_moe_nope}),
)
"""Every family read as a spec, in the order the writer tries them: where two families read
back the same DecoderConfig the first is written (Mistral before Phi-3 and Qwen2 for a plain
grouped-query Llama with a window)."""

BY_TYPE: Mapping[str, Family] = MappingProxyType({f.model_type: f for f in FAMILIES})
# class name -> the first family (in the table's order) whose class it is
BY_CLASS: Mapping[str, Family] = MappingProxyType(
    {f.model_class: f for f in reversed(FAMILIES)})


def family(model_type: str) -> Family | None:
    """The entry of a model_type (a family's own), or None."""
    return BY_TYPE.get(model_type)


def present(module: Any, *, converter: bool | None = None) -> dict[str, type]:
    """model_type -> class for each family whose class the transformers module `module` has
    (a release lacks Qwen3 before 4.51, Gemma 3 before 4.50, OLMo 2 before 4.47): every family,
    or only the converter's (converter=True) or only the layouts' (False)."""
    found = {}
    for entry in FAMILIES:
        if converter is not None and entry.converter != converter:
            continue
        cls = getattr(module, entry.model_class, None)  # a lazy module: AttributeError -> None
        if cls is not None:
            found[entry.model_type] = cls
    return found


# ---- the families left black-box, with what they lack -------------------------------------------

_HYBRID = "recurrent, convolutional or linear-attention layers beside (or instead of) attention"
_ENCODER = ("an encoder block run causally: LayerNorm after each residual add (post-norm), an "
            "embedding LayerNorm, token-type embeddings, an MLM head transform before the readout")
_SEQ2SEQ = ("the decoder of an encoder-decoder family: cross-attention blocks, an embedding "
            "LayerNorm, positions offset by 2 or sinusoidal")
_SPARSE_INDEX = ("a learned indexer choosing each query's keys (DeepSeek sparse attention), "
                 "beside latent attention")
_GEMMA_3N = "key/value sharing across layers, per-layer inputs and AltUp (Gemma 3n, Gemma 4)"

_LLAMA4 = ("chunked attention (its RoPE layers read only their own attention_chunk_size block), "
           "a weightless L2 norm of q and k in its RoPE layers only, experts fed the router's "
           "score times the token (router weight on the input), and a query temperature counted "
           "in cache slots, not positions")

BLACK_BOX: Mapping[str, str] = MappingProxyType({
    # hybrids, recurrent and state-space models
    **{t: _HYBRID for t in (
        "mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm", "jamba", "bamba",
        "zamba", "zamba2", "falcon_h1", "granitemoehybrid", "nemotron_h", "olmo_hybrid",
        "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen4_exp",
        "qwen4_exp_text", "lfm2", "lfm2_moe", "lfm3", "kimi_linear", "minimax", "lara_mini",
        "bailing_hybrid", "inkling_text", "inkling2_text", "inkling2_loop_text")},
    # encoder blocks run causally, and seq2seq decoders
    **{t: _ENCODER for t in (
        "bert", "bert-generation", "camembert", "data2vec-text", "electra", "ernie",
        "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "xlm-roberta",
        "xlm-roberta-xl", "xmod", "xlm")},
    **{t: _SEQ2SEQ for t in (
        "bart", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart",
        "trocr", "whisper")},
    **{t: _SPARSE_INDEX for t in ("deepseek_v32", "glm_moe_dsa", "axk2", "dots3_note",
                                  "dots3_note_text", "minimax_m3_vl_text")},
    **{t: _GEMMA_3N for t in ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
                              "gemma4_assistant", "gemma4_unified", "gemma4_unified_text",
                              "gemma4_unified_assistant")},
    "big_bird": "block-sparse attention", "bigbird_pegasus": "block-sparse attention",
    "reformer": "LSH and chunked attention", "prophetnet": "n-gram prediction streams",
    "xlnet": "two-stream permutation attention", "blt": "byte latent patches",
    "cpmant": "a relative-position bucket bias on the scores (T5-style), prompt embeddings",
    "ctrl": "sinusoidal positions (sines of the even columns, cosines of the odd ones)",
    "diffllama": "differential attention (two softmax maps subtracted with a learned lambda)",
    "doge": "dynamic-mask attention (a value-dependent bias on every key)",
    "dory": "nGPT's normalised residual (unit-norm interpolation) and shared keys and values",
    "jetmoe": "a mixture of attention heads (routed q and o projections)",
    "longcat_flash": "two attention and MLP sublayers per layer with a shortcut MoE and zero "
                     "experts",
    "zaya": "convolution-mixed queries and keys (CCA) and delayed recurrent values",
    "hrm_text": "two weight-shared stacks iterated in cycles",
    "deepseek_v4": "hyper-connections and compressed keys and values",
    "hy_v4": "hyper-connections and compressed keys and values",
    "bitnet": "ternary quantised weights and activations, and norms inside attention and MLP",
    "phimoe": "sparsemixer routing (a masked two-stage top 2) and LongRoPE scaling",
    "dbrx": "q, k and v clamped (clip_qkv), experts renormalised by a p-norm",
    "afmoe": "a gated attention output (the heads times a sigmoid of x) and NoPE layers",
    "laguna": "a gated attention output, heads per layer, a soft-capped router",
    "mimo_v2_flash": "value heads of another width, a value scale, windowed layers with their "
                     "own key/value heads, attention sinks in the windowed layers only",
    "beam": "a gated attention output, query scaling by position, a depth-scaled residual",
    "axk1": "a norm on the routed MLP's output only",
    "nanochat": "norms without gains, a norm of the embeddings, RoPE turned the other way",
    "modernbert-decoder": "an embedding norm, a readout transform (dense, GELU, LayerNorm), no "
                          "attention norm in layer 0",
    "mllama": "cross-attention layers to image features",
    "gemma3": "the text model inside an image-text model (Gemma3ForConditionalGeneration)",
    "fuyu": "the text model inside an image-text model (FuyuForCausalLM)",
    "phi4_multimodal": "modality adapters around the text model",
    "git": "an image encoder in front", "got_ocr2": "an image encoder in front",
    "moss_transcribe_diarize": "an audio encoder in front",
    "moshi": "multi-codebook audio streams", "musicgen": "multi-codebook audio streams",
    "musicgen_melody": "multi-codebook audio streams",
    "csm": "two stacks fed by audio codebooks",
    # ---- helper fam-sinks: what Llama 4 has beyond NoPE layers, position-scaled queries,
    # shared experts and experts stored in -> out (all expressed) ----
    **{t: _LLAMA4 for t in ("llama4_text", "llama4")},
})
"""model_type -> what its decoder has that no DecoderConfig expresses: the families audited
black-box on purpose (`hf.hf_reference` says why; docs/conformance.md lists them). A family
joins FAMILIES, and leaves this table, when a DecoderConfig expresses it."""
