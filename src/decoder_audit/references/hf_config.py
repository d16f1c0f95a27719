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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config import DecoderConfig
from ..errors import CheckpointError, ConfigError
from . import families
from .family_entry import Family, Source
from .family_errors import InvalidHFConfig, Unexpressed
from .hf_rope import rope_config_fields, rope_fields
from .hf_windows import layer_kinds, text_config

# As the README installs: through the constraints (pip would otherwise take a transformers the
# tests never ran, and on Linux a multi-GB CUDA build of torch with it).
INSTALL_HINT = "pip install -c constraints.txt -e '.[hf]' (in the decoder-audit clone)"
ATTN_IMPLEMENTATION = "eager"


# GPT-2's activations written back: "gelu_new" is the tanh approximation written out (the
# reader takes gelu_pytorch_tanh as the same function); on export we write GPT-2's own.
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
    for part in {id(c): c for c in (config, text_config(config))}.values():
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


def model_classes(tf: Any) -> dict[str, type]:
    """The model class of each family the converter's rename tables write (GPT-2, Llama,
    Mistral: `families.FAMILIES` entries with converter=True), from the transformers module
    `tf`. Accessing them imports only these modeling files (transformers loads lazily)."""
    return families.present(tf, converter=True)


def spec_classes(tf: Any) -> dict[str, type]:
    """model_type -> class of every family whose config is read as a spec (`families.FAMILIES`),
    those this release has."""
    return families.present(tf)


def family_of(model: Any, tf: Any, *, converter: bool | None = None) -> str | None:
    """The model_type of the family whose class `model` is (of the table's families, or only the
    converter's with converter=True), or None: the nearest class in its method resolution order
    that a family names, so a subclass of one family's class that is another family's class is
    read as its own. Found by the class names first, so that only the one modeling file it needs
    is touched (asking transformers for every family's class imports ~80 of them: seconds, in
    every process that audits a Hugging Face model)."""
    for cls in type(model).__mro__:
        family = families.BY_CLASS.get(cls.__name__)
        if family is None or (converter is not None and family.converter != converter):
            continue
        if getattr(tf, cls.__name__, None) is cls:  # a class of this release, not a namesake
            return family.model_type
    return None


def family_layout(model: Any) -> str | None:
    """The layout its family's entry names for a model of `spec_classes` (`Family.layout`:
    where the weights' names alone would not tell), or None: detected from the names."""
    found = family_of(model, _transformers())
    entry = families.family(found) if found is not None else None
    return entry.layout if entry is not None else None


# ---- the one reader ---------------------------------------------------------------------------

# DecoderConfig fields read as flags or numbers (a config may hold an int or None for them)
_FLAGS = ("attn_bias", "mlp_bias", "parallel_residual", "normalize_topk", "sandwich_norm")
_NUMBERS = ("norm_eps", "attn_scale", "attn_softcap", "logit_softcap", "embedding_scale",
            "routed_scaling", "residual_multiplier", "logit_scale")
# What a routed family's dense config (no experts: Qwen-MoE's num_experts=0) leaves out
ROUTED_FIELDS = ("n_experts", "experts_per_token", "expert_width", "n_shared_experts",
                 "shared_expert_width", "shared_expert_gate", "router_scoring", "router_order",
                 "normalize_topk", "router_selection_bias", "expert_groups", "groups_per_token",
                 "group_score", "routed_scaling", "first_dense_layers", "moe_every",
                 "router_bias", "expert_bias", "shared_expert_scale")


def config_from_hf(hf_config: Any, family: str | None = None) -> DecoderConfig:
    """The DecoderConfig a Hugging Face config declares, read through its family's entry
    (`families.FAMILIES`), or ConfigError naming every field we cannot express. `family` (the
    model_type of the model's class) reads the config as that family's whatever its
    model_type: a config that another model_type registers for LlamaForCausalLM (EXAONE,
    InternLM3) holds the fields LlamaForCausalLM reads. RoPE keeps the family's own layout
    (rotated halves but where the entry says otherwise)."""
    model_type = family or getattr(hf_config, "model_type", None)
    entry = families.family(model_type) if isinstance(model_type, str) else None
    if entry is None:
        raise ConfigError(f"model_type={model_type!r} is not supported; supported are "
                          f"{list(families.BY_TYPE)} (their causal-LM classes)")
    problems: list[str] = []
    if entry.block == "latent":  # latent attention's own fields, RoPE on its rotary part
        from .hf_latent import latent_fields

        fields = latent_fields(hf_config, entry, problems)
    else:
        fields = {**_sizes(hf_config, entry.grouped), "mlp": _mlp(hf_config, entry, problems)}
    read = {name: _cast(name, read_source(hf_config, source, problems))
            for name, source in entry.reads().items()}
    fields.update(read)
    fields.update(entry.fixes())
    if entry.block != "latent":
        # a RoPE field the entry reads itself (Granite SWA's per-layer bases) where it gives one
        fields.update({name: value for name, value in _positions(hf_config, entry, fields,
                                                                 problems).items()
                       if read.get(name) is None})
    problems += refusals(hf_config, entry)
    _routed(fields, hf_config, entry)
    _refuse(entry.model_type, problems)
    return DecoderConfig(**fields)


def _sizes(c: Any, grouped: bool) -> dict[str, Any]:
    """The sizes every family names the same way (transformers maps a family's own names onto
    these: GPT-2's n_embd is hidden_size); where the family's attention is `grouped`, a head
    width other than D / H (Qwen3 0.6B: 16 heads of 128 over a width of 1024) and key/value
    heads other than H."""
    width, heads = c.hidden_size, c.num_attention_heads
    head_dim = (getattr(c, "head_dim", None) if grouped else None) or width // heads
    kv_heads = getattr(c, "num_key_value_heads", None) if grouped else None
    return dict(vocab_size=c.vocab_size, d_model=width, n_layers=c.num_hidden_layers,
                n_heads=heads, n_kv_heads=None if kv_heads in (None, heads) else kv_heads,
                head_width=None if head_dim * heads == width else head_dim,
                d_ff=getattr(c, "intermediate_size", None),
                # a family whose config names its length otherwise reads it in its entry
                max_seq_len=getattr(c, "max_position_embeddings", None),
                # a config without the field (Emu3's text config in 5.0) is untied, as
                # transformers ties it: getattr(config, "tie_word_embeddings", False)
                tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)))


def attribute(c: Any, name: str) -> Any:
    """The config's attribute `name`, a dotted path into a part of it (MPT's
    attn_config.clip_qkv), or None where it has none."""
    for part in name.split("."):
        c = getattr(c, part, None)
    return c


def read_source(c: Any, source: Source, problems: list[str]) -> Any:
    """A field's value from the config: the attribute, the first of several that is set, or
    the entry's function of the config (whose `Unexpressed` joins `problems`)."""
    if isinstance(source, str):
        return getattr(c, source, None)
    if isinstance(source, tuple):
        return next((value for name in source if (value := getattr(c, name, None)) is not None),
                    None)
    try:
        return source(c)
    except Unexpressed as exc:
        problems.append(str(exc))
        return None


def _cast(name: str, value: Any) -> Any:
    if name in _FLAGS and not isinstance(value, tuple):
        return bool(value)
    if name in _NUMBERS and value is not None:
        return float(value)
    return value


def _mlp(c: Any, family: Family, problems: list[str]) -> str | None:
    """Our `mlp` for the activation the config names, where the family's MLP computes it; None
    for a family whose MLP names none (its entry fixes `mlp`: BLOOM's tanh GELU)."""
    names = family.activation
    if not names:
        return None
    name = next((n for n in names if getattr(c, n, None) is not None), names[0])
    value = getattr(c, name, None)
    if value not in family.activations:
        problems.append(f"{name}={value!r} ({family.model_type}'s MLP computes "
                        f"{' or '.join(sorted(family.activations))})")
        return next(iter(family.activations.values()))
    return family.activations[value]


def _positions(c: Any, family: Family, fields: dict[str, Any],
               problems: list[str]) -> dict[str, Any]:
    """RoPE's fields in the family's layout (rotated halves unless the entry fixes another),
    and the windows where the family's attention applies them."""
    if fields.get("pos", "rope") != "rope":
        return {}
    head_dim = fields["head_width"] or fields["d_model"] // fields["n_heads"]
    # a family whose modules fix its RoPE (GPT-J's base 10000) has it among the entry's fields
    rope = rope_fields(c, family, head_dim, problems) if family.rope_config else {}
    window = _window_fields(c, family, problems) if family.windows else {}
    if not window:  # no layer windowed (Gemma 3 with sliding_window_pattern=1): one base
        rope.pop("window_rope_theta", None)
    return {"pos": "rope", "rope_layout": fields.get("rope_layout", "rotate_half"), **rope,
            **window}


def refusals(c: Any, family: Family) -> list[str]:
    """The options of `family.refused` this config sets, each naming its value and why."""
    found = []
    for name, why, *rule in family.refused:
        value = attribute(c, name)
        if (rule[0] if rule else bool)(value):
            found.append(f"{name}={value!r} ({why})")
    return found


def _routed(fields: dict[str, Any], c: Any, family: Family) -> None:
    """A routed family's config without experts (Qwen-MoE's num_experts=0: every layer dense)
    keeps no routed field; one with experts must send each token to 1..E of them, or no model
    computes with it (num_experts_per_tok=0 routes nothing; more than E cannot be chosen)."""
    if family.experts is None:
        return
    experts, k = fields.get("n_experts"), fields.get("experts_per_token")
    if not experts or not _some_layer_routes(fields):
        for name in ROUTED_FIELDS:
            fields.pop(name, None)
        return
    names = family.reads()  # a latent block's are DeepSeek's names
    k_name = names.get("experts_per_token", "num_experts_per_tok")
    e_name = names.get("n_experts", "n_routed_experts")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= experts:
        raise InvalidHFConfig(f"{k_name}={k!r} must be an integer from 1 to {e_name}="
                              f"{experts} (the experts each token is sent to)")


def _some_layer_routes(fields: dict[str, Any]) -> bool:
    """Whether a layer routes past the dense ones (a DeepSeek config whose
    first_k_dense_replace covers every layer is a dense model); True where the fields are not
    integers, for DecoderConfig to name."""
    dense, every = fields.get("first_dense_layers", 0), fields.get("moe_every", 1)
    if not (isinstance(dense, int) and isinstance(every, int) and every >= 1):
        return True
    return any(i >= dense and (i + 1) % every == 0 for i in range(fields["n_layers"]))


def _refuse(family: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(f"cannot convert this {family} config: " + "; ".join(problems))


def _window_fields(c: Any, family: Family, problems: list[str]) -> dict[str, Any]:
    """sliding_window and window_layers from a config's sliding_window and its windowed layers
    (`layer_types`, or the rule of a release before them: `hf_windows.layer_kinds`); Qwen2's
    use_sliding_window=False turns its window off."""
    layer_types = layer_kinds(c, family.model_type)
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
        raise ConfigError(f"norm_affine={cfg.norm_affine}, pre_norm={cfg.pre_norm}, post_norm="
                          f"{cfg.post_norm}: the converter writes GPT-2 and Llama, whose "
                          "sublayers read learned norms")
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
    beyond = cfg.changed(_BEYOND_THE_CONVERTER)
    if beyond:
        raise ConfigError(f"{', '.join(beyond)}: the converter writes GPT-2 and Llama, whose "
                          "blocks have none of these")
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


# Fields no GPT-2 or Llama block computes with, refused where they differ from their default
# (each later field a DecoderConfig grows for another family joins this list)
_BEYOND_THE_CONVERTER = ("shared_norm", "residual_multiplier", "logit_scale", "nope_layers",
                         "position_offset", "latent_norm_eps", "embedding_norm", "post_norm",
                         "final_norm", "qk_norm_kind", "attn_sinks", "qk_norm_position",
                         "query_position_scale", "swiglu_alpha", "swiglu_limit", "router_bias",
                         "expert_bias", "shared_expert_scale")


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
        rms_norm_eps=cfg.norm_eps, hidden_act="silu", **rope_config_fields(cfg, tf.LlamaConfig, families.BY_TYPE["llama"]),
        attention_bias=cfg.attn_bias, mlp_bias=cfg.mlp_bias, attention_dropout=0.0, **common)
