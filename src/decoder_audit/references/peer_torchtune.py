"""torchtune's TransformerDecoder read as a spec (`peer_configs`). It keeps no config object: the
spec is read from the arguments its modules keep. MultiHeadAttention's num_heads, num_kv_heads,
head_dim and embed_dim and its projections' biases; the RoPE module's class (torchtune's own
pairs interleaved features, Qwen2's and Phi-3's rotate halves), base, and Llama 3.1's scaling
(Llama3ScaledRoPE); the RMSNorms' eps; FeedForward's activation and gate; a TiedLinear readout.
Every layer must read the same as layer 0 (a layer that differs is refused, named), and a module
of a class not read here is refused by its path and class.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .peer_record import PeerSpec, read_spec

# its RoPE modules: class name -> (layout, the attributes of a scaled one)
_TUNE_ROPE = {"RotaryPositionalEmbeddings": "interleaved", "Llama3ScaledRoPE": "interleaved",
              "Qwen2RotaryPositionalEmbeddings": "rotate_half",
              "Phi3RotaryPositionalEmbeddings": "rotate_half"}


def torchtune_spec(model: nn.Module) -> PeerSpec | None:
    if type(model).__name__ != "TransformerDecoder" or not all(
            hasattr(model, name) for name in ("tok_embeddings", "layers", "norm", "output")):
        return None
    refused: list[str] = []
    readings = [_tune_layer(i, layer, refused) for i, layer in enumerate(model.layers)]
    first = readings[0] if readings else {}
    for i, reading in enumerate(readings[1:], 1):
        differ = sorted(k for k in first.keys() | reading.keys()
                        if first.get(k) != reading.get(k))
        if differ:
            refused.append(f"layers.{i} differs from layers.0 in {differ}")
    embedding, output = model.tok_embeddings, model.output
    tied = not isinstance(output, nn.Module)  # torchtune's TiedLinear is no module
    if tied and getattr(getattr(output, "tied_module", None), "weight", None) is not \
            getattr(embedding, "weight", None):
        refused.append(f"output={type(output).__name__} (a readout that is neither a Linear "
                       "nor tied to tok_embeddings)")
    if type(embedding) is not nn.Embedding:
        refused.append(f"tok_embeddings={type(embedding).__name__} (not an nn.Embedding)")
    norm = _tune_norm(model.norm, "norm", refused)
    if first.get("norm_eps") not in (None, norm.get("norm_eps")):
        refused.append(f"norm.eps={norm.get('norm_eps')} (the final norm's eps differs from the "
                       f"blocks' {first.get('norm_eps')})")
    fields = {**first, **norm, "vocab_size": embedding.num_embeddings,
              "d_model": embedding.embedding_dim, "n_layers": len(model.layers),
              "max_seq_len": model.max_seq_len, "tie_embeddings": tied,
              "readout_bias": not tied and getattr(output, "bias", None) is not None}
    return read_spec("torchtune", fields, refused)


def _tune_layer(i: int, layer: nn.Module, refused: list[str]) -> dict[str, Any]:
    """What one TransformerSelfAttentionLayer computes, as DecoderConfig fields."""
    where = f"layers.{i}"
    if type(layer).__name__ != "TransformerSelfAttentionLayer":
        refused.append(f"{where}={type(layer).__name__} (not a self-attention layer)")
        return {}
    for scale in ("sa_scale", "mlp_scale"):
        if type(getattr(layer, scale, None)) is not nn.Identity:
            refused.append(f"{where}.{scale}={type(getattr(layer, scale)).__name__} (a gate on "
                           "the sublayer's output)")
    attn, fields = layer.attn, {}
    fields.update(_tune_norm(layer.sa_norm, f"{where}.sa_norm", refused))
    eps = fields.get("norm_eps")
    if _tune_norm(layer.mlp_norm, f"{where}.mlp_norm", refused).get("norm_eps") != eps:
        refused.append(f"{where}.mlp_norm.eps (differs from sa_norm.eps={eps})")
    if not getattr(attn, "is_causal", False):
        refused.append(f"{where}.attn.is_causal={getattr(attn, 'is_causal', None)} (not causal)")
    for norm in ("q_norm", "k_norm"):
        if getattr(attn, norm, None) is not None:
            refused.append(f"{where}.attn.{norm} (a q/k norm applied after RoPE)")
    fields.update(n_heads=attn.num_heads, n_kv_heads=attn.num_kv_heads)
    if attn.head_dim * attn.num_heads != attn.embed_dim:
        fields["head_width"] = attn.head_dim
    biased = tuple(name for name in ("q_proj", "k_proj", "v_proj", "output_proj")
                   if getattr(getattr(attn, name), "bias", None) is not None)
    fields["attn_bias"] = biased if 0 < len(biased) < 4 else bool(biased)
    fields.update(_tune_rope(attn, where, refused))
    fields.update(_tune_mlp(layer.mlp, where, refused))
    return fields


def _tune_norm(norm: nn.Module, where: str, refused: list[str]) -> dict[str, Any]:
    kind = type(norm).__name__
    if kind == "RMSNorm" and hasattr(norm, "scale"):
        return {"norm": "rmsnorm", "norm_eps": float(norm.eps)}
    refused.append(f"{where}={kind} (not torchtune's RMSNorm)")
    return {}


def _tune_rope(attn: nn.Module, where: str, refused: list[str]) -> dict[str, Any]:
    rope = attn.pos_embeddings
    if rope is None:
        return {"pos": "none"}
    kind = type(rope).__name__
    if kind not in _TUNE_ROPE:
        refused.append(f"{where}.attn.pos_embeddings={kind} (a position embedding of another "
                       "kind)")
        return {}
    fields: dict[str, Any] = {"pos": "rope", "rope_theta": float(rope.base),
                              "rope_layout": _TUNE_ROPE[kind]}
    if getattr(rope, "dim", attn.head_dim) != attn.head_dim:
        refused.append(f"{where}.attn.pos_embeddings.dim={rope.dim} (RoPE over part of the "
                       f"head width {attn.head_dim})")
    if kind == "Llama3ScaledRoPE":  # Llama 3.1's scaled RoPE
        fields["rope_scaling"] = {"type": "llama3", "factor": float(rope.scale_factor),
                                  "original_max_seq_len": int(rope.old_context_len),
                                  "low_freq_factor": float(rope.low_freq_factor),
                                  "high_freq_factor": float(rope.high_freq_factor)}
    return fields


def _tune_mlp(mlp: nn.Module, where: str, refused: list[str]) -> dict[str, Any]:
    if type(mlp).__name__ != "FeedForward":
        refused.append(f"{where}.mlp={type(mlp).__name__} (not torchtune's FeedForward)")
        return {}
    act, gated = mlp.activation, getattr(mlp, "w3", None) is not None
    gelu = getattr(act, "approximate", None) if isinstance(act, nn.GELU) else None
    kind = {(nn.SiLU, True): "swiglu", (nn.GELU, "tanh", True): "geglu",
            (nn.GELU, "none", False): "gelu", (nn.GELU, "tanh", False): "gelu_tanh",
            (nn.ReLU, False): "relu"}.get((type(act), gelu, gated) if gelu else (type(act), gated))
    if kind is None:
        refused.append(f"{where}.mlp.activation={act!r} ({'gated' if gated else 'plain'}: no "
                       "MLP of that kind)")
        return {}
    biased = tuple(name for name in ("w1", "w3", "w2")
                   if getattr(getattr(mlp, name, None), "bias", None) is not None)
    every = 3 if gated else 2
    return {"mlp": kind, "d_ff": mlp.w1.out_features,
            "mlp_bias": biased if 0 < len(biased) < every else bool(biased)}
