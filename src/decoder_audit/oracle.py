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
from .errors import CheckpointError, ContextLengthError, InputShapeError, TokenIdError


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


def check_oracle_inputs(weights, cfg: DecoderConfig, ids: torch.Tensor) -> None:
    """The model's input contract, and weights that can be read, before any lookup: ids an
    integer (B, T) tensor with values (not on the meta device), 1 <= T <= max_seq_len, every id
    in [0, V) (a -1 would otherwise index row V - 1); every weight the config needs present and
    holding values. Typed errors name the value and the limit."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] < 1 or \
            ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        dtype = getattr(ids, "dtype", None)
        raise InputShapeError(f"ids must be an integer tensor (B, T) with B >= 1, got {shape} "
                              f"of dtype {dtype}")
    if ids.device.type == "meta":
        raise InputShapeError(f"ids {tuple(ids.shape)} are on the meta device: they hold no "
                              "values to look up")
    seq_len = ids.shape[1]
    if not 1 <= seq_len <= cfg.max_seq_len:
        raise ContextLengthError(f"sequence length T={seq_len} is outside [1, max_seq_len="
                                 f"{cfg.max_seq_len}]; nothing is cropped")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= cfg.vocab_size:
        bad = low if low < 0 else high
        raise TokenIdError(f"token id {bad} is outside [0, vocab_size={cfg.vocab_size})")
    get = weights.get if isinstance(weights, Mapping) else weights
    found = {name: get(name) for name in _required_weights(cfg)}
    missing = sorted(name for name, tensor in found.items() if tensor is None)
    if missing:
        raise CheckpointError(f"the weights lack {missing}, which the config needs (norm="
                              f"{cfg.norm!r}, pos={cfg.pos!r}, mlp={cfg.mlp!r})")
    on_meta = sorted(name for name, tensor in found.items() if tensor.device.type == "meta")
    if on_meta:
        raise CheckpointError(f"weights {on_meta[:3]}{' ...' if len(on_meta) > 3 else ''} are on "
                              "the meta device: they hold no values")


def _required_weights(cfg: DecoderConfig) -> list[str]:
    """Every weight the config needs (biases are optional: used wherever present)."""
    norm_parts = ("weight", "bias") if cfg.norm == "layernorm" else ("weight",)
    names = ["token_embeddings.weight"]
    if cfg.pos == "learned":
        names.append("position_embeddings.weight")
    matrices = ("w1", "w2", "w3") if cfg.mlp == "swiglu" else ("w1", "w2")
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}"
        names += [f"{p}.{norm}.{part}" for norm in ("ln1", "ln2") for part in norm_parts]
        names += [f"{p}.attn.{n}_proj.weight" for n in ("q", "k", "v", "output")]
        names += [f"{p}.ffn.{n}.weight" for n in matrices]
    return names + [f"ln_final.{part}" for part in norm_parts]


def oracle_logits(state_dict: Mapping[str, torch.Tensor], cfg: DecoderConfig, ids: torch.Tensor,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Logits (B, T, V) of the decoder described by `cfg` with weights `state_dict`, for ids (B, T).

    The readout uses `lm_head.weight` when present and `token_embeddings.weight` otherwise (a
    tied state dict may omit the head)."""
    check_oracle_inputs(state_dict, cfg, ids)
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
