"""The Hugging Face families beyond the converter's GPT-2 and Llama, both ways, through the
layouts the gate places weights with (`references.layouts`):

    decoder_from_spec_model(hf_model) -> Decoder    hf_model_for(decoder) -> PreTrainedModel

Reading: the model's config is its spec (`hf.hf_spec`: rotate-half RoPE, as every one of these
families rotates), its weights are placed on our names, and a Decoder is built from copies of
them. A weight the spec expects and the model lacks, or one it has and the spec does not, is a
ConfigError naming it: nothing is dropped.

Writing: each family's config is written from a DecoderConfig by reading its entry backwards
(`config_fields`: `families.FAMILIES`, in the table's order), and a family is chosen only if transformers' config of it reads back (`hf_config.config_from_hf`) as exactly
that DecoderConfig, so a field a family cannot hold (Qwen3's q/k norm in Mistral, a window in
OLMo) is never lost: the next family is tried, and when none holds it the ConfigError names the
families tried. The weights are then written into the new model's own tensors where its layout
puts them (a fused q/k/v matrix row block by row block). RoPE is written in the family's own
layout: most rotate halves, a few pair features interleaved (GPT-J, CodeGen, Cohere, GLM, Helium,
Ernie 4.5; DeepSeek's latent attention holds either, as V3's rope_interleave says); the
converter's Llama path is the one that permutes interleaved rows.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import DecoderConfig
from ..errors import ConfigError
from ..model.decoder import Decoder
from ..storage.checkpoint import decoder_from_tensors
from .families import FAMILIES
from .family_entry import Family, takes
from .hf_config import ATTN_IMPLEMENTATION, config_from_hf, family_layout, spec_classes
from .hf_rope import rope_config_fields
from .hf_models import eager_experts
from .layouts import Placement, detect, named_layouts, placeable


def placed(hf_model: Any, spec: DecoderConfig) -> Placement | None:
    """Where the model's weights lie on the spec's names: in the layout its family names, or
    the one detected from the names (`layouts.detect`)."""
    layout = family_layout(hf_model)
    return detect(placeable(hf_model), spec, named_layouts(layout) if layout else None)


def placed_weights(hf_model: Any, spec: DecoderConfig) -> dict[str, torch.Tensor]:
    """{our unique-parameter name: a copy of the model's tensor} for a model whose config is
    `spec`, or ConfigError naming every weight that does not fit it (a buffer that holds a
    weight, DeepSeek-V3's selection bias, is read as the Parameter it is in our Decoder)."""
    named = placeable(hf_model)
    placement = placed(hf_model, spec)
    if placement is None:
        raise ConfigError(f"{type(hf_model).__name__}'s weights are in no known layout (first: "
                          f"{list(named)[:3]})")
    problems = list(placement.problems) + [f"{name}: a weight the spec has no place for"
                                           for name in placement.leftover]
    if problems:
        raise ConfigError(f"{type(hf_model).__name__}'s weights do not fit its config: "
                          + "; ".join(problems))
    state = {name: tensor.detach() for name, tensor in named.items()}
    tensors = {name: view.clone() for name, view in placement.canonical(state).items()}
    if spec.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # the embedding Parameter itself
    return tensors


def decoder_from_spec_model(hf_model: Any, spec: DecoderConfig) -> Decoder:
    """A Decoder of `spec` holding copies of the model's weights (dtype and device kept)."""
    return decoder_from_tensors(spec, placed_weights(hf_model, spec))


def hf_model_for(decoder: Decoder, tf: Any) -> Any:
    """The model of the first family whose config reads back as the decoder's own (eval mode,
    eager attention), holding copies of its weights; ConfigError naming the families tried."""
    cfg = decoder.config
    classes = spec_classes(tf)
    tried = []
    for family in FAMILIES:
        if not family.layout_written or family.model_type not in classes:  # a family this release lacks
            continue
        config = _written(classes[family.model_type], family, cfg)
        if config is None:
            tried.append(family.model_type)
            continue
        like = decoder.token_embeddings.weight
        try:
            hf_model = classes[family.model_type](config).to(device=like.device,
                                                              dtype=like.dtype).eval()
        except Exception:  # noqa: BLE001 - its modules refuse the config (GraniteMoE built
            tried.append(family.model_type)  # without experts): it cannot hold cfg
            continue
        if like.dtype == torch.float64:  # its default expert kernel refuses float64
            eager_experts(hf_model)
        if _write_weights(hf_model, cfg, decoder):
            return hf_model
        tried.append(family.model_type)  # its modules are not the shapes it reads back as
    # most families rotate halves: a config only their RoPE tells apart is said so
    hint = ("; rope_layout='interleaved': most families rotate halves (write rope_layout="
            "'rotate_half': the same weights, rows reordered per head, as from_hf's Llama path "
            "does)") if cfg.pos == "rope" and cfg.rope_layout == "interleaved" else ""
    raise ConfigError(f"no Hugging Face family holds this config exactly (tried {tried}; each "
                      f"reads back as another config){hint}")


def _written(model_class: type, family: Family, cfg: DecoderConfig) -> Any:
    """The family's config for cfg, or None when it does not read back as cfg."""
    config_class = model_class.config_class
    try:
        shared = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                      num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                      intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_seq_len,
                      tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None,
                      attn_implementation=ATTN_IMPLEMENTATION)
        # the family's own fields win (Cohere 2 MoE's intermediate_size is its experts' width)
        config = config_class(**{**shared, **config_fields(cfg, config_class, family)})
        back = config_from_hf(config, family.model_type)
    except Exception:  # noqa: BLE001 - the family's config refuses the fields (each family
        return None    # raises its own validation error types): it cannot hold cfg
    return config if _plain(back) == _plain(cfg) else None


def _plain(cfg: DecoderConfig) -> DecoderConfig:
    """cfg with a head width of exactly D / H written as None (the same architecture)."""
    if cfg.head_width is not None and cfg.head_width * cfg.n_heads == cfg.d_model:
        return cfg.replace(head_width=None)
    return cfg


def _write_weights(hf_model: Any, cfg: DecoderConfig, decoder: Decoder) -> bool:
    """Copy the decoder's weights into the model where its layout puts them; False (nothing
    written) when its weights do not fit cfg exactly (DeepSeek-V3's selection bias into its
    buffer)."""
    named = placeable(hf_model)
    placement = placed(hf_model, cfg)
    if placement is None or placement.problems or placement.leftover:
        return False
    ours = dict(decoder.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, spot in placement.spots.items():
            spot.write(named[spot.source].data, ours[name].detach())
    return True


# ---- a family's config from ours: its entry read backwards ----------------------------------

def config_fields(cfg: DecoderConfig, config_class: type, family: Family) -> dict[str, Any]:
    """The fields of the family's config for cfg (the sizes every family shares are added by
    `_written`): each field the entry reads from an attribute written to it (the first of
    several), the entry's `write` for the fields it derives, the activation's name, RoPE in
    the form the release reads, the windows where the family applies them. What the family
    fixes is not written: its config reads back without cfg's value, and is not chosen."""
    if family.block == "latent":
        return _deepseek(cfg, config_class, family)
    fields: dict[str, Any] = ({"num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim}
                              if family.grouped else {})
    if cfg.pos == "rope" and family.rope_config:
        fields.update(rope_config_fields(cfg, config_class, family))
    names = [name for name, ours in family.activations.items() if ours == cfg.mlp]
    if names:  # else the family computes another MLP: it reads back as another config
        fields[family.activation[0]] = names[0]
    for name, source in family.reads().items():
        if isinstance(source, (str, tuple)):
            fields[source if isinstance(source, str) else source[0]] = getattr(cfg, name)
    if family.write is not None:
        for name, value in family.write(cfg, config_class).items():
            if isinstance(value, dict) and isinstance(fields.get(name), dict):
                value = {**value, **fields[name]}  # Ministral 3's query scale beside RoPE's
            fields[name] = value
    if family.windows:
        fields.update(_windows(cfg, config_class, family))
    return fields


def _windows(cfg: DecoderConfig, config_class: type, family: Family) -> dict[str, Any]:
    """The window and its layers: `layer_types` where the release's config takes it; before
    it, the family's own rule holds them or not (Gemma 2: the even layers; Gemma 3: all but
    each sliding_window_pattern-th), which the read-back in `_written` decides."""
    kinds = ["sliding_attention" if cfg.window(i) else "full_attention"
             for i in range(cfg.n_layers)]
    fields: dict[str, Any] = {"sliding_window": cfg.sliding_window}
    if takes(config_class, "use_sliding_window"):
        fields["use_sliding_window"] = cfg.sliding_window is not None
    if takes(config_class, "layer_types"):
        return {**fields, "layer_types": kinds}
    if takes(config_class, "sliding_window_pattern"):  # the pattern p whose rule gives these
        full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
        fields["sliding_window_pattern"] = full[0] + 1 if full else cfg.n_layers + 1
    return fields


def _deepseek(cfg: DecoderConfig, config_class: type, family: Family) -> dict[str, Any]:
    """The config of a latent attention family for a latent Decoder, as `hf_latent` reads it
    back: every layer dense (first_k_dense_replace = L) without experts; V3's groups (one group
    when there are none), V2's topk_method; what the entry derives itself by its `write`. A
    Decoder they do not hold (V3 without a sigmoid and a selection bias, V2 renormalising,
    shared experts of another width) reads back otherwise and is not written."""
    fields: dict[str, Any] = {
        **rope_config_fields(cfg, config_class, family), "num_key_value_heads": cfg.n_heads,
        "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu", "attention_bias": False,
        "kv_lora_rank": cfg.kv_latent_rank, "q_lora_rank": cfg.q_latent_rank,
        "qk_rope_head_dim": cfg.rope_head_width, "qk_nope_head_dim": cfg.nope_head_width,
        "v_head_dim": cfg.value_head_width}
    if takes(config_class, "first_k_dense_replace"):
        fields["first_k_dense_replace"] = cfg.first_dense_layers if cfg.routed else cfg.n_layers
    if takes(config_class, "rope_interleave"):
        fields["rope_interleave"] = cfg.rope_layout == "interleaved"
    if family.write is not None:
        fields.update(family.write(cfg, config_class))
    v3 = family.experts == "deepseek_v3"
    if not cfg.routed or family.experts is None:
        return fields
    fields.update(n_routed_experts=cfg.n_experts, num_experts_per_tok=cfg.experts_per_token,
                  moe_intermediate_size=cfg.expert_dim, n_shared_experts=cfg.n_shared_experts,
                  routed_scaling_factor=cfg.routed_scaling)
    grouped = {"n_group": cfg.expert_groups, "topk_group": cfg.groups_per_token}
    if v3:
        return {**fields, "norm_topk_prob": cfg.normalize_topk,
                **(grouped if cfg.expert_groups is not None else
                   {"n_group": 1, "topk_group": 1})}
    if cfg.expert_groups is None:
        return {**fields, "topk_method": "greedy"}
    return {**fields, **grouped, "topk_method": "group_limited_greedy"}

