"""The slow oracle: the decoder written as explicit per-head, per-query-row loops.

It reads only a state dict (DESIGN.md's weight names) and a config, and shares no code path with
model.py: no fused kernels, no masks (query row t simply reads keys 0..t), LayerNorm and RMSNorm
from their definitions, GELU from erf or tanh, RoPE as explicit 2x2 rotations pair by pair. It
computes in float64 by default, so a disagreement with the fast model is a bug, not rounding.

It is built from differentiable torch ops, so gradients can be compared too: pass a state dict
whose tensors require grad.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .config import DecoderConfig


def _layernorm(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]  # biased, as LayerNorm defines
    return (x - mean) / torch.sqrt(var + eps) * gain + bias


def _rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    mean_square = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    return x / torch.sqrt(mean_square + eps) * gain


def _activation(kind: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if kind == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(f"no plain activation {kind!r}")


def _rope_row(vec: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """Rotate one head vector (Dh,) at `position`: each pair (vec[2j], vec[2j+1]) turns by the
    angle position * theta^(-2j/Dh), written out as the 2x2 rotation."""
    head_dim = vec.shape[-1]
    angles = torch.tensor([position * theta ** (-2.0 * j / head_dim) for j in range(head_dim // 2)],
                          dtype=vec.dtype, device=vec.device)  # (Dh/2,)
    c, s = torch.cos(angles), torch.sin(angles)
    x0, x1 = vec[0::2], vec[1::2]
    return torch.stack((c * x0 - s * x1, s * x0 + c * x1), dim=-1).reshape(head_dim)


def _rope_rows(rows: torch.Tensor, theta: float) -> torch.Tensor:
    """Row t of `rows` (T, Dh) rotated as the token at position t."""
    return torch.stack([_rope_row(rows[t], t, theta) for t in range(rows.shape[0])])


def _linear(x: torch.Tensor, sd: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    y = x @ sd[f"{name}.weight"].T
    bias = sd.get(f"{name}.bias")
    return y if bias is None else y + bias


def oracle_logits(state_dict: Mapping[str, torch.Tensor], cfg: DecoderConfig, ids: torch.Tensor,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Logits (B, T, V) of the decoder described by `cfg` with weights `state_dict`, for ids (B, T).

    The readout uses `lm_head.weight` when present and `token_embeddings.weight` otherwise (a
    tied state dict may omit the head)."""
    sd = {name: t.to(dtype) for name, t in state_dict.items()}
    batch, seq_len = ids.shape
    group, head_dim = cfg.kv_group_size, cfg.head_dim

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        if cfg.norm == "layernorm":
            return _layernorm(x, sd[f"{name}.weight"], sd[f"{name}.bias"], cfg.norm_eps)
        return _rmsnorm(x, sd[f"{name}.weight"], cfg.norm_eps)

    rows = []
    for b in range(batch):
        # x: one sequence's residual stream, (T, D)
        x = torch.stack([sd["token_embeddings.weight"][int(i)] for i in ids[b]])
        if cfg.pos == "learned":
            x = x + sd["position_embeddings.weight"][:seq_len]
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}"
            h = norm(x, f"{p}.ln1")
            q = _linear(h, sd, f"{p}.attn.q_proj")  # (T, H*Dh)
            k = _linear(h, sd, f"{p}.attn.k_proj")  # (T, Hkv*Dh)
            v = _linear(h, sd, f"{p}.attn.v_proj")
            head_outputs = []
            for head in range(cfg.n_heads):
                kv = head // group
                q_h = q[:, head * head_dim:(head + 1) * head_dim]  # (T, Dh)
                k_h = k[:, kv * head_dim:(kv + 1) * head_dim]
                v_h = v[:, kv * head_dim:(kv + 1) * head_dim]
                if cfg.pos == "rope":
                    q_h = _rope_rows(q_h, cfg.rope_theta)
                    k_h = _rope_rows(k_h, cfg.rope_theta)
                out_rows = []
                for t in range(seq_len):
                    visible = slice(0, t + 1)  # inclusive causal: row t reads keys 0..t only
                    scores = (k_h[visible] @ q_h[t]) / math.sqrt(head_dim)  # (t+1,)
                    weights = torch.exp(scores - scores.max())
                    weights = weights / weights.sum()
                    out_rows.append(weights @ v_h[visible])  # (Dh,)
                head_outputs.append(torch.stack(out_rows))  # (T, Dh)
            attn = _linear(torch.cat(head_outputs, dim=-1), sd, f"{p}.attn.output_proj")
            x = x + attn
            h = norm(x, f"{p}.ln2")
            if cfg.mlp == "swiglu":
                gate = _linear(h, sd, f"{p}.ffn.w1")
                hidden = gate * torch.sigmoid(gate) * _linear(h, sd, f"{p}.ffn.w3")
            else:
                hidden = _activation(cfg.mlp, _linear(h, sd, f"{p}.ffn.w1"))
            x = x + _linear(hidden, sd, f"{p}.ffn.w2")
        x = norm(x, "ln_final")
        readout = sd.get("lm_head.weight", sd["token_embeddings.weight"])
        rows.append(x @ readout.T)  # (T, V)
    return torch.stack(rows)  # (B, T, V)
