"""Hugging Face state dicts <-> our tensors: one rename table per family.

Each table entry (a `Rule`) also carries the HF shape that the config implies, checked for every
key before any tensor is converted:

GPT-2 (`transformer.` prefix; Conv1D stores W as (in, out), the transpose of nn.Linear):
    wte -> token_embeddings, wpe -> position_embeddings, h.i.ln_1/ln_2 -> layers.i.ln1/ln2,
    h.i.attn.c_attn (D, 3D) -> transpose, split rows into q_proj, k_proj, v_proj (D, D) each,
    h.i.attn.c_proj -> output_proj (transposed), h.i.mlp.c_fc/c_proj -> ffn.w1/w2 (transposed),
    ln_f -> ln_final, lm_head -> lm_head (stored only when untied).
Llama (`model.` prefix):
    embed_tokens, layers.i.input_layernorm/post_attention_layernorm -> ln1/ln2,
    self_attn.{q,k,v,o}_proj -> attn.{q,k,v,output}_proj, mlp.gate/up/down_proj -> ffn.w1/w3/w2,
    norm -> ln_final, lm_head. q and k rows are permuted per head, see `rope_permutation`.

RoPE layouts. HF Llama rotates halves: within a head, pair j is (x[j], x[j + Dh/2]). We rotate
interleaved pairs (x[2j], x[2j+1]), both by the same angle pos * theta^(-2j/Dh). Reordering the
q_proj and k_proj output rows of each head so that our row 2j is HF row j and our row 2j+1 is
HF row j + Dh/2 makes the two rotations identical; q.k is unchanged because q and k get the same
permutation. Example, Dh = 4: ours = HF rows [0, 2, 1, 3]; back again: HF = ours [0, 2, 1, 3].

Exporting a decoder without attention or MLP biases to GPT-2 (whose Conv1D always has them)
writes zero biases: the function is unchanged, and loading it back gives attn_bias=True.

The files: `weight_files` finds a folder's safetensors (one file or an index's shards; pickle
weights alone are refused, never unpickled) and `stored_shapes` reads their headers only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import DecoderConfig
from ..errors import CheckpointError, ConfigError
from ..storage.checkpoint import name_and_shape_problems
from .hf_config import hf_family

# Buffers that old checkpoints carry but that are not weights (causal-mask and RoPE caches).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


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


def rope_permutation(head_dim: int) -> torch.Tensor:
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
    perm = rope_permutation(dh)
    to_ours, to_hf = _permute_heads(perm, dh), _permute_heads(torch.argsort(perm), dh)
    if cfg.rope_layout == "rotate_half":  # the rows already pair as Hugging Face's do
        to_ours = to_hf = _same
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
# The files of a save_pretrained folder, read by their headers
# ----------------------------------------------------------------------------------------------

# Weights stored as pickles (torch.save): refused, never loaded, since unpickling runs code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors weights: model.safetensors, or the shards its index names. A
    folder holding only pickle weights (pytorch_model.bin) is refused naming them."""
    single, index = folder / SINGLE_FILE, folder / INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{str(index)!r} is not a safetensors index (a JSON object "
                                  f"with a weight_map of tensor -> file): {exc!r}") from None
        missing = [name for name in names if not (folder / str(name)).is_file()]
        if missing or not names:
            raise CheckpointError(f"{str(index)!r} names shards {missing or names} that are "
                                  f"not in {str(folder)!r}")
        return [folder / name for name in names]
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{str(folder)!r} holds its weights only as pickles {pickles}, "
                              f"and no {SINGLE_FILE}: decoder-audit never unpickles (unpickling "
                              "runs arbitrary code); re-save them with safetensors "
                              "(save_pretrained's default)")
    raise CheckpointError(f"{str(folder)!r} has no {SINGLE_FILE} or {INDEX_FILE}")


def stored_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype) of every stored tensor, from the headers alone (no
    tensor is read). A file that is not whole safetensors is refused naming it."""
    from safetensors import SafetensorError, safe_open

    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    part = handle.get_slice(name)
                    stored[name] = (tuple(part.get_shape()), part.get_dtype())
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable safetensors file (garbled or "
                                  f"truncated?): {exc}") from None
    return stored


def weights_name(folder: Path, files: list[Path]) -> str:
    """How a message names a folder's weights: its one file, or the index of its shards."""
    return repr(str(files[0])) if len(files) == 1 else repr(str(folder / INDEX_FILE))
