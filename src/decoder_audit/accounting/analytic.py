"""The analytic account, from the config alone: parameters regrouped from the ledger, memory,
and every forward matrix multiply with its FLOPs, summed into the four GROUPS.

Nothing here builds a model: every number is a formula in the shape letters (B batch, T sequence
length, D d_model, H query heads, Hkv KV heads, Dh head width, F FFN width, V vocabulary,
L layers).
"""

from __future__ import annotations

from ..config import DecoderConfig
from .ledger import parameter_ledger
from .results import (
    BYTES_PER_ELEMENT,
    GROUP_SCALING,
    GROUPS,
    ComponentCount,
    GroupTotal,
    Matmul,
    MemoryEstimate,
    MemoryRow,
    ParameterCounts,
)

# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------

def parameter_counts(cfg: DecoderConfig) -> ParameterCounts:
    """Regroup the analytic ledger by component (summed over layers) and label the conventions.
    Every number here is a sum of ledger rows; nothing is recounted."""
    ledger = parameter_ledger(cfg)
    rows = ledger.as_dict()
    formulas = {row.name: row.formula for row in ledger.rows}
    L = cfg.n_layers

    def over_layers(part: str) -> int:
        return sum(rows[f"layers.{i}.{part}"] for i in range(L))

    components = [
        ComponentCount("token_embeddings", rows["token_embeddings"], formulas["token_embeddings"]),
        ComponentCount("position_embeddings", rows["position_embeddings"],
                       formulas["position_embeddings"]),
        ComponentCount("attention (all blocks)", over_layers("attn"),
                       f"L x ({formulas['layers.0.attn']})" if L else ""),
        ComponentCount("MLP (all blocks)", over_layers("ffn"),
                       f"L x ({formulas['layers.0.ffn']})" if L else ""),
        ComponentCount("norms (all blocks)", over_layers("norms"),
                       f"L x ({formulas['layers.0.norms']})" if L else ""),
        ComponentCount("ln_final", rows["ln_final"], formulas["ln_final"]),
        ComponentCount("lm_head", rows["lm_head"], formulas["lm_head"]),
    ]
    assert sum(c.count for c in components) == ledger.total  # regrouping loses nothing
    embeddings = rows["token_embeddings"] + rows["position_embeddings"]
    return ParameterCounts(
        components=components,
        total=ledger.total,
        embeddings=embeddings,
        non_embedding=ledger.total - embeddings,
        non_position_embedding=ledger.total - rows["position_embeddings"],
        tied=cfg.tie_embeddings,
        total_if_tied=parameter_ledger(cfg.replace(tie_embeddings=True)).total,
        total_if_untied=parameter_ledger(cfg.replace(tie_embeddings=False)).total,
    )


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------

ACTIVATION_ASSUMPTIONS = [
    "elements the forward keeps for the backward pass, stored in fp32 (the 4 in each formula is "
    "bytes per element)",
    "no activation checkpointing (nothing is recomputed) and no dropout masks",
    "eager attention: the T x T softmax pattern of every head is materialised (a fused kernel "
    "such as flash attention keeps O(T) per head instead)",
    "the logits and their log-softmax for the cross-entropy loss are both kept",
    "parameters, gradients, optimizer state and temporary buffers are not included here",
]


def _activation_rows(cfg: DecoderConfig, B: int, T: int) -> list[MemoryRow]:
    D, H, Hkv, Dh, F, V, L = (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_ff,
                              cfg.vocab_size, cfg.n_layers)
    n_mlp = 3 if cfg.gated else 2  # w1 out, (w3 out,) activation out
    mlp_what = "w1, w3 outputs, gated product" if cfg.gated else "w1 output, activation"
    per_layer = [  # (what, elements, formula)
        ("ln1, ln2 inputs + outputs", 4 * B * T * D, "4BTD"),
        ("q, k, v", B * T * (H + 2 * Hkv) * Dh, "BT(H+2Hkv)Dh"),
        ("softmax pattern", B * H * T * T, "BHT^2"),
        ("weighted sum z", B * T * H * Dh, "BTH*Dh"),
        (mlp_what, n_mlp * B * T * F, f"{n_mlp}BTF"),
    ]
    rows = [MemoryRow(what, 4 * L * n, f"4 x L x {formula}") for what, n, formula in per_layer]
    rows += [
        MemoryRow("ln_final input + output", 4 * 2 * B * T * D, "4 x 2BTD"),
        MemoryRow("logits + log-softmax", 4 * 2 * B * T * V, "4 x 2BTV"),
    ]
    return rows


def memory_estimate(cfg: DecoderConfig, n_params: int, batch_size: int,
                    seq_len: int) -> MemoryEstimate:
    P = n_params
    training = [
        MemoryRow("weights (fp32)", 4 * P, "4 x P"),
        MemoryRow("gradients (fp32)", 4 * P, "4 x P"),
        MemoryRow("AdamW moment m (fp32)", 4 * P, "4 x P"),
        MemoryRow("AdamW moment v (fp32)", 4 * P, "4 x P"),
    ]
    activations = _activation_rows(cfg, batch_size, seq_len)
    return MemoryEstimate(
        weights={dtype: size * P for dtype, size in BYTES_PER_ELEMENT.items()},
        training=training,
        training_total=sum(row.bytes for row in training),
        activations=activations,
        activations_total=sum(row.bytes for row in activations),
        activation_assumptions=list(ACTIVATION_ASSUMPTIONS),
    )


# --------------------------------------------------------------------------------------------
# Forward matmuls, analytic
# --------------------------------------------------------------------------------------------

def forward_matmuls(cfg: DecoderConfig, batch_size: int, seq_len: int) -> list[Matmul]:
    """Every forward matrix product of the Decoder, in forward order, from the config alone.

    F.linear flattens (B, T, in) to (BT x in) and multiplies by W^T (in x out), once per layer.
    Attention multiplies per (batch row, query head): scores (T x Dh)(Dh x T) and weighted sum
    (T x T)(T x Dh), B*H times per layer; with GQA the K/V heads are shared, not the products.
    Valid for any T >= 1 (no max_seq_len check here, so the plot can extrapolate)."""
    B, T = batch_size, seq_len
    D, H, Hkv, Dh, F, V, L = (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_ff,
                              cfg.vocab_size, cfg.n_layers)
    BT = B * T
    proj, core = "attention projections", "attention scores + weighted sum"
    out = [
        Matmul("attn.q_proj", proj, BT, D, H * Dh, L, "L", "(BT x D)(D x H*Dh)"),
        Matmul("attn.k_proj", proj, BT, D, Hkv * Dh, L, "L", "(BT x D)(D x Hkv*Dh)"),
        Matmul("attn.v_proj", proj, BT, D, Hkv * Dh, L, "L", "(BT x D)(D x Hkv*Dh)"),
        Matmul("attn.scores", core, T, Dh, T, B * H * L, "B*H*L", "(T x Dh)(Dh x T)"),
        Matmul("attn.weighted_sum", core, T, T, Dh, B * H * L, "B*H*L", "(T x T)(T x Dh)"),
        Matmul("attn.output_proj", proj, BT, H * Dh, D, L, "L", "(BT x H*Dh)(H*Dh x D)"),
        Matmul("ffn.w1", "MLP", BT, D, F, L, "L", "(BT x D)(D x F)"),
    ]
    if cfg.gated:
        out.append(Matmul("ffn.w3", "MLP", BT, D, F, L, "L", "(BT x D)(D x F)"))
    out += [
        Matmul("ffn.w2", "MLP", BT, F, D, L, "L", "(BT x F)(F x D)"),
        Matmul("lm_head (tied)" if cfg.tie_embeddings else "lm_head", "readout",
               BT, D, V, 1, "1", "(BT x D)(D x V)"),
    ]
    return out


def _group_formulas(cfg: DecoderConfig) -> dict[str, str]:
    square = cfg.n_heads * cfg.head_dim == cfg.d_model  # H*Dh = D: the usual shapes
    kv = "8BTD^2" if square and cfg.kv_heads == cfg.n_heads else "4BTD(H + Hkv)Dh"
    mlp = "6BTDF" if cfg.gated else "4BTDF"
    return {
        "attention projections": f"L x {kv}",
        "attention scores + weighted sum": "L x 4BT^2D" if square else "L x 4BT^2*H*Dh",
        "MLP": f"L x {mlp}",
        "readout": "2BTDV",
    }


def group_totals(matmuls: list[Matmul], cfg: DecoderConfig) -> list[GroupTotal]:
    total = sum(mm.flops for mm in matmuls)
    formulas = _group_formulas(cfg)
    out = []
    for name in GROUPS:
        flops = sum(mm.flops for mm in matmuls if mm.group == name)
        out.append(GroupTotal(name, flops, flops / total if total else 0.0,
                              GROUP_SCALING[name], formulas[name]))
    return out


def flops_by_group(cfg: DecoderConfig, batch_size: int, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per group at (B, T); no max_seq_len check (used to extrapolate)."""
    return {g.name: g.flops
            for g in group_totals(forward_matmuls(cfg, batch_size, seq_len), cfg)}


def dominant_groups(groups: list[GroupTotal]) -> list[str]:
    """Largest groups first, until they cover at least half the forward FLOPs."""
    names, covered = [], 0.0
    for group in sorted(groups, key=lambda g: g.flops, reverse=True):
        names.append(group.name)
        covered += group.share
        if covered >= 0.5:
            break
    return names


def context_sweep(cfg: DecoderConfig, batch_size: int = 1, *, start: int = 64,
                  stop: int | None = None) -> list[tuple[int, dict[str, int]]]:
    """(T, FLOPs per group) for T = start, 2*start, ... up to stop (default 16 x max_seq_len).
    Analytic only: points beyond max_seq_len are extrapolations of the formulas."""
    stop = 16 * cfg.max_seq_len if stop is None else stop
    points, T = [], max(1, start)
    while T <= stop:
        points.append((T, flops_by_group(cfg, batch_size, T)))
        T *= 2
    return points
