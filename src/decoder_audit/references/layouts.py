"""Where a decoder someone else wrote keeps each weight of its declared architecture.

A spec (a `DecoderConfig` the user declares for their module) names every weight the
architecture has by our canonical names (DESIGN.md: `token_embeddings.weight`,
`layers.{i}.attn.q_proj.weight`, ..., `lm_head.weight`). A `Placement` says where each of them
lies in the module's own state dict: which parameter, transposed or not (a Conv1D stores
(in, out)), and which rows of it (a fused q/k/v matrix). `Placement.canonical(state)` turns the
module's state dict into canonical tensors that are *views* of the module's tensors, so the
oracle can read them, the gate can write stress weights through them, and a gradient flows back
to the module's own parameters. This is the engine that finds and places them (`detect`,
`place`); the weights a spec expects are spec_weights.py's, `Layout` and `Spot` layout_types.py's.

The layouts are layout_table.py's `LAYOUTS` (`detect` finds a module's from its parameter
names, each possibly under a wrapper's prefix, `model.`, `net.`, and each also without its root
module: `rootless`); TransformerLens' HookedTransformer (per-head W_Q, W_O, ...) is placed by
its own reader here. Anything else takes a user function (`weights_map=`, weights_map.py):
state dict -> {canonical name: tensor}.

Nothing is guessed: a weight the spec expects that the layout does not find, a weight found
with another shape, and a parameter of the module no canonical name takes are listed in
`Placement.problems` / `Placement.leftover`; the gate's `params` check reports them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from .layout_table import LAYOUTS
from .layout_types import Layout, Spot
from .spec_weights import every_canonical, misfits
from .weights_map import (WeightsMap, WeightsMapError, WeightsMapReturnError, map_label,
                          run_weights_map)


@dataclass(frozen=True)
class Placement:
    """The module's weights placed on the spec's canonical names (see the module docstring)."""

    layout: str
    spots: dict[str, Spot] = field(default_factory=dict)
    """canonical name -> where it lies (empty for a user's weights_map)."""
    user_map: WeightsMap | None = None
    problems: tuple[str, ...] = ()
    """What does not fit the spec: expected and not found, found with another shape, found
    although the spec has no such weight (an extra bias)."""
    leftover: tuple[str, ...] = ()
    """The module's parameters no canonical name takes (an extra Linear, a q/k norm)."""
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """canonical name -> the module parameters it is made of (one, or several that a
    weights_map concatenates)."""
    map_error: str = ""
    """What the weights_map did instead of mapping (raised, exited, edited its input, returned
    no dict of tensors), naming it; the params and oracle checks fail with it."""

    def canonical(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{canonical name: tensor} from the module's state dict (its names), as views (a
        weights_map's tensors are what it returns). WeightsMapError when the map misbehaves."""
        if self.user_map is not None:
            return run_weights_map(self.user_map, state)
        return {name: spot.view(state[spot.source]) for name, spot in self.spots.items()}


# The buffers a layout places (`Layout.selection_bias`, `selection_bias_at`), by the last part
# of their names.
PLACED_BUFFERS = frozenset(
    name.rpartition(".")[2] for layout in LAYOUTS
    for name in (layout.selection_bias, layout.selection_bias_at) if name)


def placeable(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a layout places: every Parameter under each of its names
    (`named_parameters(remove_duplicate=False)`), and the buffers that hold a canonical weight
    (PLACED_BUFFERS: DeepSeek-V3's e_score_correction_bias, the selection bias our Decoder keeps
    as a Parameter that requires no grad). Every other buffer (RoPE's inverse frequencies, a
    causal mask) is no weight and stays out."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update({name: buffer for name, buffer in model.named_buffers(remove_duplicate=False)
                  if name.rpartition(".")[2] in PLACED_BUFFERS})
    return named


def place(model: nn.Module, spec: DecoderConfig, weights_map: WeightsMap | None,
          layout: str | None = None) -> tuple[Placement | None, str]:
    """(where the module's weights lie on the spec's names, "") or (None, why not). `layout`:
    the name of the layout its weights lie in (a Hugging Face family's own, where its names
    alone would not tell), instead of the one detected from the names."""
    named = placeable(model)
    if weights_map is not None:
        if not callable(weights_map):
            raise ConfigError(f"weights_map={weights_map!r} must be a function from the module's "
                              "state dict to {canonical name: tensor}")
        detached = {name: tensor.detach() for name, tensor in named.items()}
        return user_placement(weights_map, detached, spec), ""
    among = named_layouts(layout) if layout is not None else None
    placement = detect(named, spec, among)
    if placement is None:
        looked = sorted({f"{layout.embedding}.weight" for layout in (among or DETECTED)}
                        | ({"embed.W_E"} if among is None else set()))
        return None, (f"token_embeddings.weight not found: no known layout's embedding is among "
                      f"{type(model).__name__}'s parameter names (first: {list(named)[:3]}; "
                      f"looked for {', '.join(looked)}, at the root or under a prefix): pass "
                      "weights_map= (--weights-map FILE.py:FN), a function from its state dict "
                      "to the canonical names")
    return placement, ""


# TransformerLens (HookedTransformer, 3.x): (module, parameter) of each canonical weight, within
# a block (blocks.{i}.) or at the top; W_in is the MLP's input matrix, or its up projection (w3)
# beside W_gate in a gated MLP; a grouped-query block names its K and V _W_K, _W_V.
_LENS_BLOCK = {"ln1.weight": "ln1.w", "ln1.bias": "ln1.b", "ln2.weight": "ln2.w",
               "ln2.bias": "ln2.b", "attn.output_proj.weight": "attn.W_O",
               "attn.output_proj.bias": "attn.b_O", "ffn.w2.weight": "mlp.W_out",
               "ffn.w2.bias": "mlp.b_out"}
_LENS_TOP = {"token_embeddings.weight": "embed.W_E", "position_embeddings.weight": "pos_embed.W_pos",
             "ln_final.weight": "ln_final.w", "ln_final.bias": "ln_final.b",
             "lm_head.weight": "unembed.W_U", "lm_head.bias": "unembed.b_U"}


def _lens_spot(prefix: str, canonical: str, shapes: Mapping[str, tuple[int, ...]]
               ) -> Spot | None:
    """Where a canonical weight lies in a TransformerLens HookedTransformer, or None."""
    module = canonical.split(".")
    if module[0] != "layers":
        name = _LENS_TOP.get(canonical)
        if name is None:  # a weight TransformerLens has no place for (an embedding norm)
            return None
        transposed = canonical == "lm_head.weight"  # W_U is (D, V)
        return Spot(prefix + name, transposed) if prefix + name in shapes else None
    block, part = f"{prefix}blocks.{module[1]}.", ".".join(module[2:])
    which = module[3] if module[2] == "attn" else ""
    if which in ("q_proj", "k_proj", "v_proj"):
        letter = which[0].upper()
        kind = "W" if module[-1] == "weight" else "b"
        for name in (f"attn.{kind}_{letter}", f"attn._{kind}_{letter}"):
            if block + name in shapes:
                return Spot(block + name, heads="in" if kind == "W" else "bias")
        return None
    gated = f"{block}mlp.W_gate" in shapes
    mlp = {"ffn.w1.weight": "mlp.W_gate" if gated else "mlp.W_in",
           "ffn.w1.bias": None if gated else "mlp.b_in",
           "ffn.w3.weight": "mlp.W_in" if gated else None, "ffn.w3.bias": "mlp.b_in" if gated
           else None}
    name = mlp[part] if part in mlp else _LENS_BLOCK.get(part)
    if name is None or block + name not in shapes:
        return None
    return Spot(block + name, heads="out" if name == "attn.W_O" else "",
                transposed=name.startswith("mlp.W_"))  # W_in, W_gate, W_out: (in, out)


def _lens_placement(prefix: str, named: Mapping[str, torch.Tensor],
                    spec: DecoderConfig) -> Placement:
    shapes = {name: tuple(tensor.shape) for name, tensor in named.items()}
    spots = {canonical: spot for canonical in every_canonical(spec)
             if (spot := _lens_spot(prefix, canonical, shapes)) is not None}
    return _placement("TransformerLens", prefix, spots, named, spec)


def rootless(layout: Layout) -> Layout | None:
    """`layout` without the root module its embedding, blocks and final norm share (Hugging
    Face's `model.`, nanoGPT's `transformer.`, GPT-NeoX's `gpt_neox.`), the head staying where
    it is: the same names a hand-written model keeps at its top (`embed_tokens`,
    `layers.{i}.self_attn.q_proj`, `norm`, `lm_head`). None for a layout without such a root."""
    inner = [name for name in (layout.embedding, layout.positions, layout.block,
                               layout.final_norm, layout.embedding_norm) if name is not None]
    root = inner[0].split(".")[0] + "."
    if "." not in inner[0] or not all(name.startswith(root) for name in inner):
        return None
    strip = lambda name: None if name is None else name[len(root):]  # noqa: E731
    return replace(layout, name=f"{layout.name}, without its {root.rstrip('.')!r} root",
                   embedding=strip(layout.embedding), positions=strip(layout.positions),
                   block=strip(layout.block), final_norm=strip(layout.final_norm),
                   embedding_norm=strip(layout.embedding_norm))


def _with_rootless(layouts: tuple[Layout, ...]) -> tuple[Layout, ...]:
    return layouts + tuple(bare for layout in layouts if (bare := rootless(layout)) is not None)


# Every layout detect() looks for: as its library names it, and rootless (see `rootless`).
DETECTED: tuple[Layout, ...] = _with_rootless(tuple(layout for layout in LAYOUTS
                                                    if layout.detected))
BY_NAME: Mapping[str, Layout] = {layout.name: layout for layout in LAYOUTS}


def named_layouts(name: str) -> tuple[Layout, ...]:
    """The layout of this name and its rootless form (ConfigError for a name no layout has)."""
    if name not in BY_NAME:
        raise ConfigError(f"layout {name!r} is not one of {sorted(BY_NAME)}")
    return _with_rootless((BY_NAME[name],))


def detect(named: Mapping[str, torch.Tensor], spec: DecoderConfig,
           among: tuple[Layout, ...] | None = None) -> Placement | None:
    """The layout of a module with these parameters (every name, `named_parameters(
    remove_duplicate=False)`: a tied weight under each of its names), placed on the spec; None
    when no known layout's embedding is among them, at the root or under any prefix. Where
    several layouts find the embedding, the one that leaves the fewest problems wins
    (LLMs-from-scratch's GPT and Llama share their names). `among`: only these layouts (a
    family's own, `named_layouts`), instead of every detected one and TransformerLens'."""
    found = [_place(layout, prefix, named, spec) for layout in (among or DETECTED)
             for prefix in _prefixes(named, f"{layout.embedding}.weight")]
    if among is None:
        found += [_lens_placement(prefix, named, spec)
                  for prefix in _prefixes(named, "embed.W_E")]
    if not found:
        return None
    return min(found, key=lambda p: len(p.problems) + len(p.leftover))


def user_placement(weights_map: WeightsMap, named: Mapping[str, torch.Tensor],
                   spec: DecoderConfig) -> Placement:
    """A user's weights_map, run once on shape-only (meta) stand-ins of the module's parameters
    to find what each canonical tensor is made of (by autograd, so a map that slices, transposes
    or concatenates is followed) and what it does not fit: the same problems a detected layout
    reports."""
    leaves = {id(t): torch.empty(t.shape, dtype=t.dtype, device="meta").requires_grad_()
              for t in named.values()}  # a tied weight: one stand-in under each of its names
    stand_ins = {name: leaves[id(t)] for name, t in named.items()}
    label = f"weights_map {map_label(weights_map)}"
    try:
        mapped = run_weights_map(weights_map, stand_ins, where=(
            " on shape-only (meta) stand-ins of the module's parameters, which it is first run "
            "on to follow what each canonical weight is made of (a map computes with tensor "
            "operations; it reads no values)"))
    except WeightsMapReturnError:
        raise  # what it returned is input: refused as a bad argument is (audit raises it)
    except WeightsMapError as exc:
        return Placement(label, user_map=weights_map, problems=(str(exc),), map_error=str(exc))
    first_name = {}
    for name, tensor in named.items():
        first_name.setdefault(id(leaves[id(tensor)]), name)
    sources = {}
    inputs = list(leaves.values())
    for canonical, tensor in mapped.items():
        grads = torch.autograd.grad(tensor.sum(), inputs, allow_unused=True) \
            if tensor.requires_grad else [None] * len(inputs)
        sources[canonical] = tuple(first_name[id(leaf)] for leaf, g in zip(inputs, grads)
                                   if g is not None)
    used = {name for names in sources.values() for name in names}
    return Placement(label, user_map=weights_map,
                     problems=tuple(misfits({n: tuple(t.shape) for n, t in mapped.items()},
                                             spec)),
                     leftover=_unused(named, used.__contains__), sources=sources)


def _prefixes(named: Mapping[str, torch.Tensor], suffix: str) -> list[str]:
    return [name[:-len(suffix)] for name in named
            if name == suffix or name.endswith("." + suffix)]


def _unused(named: Mapping[str, torch.Tensor], used: Callable[[str], bool]) -> tuple[str, ...]:
    """The first name of each Parameter none of whose names (or storage) is used."""
    by_param: dict[int, list[str]] = {}
    for name, tensor in named.items():
        by_param.setdefault(id(tensor), []).append(name)
    return tuple(names[0] for names in by_param.values()
                 if not any(used(n) for n in names))


def _place(layout: Layout, prefix: str, named: Mapping[str, torch.Tensor],
           spec: DecoderConfig) -> Placement:
    shapes = {name: tuple(tensor.shape) for name, tensor in named.items()}
    if f"{prefix}{layout.head}.weight" not in shapes:
        alias = next((a for a in layout.head_aliases if f"{prefix}{a}.weight" in shapes), None)
        layout = replace(layout, head=alias) if alias else layout
    conv1d = _conv1d(layout, prefix, shapes, spec)
    spots: dict[str, Spot] = {}
    for canonical in every_canonical(spec):
        spot = _spot(layout, prefix, canonical, shapes, spec, conv1d)
        if spot is not None:
            spots[canonical] = spot
    return _placement(layout.name, prefix, spots, named, spec)


def placed_on(layout_name: str, spots: dict[str, Spot], named: Mapping[str, torch.Tensor],
              spec: DecoderConfig) -> Placement:
    """The placement of spots a reader found itself (`peer_xtransformers`: names no layout of
    this table has), with the same problems and leftovers a detected layout reports."""
    return _placement(layout_name, "", spots, named, spec)


def _placement(layout_name: str, prefix: str, spots: dict[str, Spot],
               named: Mapping[str, torch.Tensor], spec: DecoderConfig) -> Placement:
    """The placement of these spots: the tied head where the spec ties and the module has no
    head of its own, the problems, and the module's parameters no spot takes."""
    shapes = {n: tuple(tensor.shape) for n, tensor in named.items()}
    if "lm_head.weight" not in spots and spec.tie_embeddings and "token_embeddings.weight" in spots:
        spots["lm_head.weight"] = spots["token_embeddings.weight"]  # the forward reuses it
    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    problems = misfits({name: tuple(spot.view(meta[spot.source]).shape)
                         for name, spot in spots.items()}, spec)
    sources = {spot.source for spot in spots.values()}
    leftover = _unused({n: t for n, t in named.items() if n.startswith(prefix)},
                       sources.__contains__)
    label = layout_name + (f" (under {prefix.rstrip('.')!r})" if prefix else "")
    return Placement(label, spots, problems=tuple(problems), leftover=leftover,
                     sources={name: (spot.source,) for name, spot in spots.items()})


def _qkv_rows(spec: DecoderConfig) -> dict[str, tuple[int, int]]:
    """Rows of q, k and v in a fused matrix that stacks them in this order."""
    d_q, d_kv = spec.n_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    return {"q_proj": (0, d_q), "k_proj": (d_q, d_q + d_kv), "v_proj": (d_q + d_kv, d_q + 2 * d_kv)}


def _fused_qkv_rows(layout: Layout, spec: DecoderConfig, which: str
                    ) -> tuple[tuple[int, int], int]:
    """(rows, groups) of q, k or v (`which`) in the layout's fused matrix: rows [start, stop)
    of each of `groups` equal row groups (Spot). Per KV group (qkv_per_head): the group's query
    heads, its key head, its value head; else `qkv_shards` shards each holding its share of q,
    k and v in `qkv_order` (one shard: every q row, then every k row, then every v row)."""
    if layout.qkv_per_head:  # each KV group's q heads, k and v rows together
        per, width = spec.n_heads // spec.kv_heads, spec.head_dim
        start = {"q_proj": 0, "k_proj": per, "v_proj": per + 1}[which]
        stop = start + (per if which == "q_proj" else 1)
        return (start * width, stop * width), spec.kv_heads
    shards = layout.qkv_shards
    d_q, d_kv = spec.n_heads * spec.head_dim, spec.kv_heads * spec.head_dim
    widths = {"q_proj": d_q // shards, "k_proj": d_kv // shards, "v_proj": d_kv // shards}
    start = sum(widths[name] for name in layout.qkv_order[:layout.qkv_order.index(which)])
    return (start, start + widths[which]), shards


def _conv1d(layout: Layout, prefix: str, shapes: Mapping[str, tuple[int, ...]],
            spec: DecoderConfig) -> bool:
    """A fused layout's matrices are stored (in, out) (GPT-2's Conv1D) when its first fused
    q/k/v weight is (D, 3 rows) rather than (3 rows, D): decided once, so a square matrix
    (c_proj, D x D) is read the same way as the rest."""
    if layout.fused_qkv is None:
        return False
    shape = shapes.get(f"{prefix}{layout.block.format(i=0)}.{layout.fused_qkv}.weight")
    rows = _qkv_rows(spec)["v_proj"][1]
    return shape == (spec.d_model, rows) and rows != spec.d_model


def _spot(layout: Layout, prefix: str, canonical: str, shapes: Mapping[str, tuple[int, ...]],
          spec: DecoderConfig, conv1d: bool) -> Spot | None:
    """Where `canonical` lies in this layout, or None when the layout has no such weight."""
    module, _, kind = canonical.rpartition(".")
    part = module.split(".", 2)[2] if module.startswith("layers.") else module
    if part in ("ln1", "ln2", "ln1_post", "ln2_post", "ln_final", "attn.q_norm", "attn.k_norm",
                "embedding_norm"):
        kind = layout.norm_params[0 if kind == "weight" else 1]
        if kind is None:  # the layout's norms have no shift
            return None
    if kind == "selection_bias" and layout.selection_bias_at:  # held beside the router
        source = f"{prefix}{layout.block.format(i=module.split('.')[1])}.{layout.selection_bias_at}"
        return Spot(source, flat=len(shapes[source]) > 1) if source in shapes else None
    if kind == "selection_bias" and layout.selection_bias:  # the router's own name for it
        kind = layout.selection_bias
    matrix = kind == "weight" and part.startswith(("attn.", "ffn."))
    located = layout.module_name(canonical)
    if located is not None:
        source = f"{prefix}{located[0]}.{kind}"
        if source in shapes:
            return Spot(source, conv1d and matrix)
    which = part.split(".")[-1]
    fused, rows, groups = None, None, 1
    if layout.fused_qkv and part.startswith("attn.") and which in ("q_proj", "k_proj", "v_proj"):
        fused, (rows, groups) = layout.fused_qkv, _fused_qkv_rows(layout, spec, which)
    elif layout.fused_gate_up and part in ("ffn.w1", "ffn.w3"):
        fused = layout.fused_gate_up
        rows = (0, spec.d_ff) if part == "ffn.w1" else (spec.d_ff, 2 * spec.d_ff)
    elif layout.fused_shared_gate_up and part in ("ffn.shared.w1", "ffn.shared.w3"):
        fused, width = layout.fused_shared_gate_up, spec.shared_dim
        rows = (0, width) if part == "ffn.shared.w1" else (width, 2 * width)
    expert = re.fullmatch(r"ffn\.experts\.(\d+)\.(w[123])", part)
    if layout.fused_experts and expert:
        return _fused_expert_spot(layout, f"{prefix}{layout.block.format(i=module.split('.')[1])}.",
                                  int(expert[1]), expert[2], kind, shapes, spec)
    if fused is not None:
        layer = module.split(".")[1]
        source = f"{prefix}{layout.block.format(i=layer)}.{fused}.{kind}"
        if source in shapes and (groups == 1 or shapes[source][0] % groups == 0):
            return Spot(source, conv1d and matrix, rows, groups)
    return None


def _fused_expert_spot(layout: Layout, block: str, expert: int, which: str, kind: str,
                       shapes: Mapping[str, tuple[int, ...]], spec: DecoderConfig
                       ) -> Spot | None:
    """Where routed expert `expert`'s matrix `which` (w1, w3, w2) or its bias lies in the
    tensors that hold every expert's at once (`block`: the layer's prefix), or None."""
    names = layout.fused_experts if kind == "weight" else layout.fused_expert_biases
    if names is None or kind not in ("weight", "bias"):
        return None
    E, D, width = spec.n_experts, spec.d_model, spec.expert_dim
    source = block + (names[1] if which == "w2" else names[0])
    if kind == "bias":
        whole = (E, D) if which == "w2" else (E, 2 * width)
    elif layout.experts_transposed:
        whole = (E, width, D) if which == "w2" else (E, D, 2 * width)
    else:
        whole = (E, D, width) if which == "w2" else (E, 2 * width, D)
    if shapes.get(source) != whole:  # another E or Fe: no expert's rows are known, and the
        return None                  # tensor is named as left over beside the missing ones
    if which == "w2":
        rows, step = None, 1
    elif layout.gate_up_interleaved:  # gate, up, gate, up, ...
        rows, step = (0 if which == "w1" else 1, 2 * width), 2
    else:  # every gate unit, then every up unit
        rows, step = ((0, width) if which == "w1" else (width, 2 * width)), 1
    return Spot(source, transposed=kind == "weight" and layout.experts_transposed, rows=rows,
                step=step, expert=expert)

