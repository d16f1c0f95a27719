"""The architecture a peer library's model carries in its own config, read as its spec: the
plain call `audit(model)` (or `audit(model, vocab_size=V)`) then runs params and oracle on it.

    peer_spec(model) -> PeerSpec | None     None: no peer library's model

One small reader per library, each reading attributes duck-typed (no library is imported here):

    TransformerLens  a HookedTransformer's cfg (HookedTransformerConfig)
    litgpt           a GPT's config (litgpt.Config), its norms read from the norm modules
    nanoGPT          a GPT's config (GPTConfig: n_layer, n_head, n_embd, block_size, bias,
                     vocab_size, dropout), recognised by those fields and the module's
                     transformer.wte / transformer.h / lm_head, since users copy model.py
    torchtune        a TransformerDecoder: the arguments its modules keep (heads, head width,
                     the RoPE module's base and scaling, the norms' eps, the activation, ...)
                     (`peer_torchtune`)
    x-transformers   a TransformerWrapper around a Decoder (`peer_xtransformers`)

Every option that changes the numerics is read, RoPE scaling included. An option that no
DecoderConfig expresses is named in `PeerSpec.refused`: the gate then fails params and oracle
naming it (the config was recognised, so the audit fails closed: it never passes on a spec it
could not write, nor falls back to a black box).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from torch import nn

from .peer_record import PeerSpec, read_spec
from .peer_torchtune import torchtune_spec
from .peer_xtransformers import xtransformers_spec


def peer_spec(model: nn.Module) -> PeerSpec | None:
    """The spec a peer library's model carries (see the module docstring), or None. A release
    whose config lacks a field its reader reads is refused, naming it (fails closed)."""
    for library, reader in _READERS:
        try:
            found = reader(model)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            return PeerSpec(library, None, (f"its config could not be read ({type(exc).__name__}"
                                             f": {exc})",))
        if found is not None:
            return found
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# ---- TransformerLens ----------------------------------------------------------------------------

# act_fn -> (the plain MLP's kind, the gated MLP's kind): None where no DecoderConfig has it (a
# gated one is refused whatever its activation: see _lens_mlp)
_LENS_ACTS = {"relu": ("relu", None), "gelu": ("gelu", None), "gelu_new": ("gelu_tanh", "geglu"),
              "gelu_fast": ("gelu_tanh", "geglu"), "gelu_pytorch_tanh": ("gelu_tanh", "geglu"),
              "silu": (None, "swiglu"), "swish": (None, "swiglu")}
# architectures whose blocks HookedTransformer computes another way than its config says
_LENS_OLMO = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")

# (option, value it must have, why): each a path of HookedTransformer no DecoderConfig has
_LENS_FIXED = (
    ("attention_dir", "causal", "bidirectional attention is no decoder"),
    ("attn_only", False, "blocks without an MLP"),
    ("post_embedding_ln", False, "a norm after the embedding"),
    ("scale_attn_by_inverse_layer_idx", False, "scores divided by the layer index + 1"),
    ("clip_qkv", None, "q, k, v clamped"),
    ("use_logn_attn", False, "log-n query scaling past the training length"),
    ("use_dynamic_ntk_rope", False, "Qwen-1's dynamic NTK rotary base"),
    ("use_attention_sinks", False, "learned sink logits"),
    ("num_experts", None, "routed experts (not placed for TransformerLens)"),
    ("use_qk_norm", False, "q/k norms (not placed for TransformerLens)"),
    ("use_normalization_before_and_after", False,
     "norms after the sublayers (not placed for TransformerLens)"),
)


def _lens(model: nn.Module) -> PeerSpec | None:
    cfg = getattr(model, "cfg", None)
    if type(cfg).__name__ != "HookedTransformerConfig" or not hasattr(model, "blocks"):
        return None
    refused = [f"{name}={getattr(cfg, name, want)!r} ({why})" for name, want, why in _LENS_FIXED
               if getattr(cfg, name, want) != want]
    arch = getattr(cfg, "original_architecture", None)
    block_module = sys.modules.get(type(model.blocks[0]).__module__) if len(model.blocks) else None
    post_norm = getattr(block_module, "POST_NORM_ARCHITECTURES", ())
    if arch in _LENS_OLMO or arch in post_norm:
        refused.append(f"original_architecture={arch!r} (HookedTransformer computes its block "
                       "apart from the config's fields)")
    if cfg.d_vocab_out not in (-1, cfg.d_vocab):
        refused.append(f"d_vocab_out={cfg.d_vocab_out} (an output vocabulary other than "
                       f"d_vocab={cfg.d_vocab})")
    fields = {"vocab_size": cfg.d_vocab, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
              "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_key_value_heads,
              "d_ff": cfg.d_mlp, "max_seq_len": cfg.n_ctx, "norm_eps": cfg.eps,
              "attn_bias": True, "readout_bias": True, "tie_embeddings": False}
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        fields["head_width"] = cfg.d_head
    fields.update(_lens_norm(cfg, refused))
    fields.update(_lens_mlp(cfg, refused))
    fields.update(_lens_attention(cfg, refused))
    fields.update(_lens_positions(cfg, refused))
    return read_spec("TransformerLens", fields, refused)


def _lens_norm(cfg: Any, refused: list[str]) -> dict[str, Any]:
    kind = cfg.normalization_type
    if kind not in ("LN", "LNPre", "RMS", "RMSPre"):
        refused.append(f"normalization_type={kind!r} (blocks without norms)")
        return {}
    rms = kind.startswith("RMS")
    if cfg.final_rms and not rms:
        refused.append("final_rms=True (an RMSNorm before the unembedding after LayerNorm blocks)")
    return {"norm": "rmsnorm" if rms else "layernorm", "norm_affine": not kind.endswith("Pre")}


def _lens_mlp(cfg: Any, refused: list[str]) -> dict[str, Any]:
    plain, gated = _LENS_ACTS.get(cfg.act_fn, (None, None))
    if cfg.gated_mlp:  # TransformerLens 3 computes (act(x W_gate) * (x W_in)) + b_in
        refused.append("gated_mlp=True (HookedTransformer adds b_in after the gate's product, "
                       "a bias on the hidden units that no DecoderConfig has)")
        return {}
    if plain is None:
        refused.append(f"act_fn={cfg.act_fn!r} (no plain MLP of that kind)")
        return {}
    return {"mlp": plain, "mlp_bias": True}


def _lens_attention(cfg: Any, refused: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if not cfg.use_attn_scale:
        fields["attn_scale"] = 1.0
    elif not math.isclose(cfg.attn_scale, math.sqrt(cfg.d_head), rel_tol=1e-12):
        fields["attn_scale"] = 1.0 / cfg.attn_scale  # HookedTransformer divides by it
    soft_caps = (getattr(cfg, "attn_scores_soft_cap", -1.0),
                 getattr(cfg, "output_logits_soft_cap", -1.0))
    if _positive(soft_caps[0]):
        fields["attn_softcap"] = float(soft_caps[0])
    if _positive(soft_caps[1]):
        fields["logit_softcap"] = float(soft_caps[1])
    if cfg.parallel_attn_mlp:
        fields["parallel_residual"] = True
    if cfg.use_local_attn:
        types = list(cfg.attn_types or ())
        if len(types) != cfg.n_layers or set(types) - {"global", "local"}:
            refused.append(f"attn_types={cfg.attn_types!r} (one 'global' or 'local' per layer)")
        else:
            fields.update(sliding_window=cfg.window_size,
                          window_layers=tuple(i for i, t in enumerate(types) if t == "local"))
    return fields


def _lens_positions(cfg: Any, refused: list[str]) -> dict[str, Any]:
    kind = cfg.positional_embedding_type
    if kind == "standard":
        return {"pos": "learned"}
    if kind != "rotary":
        refused.append(f"positional_embedding_type={kind!r} (neither learned positions nor RoPE)")
        return {}
    fields: dict[str, Any] = {
        "pos": "rope", "rope_theta": float(cfg.rotary_base),
        "rope_layout": "interleaved" if getattr(cfg, "rotary_adjacent_pairs", False)
        else "rotate_half"}
    if cfg.rotary_dim is not None and cfg.rotary_dim != cfg.d_head:
        fields["rotary_dim"] = cfg.rotary_dim
    scaling = _lens_rope_scaling(cfg)
    if scaling is not None:
        fields["rope_scaling"] = scaling
    local = cfg.use_local_attn and "local" in (cfg.attn_types or ())
    local_base = getattr(cfg, "rotary_base_local", None)
    if local and local_base is not None:
        fields["window_rope_theta"] = float(local_base)
    # a DecoderConfig scales the windowed layers' RoPE with the rest unless they have a base of
    # their own; HookedTransformer's rules for its local layers differ per scaling
    if local and scaling is not None and (
            local_base is None or getattr(cfg, "use_NTK_by_parts_rope", False) or
            (getattr(cfg, "use_yarn_rope", False) and not cfg.yarn_global_attn_only)):
        refused.append(f"RoPE scaling {scaling['type']!r} with local attention layers (which "
                       "layers it reaches differs from a DecoderConfig's)")
    return fields


def _lens_rope_scaling(cfg: Any) -> dict[str, Any] | None:
    """HookedTransformerConfig's RoPE scaling as a DecoderConfig's rope_scaling."""
    if getattr(cfg, "use_NTK_by_parts_rope", False):  # Llama 3.1's
        return {"type": "llama3", "factor": float(cfg.NTK_by_parts_factor),
                "original_max_seq_len": int(cfg.NTK_original_ctx_len),
                "low_freq_factor": float(cfg.NTK_by_parts_low_freq_factor),
                "high_freq_factor": float(cfg.NTK_by_parts_high_freq_factor)}
    if getattr(cfg, "use_yarn_rope", False):
        return {"type": "yarn", "factor": float(cfg.yarn_factor),
                "original_max_seq_len": int(cfg.yarn_original_max_position_embeddings),
                "beta_fast": float(cfg.yarn_beta_fast), "beta_slow": float(cfg.yarn_beta_slow),
                "attention_factor": float(cfg.yarn_attention_factor),
                "truncate": bool(cfg.yarn_truncate)}
    factor = getattr(cfg, "rotary_scaling_factor", 1.0)
    return None if factor == 1.0 else {"type": "linear", "factor": float(factor)}


# ---- litgpt -------------------------------------------------------------------------------------

_LITGPT_FIELDS = ("n_layer", "n_embd", "n_head", "n_query_groups", "rope_base", "mlp_class_name",
                  "norm_class_name", "padded_vocab_size", "rotary_percentage")


def _litgpt(model: nn.Module) -> PeerSpec | None:
    cfg = getattr(model, "config", None)
    transformer = getattr(model, "transformer", None)
    if not all(hasattr(cfg, name) for name in _LITGPT_FIELDS) or transformer is None:
        return None
    refused = [f"{name}={getattr(cfg, name)!r} ({why})" for name, want, why in (
        ("n_expert", 0, "routed experts (not placed for litgpt)"),
        ("shared_attention_norm", False, "one norm feeding both sublayers"),
        ("norm_1", True, "no norm before attention"), ("norm_2", True, "no norm before the MLP"),
        ("post_attention_norm", False, "a norm after attention (not placed for litgpt)"),
        ("post_mlp_norm", False, "a norm after the MLP (not placed for litgpt)"))
        if getattr(cfg, name, want) != want]
    fields = {"vocab_size": cfg.padded_vocab_size, "d_model": cfg.n_embd,
              "n_layers": cfg.n_layer, "n_heads": cfg.n_head, "n_kv_heads": cfg.n_query_groups,
              "d_ff": cfg.intermediate_size, "max_seq_len": cfg.block_size,
              "parallel_residual": bool(cfg.parallel_residual), "tie_embeddings": False,
              "readout_bias": bool(getattr(cfg, "lm_head_bias", False)),
              # the fused q/k/v has a bias with `bias` or `attn_bias`, the output projection with
              # `bias` alone
              "attn_bias": bool(cfg.bias or cfg.attn_bias), "attn_output_bias": bool(cfg.bias),
              "mlp_bias": bool(cfg.bias)}
    if cfg.head_size * cfg.n_head != cfg.n_embd:
        fields["head_width"] = cfg.head_size
    fields.update(_litgpt_norm(cfg, refused))
    fields.update(_litgpt_mlp(cfg, refused))
    fields.update(_litgpt_attention(cfg, refused))
    fields.update(_litgpt_rope(cfg, refused))
    if getattr(cfg, "scale_embeddings", False):
        fields["embedding_scale"] = cfg.n_embd ** 0.5
    return read_spec("litgpt", fields, refused)


def _litgpt_norm(cfg: Any, refused: list[str]) -> dict[str, Any]:
    """The norm the config declares: its class and eps by their fields, and what litgpt 0.5
    derives from the config's name besides (`Config.norm_class`: "Gemma" adds a unit offset to
    RMSNorm, "OLMo" builds LayerNorm without an affine)."""
    name = str(getattr(cfg, "name", ""))
    if cfg.norm_class_name == "RMSNorm":
        return {"norm": "rmsnorm", "norm_eps": float(cfg.norm_eps),
                "norm_offset": 1.0 if "Gemma" in name else 0.0}
    if cfg.norm_class_name == "LayerNorm":
        affine = "OLMo" not in name
        return {"norm": "layernorm", "norm_eps": float(cfg.norm_eps), "norm_affine": affine}
    refused.append(f"norm_class_name={cfg.norm_class_name!r} (a norm of another kind)")
    return {}


def _litgpt_mlp(cfg: Any, refused: list[str]) -> dict[str, Any]:
    kind, approximate = cfg.mlp_class_name, getattr(cfg, "gelu_approximate", "none")
    tanh = approximate == "tanh"
    if kind == "GptNeoxMLP" and approximate in ("none", "tanh"):
        return {"mlp": "gelu_tanh" if tanh else "gelu"}
    if kind == "LLaMAMLP":
        return {"mlp": "swiglu"}
    if kind == "GemmaMLP" and tanh:
        return {"mlp": "geglu"}
    refused.append(f"mlp_class_name={kind!r} with gelu_approximate={approximate!r} (no MLP of "
                   "that kind)")
    return {}


def _litgpt_attention(cfg: Any, refused: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if getattr(cfg, "attention_scores_scalar", None):
        fields["attn_scale"] = cfg.attention_scores_scalar ** -0.5
    if getattr(cfg, "attention_logit_softcapping", None) is not None:
        fields["attn_softcap"] = float(cfg.attention_logit_softcapping)
    if getattr(cfg, "final_logit_softcapping", None) is not None:
        fields["logit_softcap"] = float(cfg.final_logit_softcapping)
    if getattr(cfg, "norm_qk", False):
        if cfg.norm_class_name != "RMSNorm":
            refused.append(f"norm_qk=True with norm_class_name={cfg.norm_class_name!r} (q/k "
                           "norms of another kind than RMSNorm)")
        fields.update(qk_norm=True, qk_norm_scope="projection"
                      if getattr(cfg, "norm_qk_type", "default") == "olmo2" else "head")
    if getattr(cfg, "sliding_window_size", None) is not None:
        layers = tuple(i for i, on in enumerate(cfg.sliding_window_indices) if on)
        if layers:
            fields.update(sliding_window=cfg.sliding_window_size, window_layers=layers)
    return fields


def _litgpt_rope(cfg: Any, refused: list[str]) -> dict[str, Any]:
    n_elem = int(cfg.rotary_percentage * cfg.head_size)
    if n_elem == 0:
        return {"pos": "none"}
    fields: dict[str, Any] = {"pos": "rope", "rope_theta": float(cfg.rope_base),
                              "rope_layout": "rotate_half"}
    if n_elem != cfg.head_size:
        fields["rotary_dim"] = n_elem
    adjust, condense = cfg.rope_adjustments or {}, getattr(cfg, "rope_condense_ratio", 1)
    llama3 = ("factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len")
    scaling = None
    if all(name in adjust for name in llama3):
        scaling = {"type": "llama3", **{name: adjust[name] for name in llama3}}
    elif "factor" in adjust:
        scaling = {"type": "linear", "factor": float(adjust["factor"])}
    if condense != 1:  # positions divided by it: a linear scaling, on top of a linear one
        if scaling is not None and scaling["type"] != "linear":
            refused.append(f"rope_condense_ratio={condense} with rope_adjustments={adjust!r} "
                           "(two scalings at once)")
        scaling = {"type": "linear", "factor": float(condense) * (scaling or {"factor": 1.0})
                   ["factor"]}
    if scaling is not None:
        fields["rope_scaling"] = scaling
    local_base = getattr(cfg, "rope_local_base_freq", None)
    if local_base is not None:
        windows = [bool(on) for on in (cfg.sliding_window_indices or [])]
        if [bool(i) for i in cfg.rope_indices] != windows:
            refused.append(f"rope_indices={cfg.rope_indices!r} (the local RoPE base on other "
                           f"layers than the sliding windows {cfg.sliding_window_indices!r})")
        fields["window_rope_theta"] = float(local_base)
    return fields


# ---- nanoGPT ------------------------------------------------------------------------------------

_NANOGPT_FIELDS = {"block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias", "dropout"}


def _nanogpt(model: nn.Module) -> PeerSpec | None:
    """nanoGPT's model.py: LayerNorm (eps 1e-5, bias as `bias` says), exact GELU, an MLP of 4 x
    n_embd, learned positions, the head tied to the embedding; `dropout` changes nothing in
    eval mode. A field its GPTConfig does not have (a fork's option) is refused by name."""
    cfg = getattr(model, "config", None)
    transformer = getattr(model, "transformer", None)
    if not dataclasses.is_dataclass(cfg) or transformer is None or \
            not hasattr(transformer, "wte") or not hasattr(model, "lm_head"):
        return None
    names = {f.name for f in dataclasses.fields(cfg)}
    if not _NANOGPT_FIELDS - {"dropout"} <= names:
        return None
    refused = [f"{name}={getattr(cfg, name)!r} (a field nanoGPT's GPTConfig does not have)"
               for name in sorted(names - _NANOGPT_FIELDS)]
    bias = bool(cfg.bias)
    fields = {"vocab_size": cfg.vocab_size, "d_model": cfg.n_embd, "n_layers": cfg.n_layer,
              "n_heads": cfg.n_head, "d_ff": 4 * cfg.n_embd, "max_seq_len": cfg.block_size,
              "norm": "layernorm", "norm_eps": 1e-5, "norm_bias": bias, "mlp": "gelu",
              "pos": "learned", "attn_bias": bias, "mlp_bias": bias, "tie_embeddings": True}
    return read_spec("nanoGPT", fields, refused)


_READERS = (("TransformerLens", _lens), ("litgpt", _litgpt), ("nanoGPT", _nanogpt),
            ("torchtune", torchtune_spec), ("x-transformers", xtransformers_spec))
