"""torchtitan's decoders under the gate: called as torchtitan's trainer calls them, with their
architecture read as the spec.

    model = Llama3Model.Config(...).build()               # torchtitan 0.3's Llama 3
    report = da.audit(TitanCall(model), spec=spec_of(model.config))

torchtitan's `Decoder.forward(tokens, positions, attention_masks)` takes each token's position
in its document and, for flex and varlen attention, the block-causal masks the trainer builds
from them (`get_attention_masks`); the gate calls a model with ids alone. `TitanCall` is that
call: positions 0..T-1 (or the restarting `position_ids` of packed documents, the form its
dataloaders send, which the gate's packing check sends too) and the masks built from them where
the attention takes masks. Its weights keep their names under `model.`, where the layout
"torchtitan Llama 3" (references.layout_table) finds them: tok_embeddings, attention.qkv_linear.wq
(or the fused wqkv), attention.wo, feed_forward.w1..w3, attention_norm, ffn_norm, norm, lm_head.

`spec_of` reads a Llama 3 config as a DecoderConfig. torchtitan's DeepSeek-V3 is out of reach:
its routed experts are not in the spec's vocabulary of weights yet.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError


class TitanCall(nn.Module):
    """A torchtitan decoder called with ids (B, T), and optionally restarting position_ids
    (B, T) of packed documents, as its trainer calls it (module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None
                ) -> torch.Tensor:
        rows, length = input_ids.shape
        positions = position_ids if position_ids is not None else torch.arange(
            length, device=input_ids.device).expand(rows, length)  # (B, T)
        try:
            masks = self.model.get_attention_masks(positions)
        except TypeError:  # an attention that takes no masks (SDPA): causal by is_causal
            masks = None
        return self.model(input_ids, positions=positions, attention_masks=masks)  # (B, T, V)


def spec_of(config: Any) -> DecoderConfig:
    """A torchtitan Llama 3 model's config (`Llama3Model.Config`) as a DecoderConfig: the
    widths, heads, norm eps, RoPE base and Llama 3 scaling of its first layer (every layer is
    alike), tying as it enables it. ConfigError for what the spec cannot say."""
    layer = config.layers[0]
    attention, rope = layer.attention, layer.attention.rope
    hidden = layer.feed_forward.w1.out_features
    if getattr(rope, "scaling", "none") not in ("none", "llama"):
        raise ConfigError(f"torchtitan RoPE scaling={rope.scaling!r}: spec_of reads none or llama")
    scaling = None if rope.scaling == "none" else {
        "type": "llama3", "factor": rope.scaling_factor,
        "original_max_seq_len": rope.original_max_position_embeddings,
        "low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor}
    return DecoderConfig(
        vocab_size=config.vocab_size, d_model=config.dim, n_layers=len(config.layers),
        n_heads=attention.n_heads, n_kv_heads=attention.n_kv_heads, d_ff=hidden,
        max_seq_len=rope.max_seq_len, head_width=attention.head_dim, norm="rmsnorm",
        norm_eps=layer.attention_norm.eps, norm_bias=False, mlp="swiglu", pos="rope",
        rope_theta=rope.theta, rope_layout="interleaved", rope_scaling=scaling,
        qk_norm=attention.qk_norm is not None, tie_embeddings=bool(config.enable_weight_tying))


__all__ = ["TitanCall", "spec_of"]
