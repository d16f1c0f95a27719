"""The routed families of the families table (`families.FAMILIES`): Llama's attention in front
of routed experts (DeepSeek's latent attention is families_latent.py's). Mixtral, Qwen-MoE and
OLMoE first; then the routers derived from them and from DeepSeek-V3's (FlexOlmo, dots.llm1,
GLM-4.5, Solar Open, HY-V3, MiniMax-M2, Aria, Ernie 4.5 MoE, Mellum, GraniteMoE, EXAONE MoE,
Kolibri 1); then the routers with biases, sinks or windowed RoPE (GPT-OSS, Hunyuan MoE,
GraniteMoe SWA, Flint, Cohere 2 MoE).
Beside the entries, the functions they read fields through (`Family.read`) and their inverses
for the writer (`Family.write`). Each reads exactly what the family's modeling code computes
with, and raises `Unexpressed` (named among the refusals) or `InvalidHFConfig` (no model) where
that is not a DecoderConfig's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .families_llama import (GRANITE_READ, SWA_READ, ntk_alpha, rope_only_in_windows,
                             rope_only_where_windowed, swa_write)
from .family_entry import CLIPPED, Family, llama, takes
from .family_errors import InvalidHFConfig, Unexpressed

# ---- Mixtral, Qwen-MoE, OLMoE: softmax then top k ----------------------------------------------

_ROUTED = dict(fixed={"router_scoring": "softmax", "router_order": "score_topk"})


def _qwen2_moe_qkv_bias(config: Any) -> bool:
    """Qwen2-MoE's q/k/v biases: its config's qkv_bias from transformers 5, always on before
    (a release whose config does not take qkv_bias)."""
    return not takes(type(config), "qkv_bias") or bool(config.qkv_bias)


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


# Qwen-MoE's experts: moe_intermediate_size wide, dense layers first, then every
# decoder_sparse_step-th layer routed
_QWEN_MOE = {"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
             "normalize_topk": "norm_topk_prob", "expert_width": "moe_intermediate_size",
             "first_dense_layers": _qwen_dense_layers, "moe_every": "decoder_sparse_step"}
_OLMOE_READ = {"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
               "normalize_topk": "norm_topk_prob"}

ROUTED: tuple[Family, ...] = (
    # Llama's attention with a router, softmax then top k, in front of E experts
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
    llama("olmoe", "OlmoeForCausalLM", experts="olmoe", refused=(CLIPPED,),
          fixed={**_ROUTED["fixed"], "qk_norm": True, "qk_norm_scope": "projection"},
          read=_OLMOE_READ),
)


# ---- routed families (helper fam-moe) ----------------------------------------------------------

def first_k_dense(config: Any) -> int:
    """DeepSeek's dense layers first: first_k_dense_replace."""
    return config.first_k_dense_replace or 0  # Dots1's may be None: no dense layer


def dense_prefix(attribute: str) -> Callable[[Any], int]:
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


def dense_prefix_write(attribute: str) -> Callable[[Any, type], dict[str, Any]]:
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
    return {**dense_prefix_write("mlp_layer_types")(cfg, config_class),
            "rope_parameters": {"full_attention": full, "sliding_attention": local}}


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
# GraniteMoeShared's (and GraniteMoe SWA's) one shared MLP, of shared_intermediate_size (0: none)
_GRANITE_SHARED = {"n_shared_experts": lambda c: int(bool(c.shared_intermediate_size)),
                   "shared_expert_width": lambda c: c.shared_intermediate_size or None}
# the k largest logits, scored by a softmax among themselves (a distribution already)
_TOPK_SOFTMAX = {"router_scoring": "softmax", "router_order": "topk_score",
                 "normalize_topk": True}


def _checkpoint_rotary_dim(config: Any) -> int | None:
    """MiniMax-M2's checkpoints declare the rotated width as rotary_dim (64 of each 128-wide
    head). transformers 5.18 (#48486) reads it into rope_parameters' partial_rotary_factor; 5.17
    kept it as an attribute nothing read and rotated every feature (#48241). The declared
    architecture is the checkpoint's: its rotary_dim where the RoPE fields hold no factor (None
    leaves them to the RoPE reader)."""
    declared = getattr(config, "rotary_dim", None)
    factor = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    if isinstance(declared, int) and not isinstance(declared, bool) and factor == 1.0:
        return declared if declared < config.head_dim else None
    return None


def no_shared_mlp(attribute: str) -> tuple:
    """A block that builds its shared MLP whatever: of width 0 where `attribute` is 0, its
    zero-size weights a shape no DecoderConfig has (refused, never left over in params)."""
    return (attribute, "a shared MLP of width 0 (zero-size weights; no shared experts is "
            "n_shared_experts=0 without them)", lambda value: value == 0)


_BIASED_MLPS = ("mlp_bias", "biased dense and shared MLPs beside unbiased experts: routed "
                "layers have no biases here")

ROUTED_DERIVED: tuple[Family, ...] = (
    # FlexOlmo: OLMo 2's block (norms after the sublayers, q/k norms over the projections) in
    # front of OLMoE's router
    llama("flex_olmo", "FlexOlmoForCausalLM", experts="olmoe",
          fixed={**_ROUTED["fixed"], "pre_norm": False, "sandwich_norm": True, "qk_norm": True,
                 "qk_norm_scope": "projection"}, read=_OLMOE_READ),
    # dots.llm1: Qwen3's attention, DeepSeek-V3's router and shared experts
    llama("dots1", "Dots1ForCausalLM", **_V3_ROUTED, fixed={**_V3_FIXED, "qk_norm": True},
          refused=(no_shared_mlp("n_shared_experts"),),
          read={**_V3_READ, "n_experts": "n_routed_experts",
                "n_shared_experts": "n_shared_experts", "first_dense_layers": first_k_dense}),
    # GLM-4.5 (and Sarvam-MoE, whose config is read by this class): the first half of each head
    # rotated (partial_rotary_factor 0.5), q/k/v biases without an output bias, optional
    # per-head q/k norms, DeepSeek-V3's router
    llama("glm4_moe", "Glm4MoeForCausalLM", **_V3_ROUTED, partial_rotary=True,
          refused=(no_shared_mlp("n_shared_experts"),),
          fixed={**_V3_FIXED, "attn_output_bias": False},
          read={**_V3_READ, "n_experts": "n_routed_experts", "qk_norm": "use_qk_norm",
                "n_shared_experts": "n_shared_experts", "first_dense_layers": first_k_dense}),
    # Solar Open: Llama's attention without an output bias, every layer routed as GLM-4.5's
    llama("solar_open", "SolarOpenForCausalLM", **_V3_ROUTED,
          refused=(no_shared_mlp("n_shared_experts"),),
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
                "first_dense_layers": dense_prefix("mlp_layer_types")},
          write=dense_prefix_write("mlp_layer_types")),
    # MiniMax-M2: q/k norms over the projections, partial rotary, a sigmoid router chosen with
    # a selection bias, always renormalised, every layer routed
    llama("minimax_m2", "MiniMaxM2ForCausalLM", experts="deepseek_v3", partial_rotary=True,
          fixed={**_V3_FIXED, "qk_norm": True, "qk_norm_scope": "projection",
                 "normalize_topk": True},
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                "rotary_dim": _checkpoint_rotary_dim}),
    # Aria's text model: the k largest logits softmaxed, shared experts of intermediate_size
    llama("aria_text", "AriaTextForCausalLM", experts="mixtral",
          refused=(_BIASED_MLPS, no_shared_mlp("moe_num_shared_experts")),
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
                "first_dense_layers": dense_prefix("mlp_layer_types")},
          write=_mellum_write),
    # GraniteMoE: Granite's multipliers, the k largest logits softmaxed, every layer routed;
    # GraniteMoeShared adds one shared MLP of shared_intermediate_size (0: none)
    llama("granitemoe", "GraniteMoeForCausalLM", experts="mixtral", fixed=_TOPK_SOFTMAX,
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                **GRANITE_READ}, write=_granite_write),
    llama("granitemoeshared", "GraniteMoeSharedForCausalLM", experts="mixtral",
          fixed=_TOPK_SOFTMAX, write=_granite_shared_write,
          read={"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                **GRANITE_READ, **_GRANITE_SHARED}),
    # EXAONE MoE: EXAONE 4's attention (per-head q/k norms, the full layers NoPE where a window
    # is set), DeepSeek-V3's router and shared experts, dense layers from mlp_layer_types
    llama("exaone_moe", "ExaoneMoeForCausalLM", **_V3_ROUTED, fixed={**_V3_FIXED, "qk_norm": True},
          refused=(no_shared_mlp("num_shared_experts"),),
          read={**_V3_READ, "n_experts": "num_experts", "n_shared_experts": "num_shared_experts",
                "first_dense_layers": dense_prefix("mlp_layer_types"),
                "nope_layers": rope_only_where_windowed}),
    # Kolibri 1: EXAONE 4's attention in GLM-4's sandwich block; the k largest biased logits
    # chosen, each weighed by its own logit's sigmoid; one shared expert; every layer routed
    llama("kolibri1", "Kolibri1ForCausalLM", experts="kolibri",
          refused=(no_shared_mlp("shared_expert_intermediate_size"),),
          fixed={"router_scoring": "sigmoid", "router_order": "topk_score",
                 "router_selection_bias": True, "qk_norm": True, "sandwich_norm": True,
                 "n_shared_experts": 1},
          read={"n_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                "normalize_topk": "norm_topk_prob", "expert_width": "moe_intermediate_size",
                "shared_expert_width": "shared_expert_intermediate_size",
                "d_ff": "moe_intermediate_size",  # no dense layer
                "nope_layers": rope_only_where_windowed}),
)


# ---- routers with biases, sinks or windowed RoPE (helper fam-sinks) -----------------------------

def _hunyuan_experts(config: Any) -> int:
    """Hunyuan-MoE's E; a list (E and k per layer) is not expressed."""
    experts, k = config.num_experts, config.moe_topk
    if isinstance(experts, list) or isinstance(k, list):
        raise Unexpressed(f"num_experts={experts!r}, moe_topk={k!r} (experts per layer: one E "
                          "and one k for every routed layer)")
    return experts


def _hunyuan_topk(config: Any) -> int | None:
    """Hunyuan-MoE's k (a list: refused with its E, by `_hunyuan_experts`)."""
    return None if isinstance(config.moe_topk, list) else config.moe_topk


def _cohere2_moe_dense_width(config: Any) -> int:
    """The dense prefix's width: prefix_dense_intermediate_size, or intermediate_size."""
    return config.prefix_dense_intermediate_size or config.intermediate_size


def _cohere2_moe_scoring(config: Any) -> str:
    if config.expert_selection_fn not in ("softmax", "sigmoid"):
        raise InvalidHFConfig(f"expert_selection_fn={config.expert_selection_fn!r} (its router "
                              "computes softmax or sigmoid)")
    return config.expert_selection_fn


def _cohere2_moe_halved(config: Any) -> float:
    """0.5 where the shared experts are averaged with the routed sum ((routed + shared) / 2:
    both halved: routed_scaling and shared_expert_scale), 1 where they are added (or there are
    none)."""
    strategy = config.shared_expert_combination_strategy
    if strategy not in ("average", "sum"):
        raise InvalidHFConfig(f"shared_expert_combination_strategy={strategy!r} (average or "
                              "sum)")
    return 0.5 if config.num_shared_experts and strategy == "average" else 1.0


def _cohere2_moe_nope(config: Any) -> tuple[int, ...] | None:
    """Cohere 2 MoE rotates in its windowed layers, and in its dense prefix where
    prefix_dense_sliding_window_pattern is 1 (force_rope): the other layers are NoPE."""
    kinds, mlps = list(config.layer_types), list(config.mlp_layer_types)
    forced = config.prefix_dense_sliding_window_pattern == 1
    nope = tuple(i for i, kind in enumerate(kinds)
                 if (kind != "sliding_attention" or config.sliding_window is None)
                 and not (forced and mlps[i] == "dense"))
    return nope or None


def _cohere2_moe_write(cfg: Any, config_class: type) -> dict[str, Any]:
    """Cohere 2 MoE's fields for cfg (the inverse of its function reads): norms, the dense
    prefix, the router's scoring, the shared experts' combination, the layers' kinds."""
    dense = ["dense" if i < cfg.first_dense_layers else "sparse" for i in range(cfg.n_layers)]
    rms = cfg.norm == "rmsnorm"
    averaged = cfg.shared_expert_scale == 0.5 and cfg.routed_scaling == 0.5
    return {"rms_norm_eps": cfg.norm_eps if rms else None,
            "layer_norm_eps": 1e-5 if rms else cfg.norm_eps,
            "prefix_dense_intermediate_size": cfg.d_ff, "mlp_layer_types": dense,
            "expert_selection_fn": cfg.router_scoring, "norm_topk_prob": cfg.normalize_topk,
            "shared_expert_combination_strategy": "average" if averaged else "sum"}


def _swiglu_clamp(field: str, hard_coded: float) -> Callable[[Any], Any]:
    """gpt-oss's clamped SwiGLU constant `field` from its config, or, from a release whose config
    has no such field (4.55 to 4.57: GptOssExperts set alpha = 1.702 and limit = 7.0 itself), the
    value that release's module computes with."""
    def read(config: Any) -> Any:
        return getattr(config, field) if hasattr(config, field) else hard_coded

    read.__name__ = field
    return read


# GPT-OSS: sinks in every layer, alternating windows, YaRN; the router's biased logits, top k of
# them, then their softmax; experts with biases on the clamped SwiGLU (its config's hidden_act is
# read by no module: silu is the only value taken, the experts compute theirs)
GPT_OSS = llama("gpt_oss", "GptOssForCausalLM", experts="gpt_oss",
                activations={"silu": "swiglu_clamped"},
                fixed={**_TOPK_SOFTMAX, "attn_sinks": True, "router_bias": True,
                       "expert_bias": True, "mlp_bias": False},
                read={"n_experts": "num_local_experts",
                      "experts_per_token": "num_experts_per_tok",
                      "swiglu_alpha": _swiglu_clamp("swiglu_alpha", 1.702),
                      "swiglu_limit": _swiglu_clamp("swiglu_limit", 7.0)})
# Hunyuan MoE: Hunyuan's attention (`families_llama.HUNYUAN_DENSE`); the router (softmax, top k,
# renormalised) in front of E experts and one shared MLP, all intermediate_size wide
HUNYUAN_MOE = llama("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", windows=False,
                    rope_form=ntk_alpha, experts="hunyuan",
                    fixed={**_ROUTED["fixed"], "qk_norm": True, "qk_norm_position": "after_rope",
                           "mlp_bias": False, "normalize_topk": True, "n_shared_experts": 1},
                    read={"n_experts": _hunyuan_experts, "experts_per_token": _hunyuan_topk},
                    write=lambda cfg, cls: {"num_experts": cfg.n_experts,
                                            "moe_topk": cfg.experts_per_token})
WINDOWED_ROUTED: tuple[Family, ...] = (
    # GraniteMoe SWA: Granite SWA's block (`families_llama`), its routed block (top k of the
    # logits, then their softmax) and optional shared MLP
    llama("granitemoe_swa", "GraniteMoeSWAForCausalLM", experts="granitemoe", write=swa_write,
          fixed={"attn_sinks": True, **_TOPK_SOFTMAX, "mlp_bias": False},
          read={**SWA_READ, "n_experts": "num_local_experts",
                "experts_per_token": "num_experts_per_tok", **_GRANITE_SHARED}),
    # Flint: Qwen3-MoE's attention with sinks, RoPE only in its windowed layers; sigmoid
    # routing, an ungated shared expert, dense layers first
    llama("flint", "FlintForCausalLM", experts="qwen_moe", write=_qwen_moe_write,
          fixed={"qk_norm": True, "attn_sinks": True, "router_scoring": "sigmoid",
                 "router_order": "score_topk", "n_shared_experts": 1},
          read={**_QWEN_MOE, "shared_expert_width": "shared_expert_intermediate_size",
                "nope_layers": rope_only_in_windows}),
    # Cohere 2 MoE: Cohere 2's parallel block with one norm (RMSNorm where rms_norm_eps is set,
    # else a LayerNorm without shift), interleaved RoPE only in the windowed and dense-prefix
    # layers, logits times logit_scale; top k of the logits, then their softmax (or sigmoids,
    # renormalised), shared experts intermediate_size wide each, averaged with the routed sum
    # (its own block: the norm's kind is read, not Llama's RMSNorm)
    Family("cohere2_moe", "Cohere2MoeForCausalLM", block="cohere", experts="cohere2_moe",
           write=_cohere2_moe_write,
           fixed={"pos": "rope", "parallel_residual": True, "shared_norm": True,
                  "rope_layout": "interleaved", "router_order": "topk_score", "mlp_bias": False},
           read={"attn_bias": "attention_bias",
                 "norm": lambda c: "layernorm" if c.rms_norm_eps is None else "rmsnorm",
                 "norm_eps": lambda c: c.layer_norm_eps if c.rms_norm_eps is None
                 else c.rms_norm_eps,
                 "norm_bias": lambda c: c.rms_norm_eps is not None,
                 "logit_scale": "logit_scale", "n_experts": "num_experts",
                 "experts_per_token": "num_experts_per_tok", "expert_width": "intermediate_size",
                 "d_ff": _cohere2_moe_dense_width,
                 "first_dense_layers": dense_prefix("mlp_layer_types"),
                 "router_scoring": _cohere2_moe_scoring,
                 "normalize_topk": lambda c: c.expert_selection_fn == "softmax"
                 or c.norm_topk_prob,
                 "n_shared_experts": "num_shared_experts",
                 "routed_scaling": _cohere2_moe_halved, "shared_expert_scale": _cohere2_moe_halved,
                 "nope_layers": _cohere2_moe_nope}),
)
