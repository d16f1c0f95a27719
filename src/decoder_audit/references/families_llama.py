"""The Llama-named families of the families table (`families.FAMILIES`): Llama's block under
other names, each entry its diff from Llama (`llama()`). The converter's Llama and Mistral; the
first families the layouts placed (Qwen2, Qwen3, Phi-3, OLMo, StableLM, Gemma); the dense
Llama-named families (Helium, OLMo 3, Starcoder2, GLM, SmolLM3, EXAONE 4, Nemotron, Granite,
Cohere, Apertus, ...); and the dense ones with RoPE of their own (Hunyuan's NTK alpha, Ministral
3's position-scaled queries, Granite SWA's base per layer). Beside the entries, the functions
they read fields through (`Family.read`) and their inverses for the writer (`Family.write`);
the Granite and windowed-RoPE reads the routed families share (`families_routed`) are here too.
Each reads exactly what the family's modeling code computes with, and raises `Unexpressed`
(named among the refusals) or `InvalidHFConfig` (no model) where that is not a DecoderConfig's.
"""

from __future__ import annotations

from typing import Any

from .family_entry import CLIPPED, PLAIN_ACTIVATIONS, TANH_GATED, Family, llama
from .family_errors import InvalidHFConfig, Unexpressed
from .hf_windows import layer_kinds

# ---- Gemma -------------------------------------------------------------------------------------

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


def _gemma2_write(cfg: Any, config_class: type) -> dict[str, Any]:
    scalar = (cfg.attn_scale or cfg.head_dim ** -0.5) ** -2  # scores * scalar^-0.5
    if abs(scalar - round(scalar)) < 1e-9 * scalar:
        scalar = round(scalar)  # the config field is an integer
    return {"query_pre_attn_scalar": scalar}


_GEMMA = dict(activation=("hidden_activation", "hidden_act"), activations=TANH_GATED,
              fixed={"norm_offset": 1.0}, read={"embedding_scale": _gemma_scale})
_GEMMA2 = dict(activation=("hidden_activation",), activations=TANH_GATED,
               write=_gemma2_write,
               read={"embedding_scale": _gemma_scale, "attn_scale": _gemma2_scale,
                     "attn_softcap": "attn_logit_softcapping",
                     "logit_softcap": "final_logit_softcapping"},
               fixed={"norm_offset": 1.0, "sandwich_norm": True})


# ---- the converter's Llama and Mistral, and the first families the layouts placed --------------

CONVERTER_LLAMAS: tuple[Family, ...] = (
    llama("llama", "LlamaForCausalLM", converter=True, layout_written=False),
    # Mistral: Llama's architecture under other class names, its window applied
    llama("mistral", "MistralForCausalLM", converter=True),
)
LLAMA_DERIVED: tuple[Family, ...] = (
    llama("qwen2", "Qwen2ForCausalLM",
          fixed={"attn_bias": True, "attn_output_bias": False}),
    llama("qwen3", "Qwen3ForCausalLM", fixed={"qk_norm": True}),
    llama("phi3", "Phi3ForCausalLM", partial_rotary=True),
    llama("olmo2", "Olmo2ForCausalLM",
          fixed={"pre_norm": False, "sandwich_norm": True, "qk_norm": True,
                 "qk_norm_scope": "projection"}),
    llama("olmo", "OlmoForCausalLM", refused=(CLIPPED,),
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
)


# ---- the Granite multipliers and RoPE only in windows, shared with families_routed -------------

def granite_embedding_scale(config: Any) -> float | None:
    """Granite's embedding_multiplier (1: no scale)."""
    return None if config.embedding_multiplier == 1 else float(config.embedding_multiplier)


def granite_logit_scale(config: Any) -> float:
    """Granite divides the logits by logits_scaling: a scale of its inverse."""
    scaling = config.logits_scaling
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or scaling == 0:
        raise InvalidHFConfig(f"logits_scaling={scaling!r} must be a number other than 0 (the "
                              "logits are divided by it)")
    return 1.0 / float(scaling)


# Granite's multipliers: embeddings x embedding_multiplier, scores x attention_multiplier (in
# place of 1/sqrt(Dh)), each sublayer's output x residual_multiplier, logits / logits_scaling
GRANITE_READ = {"embedding_scale": granite_embedding_scale, "attn_scale": "attention_multiplier",
                "residual_multiplier": "residual_multiplier", "logit_scale": granite_logit_scale}


def _layer_kinds(config: Any) -> list[str]:
    """Each layer's attention kind as the family's modules index it (`layer_types`, or the rule
    of a release before it), every layer full where the config names none."""
    return layer_kinds(config) or ["full_attention"] * config.num_hidden_layers


def _nope(layers: Any) -> tuple[int, ...] | None:
    found = tuple(sorted(layers))
    return found or None


def rope_only_where_windowed(config: Any) -> tuple[int, ...] | None:
    """EXAONE 4's attention (EXAONE 4, EXAONE MoE, Kolibri 1) and Cohere 2's: once a
    sliding_window is set, RoPE only in the windowed layers (the full-attention layers are
    NoPE). Without a window EXAONE 4 rotates every layer."""
    if config.sliding_window is None:
        return None
    return _nope(i for i, kind in enumerate(_layer_kinds(config)) if kind != "sliding_attention")


def rope_only_in_windows(config: Any) -> tuple[int, ...] | None:
    """Cohere 2 and Flint rotate q and k only in a layer whose window is set: without a
    sliding_window no layer has positions."""
    if config.sliding_window is None:
        return tuple(range(config.num_hidden_layers))
    return rope_only_where_windowed(config)


# ---- dense Llama-named families (helper fam-llama) ----------------------------------------------

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


_COHERE = dict(fixed={"norm": "layernorm", "norm_bias": False, "rope_layout": "interleaved",
                      "parallel_residual": True, "shared_norm": True, "mlp_bias": False},
               read={"norm_eps": "layer_norm_eps", "logit_scale": "logit_scale"})
# Granite's multipliers as its own config holds them (an embedding_multiplier of 1 read as 1)
_GRANITE = {"residual_multiplier": "residual_multiplier", "embedding_scale": "embedding_multiplier",
            "attn_scale": "attention_multiplier"}
def _glm_fixed_half(config: Any) -> int | None:
    """GLM's rotated width where its config names no factor: transformers 4.46's module rotated
    half of each head whatever the config said (4.47 added partial_rotary_factor, default 0.5);
    None where the config holds the factor (the RoPE reader reads it)."""
    rope = getattr(config, "rope_parameters", None) or {}
    if "partial_rotary_factor" in rope or hasattr(config, "partial_rotary_factor"):
        return None
    return (getattr(config, "head_dim", None) or
            config.hidden_size // config.num_attention_heads) // 2


_GLM = dict(partial_rotary=True,  # the first R features, pairs interleaved within them
            fixed={"rope_layout": "interleaved", "attn_output_bias": False, "mlp_bias": False},
            read={"rotary_dim": _glm_fixed_half})

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
          read={"nope_layers": rope_only_where_windowed}),
    llama("arcee", "ArceeForCausalLM", activations=PLAIN_ACTIVATIONS),
    llama("jais2", "Jais2ForCausalLM", activations=PLAIN_ACTIVATIONS, fixed={"norm": "layernorm"},
          read={"norm_eps": "layer_norm_eps"}),
    # LayerNorm1P: gain 1 + w
    llama("nemotron", "NemotronForCausalLM", activations=PLAIN_ACTIVATIONS, partial_rotary=True,
          fixed={"norm": "layernorm", "norm_offset": 1.0}, read={"norm_eps": "norm_eps"}),
    llama("granite", "GraniteForCausalLM",
          read={**_GRANITE, "logit_scale": granite_logit_scale},
          write=lambda cfg, cls: {"logits_scaling": 1.0 / cfg.logit_scale}),
    # Granite's block with post norms; its logits multiplied by logits_scaling
    llama("hyperclovax", "HyperCLOVAXForCausalLM",
          read={**_GRANITE, "logit_scale": "logits_scaling", "sandwich_norm": "use_post_norm"}),
    llama("cohere", "CohereForCausalLM", **_COHERE,
          refused=(("use_qk_norm", "per-head LayerNorms of q and k with a gain per head ((H, Dh) "
                                   "weights)"),)),
    llama("cohere2", "Cohere2ForCausalLM", **{**_COHERE, "read": {
        **_COHERE["read"], "nope_layers": rope_only_in_windows}}),
    # per-head q/k RMSNorms before RoPE; a plain MLP, its xIELU learned per layer
    llama("apertus", "ApertusForCausalLM", activations={"xielu": "xielu", **PLAIN_ACTIVATIONS},
          fixed={"qk_norm": True, "mlp_bias": False}),
    # Apertus 1.5's text model: Apertus's block, its readout optionally pruned to a prefix of the
    # vocabulary (the multimodal code rows dropped from the head, kept in the embedding)
    llama("apertus1p5_text", "Apertus1p5TextForCausalLM",
          activations={"xielu": "xielu", **PLAIN_ACTIVATIONS},
          fixed={"qk_norm": True, "mlp_bias": False},
          refused=(("output_vocab_size", "a readout pruned to the first output_vocab_size rows "
                                         "of the vocabulary, narrower than the embedding"),)),
)


# ---- dense families with RoPE of their own (helper fam-sinks) ----------------------------------

def ntk_alpha(rope: dict, config: Any) -> dict:
    """Hunyuan's "dynamic" RoPE with an alpha is static NTK (compute_ntk_alpha_rope_parameters):
    the base theta * alpha ** (Dh / (Dh - 2)), on every position, never stretched again."""
    if rope.get("rope_type") != "dynamic" or not rope.get("alpha"):
        return rope
    dim = config.head_dim
    theta = rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2))
    return {"rope_type": "default", "rope_theta": theta,
            "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0)}


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


# Granite SWA's reads: Granite's multipliers, a RoPE base per layer
SWA_READ = {**GRANITE_READ,
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


# Hunyuan: per-head q/k RMSNorms on the rotated heads; no window (Llama's model); its "dynamic"
# RoPE with an alpha a static NTK base
HUNYUAN_DENSE = llama("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", windows=False,
                      rope_form=ntk_alpha,
                      fixed={"qk_norm": True, "qk_norm_position": "after_rope", "mlp_bias": False})
SCALED_DENSE: tuple[Family, ...] = (
    # Ministral 3: Mistral's block, each query times 1 + beta ln(1 + floor(pos / L)) after RoPE
    llama("ministral3", "Ministral3ForCausalLM", write=ministral3_write,
          read={"query_position_scale": ministral3_query_scale}),
    # Granite SWA: Granite's multipliers, sinks in every layer, windows on layer_types, a RoPE
    # base per layer (0: NoPE)
    llama("granite_swa", "GraniteSWAForCausalLM", write=swa_write,
          fixed={"attn_sinks": True}, read=SWA_READ),
)
