"""x-transformers' TransformerWrapper around a Decoder, read as a spec (`peer_configs`).

x-transformers keeps no config object: its Decoder takes some 80 options and keeps them spread
over its modules. So the reader works in two steps:

  1. what a DecoderConfig can say is read from the modules (the width, depth, heads, key/value
     heads and head width of the attention, the feed-forward's width, activation, gating and
     biases, the norm's kind and unit offset, the rotary module's width, base, interpolation
     factor and xpos, the readout), and turned into the Decoder's own arguments;
  2. a reference TransformerWrapper is built from those arguments alone (on the meta device: no
     weights are allocated) and compared with the model, module by module: the same classes,
     the same parameter and buffer names and shapes, the same plain settings (numbers, flags,
     strings, the functions a module calls). Whatever differs is an option step 1 did not
     read, and it is refused by its module path and value: the reader never passes on an
     option it did not express.

Its weights lie where no detected layout looks (layer 2i is block i's attention, 2i + 1 its
feed-forward; a GLU's one projection stacks the up rows, then the gate rows), so the reader
places them itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .layout_types import Spot
from .layouts import placeable, placed_on
from .peer_record import PeerSpec, read_spec

_ACTIVATIONS = {("GELU", False): "gelu", ("GELU", True): None, ("SiLU", True): "swiglu",
                ("ReLU", False): "relu"}


def xtransformers_spec(model: nn.Module) -> PeerSpec | None:
    layers = getattr(model, "attn_layers", None)
    if type(layers).__name__ != "Decoder" or not hasattr(model, "token_emb") or \
            not type(model).__module__.startswith("x_transformers"):
        return None
    refused: list[str] = []
    try:
        kwargs, fields = _read(model, layers, refused)
    except (AttributeError, IndexError, TypeError) as exc:  # a structure of another kind
        refused.append(f"its modules are not a Decoder's attention and feed-forward layers as "
                       f"read here ({type(exc).__name__}: {exc})")
    if refused:
        return PeerSpec("x-transformers", None, tuple(refused),
                        vocab_size=model.token_emb.emb.num_embeddings)
    refused += _differences(model, kwargs)
    found = read_spec("x-transformers", fields, refused)
    if found.spec is None:
        return found
    named = placeable(model)
    spots = _spots(model, found.spec)
    return PeerSpec("x-transformers", found.spec,
                    placement=placed_on("x-transformers", spots, named, found.spec))


def _read(model: nn.Module, layers: nn.Module, refused: list[str]
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the reference's constructor arguments, the DecoderConfig fields) read from the
    modules; an option that rules out both is appended to `refused`."""
    depth = len(layers.layers) // 2
    if tuple(layers.layer_types) != ("a", "f") * depth or depth == 0:
        refused.append(f"attn_layers.layer_types={tuple(layers.layer_types)} (not attention "
                       "then feed-forward, layer after layer)")
        return {}, {}
    attn, ff = layers.layers[0][1], layers.layers[1][1]
    heads, kv_heads = attn.heads, attn.kv_heads
    dim, dim_head = layers.dim, attn.to_q.out_features // attn.heads
    if kv_heads != heads:  # query head h reads key/value head h mod Hkv; ours h // (H / Hkv)
        refused.append(f"attn_kv_heads={kv_heads} (x-transformers groups query heads by head "
                       "index mod Hkv, a DecoderConfig by head index // (H / Hkv))")
    decoder = {"dim": dim, "depth": depth, "heads": heads, "attn_dim_head": dim_head,
               "attn_kv_heads": kv_heads, "attn_flash": bool(attn.attend.flash)}
    fields = {"vocab_size": model.token_emb.emb.num_embeddings, "d_model": dim,
              "n_layers": depth, "n_heads": heads, "max_seq_len": model.max_seq_len}
    if dim_head * heads != dim:
        fields["head_width"] = dim_head
    for read in (_read_norm, _read_ff, _read_rotary):
        more_kwargs, more_fields = read(layers, ff, refused)
        decoder.update(more_kwargs)
        fields.update(more_fields)
    wrapper, readout = _read_wrapper(model, refused)
    return {"decoder": decoder, "wrapper": wrapper}, {**fields, **readout}


def _read_norm(layers: nn.Module, ff: nn.Module, refused: list[str]
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    norm = layers.final_norm
    kind = type(norm).__name__
    offset = 1.0 if getattr(norm, "unit_offset", False) else 0.0
    kwargs = {"norm_add_unit_offset": bool(offset)}
    if kind == "LayerNorm":  # a gain, no shift, around torch's LayerNorm of eps 1e-5 (another
        # eps in a module differs from the reference's, and is refused there)
        return kwargs, {"norm": "layernorm", "norm_bias": False, "norm_eps": 1e-5,
                        "norm_offset": offset}
    if kind == "RMSNorm":  # x / ||x|| * sqrt(D): an RMSNorm without eps
        return {**kwargs, "use_rmsnorm": True}, {"norm": "rmsnorm", "norm_eps": 0.0,
                                                 "norm_offset": offset}
    refused.append(f"attn_layers.final_norm={kind} (a norm of another kind)")
    return {}, {}


def _read_ff(layers: nn.Module, ff: nn.Module, refused: list[str]
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    first, out = ff.ff[0], [m for m in ff.ff if isinstance(m, nn.Linear)][-1]
    glu = type(first).__name__ == "GLU"
    linear = first.proj if glu else first[0]
    act = first.act if glu else first[-1]
    inner = linear.out_features // 2 if glu else linear.out_features
    kind = _ACTIVATIONS.get((type(act).__name__, glu)) if not isinstance(act, nn.GELU) or \
        act.approximate == "none" else None
    if kind is None:
        refused.append(f"the feed-forward's activation {act!r} (glu={glu}: no MLP of that kind)")
        return {}, {}
    # a GLU's projection always has a bias (ff_no_bias drops the output's alone)
    biased = (("w1", "w3") if glu else ("w1",)) * (linear.bias is not None) + \
        ("w2",) * (out.bias is not None)
    every = 3 if glu else 2
    kwargs = {"ff_mult": inner / layers.dim, "ff_glu": glu, "ff_no_bias": out.bias is None,
              "ff_swish": isinstance(act, nn.SiLU)}
    return kwargs, {"mlp": kind, "d_ff": inner,
                    "mlp_bias": biased if 0 < len(biased) < every else bool(biased)}


def _read_rotary(layers: nn.Module, ff: nn.Module, refused: list[str]
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    rotary, dim_head = layers.rotary_pos_emb, layers.layers[0][1].to_q.out_features // \
        layers.layers[0][1].heads
    if rotary is None:
        return {}, {"pos": "none"}
    if getattr(rotary, "scale", None) is not None:
        refused.append("rotary_xpos=True (xpos scales q and k by position)")
    width = 2 * rotary.inv_freq.numel()  # R: pair j turns by pos * base^(-2j / R)
    # the base, from the first pair but one: base * rescale^(R / (R - 2)) as RotaryEmbedding has it
    base = 10000.0 if width < 4 else float(rotary.inv_freq[1].double()) ** (-width / 2)
    rescale = 1.0 if width < 4 else (base / 10000.0) ** ((width - 2) / width)
    expected = base ** -(torch.arange(0, width, 2, dtype=torch.float64) / width)
    if not torch.allclose(rotary.inv_freq.double().cpu(), expected, rtol=1e-5, atol=0.0):
        refused.append(f"attn_layers.rotary_pos_emb.inv_freq={rotary.inv_freq.tolist()} (not "
                       f"base^(-2j/R) for any one base: R={width}, from its second pair "
                       f"base={base:.6g})")
    kwargs = {"rotary_pos_emb": True, "rotary_emb_dim": width,
              "rotary_interpolation_factor": rotary.interpolation_factor,
              "rotary_base_rescale_factor": rescale}
    fields: dict[str, Any] = {"pos": "rope", "rope_layout": "interleaved",
                              "rope_theta": 10000.0 * rescale ** (width / (width - 2))
                              if width >= 4 else 10000.0}
    if width != dim_head:
        fields["rotary_dim"] = width
    if rotary.interpolation_factor != 1:
        fields["rope_scaling"] = {"type": "linear", "factor": float(rotary.interpolation_factor)}
    return kwargs, fields


def _read_wrapper(model: nn.Module, refused: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    pos = type(model.pos_emb).__name__
    if pos != "always":
        refused.append(f"pos_emb={pos} (x-transformers scales its absolute positions by "
                       "dim ** -0.5, or computes them: use_abs_pos_emb=False with rotary_pos_emb)")
    wrapper: dict[str, Any] = {"num_tokens": model.num_tokens, "max_seq_len": model.max_seq_len,
                               "use_abs_pos_emb": False}
    head = model.to_logits
    if isinstance(head, nn.Linear):
        return {**wrapper, "logits_dim": head.out_features}, {
            "tie_embeddings": False, "readout_bias": head.bias is not None}
    scale = getattr(model, "tie_embedding_scale", None)
    if scale != 1.0:
        refused.append(f"tie_embedding=True with tie_embedding_scale={scale} (a tied readout "
                       "multiplied by a constant)")
    return {**wrapper, "tie_embedding": True, "tie_embedding_scale": scale}, {
        "tie_embeddings": True}


# ---- the reference, compared -------------------------------------------------------------------

def _differences(model: nn.Module, kwargs: dict[str, Any]) -> list[str]:
    """Each way the model differs from the reference built from `kwargs` alone (see the
    module docstring), named by module path."""
    try:
        with torch.device("meta"):
            decoder = type(model.attn_layers)(**kwargs["decoder"])
            reference = type(model)(attn_layers=decoder, **kwargs["wrapper"])
    except Exception as exc:  # noqa: BLE001 - an option read wrongly: refused, named
        return [f"x-transformers' Decoder could not be rebuilt from the options read "
                f"({type(exc).__name__}: {exc}), so the others are unknown"]
    ours, theirs = dict(model.named_modules()), dict(reference.named_modules())
    found = [f"{name or 'the wrapper'}={type(ours[name]).__name__} (a module the options read "
             "do not build)" for name in ours if name not in theirs
             or type(theirs[name]) is not type(ours[name])]
    found += [f"{name} missing (the options read build it)" for name in theirs if name not in ours]
    for name in ours.keys() & theirs.keys():
        if type(theirs[name]) is type(ours[name]):
            found += _settings_differ(name, ours[name], theirs[name])
    shapes = lambda m: {n: tuple(t.shape) for n, t in  # noqa: E731
                        [*m.named_parameters(), *m.named_buffers()] if t is not None}
    mine, built = shapes(model), shapes(reference)
    found += [f"{n} {list(mine.get(n, ()))} (the options read build "
              f"{list(built[n]) if n in built else 'no such tensor'})"
              for n in sorted(mine.keys() | built.keys()) if mine.get(n) != built.get(n)]
    return sorted(found)


def _settings_differ(name: str, ours: nn.Module, theirs: nn.Module) -> list[str]:
    if isinstance(ours, nn.Dropout):  # eval mode: dropout changes nothing the gate compares
        return []
    mine, built = dict(_settings(ours)), dict(_settings(theirs))
    where = name or "the wrapper"
    return [f"{where}.{key}={mine.get(key)!r} (the options read give {built.get(key)!r})"
            for key in sorted(mine.keys() | built.keys())
            if not _same(mine.get(key), built.get(key))]


def _settings(module: nn.Module) -> Iterator[tuple[str, Any]]:
    """A module's own plain settings: numbers, flags, strings and the functions it calls."""
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training" or isinstance(value, (nn.Module, torch.Tensor)):
            continue
        yield key, _plain(value)


def _plain(value: Any) -> Any:
    """A setting as compared: a number, flag or string as it is, a sequence or dict item by
    item, a function by its name (and a partial's arguments), anything else by its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, functools.partial):
        return (_plain(value.func), _plain(value.args), _plain(value.keywords))
    if isinstance(value, torch.dtype):
        return str(value)
    if callable(value):  # a function it calls: which one, not where it lives
        return getattr(value, "__qualname__", type(value).__qualname__)
    return f"<{type(value).__qualname__}>"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


# ---- where the weights lie ---------------------------------------------------------------------

def _spots(model: nn.Module, spec) -> dict[str, Spot]:
    """canonical name -> where it lies in the wrapper (see the module docstring)."""
    norm = "g" if spec.norm == "rmsnorm" else "gamma"
    spots = {"token_embeddings.weight": Spot("token_emb.emb.weight"),
             "ln_final.weight": Spot(f"attn_layers.final_norm.{norm}")}
    if isinstance(model.to_logits, nn.Linear):
        spots["lm_head.weight"] = Spot("to_logits.weight")
        if model.to_logits.bias is not None:
            spots["lm_head.bias"] = Spot("to_logits.bias")
    f = spec.d_ff
    for i in range(spec.n_layers):
        attn, ff = f"attn_layers.layers.{2 * i}", f"attn_layers.layers.{2 * i + 1}"
        spots[f"layers.{i}.ln1.weight"] = Spot(f"{attn}.0.0.{norm}")
        spots[f"layers.{i}.ln2.weight"] = Spot(f"{ff}.0.0.{norm}")
        for ours, theirs in (("q_proj", "to_q"), ("k_proj", "to_k"), ("v_proj", "to_v"),
                             ("output_proj", "to_out")):
            spots[f"layers.{i}.attn.{ours}.weight"] = Spot(f"{attn}.1.{theirs}.weight")
        if spec.gated:  # GLU: proj stacks the up rows (w3), then the gate rows (w1)
            up = {"w3": (0, f), "w1": (f, 2 * f)}
            for w, rows in up.items():
                spots[f"layers.{i}.ffn.{w}.weight"] = Spot(f"{ff}.1.ff.0.proj.weight", rows=rows)
                if spec.has_bias(w):
                    spots[f"layers.{i}.ffn.{w}.bias"] = Spot(f"{ff}.1.ff.0.proj.bias", rows=rows)
        else:
            spots[f"layers.{i}.ffn.w1.weight"] = Spot(f"{ff}.1.ff.0.0.weight")
            if spec.has_bias("w1"):
                spots[f"layers.{i}.ffn.w1.bias"] = Spot(f"{ff}.1.ff.0.0.bias")
        out = max(j for j, m in enumerate(model.attn_layers.layers[2 * i + 1][1].ff)
                  if isinstance(m, nn.Linear))
        spots[f"layers.{i}.ffn.w2.weight"] = Spot(f"{ff}.1.ff.{out}.weight")
        if spec.has_bias("w2"):
            spots[f"layers.{i}.ffn.w2.bias"] = Spot(f"{ff}.1.ff.{out}.bias")
    return spots
