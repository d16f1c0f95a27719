"""The data types of the layouts: `Layout`, one way of naming a decoder's weights (the table of
them is layout_table.py), and `Spot`, where one canonical weight lies in a module's state dict
(a parameter, transposed or not, rows of it; `layouts.Placement` holds one per canonical name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """One way of naming a decoder's weights. Module names are relative to the block
    (`block` with {i}) or to the model; `parts` maps our in-block module names to the layout's."""

    name: str
    embedding: str
    positions: str | None
    block: str
    final_norm: str | None
    head: str
    parts: dict[str, str]
    fused_qkv: str | None = None
    """The in-block module whose weight stacks q, k and v rows (in that order)."""
    qkv_per_head: bool = False
    """The fused q/k/v rows are grouped by key/value head, each group's query heads, then its k
    and v rows ((Hkv, H/Hkv + 2, Dh) rows: GPT-NeoX's (H, 3, Dh) without grouped queries,
    torchtitan's fused wqkv), instead of all q rows, then all k rows, then all v rows."""
    fused_gate_up: str | None = None
    """The in-block module whose weight stacks the gated MLP's w1 (gate) rows, then w3 (up)."""
    norm_params: tuple[str, str | None] = ("weight", "bias")
    """The layout's names for a norm's gain and shift (None: its norms have no shift)."""
    head_aliases: tuple[str, ...] = ()
    """Other names of the head's module, used where the module has no `head` (GPT-NeoX's
    embed_out before transformers 5)."""
    fused_experts: tuple[str, str] | None = None
    """The in-block parameters that hold every routed expert's matrices at once (transformers
    5): (gate_up (E, 2 Fe, D): each expert's w1 rows then its w3 rows, down (E, D, Fe): w2)."""
    gate_up_interleaved: bool = False
    """The fused gate_up's units alternate, gate, up, gate, up (GPT-OSS: w1 the even units, w3
    the odd ones), instead of every gate unit, then every up unit."""
    fused_expert_biases: tuple[str, str] | None = None
    """The in-block parameters that hold every routed expert's biases (expert_bias): gate_up
    (E, 2 Fe), laid out as the fused gate_up's units, and down (E, D) (GPT-OSS)."""
    selection_bias: str | None = None
    """The router module's name for the selection bias (ffn.router.selection_bias), where it
    is a buffer rather than a Parameter (DeepSeek-V3's e_score_correction_bias, updated by a
    balancing rule, never by gradients): `placeable` adds such buffers to what is placed."""
    selection_bias_at: str | None = None
    """The selection bias's in-block name where it is no tensor of the router module's own
    (MiniMax-M2's and HY-V3's buffer mlp.e_score_correction_bias, held by the block and handed
    to the router; Ernie 4.5's (1, E) Parameter mlp.gate.moe_statics.e_score_correction_bias,
    read flattened)."""
    experts_transposed: bool = False
    """The fused experts are stored in -> out (Aria, GPT-OSS): gate_up (E, D, 2 Fe) whose
    first Fe columns are an expert's w1 (or its even ones, gate_up_interleaved), down
    (E, Fe, D); each expert's matrix is read transposed."""
    fused_shared_gate_up: str | None = None
    """The in-block module whose weight stacks the shared experts' w1 (gate) rows, then their w3
    (up) rows (GraniteMoeShared's shared_mlp.input_linear)."""
    qkv_shards: int = 1
    """The fused q/k/v rows are split in this many equal shards, each holding its share of q, k
    and v (in `qkv_order`): CodeGen's qkv_proj is 4 shards (its mp_num) of q, v, k rows."""
    qkv_order: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")
    """The order of q, k and v rows in a fused matrix (in each shard)."""
    detected: bool = True
    """False: placed only where a family's entry names it (`family_entry.Family.layout`), never
    detected from the names, which are another layout's with the same shapes in another row
    order (GPT-BigCode's c_attn is GPT-2's name and shape, its rows per KV group)."""
    embedding_norm: str | None = None
    """The module of the norm on the embeddings (BLOOM's word_embeddings_layernorm)."""

    def module_name(self, canonical: str) -> tuple[str, str] | None:
        """(the layout's module name, parameter kind) for a canonical weight name."""
        module, _, kind = canonical.rpartition(".")
        if module.startswith("layers."):
            _, i, part = module.split(".", 2)
            expert = re.fullmatch(r"ffn\.experts\.(\d+)\.(.+)", part)  # one pattern for all E
            inner = (self.parts.get(part) if expert is None else
                     self.parts.get(f"ffn.experts.{{e}}.{expert[2]}", "").format(e=expert[1]))
            return None if not inner else (f"{self.block.format(i=i)}.{inner}", kind)
        top = {"token_embeddings": self.embedding, "position_embeddings": self.positions,
               "embedding_norm": self.embedding_norm, "ln_final": self.final_norm,
               "lm_head": self.head}.get(module)
        if top is None:  # a layout without such a weight (no position table, say)
            return None
        return top, kind


@dataclass(frozen=True)
class Spot:
    """Where one canonical weight lies: module parameter `source`, transposed first or not, then
    rows [start, stop) of it (None: every row), or of each of its `groups` equal row groups,
    concatenated (GPT-NeoX's fused q/k/v: head h's q rows are rows [0, Dh) of group h)."""

    source: str
    transposed: bool = False
    rows: tuple[int, int] | None = None
    groups: int = 1
    heads: str = ""
    """A weight stored head by head (TransformerLens): "in" for (heads, in, Dh) -> (heads * Dh,
    in) (W_Q, W_K, W_V), "out" for (heads, Dh, out) -> (out, heads * Dh) (W_O), "bias" for
    (heads, Dh) -> (heads * Dh,) (b_Q, b_K, b_V)."""
    expert: int | None = None
    """A weight stored with every expert's in one tensor (E, out, in) (transformers 5's
    gate_up_proj and down_proj): this expert's matrix, tensor[expert], before the rows."""
    step: int = 1
    """Every step-th row of [start, stop) (GPT-OSS's interleaved gate and up units: step 2)."""
    flat: bool = False
    """A vector stored with unit axes around it (Ernie 4.5's (1, E) selection bias): read
    flattened."""

    def _target(self, tensor: torch.Tensor) -> torch.Tensor:
        """A view of the weight's place in `tensor`: (rows, ...), or (groups, rows, ...) whose
        first two axes flattened give the canonical weight."""
        if self.expert is not None:
            tensor = tensor[self.expert]  # (out, in): a view
        if self.flat:
            return tensor.flatten()  # (1, E) -> (E,): a view of a contiguous tensor
        if self.heads == "in":
            return tensor.transpose(1, 2)  # (heads, Dh, in)
        if self.heads == "out":
            return tensor.flatten(0, 1).T  # (out, heads * Dh): a view, the heads contiguous
        if self.heads == "bias":
            return tensor.flatten()
        out = tensor.T if self.transposed else tensor
        if self.rows is None:
            return out
        start, stop = self.rows
        if self.groups == 1:
            return out[start:stop:self.step]
        return out.unflatten(0, (self.groups, -1))[:, start:stop]

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The canonical weight: a view of `tensor`, or for grouped rows (and TransformerLens'
        per-head matrices) a differentiable copy (its rows are not evenly spaced in memory)."""
        target = self._target(tensor)
        return target.flatten(0, 1) if self.groups > 1 or self.heads == "in" else target

    def write(self, tensor: torch.Tensor, value: torch.Tensor) -> None:
        """Write the canonical weight's `value` into its place in `tensor` (no autograd)."""
        target = self._target(tensor)
        target.copy_(value.view(target.shape))
