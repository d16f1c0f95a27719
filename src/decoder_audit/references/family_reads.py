"""What the families of references/families.py whose decoders need attention sinks, the clamped
SwiGLU, biased routers and experts, q/k norms after RoPE or position-scaled queries (GPT-OSS,
Hunyuan, Ministral 3, Granite SWA, GraniteMoe SWA, Flint, Cohere 2 MoE) derive from their
configs: the functions their entries read fields through (`Family.read`), and their inverses
for the writer (`Family.write`). Each reads exactly what the family's modeling code computes
with, and raises `Unexpressed` (named among the refusals) or `InvalidHFConfig` (no model) where
that is not a DecoderConfig's."""

from __future__ import annotations

from typing import Any

from .family_errors import InvalidHFConfig, Unexpressed


def ntk_alpha(rope: dict, config: Any) -> dict:
    """Hunyuan's "dynamic" RoPE with an alpha is static NTK (compute_ntk_alpha_rope_parameters):
    the base theta * alpha ** (Dh / (Dh - 2)), on every position, never stretched again."""
    if rope.get("rope_type") != "dynamic" or not rope.get("alpha"):
        return rope
    dim = config.head_dim
    theta = rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2))
    return {"rope_type": "default", "rope_theta": theta,
            "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0)}


def hunyuan_experts(config: Any) -> int:
    """Hunyuan-MoE's E; a list (E and k per layer) is not expressed."""
    experts, k = config.num_experts, config.moe_topk
    if isinstance(experts, list) or isinstance(k, list):
        raise Unexpressed(f"num_experts={experts!r}, moe_topk={k!r} (experts per layer: one E "
                          "and one k for every routed layer)")
    return experts


def hunyuan_topk(config: Any) -> int | None:
    """Hunyuan-MoE's k (a list: refused with its E, by `hunyuan_experts`)."""
    return None if isinstance(config.moe_topk, list) else config.moe_topk


def _rope_dict(config: Any) -> dict:
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
                or {})


def ministral3_query_scale(config: Any) -> dict | None:
    """Ministral 3's queries times 1 + beta ln(1 + floor(pos / original)) in every layer
    (get_llama_4_attn_scale: llama_4_scaling_beta over original_max_position_embeddings, both
    in rope_parameters; its attention multiplies by whatever they are, so a missing one is no
    model at all). beta 0 scales nothing."""
    rope = _rope_dict(config)
    beta, length = rope.get("llama_4_scaling_beta"), rope.get("original_max_position_embeddings")
    if beta is None or not length:
        raise InvalidHFConfig(f"rope_parameters llama_4_scaling_beta={beta!r}, "
                              f"original_max_position_embeddings={length!r}: Ministral 3's "
                              "attention scales its queries by both")
    return {"beta": float(beta), "length": int(length)} if beta else None


def ministral3_write(cfg: Any, config_class: type) -> dict[str, Any]:
    """Ministral 3's rope_parameters keys of the query scale, beta and length, beside the RoPE
    fields (a RoPE with its own original length keeps it: the read-back decides whether the two
    agree)."""
    scale = cfg.query_position_scale or {"beta": 0.0, "length": cfg.max_seq_len}
    return {"rope_parameters": {"llama_4_scaling_beta": scale["beta"],
                                "original_max_position_embeddings": scale["length"]}}


def _layer_bases(config: Any) -> dict[str, Any]:
    """Granite SWA's layer_rope_theta (a RoPE base per layer, 0: no RoPE) as nope_layers,
    rope_theta and window_rope_theta: one base for the full layers and one for the windowed
    ones (whose RoPE is then never scaled), or it is not expressed."""
    thetas = list(getattr(config, "layer_rope_theta", None) or [])
    if not thetas:
        return {}
    kinds = list(getattr(config, "layer_types", None) or [])
    windowed = {i for i, kind in enumerate(kinds) if kind == "sliding_attention"} \
        if getattr(config, "sliding_window", None) is not None else set()
    full = {float(t) for i, t in enumerate(thetas) if t and i not in windowed}
    local = {float(t) for i, t in enumerate(thetas) if t and i in windowed}
    scaled = _rope_dict(config).get("rope_type", "default") != "default"
    if len(thetas) != config.num_hidden_layers or len(full) > 1 or len(local) > 1 or (
            full and local and full != local and scaled):
        raise Unexpressed(f"layer_rope_theta={thetas} (one RoPE base for the full layers and "
                          "one, never scaled, for the windowed layers: rope_theta, "
                          "window_rope_theta)")
    bases = {"nope_layers": tuple(i for i, t in enumerate(thetas) if not t) or None}
    if full or local:
        bases["rope_theta"] = next(iter(full or local))
    if full and local and full != local:
        bases["window_rope_theta"] = next(iter(local))
    return bases


def swa_embedding_scale(config: Any) -> float | None:
    """Granite's embedding_multiplier (1: nothing)."""
    scale = float(config.embedding_multiplier)
    return None if scale == 1.0 else scale


def swa_logit_scale(config: Any) -> float:
    """Granite divides its logits by logits_scaling."""
    if not config.logits_scaling:
        raise InvalidHFConfig(f"logits_scaling={config.logits_scaling!r}: the logits are divided "
                              "by it")
    return 1.0 / float(config.logits_scaling)


SWA_READ = {"embedding_scale": swa_embedding_scale, "attn_scale": "attention_multiplier",
             "residual_multiplier": "residual_multiplier", "logit_scale": swa_logit_scale,
             "nope_layers": lambda c: _layer_bases(c).get("nope_layers"),
             "rope_theta": lambda c: _layer_bases(c).get("rope_theta"),
             "window_rope_theta": lambda c: _layer_bases(c).get("window_rope_theta")}


def swa_write(cfg: Any, config_class: type) -> dict[str, Any]:
    """Granite SWA's multipliers and per-layer bases for cfg (the inverse of SWA_READ)."""
    bases = [0.0 if not cfg.rotates(i) else
             (cfg.window_rope_theta if cfg.window(i) and cfg.window_rope_theta else cfg.rope_theta)
             for i in range(cfg.n_layers)]
    fields: dict[str, Any] = {"embedding_multiplier": cfg.embedding_scale or 1.0,
                              "logits_scaling": 1.0 / cfg.logit_scale, "layer_rope_theta": bases}
    if cfg.routed:
        fields["shared_intermediate_size"] = cfg.shared_dim
    return fields


def windowed_rope_only(config: Any) -> tuple[int, ...] | None:
    """Flint rotates only in its windowed layers: every other layer is NoPE (all of them
    without a window)."""
    kinds = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    nope = tuple(i for i, kind in enumerate(kinds) if kind != "sliding_attention" or window is None)
    return nope or None


def cohere2_moe_prefix(config: Any) -> int:
    """Cohere 2 MoE's dense layers (mlp_layer_types "dense"), which must be the first ones."""
    kinds = list(config.mlp_layer_types)
    dense = [i for i, kind in enumerate(kinds) if kind == "dense"]
    if dense != list(range(len(dense))) or not set(kinds) <= {"dense", "sparse"}:
        raise Unexpressed(f"mlp_layer_types={kinds} (the dense layers must be the first ones: "
                          "first_dense_layers)")
    return len(dense)


def cohere2_moe_dense_width(config: Any) -> int:
    """The dense prefix's width: prefix_dense_intermediate_size, or intermediate_size."""
    return config.prefix_dense_intermediate_size or config.intermediate_size


def cohere2_moe_scoring(config: Any) -> str:
    if config.expert_selection_fn not in ("softmax", "sigmoid"):
        raise InvalidHFConfig(f"expert_selection_fn={config.expert_selection_fn!r} (its router "
                              "computes softmax or sigmoid)")
    return config.expert_selection_fn


def cohere2_moe_average(config: Any) -> float | None:
    """0.5 where the shared experts are averaged with the routed sum ((routed + shared) / 2:
    both halved), None where they are added (or there are none)."""
    strategy = config.shared_expert_combination_strategy
    if strategy not in ("average", "sum"):
        raise InvalidHFConfig(f"shared_expert_combination_strategy={strategy!r} (average or "
                              "sum)")
    return 0.5 if config.num_shared_experts and strategy == "average" else None


def cohere2_moe_nope(config: Any) -> tuple[int, ...] | None:
    """Cohere 2 MoE rotates in its windowed layers, and in its dense prefix where
    prefix_dense_sliding_window_pattern is 1 (force_rope): the other layers are NoPE."""
    kinds, mlps = list(config.layer_types), list(config.mlp_layer_types)
    forced = config.prefix_dense_sliding_window_pattern == 1
    nope = tuple(i for i, kind in enumerate(kinds)
                 if (kind != "sliding_attention" or config.sliding_window is None)
                 and not (forced and mlps[i] == "dense"))
    return nope or None


def cohere2_moe_write(cfg: Any, config_class: type) -> dict[str, Any]:
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
