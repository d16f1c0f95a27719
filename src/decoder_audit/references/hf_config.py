"""Hugging Face configs <-> DecoderConfig: which GPT2Config / LlamaConfig fields we can express,
and the family (and model class) that expresses a DecoderConfig.

Refused, with a ConfigError naming the field: RoPE scaling (rope_parameters.rope_type other than
"default"), partial rotary factors, sliding windows, head_dim != hidden_size / heads, activations
other than SiLU (Llama) or gelu_new / gelu_pytorch_tanh / gelu / relu (GPT-2),
scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, unscaled attention and cross attention.

Any family's config: `refuse_bad_sizes` refuses a size (layers, width, heads, vocabulary,
context) that is not an integer or is below its least (1 for layers, width, heads and
vocabulary), naming the field as config.json spells it.

`transformers` is imported only inside `_transformers()`, so this module loads without it.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config import DecoderConfig
from ..errors import CheckpointError, ConfigError
from .hf_windows import layer_kinds

INSTALL_HINT = "pip install 'decoder-audit[hf]'"
ATTN_IMPLEMENTATION = "eager"


class InvalidHFConfig(ConfigError):
    """A config whose values no model computes with (not one we merely cannot express): the
    model is refused, never audited as a black box."""

# HF activation name -> ours. GPT-2's "gelu_new" is the tanh approximation written out; it equals
# F.gelu(approximate="tanh") up to float rounding. On export we write "gelu_new", GPT-2's own.
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                     "relu": "relu"}
_GPT2_EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "Hugging Face conversion needs the optional dependency 'transformers'; install it "
            f"with: {INSTALL_HINT}") from exc
    return transformers


@contextlib.contextmanager
def quiet(tf: Any) -> Iterator[None]:
    """transformers' warnings and progress bars off (its loading report, the "Loading weights"
    bar): what goes wrong is said once, by us; they are restored after."""
    logging = tf.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    try:
        return getter() if callable(getter) else config
    except Exception:  # noqa: BLE001 - a composite config without a text part: use it whole
        return config


# Sizes every family names the same way (transformers maps a family's own names onto these:
# GPT-2's n_layer is num_hidden_layers), with the least each may be. transformers checks few of
# them: "n_layer": -2 builds a model with no layers at all, "n_head": 0 divides by zero. A width
# or context of 0 is some family's convention (a NoPE model's head_dim), so only a negative one
# or one that is no integer is refused.
SIZE_FIELDS = {"vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
               "num_key_value_heads": 0, "intermediate_size": 0, "head_dim": 0,
               "max_position_embeddings": 0}


def json_name(config: Any, name: str) -> str:
    """The name config.json spells a size with (GPT-2: n_layer for num_hidden_layers)."""
    return (getattr(config, "attribute_map", None) or {}).get(name, name)


def refuse_bad_sizes(config: Any, config_path: Path, *,
                     error: type[Exception] = CheckpointError) -> None:
    """`error` naming the file and the field when a size is not an integer of at least its
    SIZE_FIELDS least (None, a size left to its default, is fine)."""
    for part in {id(c): c for c in (config, _text_config(config))}.values():
        for name, least in SIZE_FIELDS.items():
            try:
                value = getattr(part, name)
            except AttributeError:
                continue
            if value is None or (isinstance(value, int) and not isinstance(value, bool)
                                 and value >= least):
                continue
            raise error(f"{str(config_path)!r}: {json_name(part, name)}={value!r} must be an "
                        f"integer >= {least}")


def present_classes(tf: Any, names: dict[str, str]) -> dict[str, type]:
    """family -> class for each class name (of `names`, family -> name) that the transformers
    module `tf` has: a family whose class an older release lacks (Qwen3 before 4.51, Gemma 3
    before 4.50, OLMo 2 before 4.47) is absent from the table on that release."""
    found = {}
    for family, name in names.items():
        cls = getattr(tf, name, None)  # transformers' lazy module: AttributeError -> None
        if cls is not None:  # (cli.convert reads the names through a namespace of strings)
            found[family] = cls
    return found


_CONVERTER_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                      "mistral": "MistralForCausalLM"}
_SPEC_CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "gemma": "GemmaForCausalLM", "stablelm": "StableLmForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "olmo": "OlmoForCausalLM", "olmo2": "Olmo2ForCausalLM",
                 "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
                 "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def model_classes(tf: Any) -> dict[str, type]:
    """The model class of each family we convert, from the transformers module `tf`. Accessing
    them imports only these modeling files (transformers loads its models lazily). Mistral is
    Llama's architecture under other class names (its sliding window must be off)."""
    return present_classes(tf, _CONVERTER_CLASSES)


def spec_classes(tf: Any) -> dict[str, type]:
    """The model classes whose config declares an architecture a DecoderConfig expresses (the
    gate's spec for them, `hf.hf_spec`): the converter's, and Qwen2 (q/k/v biases, none on the
    output projection), Qwen3 (a per-head q/k RMSNorm), Gemma (GeGLU, RMSNorm gains 1 + w,
    the embedding scaled by sqrt(D)), StableLM (LayerNorm, partial rotary, q/k/v biases),
    Phi-3 (fused q/k/v and gate/up weights, partial rotary) and GPT-NeoX (parallel residual,
    partial rotary, q/k/v fused head by head) and Gemma 2 (Gemma's block with sandwich norms,
    soft-capped scores and logits, every other layer windowed), Gemma 3's text model (per-head
    q/k norms, its windowed layers on their own RoPE base), OLMo (LayerNorms that learn
    nothing) and OLMo 2 (no pre-norms, sandwich norms, q/k norms over the whole projection),
    and the routed families (`_MOE_FAMILIES`: Mixtral, Qwen2-MoE with its gated shared expert,
    Qwen3-MoE, OLMoE) and DeepSeek-V2 and V3 (latent attention, grouped routing, V3's sigmoid
    scores and selection bias), whose weights the converter does not write. Only those this
    release has (`present_classes`)."""
    return {**model_classes(tf), **present_classes(tf, _SPEC_CLASSES)}


def spec_family(model: Any, tf: Any) -> str | None:
    """The family among `spec_classes` that `model` is an instance of (its class or a
    subclass), or None. Found by the class names along the model's MRO first, so that only
    the one modeling file it needs is touched (asking for every spec class imports ~20 of
    them: a second on a loaded CPU, in every process that audits a Hugging Face model)."""
    names = {**_CONVERTER_CLASSES, **_SPEC_CLASSES}
    ancestry = {cls.__name__ for cls in type(model).__mro__}
    for family, name in names.items():
        if name in ancestry:
            cls = getattr(tf, name, None)
            if cls is not None and isinstance(model, cls):
                return family
    return None


def spec_class_names() -> list[str]:
    """The class names of `spec_classes`, without importing any of them."""
    return [*_CONVERTER_CLASSES.values(), *_SPEC_CLASSES.values()]


# ---- the forms a config field took across the transformers releases this project supports ----
# (docs/transformers-range.md lists them with the release each changed in.) Each is decided from
# the config's own class (what its release's modeling code reads), never from a version string.

def holds_rope_parameters(config_class: type) -> bool:
    """Whether configs of this class hold RoPE in `rope_parameters` (transformers 5: one dict
    with rope_type, rope_theta, partial_rotary_factor and the scaling's keys; `rope_scaling` is a
    property aliasing it) rather than flat `rope_theta` (and `partial_rotary_factor`) beside a
    `rope_scaling` dict keyed `type` or `rope_type` (transformers 4), whose modeling code reads
    only those and ignores a `rope_parameters` attribute."""
    return isinstance(getattr(config_class, "rope_scaling", None), property)


def takes(config_class: type, field: str) -> bool:
    """Whether this release's config class takes `field` as an argument of its own: a field it
    does not take is an attribute its modeling code ignores (Gemma 2's `layer_types` before
    4.53, whose windowed layers are the even ones whatever the attribute says; Phi-3's
    `partial_rotary_factor` before 4.49)."""
    try:
        return field in inspect.signature(config_class.__init__).parameters
    except (TypeError, ValueError):
        return False


# Families whose attention rotates only the first partial_rotary_factor of each head's features
# (Llama's apply_rotary_pos_emb rotates them all, so a Llama config with a factor is refused).
_PARTIAL_ROTARY = ("stablelm", "phi3", "gpt_neox")
# Routed families: Llama's attention (Qwen2-MoE's q/k/v biases, Qwen3-MoE's per-head q/k norms,
# OLMoE's over the whole projection) with a router, softmax then top k, in front of E experts.
_MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
# Latent attention in front of routed experts (dense first layers, shared experts, grouped routing)
_DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3")
_LLAMA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                   "stablelm", "phi3", "olmo", "olmo2", *_MOE_FAMILIES)


def config_from_hf(hf_config: Any, family: str | None = None) -> DecoderConfig:
    """A DecoderConfig for a GPT2Config or LlamaConfig, or ConfigError naming every field we
    cannot express. `family` ("gpt2" or "llama", from the model's class) reads the config as that
    family's whatever its model_type: a config that another model_type registers for
    LlamaForCausalLM (EXAONE, InternLM3) holds the fields LlamaForCausalLM reads."""
    model_type = family or getattr(hf_config, "model_type", None)
    if model_type == "gpt2":
        return _gpt2_config(hf_config)
    if model_type in _LLAMA_FAMILIES:
        return _llama_config(hf_config, model_type)
    if model_type == "gpt_neox":
        return _neox_config(hf_config)
    if model_type in _DEEPSEEK_FAMILIES:
        return _deepseek_config(hf_config, model_type)
    raise ConfigError(f"model_type={model_type!r} is not supported; supported are 'gpt2' "
                      f"(GPT2LMHeadModel), 'gpt_neox', {list(_LLAMA_FAMILIES)} and "
                      f"{list(_DEEPSEEK_FAMILIES)} (their *ForCausalLM)")


def _refuse(family: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(f"cannot convert this {family} config: " + "; ".join(problems))


def _gpt2_config(c: Any) -> DecoderConfig:
    problems = []
    act = c.activation_function
    if act not in _GPT2_ACTIVATIONS:
        problems.append(f"activation_function={act!r} (supported: {sorted(_GPT2_ACTIVATIONS)})")
    if not c.scale_attn_weights:
        problems.append("scale_attn_weights=False (we always scale scores by 1/sqrt(Dh))")
    if c.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_by_inverse_layer_idx=True (no per-layer score scaling here)")
    if c.reorder_and_upcast_attn:
        problems.append("reorder_and_upcast_attn=True")
    if getattr(c, "add_cross_attention", False):
        problems.append("add_cross_attention=True (a decoder-only model has no cross attention)")
    _refuse("GPT-2", problems)
    return DecoderConfig(
        vocab_size=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head,
        d_ff=c.n_inner if c.n_inner is not None else 4 * c.n_embd, max_seq_len=c.n_positions,
        norm="layernorm", norm_eps=float(c.layer_norm_epsilon), mlp=_GPT2_ACTIVATIONS[act],
        pos="learned", attn_bias=True, mlp_bias=True, tie_embeddings=bool(c.tie_word_embeddings),
    )


def _rope_fields(c: Any, family: str, head_dim: int, problems: list[str]) -> dict[str, Any]:
    """rope_theta, rotary_dim and rope_scaling from a config's RoPE fields in the form its
    release holds them (`rope_parameters_of`), appending what we cannot express to `problems`."""
    rope = rope_parameters_of(c, family)
    field = "rope_parameters" if holds_rope_parameters(type(c)) else "rope_scaling"
    window_theta = None
    if "full_attention" in rope:  # per layer type (Gemma 3): the windowed layers' own base
        local = dict(rope.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            problems.append(f"{field}.sliding_attention.rope_type="
                            f"{local['rope_type']!r} (the windowed layers' RoPE is unscaled here)")
        window_theta = local.get("rope_theta")
        rope = dict(rope["full_attention"])
    theta = rope.get("rope_theta")
    if theta is None:
        problems.append("rope_theta is missing")
    factor = rope.get("partial_rotary_factor", 1.0)
    rotary_dim = None
    if factor != 1.0:
        rotary_dim = int(head_dim * factor)  # as transformers rounds it
        if family not in _PARTIAL_ROTARY:
            problems.append(f"partial_rotary_factor={factor} ({family}'s "
                            "attention rotates every feature)")
        elif rotary_dim % 2 or rotary_dim <= 0:
            problems.append(f"partial_rotary_factor={factor} rotates {rotary_dim} of "
                            f"{head_dim} features; RoPE needs an even number")
    scaling = _rope_scaling_from_hf(rope, c, problems, field)
    fields = {"rope_theta": float(theta or 0.0), "rotary_dim": rotary_dim,
              "rope_scaling": scaling}
    if window_theta is not None and getattr(c, "sliding_window", None) is not None:
        fields["window_rope_theta"] = float(window_theta)
    return fields


def rope_parameters_of(c: Any, family: str) -> dict[str, Any]:
    """The config's RoPE as transformers 5's `rope_parameters` spells it (rope_type, rope_theta,
    partial_rotary_factor and the scaling's keys; Gemma 3 one such dict per layer type), read
    from the form the config's release holds (`holds_rope_parameters`): transformers 4's flat
    rope_theta and partial_rotary_factor beside `rope_scaling` (keyed `type` or `rope_type`),
    GPT-NeoX's rotary_pct and rotary_emb_base, Gemma 3's rope_local_base_freq for its windowed
    layers. The legacy form is completed as transformers 5 completes it on loading such a
    config.json: llama3 and YaRN without original_max_position_embeddings take
    max_position_embeddings."""
    if holds_rope_parameters(type(c)):
        rope = dict(getattr(c, "rope_parameters", None) or {})
        if "full_attention" in rope:
            return rope
        rope.setdefault("rope_theta", getattr(c, "rope_theta", None))
        rope.setdefault("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
        return rope
    rope = dict(getattr(c, "rope_scaling", None) or {})
    rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    rope.pop("type", None)
    if family == "gpt_neox":  # its attention rotates int(head_size * rotary_pct) features
        rope["rope_theta"] = getattr(c, "rotary_emb_base", getattr(c, "rope_theta", None))
        rope["partial_rotary_factor"] = getattr(c, "rotary_pct", 1.0)
    else:
        rope["rope_theta"] = getattr(c, "rope_theta", None)
        partial = family not in _PARTIAL_ROTARY or takes(type(c), "partial_rotary_factor")
        rope["partial_rotary_factor"] = getattr(c, "partial_rotary_factor", 1.0) if partial else 1.0
    if rope["rope_type"] in ("llama3", "yarn") and not rope.get("original_max_position_embeddings"):
        rope["original_max_position_embeddings"] = c.max_position_embeddings
    if family == "gemma3_text":  # the windowed layers: unscaled, on their own base
        local = {"rope_type": "default", "rope_theta": getattr(c, "rope_local_base_freq", None)}
        return {"full_attention": rope, "sliding_attention": local}
    return rope


def _rope_scaling_from_hf(rope: dict, c: Any, problems: list[str],
                          field: str = "rope_parameters") -> dict | None:
    """Our rope_scaling for transformers' rope_parameters (None for rope_type "default");
    `field` names where the config holds it in problems."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ("linear", "dynamic", "llama3", "yarn"):
        problems.append(f"{field}.rope_type={kind!r} (supported: default, linear, "
                        "dynamic, llama3, yarn)")
        return None
    original = rope.get("original_max_position_embeddings")
    scaling: dict[str, Any] = {"type": kind, "factor": rope.get("factor")}
    if kind == "dynamic":  # transformers grows the base past max_position_embeddings
        scaling["original_max_seq_len"] = c.max_position_embeddings
    if kind in ("llama3", "yarn"):
        scaling["original_max_seq_len"] = original
    if kind == "llama3":
        scaling.update(low_freq_factor=rope.get("low_freq_factor"),
                       high_freq_factor=rope.get("high_freq_factor"))
    if kind == "yarn":
        if scaling["factor"] is None and original:
            scaling["factor"] = c.max_position_embeddings / original
        attention = rope.get("attention_factor")
        mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
        if attention is None and mscale and mscale_all and scaling["factor"]:
            # DeepSeek's ratio of two log scales, resolved here to the factor it gives
            attention = ((0.1 * mscale * math.log(scaling["factor"]) + 1.0)
                         / (0.1 * mscale_all * math.log(scaling["factor"]) + 1.0)
                         if scaling["factor"] > 1 else 1.0)
        scaling.update(beta_fast=float(rope.get("beta_fast") or 32.0),
                       beta_slow=float(rope.get("beta_slow") or 1.0),
                       attention_factor=attention, truncate=bool(rope.get("truncate", True)))
    absent = sorted(key for key, value in scaling.items() if value is None and
                    key != "attention_factor")
    if absent:
        problems.append(f"{field} of rope_type {kind!r} lack {absent}")
        return None
    return scaling


def _llama_config(c: Any, family: str = "llama") -> DecoderConfig:
    problems = []
    # the gate's activation: SiLU (SwiGLU); Gemma's tanh GELU (GeGLU)
    gemma = family in ("gemma", "gemma2", "gemma3_text")
    gates = {"silu": "swiglu"} if not gemma else {"gelu_pytorch_tanh": "geglu",
                                                  "gelu_new": "geglu"}
    act = _activation(c, family)
    if act not in gates:
        problems.append(f"hidden_act={act!r} (this family's gate is "
                        f"{' or '.join(sorted(gates))})")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = _rope_fields(c, family, head_dim, problems)
    window = _window_fields(c, family, problems)
    if not window:  # no layer windowed (Gemma 3 with sliding_window_pattern=1): one base
        rope.pop("window_rope_theta", None)
    if getattr(c, "clip_qkv", None) is not None:  # OLMo's option
        problems.append(f"clip_qkv={c.clip_qkv} (q, k and v clamped: not expressed)")
    for flag in ("qk_layernorm", "use_parallel_residual"):  # StableLM's options
        if getattr(c, flag, False):
            problems.append(f"{flag}=True ({family}'s per-head LayerNorms of q and k, or its "
                            "single-norm parallel block, are not expressed)")
    routed = _routed_fields(c, family, problems)
    _refuse(family, problems)
    n_kv = c.num_key_value_heads
    layernorm = family in ("stablelm", "olmo")
    return DecoderConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=None if n_kv in (None, c.num_attention_heads) else n_kv,
        # Qwen3 0.6B: 16 heads of 128 over a width of 1024
        head_width=None if head_dim * c.num_attention_heads == c.hidden_size else head_dim,
        d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings,
        norm="layernorm" if layernorm else "rmsnorm",
        # OLMo's LayerNorm learns nothing, with transformers' fixed eps
        norm_eps=1e-5 if family == "olmo" else float(c.layer_norm_eps if layernorm
                                                     else c.rms_norm_eps),
        norm_affine=family != "olmo", norm_bias=family != "olmo",
        mlp=gates.get(act, "swiglu"), pos="rope", **rope, **window,
        norm_offset=1.0 if gemma else 0.0,
        embedding_scale=float(c.hidden_size) ** 0.5 if gemma else None,
        **(_gemma2_fields(c) if family in ("gemma2", "gemma3_text") else {}),
        **(dict(pre_norm=False, sandwich_norm=True, qk_norm_scope="projection")
           if family == "olmo2" else {}),
        **(dict(qk_norm_scope="projection") if family == "olmoe" else {}),
        **routed,
        # Mistral's and Qwen2's configs have neither flag: Mistral's projections have no
        # biases, Qwen2's q, k and v have one and its output projection none (StableLM's
        # use_qkv_bias likewise; Qwen2-MoE's qkv_bias from transformers 5, always on before)
        attn_bias=family == "qwen2" or bool(getattr(c, "attention_bias", False)
                                            or getattr(c, "use_qkv_bias", False))
        or (family == "qwen2_moe" and (not takes(type(c), "qkv_bias") or bool(c.qkv_bias))),
        attn_output_bias=False if family in ("qwen2", "qwen2_moe", "stablelm") else None,
        qk_norm=family in ("qwen3", "gemma3_text", "olmo2", "qwen3_moe", "olmoe"),
        mlp_bias=bool(getattr(c, "mlp_bias", False)),
        tie_embeddings=bool(c.tie_word_embeddings),
    )


def _routed_fields(c: Any, family: str, problems: list[str]) -> dict[str, Any]:
    """The routed-expert fields of a MoE family's config (none for a dense one): E experts of
    which k per token, scored by a softmax before the top k (every family here), renormalised
    always (Mixtral) or as norm_topk_prob says; the experts' width (Qwen-MoE's
    moe_intermediate_size; Mixtral's and OLMoE's experts are intermediate_size wide); Qwen-MoE's
    dense layers (mlp_only_layers, which must be the first ones, and decoder_sparse_step);
    Qwen2-MoE's one shared expert behind a sigmoid gate."""
    if family not in _MOE_FAMILIES:
        return {}
    experts = c.num_local_experts if family == "mixtral" else c.num_experts
    fields: dict[str, Any] = {
        "n_experts": experts, "experts_per_token": c.num_experts_per_tok,
        "router_scoring": "softmax", "router_order": "score_topk",
        "normalize_topk": True if family == "mixtral" else bool(c.norm_topk_prob)}
    if family in ("qwen2_moe", "qwen3_moe"):
        if not experts:  # num_experts=0: every layer dense
            return {}
        dense = sorted(getattr(c, "mlp_only_layers", None) or [])
        if dense != list(range(len(dense))):
            problems.append(f"mlp_only_layers={dense} (the dense layers must be the first ones: "
                            "first_dense_layers)")
        fields.update(expert_width=c.moe_intermediate_size, first_dense_layers=len(dense),
                      moe_every=c.decoder_sparse_step)
    if family == "qwen2_moe":
        fields.update(n_shared_experts=1, shared_expert_width=c.shared_expert_intermediate_size,
                      shared_expert_gate=True)
    return fields


# transformers' RMSNorm default: the latent norms (q_a_layernorm, kv_a_layernorm) are built
# without the config's rms_norm_eps, the block norms with it
_LATENT_NORM_EPS = 1e-6


def _deepseek_config(c: Any, family: str) -> DecoderConfig:
    """DeepseekV2Config or DeepseekV3Config as transformers' modules compute it: latent
    attention (q_lora_rank None: one q_proj), each head its nope features then its rope ones,
    RoPE on the rope part (V2 on interleaved pairs, as complex numbers; V3 interleaved or on
    halves as rope_interleave says), scores scaled by (nope + rope)^-0.5 (times YaRN's mscale
    squared where mscale_all_dim is set); the first first_k_dense_replace layers dense, every
    later one routed with n_shared_experts shared experts of moe_intermediate_size, their
    weights times routed_scaling_factor. V3 scores by a sigmoid, chooses by the score plus its
    e_score_correction_bias within its topk_group best of n_group groups (each worth its two
    best), renormalises as norm_topk_prob says; V2 scores by a softmax, chooses greedily or
    within groups each worth its best (topk_method), and never renormalises (its router
    ignores norm_topk_prob).

    Read in transformers 5's form only (a config holding rope_parameters): before it,
    DeepSeek's router returned (indices, weights), each expert was a module of its own, and its
    MoE block mixed float32 weights into a float64 model; those releases' models are audited
    black-box, saying so."""
    if not holds_rope_parameters(type(c)):
        raise ConfigError(f"{family} config of a transformers 4 release (rope_theta beside "
                          "rope_scaling): its modules are read as a spec in transformers 5's "
                          "form only (a router returning logits, weights and indices; the "
                          "experts in two tensors)")
    problems = []
    if c.hidden_act != "silu":
        problems.append(f"hidden_act={c.hidden_act!r} (the gate's activation is SiLU: swiglu)")
    if getattr(c, "attention_bias", False):
        problems.append("attention_bias=True (q_a_proj, kv_a_proj_with_mqa and o_proj with "
                        "biases: latent attention has none here)")
    if getattr(c, "mlp_bias", False):
        problems.append("mlp_bias=True (the dense and shared MLPs biased, the experts not)")
    if c.num_key_value_heads not in (None, c.num_attention_heads):
        problems.append(f"num_key_value_heads={c.num_key_value_heads} != num_attention_heads="
                        f"{c.num_attention_heads} (kv_b_proj gives every head its own key and "
                        "value; transformers repeats them again and fails)")
    if float(c.rms_norm_eps) != _LATENT_NORM_EPS:
        problems.append(f"rms_norm_eps={c.rms_norm_eps} (the latent norms q_a_layernorm and "
                        f"kv_a_layernorm keep transformers' {_LATENT_NORM_EPS}: one norm_eps "
                        "cannot hold both)")
    rope = _rope_fields(c, family, c.qk_rope_head_dim, problems)
    rope.pop("rotary_dim")  # the rotary part is rope_head_width (a factor is refused above)
    head = c.qk_nope_head_dim + c.qk_rope_head_dim
    attn_scale = None
    params = rope_parameters_of(c, family)
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        # yarn_apply_mscale: the softmax scale times mscale^2, whatever the RoPE type
        factor = params.get("factor") or 1.0
        mscale = 0.1 * params["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        attn_scale = head ** -0.5 * mscale * mscale
    routed = _deepseek_routing(c, family, problems)
    _refuse(family, problems)
    interleaved = family == "deepseek_v2" or bool(getattr(c, "rope_interleave", True))
    return DecoderConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads, d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings, norm="rmsnorm", norm_eps=float(c.rms_norm_eps),
        mlp="swiglu", pos="rope", rope_layout="interleaved" if interleaved else "rotate_half",
        **rope, attn_scale=attn_scale, kv_latent_rank=c.kv_lora_rank,
        q_latent_rank=c.q_lora_rank, rope_head_width=c.qk_rope_head_dim,
        nope_head_width=c.qk_nope_head_dim, value_head_width=c.v_head_dim, **routed,
        tie_embeddings=bool(c.tie_word_embeddings))


def _deepseek_routing(c: Any, family: str, problems: list[str]) -> dict[str, Any]:
    """The routed fields of a DeepSeek config (see `_deepseek_config`); none where no layer
    routes (first_k_dense_replace >= num_hidden_layers)."""
    dense = c.first_k_dense_replace or 0
    if dense >= c.num_hidden_layers:
        return {}
    fields: dict[str, Any] = {
        "n_experts": c.n_routed_experts, "experts_per_token": c.num_experts_per_tok,
        "expert_width": c.moe_intermediate_size, "n_shared_experts": c.n_shared_experts,
        "routed_scaling": float(c.routed_scaling_factor), "first_dense_layers": dense}
    if family == "deepseek_v3":
        if c.n_group is None or c.topk_group is None:
            problems.append(f"n_group={c.n_group}, topk_group={c.topk_group} (V3's router "
                            "always chooses within groups: both are needed)")
            return fields
        fields.update(router_scoring="sigmoid", router_selection_bias=True,
                      normalize_topk=bool(c.norm_topk_prob))
        if c.n_group == 1:  # one group of every expert, always chosen: no limit
            return fields
        return {**fields, "expert_groups": c.n_group, "groups_per_token": c.topk_group,
                "group_score": "top2_sum"}
    fields.update(router_scoring="softmax", normalize_topk=False)
    if c.topk_method == "group_limited_greedy":
        fields.update(expert_groups=c.n_group, groups_per_token=c.topk_group, group_score="max")
    elif c.topk_method != "greedy":
        problems.append(f"topk_method={c.topk_method!r} (V2's router computes 'greedy' and "
                        "'group_limited_greedy' only)")
    return fields


def _activation(c: Any, family: str) -> Any:
    """The activation a config names: Gemma 2 and 3 in hidden_activation; Gemma in
    hidden_activation where it is set (what 4.45-4.47 read, and what Gemma's published configs
    mean beside their legacy hidden_act="gelu"), else hidden_act; the others in hidden_act."""
    if family in ("gemma2", "gemma3_text"):
        return c.hidden_activation
    if family == "gemma":
        return getattr(c, "hidden_activation", None) or c.hidden_act
    return c.hidden_act


def _window_fields(c: Any, family: str, problems: list[str]) -> dict[str, Any]:
    """sliding_window and window_layers from a config's sliding_window and its windowed layers
    (`layer_types`, or the rule of a release before them: `hf_windows.layer_kinds`); Qwen2's
    use_sliding_window=False turns its window off."""
    layer_types = layer_kinds(c, family)
    window = getattr(c, "sliding_window", None)
    if getattr(c, "use_sliding_window", True) is False:
        window = None
        if layer_types and any(t != "full_attention" for t in layer_types):
            problems.append(f"layer_types={layer_types} with use_sliding_window=False")
    if window is None:
        return {}
    if not layer_types:
        return {"sliding_window": window}
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
        problems.append(f"layer_types {unknown} (only full_attention and sliding_attention)")
    windowed = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    if not windowed:
        return {}
    return {"sliding_window": window,
            "window_layers": None if len(windowed) == len(layer_types) else windowed}


def _gemma2_fields(c: Any) -> dict[str, Any]:
    """Gemma 2's scores scaled by query_pre_attn_scalar^-0.5, its soft caps, sandwich norms. A
    scalar that is not a finite number > 0 is refused: (-8) ** -0.5 is complex, and the
    model's softmax, dropping the imaginary part, attends uniformly."""
    scalar = c.query_pre_attn_scalar
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or \
            not 0 < scalar < float("inf"):
        raise InvalidHFConfig(f"query_pre_attn_scalar={scalar!r} must be a finite number > 0 "
                              "(the scores are scaled by its inverse square root)")
    return {"attn_scale": float(scalar) ** -0.5,
            "attn_softcap": c.attn_logit_softcapping, "logit_softcap": c.final_logit_softcapping,
            "sandwich_norm": True}


_NEOX_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                     "gelu_fast": "gelu_tanh", "relu": "relu"}


def _neox_config(c: Any) -> DecoderConfig:
    """GPTNeoXConfig (Pythia, GPT-NeoX-20B): LayerNorms with biases, a GELU MLP with biases,
    partial rotary on rotated halves, parallel or sequential residual."""
    problems = []
    if c.hidden_act not in _NEOX_ACTIVATIONS:
        problems.append(f"hidden_act={c.hidden_act!r} (supported: {sorted(_NEOX_ACTIVATIONS)})")
    head_dim = c.hidden_size // c.num_attention_heads
    rope = _rope_fields(c, "gpt_neox", head_dim, problems)
    _refuse("GPT-NeoX", problems)
    return DecoderConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads, d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings, norm="layernorm",
        norm_eps=float(c.layer_norm_eps), mlp=_NEOX_ACTIVATIONS[c.hidden_act], pos="rope",
        **rope, parallel_residual=bool(c.use_parallel_residual),
        attn_bias=bool(getattr(c, "attention_bias", True)), mlp_bias=True,
        tie_embeddings=bool(c.tie_word_embeddings))


def hf_family(cfg: DecoderConfig) -> str:
    """"gpt2" or "llama": the HF family that expresses cfg, or ConfigError naming the fields."""
    if cfg.routed or cfg.latent_attention:
        raise ConfigError(f"n_experts={cfg.n_experts}, kv_latent_rank={cfg.kv_latent_rank}: the "
                          "converter writes GPT-2 and Llama, which have one dense MLP and plain "
                          "q/k/v projections (no routed experts, no latent attention)")
    if cfg.mlp == "geglu" or cfg.norm_offset or cfg.embedding_scale is not None:
        raise ConfigError(f"mlp={cfg.mlp!r}, norm_offset={cfg.norm_offset}, embedding_scale="
                          f"{cfg.embedding_scale}: the converter writes GPT-2 and Llama, which "
                          "have no GeGLU, no norm offset and no embedding scale")
    if cfg.readout_bias:
        raise ConfigError("readout_bias=True: the converter's families read out without a bias")
    if not cfg.norm_affine or not cfg.pre_norm:
        raise ConfigError(f"norm_affine={cfg.norm_affine}, pre_norm={cfg.pre_norm}: the "
                          "converter writes GPT-2 and Llama, whose sublayers read learned norms")
    if cfg.rotary_dim is not None or cfg.parallel_residual or cfg.sandwich_norm:
        raise ConfigError(f"rotary_dim={cfg.rotary_dim}, parallel_residual="
                          f"{cfg.parallel_residual}, sandwich_norm={cfg.sandwich_norm}: the "
                          "converter writes GPT-2 and Llama, whose RoPE rotates every feature "
                          "and whose blocks are sequential with two norms")
    if cfg.sliding_window is not None or cfg.attn_scale is not None or cfg.attn_softcap \
            or cfg.logit_softcap:
        raise ConfigError(f"sliding_window={cfg.sliding_window}, attn_scale={cfg.attn_scale}, "
                          f"attn_softcap={cfg.attn_softcap}, logit_softcap={cfg.logit_softcap}: "
                          "the converter writes GPT-2 and Llama, whose attention is full causal "
                          "with scores q.k / sqrt(Dh), uncapped")
    if isinstance(cfg.attn_bias, tuple) or isinstance(cfg.mlp_bias, tuple):
        raise ConfigError(f"attn_bias={cfg.attn_bias}, mlp_bias={cfg.mlp_bias}: the converter "
                          "writes GPT-2 and Llama, which bias every attention projection or "
                          "none, and every MLP matrix or none")
    if cfg.qk_norm or cfg.output_bias != cfg.attn_bias:
        raise ConfigError(f"qk_norm={cfg.qk_norm}, attn_output_bias={cfg.attn_output_bias}: "
                          "the converter writes GPT-2 and Llama, which have no q/k norm and bias "
                          "all four attention projections or none")
    if cfg.norm == "layernorm" and cfg.pos == "learned" and cfg.mlp in _GPT2_EXPORT_ACTIVATIONS:
        if cfg.kv_heads != cfg.n_heads:
            raise ConfigError(f"n_kv_heads={cfg.n_kv_heads} != n_heads={cfg.n_heads}: GPT-2 has "
                              "no grouped-query attention")
        if cfg.head_width is not None:
            raise ConfigError(f"head_width={cfg.head_width}: GPT-2's heads are D / H wide")
        if not cfg.norm_bias:
            raise ConfigError("norm_bias=False: GPT-2's LayerNorms have a bias")
        return "gpt2"
    if cfg.norm == "rmsnorm" and cfg.pos == "rope" and cfg.mlp == "swiglu":
        return "llama"
    raise ConfigError(
        f"no supported Hugging Face family expresses norm={cfg.norm!r}, pos={cfg.pos!r}, "
        f"mlp={cfg.mlp!r}: GPT-2 needs norm='layernorm', pos='learned', mlp in "
        f"{sorted(_GPT2_EXPORT_ACTIVATIONS)}; Llama needs norm='rmsnorm', pos='rope', mlp='swiglu'")


def config_to_hf(cfg: DecoderConfig) -> Any:
    """The GPT2Config or LlamaConfig of a decoder (eager attention, no dropout, no special ids:
    a decoder-audit model has no dropout and knows nothing of a tokenizer)."""
    tf = _transformers()
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  attn_implementation=ATTN_IMPLEMENTATION)
    if hf_family(cfg) == "gpt2":
        return tf.GPT2Config(
            n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
            n_positions=cfg.max_seq_len, layer_norm_epsilon=cfg.norm_eps,
            activation_function=_GPT2_EXPORT_ACTIVATIONS[cfg.mlp],
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    return tf.LlamaConfig(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps, hidden_act="silu", **rope_config_fields(cfg, tf.LlamaConfig),
        attention_bias=cfg.attn_bias, mlp_bias=cfg.mlp_bias, attention_dropout=0.0, **common)


def rope_config_fields(cfg: DecoderConfig, config_class: type, family: str = "llama"
                       ) -> dict[str, Any]:
    """The RoPE fields of a `config_class` config for cfg, in the form that class's release
    reads (`holds_rope_parameters`; the inverse of `rope_parameters_of`): transformers 5's
    rope_parameters (Gemma 3's per layer type), or transformers 4's flat rope_theta and
    partial_rotary_factor beside rope_scaling (None when unscaled; GPT-NeoX's rotary_emb_base
    and rotary_pct; Gemma 3's windowed layers on rope_local_base_freq)."""
    params = rope_parameters_for(cfg)
    if cfg.rotary_dim is not None:
        params["partial_rotary_factor"] = cfg.rotary_dim / cfg.head_dim
    window_theta = cfg.window_rope_theta or cfg.rope_theta
    if holds_rope_parameters(config_class):
        if family == "gpt_neox" and cfg.rotary_dim is not None:
            # 5.0-5.4 overwrite rope_parameters' factor with a rotary_pct argument (0.25 if none)
            return {"rope_parameters": params, "rotary_pct": params["partial_rotary_factor"]}
        if family == "gemma3_text":
            local = {"rope_type": "default", "rope_theta": window_theta}
            return {"rope_parameters": {"full_attention": params, "sliding_attention": local}}
        return {"rope_parameters": params}
    theta, partial = params.pop("rope_theta"), params.pop("partial_rotary_factor", None)
    fields: dict[str, Any] = {"rope_theta": theta}
    if family == "gpt_neox":
        fields = {"rotary_emb_base": theta, "rotary_pct": 1.0 if partial is None else partial}
    elif partial is not None:
        fields["partial_rotary_factor"] = partial
    if params["rope_type"] != "default":
        fields["rope_scaling"] = params
    if family == "gemma3_text":
        fields["rope_local_base_freq"] = window_theta
    # A field the class does not take would be an attribute its modeling code ignores: left
    # out, the config reads back without it, and `hf_families` tries the next family.
    return {name: value for name, value in fields.items() if takes(config_class, name)}


def rope_parameters_for(cfg: DecoderConfig) -> dict[str, Any]:
    """transformers' rope_parameters for our rope_theta and rope_scaling."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    scaling = dict(cfg.rope_scaling or {})
    if not scaling:
        return out
    kind = out["rope_type"] = scaling.pop("type")
    original = scaling.pop("original_max_seq_len", None)
    if kind in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = original
    elif kind == "dynamic" and original != cfg.max_seq_len:
        raise ConfigError(f"rope_scaling dynamic with original_max_seq_len={original} != "
                          f"max_seq_len={cfg.max_seq_len}: transformers grows the base past "
                          "max_position_embeddings, so the two must be one number")
    if kind == "yarn" and scaling.get("attention_factor") is None:
        scaling.pop("attention_factor", None)  # transformers derives the same default
    return out | scaling
