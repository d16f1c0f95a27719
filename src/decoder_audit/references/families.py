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
    experts      how its routed experts are declared ("mixtral", "qwen_moe", "olmoe", or None
                 for a dense MLP); `block` the reader of a block unlike Llama's ("gpt2",
                 "gpt_neox", "latent": DeepSeek's latent attention in front of routed experts).

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
    "deepseek_v2", "gpt_oss", "hunyuan", "granitemoe" (the router's form), None for a dense
    MLP."""
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


FAMILIES: tuple[Family, ...] = (
    # the converter's families (rename tables; Llama's RoPE rows permuted)
    Family("gpt2", "GPT2LMHeadModel", block="gpt2", converter=True, windows=False, grouped=False,
           layout_written=False,
           activation=("activation_function",),
           activations={"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "gelu": "gelu", "relu": "relu"},
           fixed={"norm": "layernorm", "pos": "learned", "attn_bias": True, "mlp_bias": True},
           read={"norm_eps": "layer_norm_epsilon",
                 "d_ff": lambda c: c.n_inner if c.n_inner is not None else 4 * c.n_embd},
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
                 "attn_bias": lambda c: bool(getattr(c, "attention_bias", True))},
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
           windows=False),
    Family("deepseek_v2", "DeepseekV2ForCausalLM", block="latent", experts="deepseek_v2",
           windows=False),
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
