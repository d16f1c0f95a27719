"""Hugging Face transformers as an independent reference: GPT-2 and Llama, both ways.

    from_hf(GPT2LMHeadModel | LlamaForCausalLM) -> Decoder      to_hf(Decoder) -> PreTrainedModel
    load_hf_folder(dir) -> Decoder                              save_hf_folder(decoder, dir)

`transformers` is the optional extra `hf`; it is imported only inside these functions, so the
core package works without it. Every model we build uses attn_implementation="eager" (HF's
explicit softmax path, the one whose attention weights can be read back).

How the weights map (one rename table per family; each entry also carries the HF shape that
the config implies, checked for every key before any tensor is converted):

GPT-2 (`transformer.` prefix; Conv1D stores W as (in, out), the transpose of nn.Linear):
    wte -> token_embeddings, wpe -> position_embeddings, h.i.ln_1/ln_2 -> layers.i.ln1/ln2,
    h.i.attn.c_attn (D, 3D) -> transpose, split rows into q_proj, k_proj, v_proj (D, D) each,
    h.i.attn.c_proj -> output_proj (transposed), h.i.mlp.c_fc/c_proj -> ffn.w1/w2 (transposed),
    ln_f -> ln_final, lm_head -> lm_head (stored only when untied).
Llama (`model.` prefix):
    embed_tokens, layers.i.input_layernorm/post_attention_layernorm -> ln1/ln2,
    self_attn.{q,k,v,o}_proj -> attn.{q,k,v,output}_proj, mlp.gate/up/down_proj -> ffn.w1/w3/w2,
    norm -> ln_final, lm_head. q and k rows are permuted per head, see `_rope_permutation`.

RoPE layouts. HF Llama rotates halves: within a head, pair j is (x[j], x[j + Dh/2]). We rotate
interleaved pairs (x[2j], x[2j+1]), both by the same angle pos * theta^(-2j/Dh). Reordering the
q_proj and k_proj output rows of each head so that our row 2j is HF row j and our row 2j+1 is
HF row j + Dh/2 makes the two rotations identical; q.k is unchanged because q and k get the same
permutation. Example, Dh = 4: ours = HF rows [0, 2, 1, 3]; back again: HF = ours [0, 2, 1, 3].

Precision: transformers computes Llama's rotary angles in float32 (and its RMSNorm in float32)
even for a float64 model, which bounds a float64 Llama comparison near 1e-6; GPT-2 in float64
agrees to ~1e-15.

Refused, with a ConfigError naming the field: RoPE scaling (rope_parameters.rope_type other than
"default"), partial rotary factors, sliding windows, head_dim != hidden_size / heads, activations
other than SiLU (Llama) or gelu_new / gelu_pytorch_tanh / gelu / relu (GPT-2),
scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, unscaled attention, cross attention,
and a tie flag that disagrees with the model's actual aliasing (DEFECTS.md A5).
Exporting a decoder without attention or MLP biases to GPT-2 (whose Conv1D always has them)
writes zero biases: the function is unchanged, and loading it back gives attn_bias=True.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import (
    copy_into_parameters,
    decoder_from_tensors,
    name_and_shape_problems,
    write_folder_atomically,
)
from ..config import DecoderConfig
from ..errors import CheckpointError, ConfigError
from ..model import Decoder

INSTALL_HINT = "pip install 'decoder-audit[hf]'"
ATTN_IMPLEMENTATION = "eager"

# HF activation name -> ours. GPT-2's "gelu_new" is the tanh approximation written out; it equals
# F.gelu(approximate="tanh") up to float rounding. On export we write "gelu_new", GPT-2's own.
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                     "relu": "relu"}
_GPT2_EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# Buffers that old checkpoints carry but that are not weights (causal-mask and RoPE caches).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "Hugging Face conversion needs the optional dependency 'transformers'; install it "
            f"with: {INSTALL_HINT}") from exc
    return transformers


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------

def config_from_hf(hf_config: Any) -> DecoderConfig:
    """A DecoderConfig for a GPT2Config or LlamaConfig, or ConfigError naming every field we
    cannot express."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type == "gpt2":
        return _gpt2_config(hf_config)
    if model_type == "llama":
        return _llama_config(hf_config)
    raise ConfigError(f"model_type={model_type!r} is not supported; supported are 'gpt2' "
                      "(GPT2LMHeadModel) and 'llama' (LlamaForCausalLM)")


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


def _llama_config(c: Any) -> DecoderConfig:
    problems = []
    if c.hidden_act != "silu":
        problems.append(f"hidden_act={c.hidden_act!r} (our SwiGLU gate is SiLU)")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        problems.append(f"head_dim={head_dim} != hidden_size/num_attention_heads="
                        f"{c.hidden_size}/{c.num_attention_heads}")
    rope = dict(getattr(c, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        problems.append(f"rope_parameters.rope_type={rope_type!r} (RoPE scaling is not supported)")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"rope_parameters.partial_rotary_factor={rope['partial_rotary_factor']}")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    if theta is None:
        problems.append("rope_parameters.rope_theta is missing")
    if getattr(c, "sliding_window", None) is not None:
        problems.append(f"sliding_window={c.sliding_window} (attention here is full causal)")
    layer_types = getattr(c, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        problems.append(f"layer_types={layer_types} (only full_attention)")
    _refuse("Llama", problems)
    n_kv = c.num_key_value_heads
    return DecoderConfig(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=None if n_kv in (None, c.num_attention_heads) else n_kv,
        d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings, norm="rmsnorm",
        norm_eps=float(c.rms_norm_eps), mlp="swiglu", pos="rope", rope_theta=float(theta),
        attn_bias=bool(c.attention_bias), mlp_bias=bool(c.mlp_bias),
        tie_embeddings=bool(c.tie_word_embeddings),
    )


def hf_family(cfg: DecoderConfig) -> str:
    """"gpt2" or "llama": the HF family that expresses cfg, or ConfigError naming the fields."""
    if cfg.norm == "layernorm" and cfg.pos == "learned" and cfg.mlp in _GPT2_EXPORT_ACTIVATIONS:
        if cfg.kv_heads != cfg.n_heads:
            raise ConfigError(f"n_kv_heads={cfg.n_kv_heads} != n_heads={cfg.n_heads}: GPT-2 has "
                              "no grouped-query attention")
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
        rms_norm_eps=cfg.norm_eps, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        attention_bias=cfg.attn_bias, mlp_bias=cfg.mlp_bias, attention_dropout=0.0, **common)


# ----------------------------------------------------------------------------------------------
# The rename tables
# ----------------------------------------------------------------------------------------------

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class Rule:
    """HF tensors `hf` (with shapes `hf_shapes`) <-> our tensors `ours`, through two inverse maps."""
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[int, ...], ...]
    ours: tuple[str, ...]
    to_ours: Callable[[Tensors], Tensors]
    to_hf: Callable[[Tensors], Tensors]


def _same(parts: Tensors) -> Tensors:
    return list(parts)


def _transpose(parts: Tensors) -> Tensors:
    return [parts[0].t()]  # Conv1D (in, out) <-> nn.Linear (out, in)


def _split_rows_transposed(parts: Tensors) -> Tensors:
    return list(parts[0].t().chunk(3))  # c_attn (D, 3D) -> (3D, D) -> q, k, v (D, D) each


def _cat_transposed(parts: Tensors) -> Tensors:
    return [torch.cat(parts).t()]  # q, k, v (D, D) -> (3D, D) -> c_attn (D, 3D)


def _split(parts: Tensors) -> Tensors:
    return list(parts[0].chunk(3))  # c_attn bias (3D,) -> q, k, v biases


def _cat(parts: Tensors) -> Tensors:
    return [torch.cat(parts)]


def _rope_permutation(head_dim: int) -> torch.Tensor:
    """Row order taking one HF (rotate-half) head to ours (interleaved): ours = hf[perm].
    perm[2j] = j, perm[2j+1] = j + Dh/2; e.g. Dh = 4 -> [0, 2, 1, 3]."""
    return torch.arange(head_dim).view(2, head_dim // 2).t().reshape(-1)


def _permute_heads(perm: torch.Tensor, head_dim: int) -> Callable[[Tensors], Tensors]:
    def apply(parts: Tensors) -> Tensors:
        w = parts[0]  # (heads*Dh, D) weight or (heads*Dh,) bias
        per_head = w.reshape(-1, head_dim, *w.shape[1:])  # (heads, Dh, ...)
        return [per_head[:, perm].reshape(w.shape)]
    return apply


def _gpt2_rules(cfg: DecoderConfig) -> list[Rule]:
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    rules = [Rule(("transformer.wte.weight",), ((v, d),), ("token_embeddings.weight",), _same, _same),
             Rule(("transformer.wpe.weight",), ((cfg.max_seq_len, d),),
                  ("position_embeddings.weight",), _same, _same)]
    for i in range(cfg.n_layers):
        h, o = f"transformer.h.{i}", f"layers.{i}"
        rules += [
            Rule((f"{h}.ln_1.weight",), ((d,),), (f"{o}.ln1.weight",), _same, _same),
            Rule((f"{h}.ln_1.bias",), ((d,),), (f"{o}.ln1.bias",), _same, _same),
            Rule((f"{h}.attn.c_attn.weight",), ((d, 3 * d),),
                 tuple(f"{o}.attn.{p}_proj.weight" for p in "qkv"),
                 _split_rows_transposed, _cat_transposed),
            Rule((f"{h}.attn.c_attn.bias",), ((3 * d,),),
                 tuple(f"{o}.attn.{p}_proj.bias" for p in "qkv"), _split, _cat),
            Rule((f"{h}.attn.c_proj.weight",), ((d, d),), (f"{o}.attn.output_proj.weight",),
                 _transpose, _transpose),
            Rule((f"{h}.attn.c_proj.bias",), ((d,),), (f"{o}.attn.output_proj.bias",), _same, _same),
            Rule((f"{h}.ln_2.weight",), ((d,),), (f"{o}.ln2.weight",), _same, _same),
            Rule((f"{h}.ln_2.bias",), ((d,),), (f"{o}.ln2.bias",), _same, _same),
            Rule((f"{h}.mlp.c_fc.weight",), ((d, f),), (f"{o}.ffn.w1.weight",), _transpose, _transpose),
            Rule((f"{h}.mlp.c_fc.bias",), ((f,),), (f"{o}.ffn.w1.bias",), _same, _same),
            Rule((f"{h}.mlp.c_proj.weight",), ((f, d),), (f"{o}.ffn.w2.weight",), _transpose,
                 _transpose),
            Rule((f"{h}.mlp.c_proj.bias",), ((d,),), (f"{o}.ffn.w2.bias",), _same, _same),
        ]
    rules += [Rule(("transformer.ln_f.weight",), ((d,),), ("ln_final.weight",), _same, _same),
              Rule(("transformer.ln_f.bias",), ((d,),), ("ln_final.bias",), _same, _same)]
    if not cfg.tie_embeddings:
        rules.append(Rule(("lm_head.weight",), ((v, d),), ("lm_head.weight",), _same, _same))
    return rules


def _llama_rules(cfg: DecoderConfig) -> list[Rule]:
    d, f, v, dh = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.head_dim
    dq, dkv = cfg.n_heads * dh, cfg.kv_heads * dh
    perm = _rope_permutation(dh)
    to_ours, to_hf = _permute_heads(perm, dh), _permute_heads(torch.argsort(perm), dh)
    rules = [Rule(("model.embed_tokens.weight",), ((v, d),), ("token_embeddings.weight",),
                  _same, _same)]
    for i in range(cfg.n_layers):
        h, o = f"model.layers.{i}", f"layers.{i}"
        attn = [("q_proj", "q_proj", dq, to_ours, to_hf), ("k_proj", "k_proj", dkv, to_ours, to_hf),
                ("v_proj", "v_proj", dkv, _same, _same)]
        for hf_name, our_name, rows, fwd, back in attn:
            rules.append(Rule((f"{h}.self_attn.{hf_name}.weight",), ((rows, d),),
                              (f"{o}.attn.{our_name}.weight",), fwd, back))
            if cfg.attn_bias:
                rules.append(Rule((f"{h}.self_attn.{hf_name}.bias",), ((rows,),),
                                  (f"{o}.attn.{our_name}.bias",), fwd, back))
        rules.append(Rule((f"{h}.self_attn.o_proj.weight",), ((d, dq),),
                          (f"{o}.attn.output_proj.weight",), _same, _same))
        if cfg.attn_bias:
            rules.append(Rule((f"{h}.self_attn.o_proj.bias",), ((d,),),
                              (f"{o}.attn.output_proj.bias",), _same, _same))
        for hf_name, our_name, shape in (("gate_proj", "w1", (f, d)), ("up_proj", "w3", (f, d)),
                                         ("down_proj", "w2", (d, f))):
            rules.append(Rule((f"{h}.mlp.{hf_name}.weight",), (shape,),
                              (f"{o}.ffn.{our_name}.weight",), _same, _same))
            if cfg.mlp_bias:
                rules.append(Rule((f"{h}.mlp.{hf_name}.bias",), ((shape[0],),),
                                  (f"{o}.ffn.{our_name}.bias",), _same, _same))
        rules += [Rule((f"{h}.input_layernorm.weight",), ((d,),), (f"{o}.ln1.weight",), _same, _same),
                  Rule((f"{h}.post_attention_layernorm.weight",), ((d,),), (f"{o}.ln2.weight",),
                       _same, _same)]
    rules.append(Rule(("model.norm.weight",), ((d,),), ("ln_final.weight",), _same, _same))
    if not cfg.tie_embeddings:
        rules.append(Rule(("lm_head.weight",), ((v, d),), ("lm_head.weight",), _same, _same))
    return rules


def _rules(cfg: DecoderConfig) -> tuple[str, list[Rule]]:
    family = hf_family(cfg)
    if family == "gpt2":
        # GPT-2's Conv1D always has biases: the table is built for a biased config.
        return family, _gpt2_rules(cfg.replace(attn_bias=True, mlp_bias=True))
    return family, _llama_rules(cfg)


# ----------------------------------------------------------------------------------------------
# HF tensors <-> our tensors
# ----------------------------------------------------------------------------------------------

def hf_tensors_to_ours(cfg: DecoderConfig, hf_tensors: Mapping[str, torch.Tensor], *,
                       source: str = "Hugging Face weights") -> dict[str, torch.Tensor]:
    """Our unique-parameter tensors from an HF state dict (names and shapes checked first)."""
    family, rules = _rules(cfg)
    prefix = "transformer." if family == "gpt2" else "model."
    tensors = _normalise_names(hf_tensors, prefix)
    if cfg.tie_embeddings and "lm_head.weight" in tensors:
        # A tied model's state_dict repeats the embedding as lm_head.weight; it must be equal.
        embed = tensors[rules[0].hf[0]]
        head = tensors.pop("lm_head.weight")
        if head.shape != embed.shape or not torch.equal(head, embed):
            raise ConfigError(f"{source}: tie_word_embeddings=True but lm_head.weight differs from "
                              f"{rules[0].hf[0]}; the flag and the weights disagree")
    expected = {n: s for rule in rules for n, s in zip(rule.hf, rule.hf_shapes)}
    problems = name_and_shape_problems(expected, {n: t.shape for n, t in tensors.items()})
    if problems:
        raise CheckpointError(f"{source} do not fit the config: " + "; ".join(problems))
    ours: dict[str, torch.Tensor] = {}
    for rule in rules:
        ours.update(zip(rule.ours, rule.to_ours([tensors[n] for n in rule.hf])))
    return ours


def our_tensors_to_hf(cfg: DecoderConfig, tensors: Mapping[str, torch.Tensor]
                      ) -> dict[str, torch.Tensor]:
    """HF state-dict tensors from our unique-parameter tensors (GPT-2: missing biases -> 0)."""
    family, rules = _rules(cfg)
    tensors = dict(tensors)
    if family == "gpt2":
        like = tensors["token_embeddings.weight"]
        for name, shape in _missing_gpt2_biases(cfg):
            tensors[name] = like.new_zeros(shape)
    out: dict[str, torch.Tensor] = {}
    for rule in rules:
        out.update(zip(rule.hf, rule.to_hf([tensors[n] for n in rule.ours])))
    return out


def _missing_gpt2_biases(cfg: DecoderConfig) -> list[tuple[str, tuple[int, ...]]]:
    missing = []
    for i in range(cfg.n_layers):
        if not cfg.attn_bias:
            missing += [(f"layers.{i}.attn.{p}_proj.bias", (cfg.d_model,)) for p in ("q", "k", "v")]
            missing.append((f"layers.{i}.attn.output_proj.bias", (cfg.d_model,)))
        if not cfg.mlp_bias:
            missing += [(f"layers.{i}.ffn.w1.bias", (cfg.d_ff,)),
                        (f"layers.{i}.ffn.w2.bias", (cfg.d_model,))]
    return missing


def _normalise_names(hf_tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Drop non-weight buffers; add the `transformer.`/`model.` prefix to base-model checkpoints
    (e.g. the original gpt2 files name `wte.weight`, not `transformer.wte.weight`)."""
    kept = {n: t for n, t in hf_tensors.items() if not n.endswith(_IGNORED_SUFFIXES)}
    if kept and not any(n.startswith(prefix) for n in kept):
        kept = {n if n == "lm_head.weight" else prefix + n: t for n, t in kept.items()}
    return kept


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _check_tie_flag(hf_model: Any) -> None:
    """The declared tie flag must agree with the aliasing actually present (DEFECTS.md A5)."""
    embed, head = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
    actually_tied = embed is not None and head is not None and head.weight is embed.weight
    declared = bool(hf_model.config.tie_word_embeddings)
    if declared != actually_tied:
        raise ConfigError(f"tie_word_embeddings={declared} but lm_head.weight is "
                          f"{'' if actually_tied else 'not '}the embedding Parameter")


def from_hf(hf_model: Any) -> Decoder:
    """A Decoder holding copies of a GPT2LMHeadModel's or LlamaForCausalLM's weights, with the
    same dtype and device. Raises ConfigError naming any field we cannot express."""
    _transformers()
    cfg = config_from_hf(hf_model.config)
    _check_tie_flag(hf_model)
    source = f"{type(hf_model).__name__} weights"
    return decoder_from_tensors(cfg, hf_tensors_to_ours(cfg, hf_model.state_dict(), source=source))


def to_hf(decoder: Decoder) -> Any:
    """A GPT2LMHeadModel or LlamaForCausalLM (eager attention, eval mode) holding copies of the
    decoder's weights, in its dtype and on its device."""
    tf = _transformers()
    if not isinstance(decoder, Decoder):
        raise TypeError(f"to_hf needs a decoder_audit Decoder, got {type(decoder).__name__}")
    cfg = decoder.config
    hf_config = config_to_hf(cfg)
    model_cls = tf.GPT2LMHeadModel if hf_family(cfg) == "gpt2" else tf.LlamaForCausalLM
    like = decoder.token_embeddings.weight
    hf_model = model_cls(hf_config).to(device=like.device, dtype=like.dtype).eval()
    copy_into_parameters(hf_model, our_tensors_to_hf(cfg, dict(decoder.named_parameters())))
    _check_tie_flag(hf_model)
    return hf_model


def load_hf_folder(folder: str | os.PathLike) -> Decoder:
    """A Decoder from a Hugging Face folder as `save_pretrained` writes it: config.json plus
    model.safetensors (or sharded model-*.safetensors with model.safetensors.index.json). An
    old-style pytorch_model.bin is read only with torch.load(weights_only=True)."""
    tf = _transformers()
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{str(folder)!r} has no config.json; not a Hugging Face model folder")
    try:
        hf_config = tf.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise CheckpointError(f"{str(config_path)!r} is not a readable Hugging Face config: "
                              f"{exc}") from exc
    cfg = config_from_hf(hf_config)
    ours = hf_tensors_to_ours(cfg, _read_hf_weights(folder), source=f"weights in {str(folder)!r}")
    return decoder_from_tensors(cfg, ours)


def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / "pytorch_model.bin").is_file():
        path = folder / "pytorch_model.bin"
        try:  # weights_only=True: tensors and plain containers only, never arbitrary objects
            return dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as exc:  # noqa: BLE001 - any failure means "not a plain weight file"
            raise CheckpointError(f"{str(path)!r} could not be read with "
                                  f"torch.load(weights_only=True): {exc}") from exc
    else:
        raise CheckpointError(f"{str(folder)!r} has no model.safetensors, "
                              "model.safetensors.index.json or pytorch_model.bin")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {exc}") from exc
    return tensors


def save_hf_folder(decoder: Decoder, folder: str | os.PathLike) -> Path:
    """Write the decoder as a Hugging Face folder (config.json + model.safetensors, via
    `save_pretrained`), swapped into place atomically like our own checkpoints."""
    hf_model = to_hf(decoder)
    return write_folder_atomically(folder, lambda tmp: hf_model.save_pretrained(tmp),
                                   marker_files=("config.json",))


@torch.no_grad()
def max_logit_difference(decoder: Decoder, hf_model: Any, ids: torch.Tensor) -> float:
    """max |ours - HF| over the logits of ids (B, T): the evidence that a conversion held."""
    ours = decoder(ids)
    theirs = hf_model(input_ids=ids).logits
    return (ours - theirs.to(ours.dtype)).abs().max().item()
