"""The analytic account, from the config alone: parameters regrouped from the ledger, memory,
and every forward matrix multiply with its FLOPs, summed into the four GROUPS.

Nothing here builds a model: every number is a formula in the shape letters (B batch, T sequence
length, D d_model, H query heads, Hkv KV heads, Dh head width, F FFN width, V vocabulary,
L layers).
"""

from __future__ import annotations

from ..config import DecoderConfig
from .ledger import active_parameters, expert_parameters, parameter_ledger
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
        *([ComponentCount("embedding_norm", rows["embedding_norm"], formulas["embedding_norm"])]
          if "embedding_norm" in rows else []),
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
        routed_experts=expert_parameters(cfg) * (cfg.n_experts or 0) * sum(
            cfg.routes(i) for i in range(L)),
        active=active_parameters(cfg),
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
    qkv = ("q, k, v", B * T * (H + 2 * Hkv) * Dh, "BT(H+2Hkv)Dh")
    if cfg.latent_attention:  # the decompressed heads, and the latents they come from
        latents = cfg.kv_latent_rank + cfg.rope_head_width + (cfg.q_latent_rank or 0)
        qkv = ("q, k, v and their latents", B * T * (H * (2 * Dh + cfg.value_dim) + latents),
               "BT(H(2Dh+Dv) + C+R" + ("+Cq)" if cfg.q_latent_rank else ")"))
    per_layer = [  # (what, elements, formula)
        ("ln1, ln2 inputs + outputs", 4 * B * T * D, "4BTD"),
        qkv,
        ("softmax pattern", B * H * T * T, "BHT^2"),
        ("weighted sum z", B * T * H * cfg.value_dim, "BTH*Dv"),
    ]
    rows = [MemoryRow(what, 4 * L * n, f"4 x L x {formula}") for what, n, formula in per_layer]
    routed = sum(cfg.routes(i) for i in range(L))
    if L - routed:
        rows.append(MemoryRow(mlp_what, 4 * (L - routed) * n_mlp * B * T * F,
                              f"4 x {'Ld' if routed else 'L'} x {n_mlp}BTF"))
    if routed:  # each token's k experts and the shared ones, and the router's logits
        width = cfg.experts_per_token * cfg.expert_dim + cfg.shared_dim
        rows.append(MemoryRow(f"router logits; {mlp_what} of the k experts and shared",
                              4 * routed * B * T * (cfg.n_experts + n_mlp * width),
                              f"4 x Lr x BT(E + {n_mlp}(k*Fe + Fs))"))
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
    (T x T)(T x Dv), B*H times per layer; with GQA the K/V heads are shared, not the products.
    A routed layer multiplies each token by its k experts only: BTk rows through an expert's
    matrices in all (however they are spread over the E experts), plus the router and the
    shared experts. Valid for any T >= 1 (no max_seq_len check here, so the plot can
    extrapolate)."""
    B, T = batch_size, seq_len
    H, Dh, Dv, V, L = cfg.n_heads, cfg.head_dim, cfg.value_dim, cfg.vocab_size, cfg.n_layers
    BT = B * T
    core = "attention scores + weighted sum"
    out = _projections(cfg, BT)
    out[-1:-1] = [  # the core sits before the output projection
        Matmul("attn.scores", core, T, Dh, T, B * H * L, "B*H*L", "(T x Dh)(Dh x T)"),
        Matmul("attn.weighted_sum", core, T, T, Dv, B * H * L, "B*H*L",
               "(T x T)(T x Dv)" if cfg.latent_attention else "(T x T)(T x Dh)"),
    ]
    out += _mlp_matmuls(cfg, BT)
    out.append(Matmul("lm_head (tied)" if cfg.tie_embeddings else "lm_head", "readout",
                      BT, cfg.d_model, V, 1, "1", "(BT x D)(D x V)"))
    return out


def _projections(cfg: DecoderConfig, BT: int) -> list[Matmul]:
    """The attention projections of every layer, the output projection last."""
    D, H, Hkv, Dh, Dv, L = (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.value_dim,
                            cfg.n_layers)
    proj = "attention projections"
    if not cfg.latent_attention:
        return [Matmul("attn.q_proj", proj, BT, D, H * Dh, L, "L", "(BT x D)(D x H*Dh)"),
                Matmul("attn.k_proj", proj, BT, D, Hkv * Dh, L, "L", "(BT x D)(D x Hkv*Dh)"),
                Matmul("attn.v_proj", proj, BT, D, Hkv * Dh, L, "L", "(BT x D)(D x Hkv*Dh)"),
                Matmul("attn.output_proj", proj, BT, H * Dh, D, L, "L", "(BT x H*Dh)(H*Dh x D)")]
    C, R, Dn, Cq = cfg.kv_latent_rank, cfg.rope_head_width, cfg.nope_head_width, cfg.q_latent_rank
    out = [Matmul("attn.q_proj", proj, BT, D, H * Dh, L, "L", "(BT x D)(D x H*Dh)")] \
        if Cq is None else [
        Matmul("attn.q_a_proj", proj, BT, D, Cq, L, "L", "(BT x D)(D x Cq)"),
        Matmul("attn.q_b_proj", proj, BT, Cq, H * Dh, L, "L", "(BT x Cq)(Cq x H*Dh)")]
    return out + [
        Matmul("attn.kv_a_proj", proj, BT, D, C + R, L, "L", "(BT x D)(D x C+R)"),
        Matmul("attn.kv_b_proj", proj, BT, C, H * (Dn + Dv), L, "L", "(BT x C)(C x H*(Dn+Dv))"),
        Matmul("attn.output_proj", proj, BT, H * Dv, D, L, "L", "(BT x H*Dv)(H*Dv x D)")]


def _mlp_matmuls(cfg: DecoderConfig, BT: int) -> list[Matmul]:
    """The dense layers' MLPs (width F), then the routed layers' router, the k experts of every
    token (BTk rows, width Fe) and the shared experts (width Fs)."""
    D, F = cfg.d_model, cfg.d_ff
    routed = sum(cfg.routes(i) for i in range(cfg.n_layers))
    dense = cfg.n_layers - routed
    out = []
    if dense:
        out += _mlp("ffn", BT, D, F, dense, "Ld" if routed else "L", "BT", "F", cfg.gated)
    if routed:
        E, k, Fe = cfg.n_experts, cfg.experts_per_token, cfg.expert_dim
        out.append(Matmul("ffn.router", "MLP", BT, D, E, routed, "Lr", "(BT x D)(D x E)"))
        out += _mlp("ffn.experts", BT * k, D, Fe, routed, "Lr", "BTk", "Fe", cfg.gated)
        if cfg.n_shared_experts:
            out += _mlp("ffn.shared", BT, D, cfg.shared_dim, routed, "Lr", "BT", "Fs", cfg.gated)
        if cfg.shared_expert_gate:
            out.append(Matmul("ffn.shared_gate", "MLP", BT, D, 1, routed, "Lr", "(BT x D)(D x 1)"))
    return out


def _mlp(name: str, rows: int, D: int, width: int, count: int, count_formula: str,
         rows_formula: str, width_letter: str, gated: bool) -> list[Matmul]:
    """w1 (and w3) D -> width, then w2 back, for `rows` rows, `count` times."""
    into = f"({rows_formula} x D)(D x {width_letter})"
    out = [Matmul(f"{name}.w1", "MLP", rows, D, width, count, count_formula, into)]
    if gated:
        out.append(Matmul(f"{name}.w3", "MLP", rows, D, width, count, count_formula, into))
    out.append(Matmul(f"{name}.w2", "MLP", rows, width, D, count, count_formula,
                      f"({rows_formula} x {width_letter})({width_letter} x D)"))
    return out


def _group_formulas(cfg: DecoderConfig) -> dict[str, str]:
    square = cfg.n_heads * cfg.head_dim == cfg.d_model  # H*Dh = D: the usual shapes
    kv = "8BTD^2" if square and cfg.kv_heads == cfg.n_heads else "4BTD(H + Hkv)Dh"
    mlp = "6BTDF" if cfg.gated else "4BTDF"
    core = "L x 4BT^2D" if square else "L x 4BT^2*H*Dh"
    if cfg.latent_attention:
        kv = "2BT(D*Cq + Cq*H*Dh + D*(C+R) + C*H*(Dn+Dv) + H*Dv*D)" if cfg.q_latent_rank \
            else "2BT(D*H*Dh + D*(C+R) + C*H*(Dn+Dv) + H*Dv*D)"
        core = "L x 2BT^2*H*(Dh + Dv)"
    if cfg.routed:
        m = 3 if cfg.gated else 2
        shared = (f" + {2 * m}BTD*Fs" if cfg.n_shared_experts else "") + (
            " + 2BTD" if cfg.shared_expert_gate else "")
        routed = f"Lr x (2BTDE + {2 * m}BTk*D*Fe{shared})"
        dense = cfg.n_layers - sum(cfg.routes(i) for i in range(cfg.n_layers))
        mlp = f"Ld x {mlp} + {routed}" if dense else routed
    else:
        mlp = f"L x {mlp}"
    return {
        "attention projections": f"L x {kv}",
        "attention scores + weighted sum": core,
        "MLP": mlp,
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
