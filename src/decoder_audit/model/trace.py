"""Named intermediate records of one forward pass, with their declared shapes.

`run_with_trace(model, ids)` runs the decoder's eager path (scores -> mask -> softmax -> pattern,
the path a person can inspect) and returns `(logits, trace)`. The trace maps a stable dotted
name to a tensor, e.g. `trace["layers.0.attn.pattern"]` of shape (B, H, T, T). The plain forward
records nothing: recording is only switched on by passing a Trace into the model.

Each site declares its shape in the letters of DESIGN.md; `trace.expected_shape(name)` resolves
the letters for this run, and `trace.shape_mismatches()` is the shape ledger's verdict.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import DecoderConfig

Shape = tuple[str, ...]

# The one table of trace sites: every name the model records, with its declared shape.
# Recording a name that is not here raises, so the table and the model cannot drift apart.
INPUT_SITES: dict[str, Shape] = {
    "tokens": ("B", "T", "D"),
    "positions": ("T", "D"),  # pos = learned or sinusoidal only
    "embed": ("B", "T", "D"),  # the residual stream entering block 0
}
BLOCK_SITES: dict[str, Shape] = {  # each under "layers.{i}."
    "ln1": ("B", "T", "D"),
    "attn.q": ("B", "H", "T", "Dh"),  # after RoPE, when pos = rope
    "attn.k": ("B", "Hkv", "T", "Dh"),
    "attn.v": ("B", "Hkv", "T", "Dv"),  # Dv = Dh but in latent attention
    "attn.scores": ("B", "H", "T", "T"),  # scaled (plus ALiBi's bias), before the mask
    "attn.pattern": ("B", "H", "T", "T"),  # softmax rows; zero above the diagonal
    "attn.sink": ("B", "H", "T"),  # the sink's share of each row (attn_sinks only)
    "attn.z": ("B", "H", "T", "Dv"),  # pattern @ v, per head
    "attn.out": ("B", "T", "D"),  # after output_proj
    "resid_mid": ("B", "T", "D"),
    "ln2": ("B", "T", "D"),
    "ffn.hidden": ("B", "T", "F"),
    "ffn.out": ("B", "T", "D"),
    "resid_post": ("B", "T", "D"),
}
ROUTED_SITES: dict[str, Shape] = {  # a routed layer's, under "layers.{i}."
    "ffn.router": ("B", "T", "E"),  # the router's logits
    "ffn.gates": ("B", "T", "E"),  # each expert's weight in the token's sum; 0 where not chosen
}
OUTPUT_SITES: dict[str, Shape] = {
    "ln_final": ("B", "T", "D"),
    "logits": ("B", "T", "V"),
}


def declared_shapes(cfg: DecoderConfig) -> dict[str, Shape]:
    """Every trace site of a decoder with this config, in forward order, with symbolic shapes."""
    sites = {name: shape for name, shape in INPUT_SITES.items()
             if name != "positions" or cfg.pos in ("learned", "sinusoidal")}
    for i in range(cfg.n_layers):
        sites.update({f"layers.{i}.{name}": shape for name, shape in BLOCK_SITES.items()
                      if (name != "ffn.hidden" or not cfg.routes(i))
                      and (name != "attn.sink" or cfg.attn_sinks)})
        if cfg.routes(i):  # a routed layer records its router instead of one hidden layer
            sites.update({f"layers.{i}.{name}": shape for name, shape in ROUTED_SITES.items()})
    sites.update(OUTPUT_SITES)
    return sites


class Trace(dict):
    """name -> recorded tensor, plus each site's declared shape for one run of size (B, T)."""

    def __init__(self, cfg: DecoderConfig, batch_size: int, seq_len: int):
        super().__init__()
        self.declared = declared_shapes(cfg)
        self.sizes = {
            "B": batch_size, "T": seq_len, "D": cfg.d_model, "H": cfg.n_heads,
            "Hkv": cfg.kv_heads, "Dh": cfg.head_dim, "Dv": cfg.value_dim, "F": cfg.d_ff,
            "V": cfg.vocab_size, "E": cfg.n_experts,
        }

    def record(self, name: str, value: torch.Tensor) -> None:
        if name not in self.declared:
            raise KeyError(f"trace site {name!r} is not declared")
        self[name] = value.detach()

    def expected_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.sizes[letter] for letter in self.declared[name])

    def shape_mismatches(self) -> list[str]:
        """Sites whose recorded shape differs from the declared one, or that were never recorded."""
        problems = []
        for name, letters in self.declared.items():
            if name not in self:
                problems.append(f"{name}: declared {letters} but not recorded")
                continue
            got, want = tuple(self[name].shape), self.expected_shape(name)
            if got != want:
                problems.append(f"{name}: shape {got}, declared ({', '.join(letters)}) = {want}")
        return problems


def run_with_trace(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, Trace]:
    """Run one forward pass of `model` (a Decoder) on ids (B, T) and record every named site."""
    return model.run_with_trace(ids)
