"""RoPE in a Hugging Face config, both ways, in every form the supported transformers releases
hold it (docs/transformers-range.md). Each form is decided from the config's own class (what
its release's modeling code reads), never from a version string:

    transformers 5   `rope_parameters`: one dict with rope_type, rope_theta,
                     partial_rotary_factor and the scaling's keys (Gemma 3: one such dict per
                     layer type); `rope_scaling` is a property aliasing it
    transformers 4   flat `rope_theta` (and `partial_rotary_factor`) beside a `rope_scaling`
                     dict keyed `type` or `rope_type`; a family may spell a field its own way
                     (`Family.legacy_rope`: GPT-NeoX's rotary_emb_base and rotary_pct, Gemma 3's
                     rope_local_base_freq for its windowed layers)

    rope_fields(config, family, head_dim, problems) -> our rope_theta, rotary_dim, rope_scaling
    rope_config_fields(cfg, config_class, family)   -> the config's fields for ours
"""

from __future__ import annotations

import math
from typing import Any

from ..config import DecoderConfig
from ..errors import ConfigError
from .family_entry import Family, takes

SCALINGS = ("linear", "dynamic", "llama3", "yarn")


def holds_rope_parameters(config_class: type) -> bool:
    """Whether configs of this class hold RoPE in `rope_parameters` (transformers 5) rather than
    flat `rope_theta` beside `rope_scaling` (transformers 4, whose modeling code reads only
    those and ignores a `rope_parameters` attribute)."""
    return isinstance(getattr(config_class, "rope_scaling", None), property)


def rope_fields(c: Any, family: Family, head_dim: int, problems: list[str]) -> dict[str, Any]:
    """rope_theta, rotary_dim and rope_scaling from a config's RoPE fields in the form its
    release holds them (`rope_parameters_of`), appending what we cannot express to `problems`;
    window_rope_theta where the windowed layers turn on a base of their own."""
    rope = rope_parameters_of(c, family)
    if family.rope_form is not None:  # the family's own form, as a standard one
        rope = family.rope_form(rope, c)
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
        if not family.partial_rotary:
            problems.append(f"partial_rotary_factor={factor} ({family.model_type}'s "
                            "attention rotates every feature)")
        elif rotary_dim % 2 or rotary_dim <= 0:
            problems.append(f"partial_rotary_factor={factor} rotates {rotary_dim} of "
                            f"{head_dim} features; RoPE needs an even number")
    scaling = _scaling_from_hf(rope, c, problems, field)
    fields = {"rope_theta": float(theta or 0.0), "rotary_dim": rotary_dim,
              "rope_scaling": scaling}
    if window_theta is not None and getattr(c, "sliding_window", None) is not None:
        fields["window_rope_theta"] = float(window_theta)
    return fields


def rope_parameters_of(c: Any, family: Family) -> dict[str, Any]:
    """The config's RoPE as transformers 5's `rope_parameters` spells it, read from the form the
    config's release holds (`holds_rope_parameters`). The legacy form is completed as
    transformers 5 completes it on loading such a config.json: llama3 and YaRN without
    original_max_position_embeddings take max_position_embeddings."""
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
    names = family.legacy_rope
    rope["rope_theta"] = getattr(c, names.get("rope_theta", "rope_theta"),
                                 getattr(c, "rope_theta", None))
    partial = names.get("partial_rotary_factor", "partial_rotary_factor")
    # a release whose config does not take the factor ignores it (Phi-3 before 4.49)
    reads = not family.partial_rotary or partial != "partial_rotary_factor" or takes(type(c),
                                                                                     partial)
    rope["partial_rotary_factor"] = getattr(c, partial, 1.0) if reads else 1.0
    if rope["rope_type"] in ("llama3", "yarn") and not rope.get("original_max_position_embeddings"):
        rope["original_max_position_embeddings"] = c.max_position_embeddings
    if "window_rope_theta" in names:  # the windowed layers: unscaled, on their own base
        local = {"rope_type": "default", "rope_theta": getattr(c, names["window_rope_theta"],
                                                                None)}
        return {"full_attention": rope, "sliding_attention": local}
    return rope


def _scaling_from_hf(rope: dict, c: Any, problems: list[str],
                     field: str = "rope_parameters") -> dict | None:
    """Our rope_scaling for transformers' rope_parameters (None for rope_type "default");
    `field` names where the config holds it in problems."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind not in SCALINGS:
        problems.append(f"{field}.rope_type={kind!r} (supported: default, {', '.join(SCALINGS)})")
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
        scaling.update(beta_fast=float(rope.get("beta_fast") or 32.0),
                       beta_slow=float(rope.get("beta_slow") or 1.0),
                       attention_factor=_yarn_attention(rope, scaling["factor"]),
                       truncate=bool(rope.get("truncate", True)))
    absent = sorted(key for key, value in scaling.items() if value is None and
                    key != "attention_factor")
    if absent:
        problems.append(f"{field} of rope_type {kind!r} lack {absent}")
        return None
    return scaling


def _yarn_attention(rope: dict, factor: float | None) -> float | None:
    """YaRN's attention factor as given, or DeepSeek's ratio of two log scales (mscale,
    mscale_all_dim) resolved to the factor it gives; None: YaRN's default."""
    attention = rope.get("attention_factor")
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention is None and mscale and mscale_all and factor:
        return ((0.1 * mscale * math.log(factor) + 1.0)
                / (0.1 * mscale_all * math.log(factor) + 1.0) if factor > 1 else 1.0)
    return attention


def rope_config_fields(cfg: DecoderConfig, config_class: type, family: Family
                       ) -> dict[str, Any]:
    """The RoPE fields of a `config_class` config for cfg, in the form that class's release
    reads (`holds_rope_parameters`; the inverse of `rope_parameters_of`)."""
    params = rope_parameters_for(cfg)
    if cfg.rotary_dim is not None:
        params["partial_rotary_factor"] = cfg.rotary_dim / cfg.head_dim
    window_theta = cfg.window_rope_theta or cfg.rope_theta
    names = family.legacy_rope
    own_factor = names.get("partial_rotary_factor")
    if holds_rope_parameters(config_class):
        if own_factor and cfg.rotary_dim is not None:
            # GPT-NeoX 5.0-5.4 overwrite rope_parameters' factor with a rotary_pct argument
            return {"rope_parameters": params, own_factor: params["partial_rotary_factor"]}
        if "window_rope_theta" in names:
            local = {"rope_type": "default", "rope_theta": window_theta}
            return {"rope_parameters": {"full_attention": params, "sliding_attention": local}}
        return {"rope_parameters": params}
    theta, partial = params.pop("rope_theta"), params.pop("partial_rotary_factor", None)
    fields: dict[str, Any] = {names.get("rope_theta", "rope_theta"): theta}
    if own_factor:
        fields[own_factor] = 1.0 if partial is None else partial
    elif partial is not None:
        fields["partial_rotary_factor"] = partial
    if params["rope_type"] != "default":
        fields["rope_scaling"] = params
    if "window_rope_theta" in names:
        fields[names["window_rope_theta"]] = window_theta
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
