"""Sizing a decoder before building it: parameters, memory, and every forward matrix multiply.

`account(cfg, batch_size=1, seq_len=None)` works from the config alone (no weight is allocated):

- parameters come from `parameter_ledger(cfg)`, regrouped and labelled with their conventions
  (total unique, without embeddings, tied vs untied);
- memory is the weights in fp32 / bf16 / fp16, the AdamW training footprint, and an activation
  estimate whose assumptions are written beside it;
- FLOPs are listed matmul by matmul, derived from the shapes the model's code multiplies, and
  summed into four groups. Each (m x n)(n x p) product costs 2mnp.

The analytic count is then checked against a measurement: the model is built on the meta
device (shapes only) and run under `torch.utils.flop_counter.FlopCounterMode`. The measured
path is `run_with_trace`, the eager attention path whose q @ k^T and pattern @ v are explicit
matmuls the counter sees. (On real CPU tensors the fused `F.scaled_dot_product_attention` kernel
is invisible to the counter; on meta it falls back to the math path and is counted too, which
is recorded as a second measurement.)

Shape letters: B batch, T sequence length, D d_model, H query heads, Hkv KV heads, Dh head width,
F FFN width, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .config import DecoderConfig
from .errors import ContextLengthError, InputShapeError
from .ledger import parameter_ledger

FLOP_CONVENTIONS = (
    "an (m x n)(n x p) matrix product costs 2mnp FLOPs (one multiply-add = 2 FLOPs)",
    "forward pass only; forward + backward is reported as 3 x forward and labelled as such",
    "embedding lookups cost 0 FLOPs (they are row reads, not products)",
    "attention scores and weighted sum over the full T x T square: no causal halving",
    "the tied readout still costs 2BTDV: tying shares the weight, not the multiply",
    "not matmuls, so not counted: biases, norms, softmax, masking, the 1/sqrt(Dh) scale, RoPE, "
    "activations (GELU/ReLU/SiLU and the SwiGLU product), residual adds",
)

# The four groups of forward matmuls, in forward order, with how each grows with T.
GROUPS = ("attention projections", "attention scores + weighted sum", "MLP", "readout")
GROUP_SCALING = {
    "attention projections": "linear in T",
    "attention scores + weighted sum": "quadratic in T",
    "MLP": "linear in T",
    "readout": "linear in T",
}

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}

MEASURED_PATH = ("run_with_trace (eager attention: explicit q @ k^T and pattern @ v matmuls), "
                 "model built on the meta device, counted by torch.utils.flop_counter."
                 "FlopCounterMode")
_LINEAR_OPS = ("aten.mm", "aten.addmm")  # what F.linear becomes (addmm when there is a bias)
_ATTENTION_OPS = ("aten.bmm", "aten.baddbmm")  # batched per-head products


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------

class _ToDict:
    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


def _plain(value: Any) -> Any:
    """Dataclasses (including computed properties listed in `_extra`) as JSON-ready values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in getattr(value, "_extra", ()):
            out[name] = _plain(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class ComponentCount(_ToDict):
    """Parameters of one component summed over all layers, e.g. "attention" = L x one block."""

    name: str
    count: int
    formula: str


@dataclass(frozen=True)
class ParameterCounts(_ToDict):
    """The ledger's numbers, regrouped and labelled with the convention each one uses."""

    components: list[ComponentCount]
    total: int
    """Unique learned scalars: a tied weight counts once (the ledger total)."""
    embeddings: int
    """token_embeddings (V*D) + position_embeddings (max_seq_len*D, learned positions only)."""
    non_embedding: int
    """total - embeddings. A tied readout has no Parameter of its own, so it leaves with the
    token table; an untied lm_head (V*D) is a matmul weight and stays in."""
    non_position_embedding: int
    """total - position_embeddings: nanoGPT's get_num_params() convention, which keeps the token
    table because, tied, it is also the readout."""
    tied: bool
    total_if_tied: int
    """The ledger total of the same config with tie_embeddings=True."""
    total_if_untied: int
    """The ledger total of the same config with tie_embeddings=False (+V*D for lm_head)."""


@dataclass(frozen=True)
class MemoryRow(_ToDict):
    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class MemoryEstimate(_ToDict):
    weights: dict[str, int]
    """Bytes to hold the unique parameters in each dtype (fp32, bf16, fp16)."""
    training: list[MemoryRow]
    """fp32 weights, gradients and the two AdamW moments: 16 bytes per parameter."""
    training_total: int
    activations: list[MemoryRow]
    """An estimate: see `activation_assumptions`."""
    activations_total: int
    activation_assumptions: list[str]


@dataclass(frozen=True)
class Matmul(_ToDict):
    """One forward matrix product (m x n)(n x p), run `count` times per forward pass."""

    name: str  # e.g. "attn.q_proj"
    group: str  # one of GROUPS
    m: int
    n: int
    p: int
    count: int
    count_formula: str  # e.g. "L" or "B*H*L"
    shape_formula: str  # e.g. "(BT x D)(D x H*Dh)"

    _extra = ("operands", "flops_each", "flops")

    @property
    def operands(self) -> str:
        return f"({self.m} x {self.n})({self.n} x {self.p})"

    @property
    def flops_each(self) -> int:
        return 2 * self.m * self.n * self.p

    @property
    def flops(self) -> int:
        return self.count * self.flops_each


@dataclass(frozen=True)
class GroupTotal(_ToDict):
    name: str
    flops: int
    share: float  # of the forward matmul total
    scaling: str  # "linear in T" or "quadratic in T"
    formula: str  # the group's closed form in the shape letters


@dataclass(frozen=True)
class MeasuredFlops(_ToDict):
    path: str
    total: int
    by_op: dict[str, int]
    """FlopCounterMode's counts per aten op, e.g. {"aten.mm": ..., "aten.bmm": ...}."""
    linear_ops_total: int
    """mm + addmm: every F.linear, to compare with projections + MLP + readout."""
    attention_ops_total: int
    """bmm (+ baddbmm): the per-head products, to compare with scores + weighted sum."""
    sdpa_meta_total: int
    """The plain forward (F.scaled_dot_product_attention) on meta, where torch decomposes it
    into the math path's bmm."""
    matches_analytic: bool
    differences: list[str]


@dataclass(frozen=True)
class Accounting(_ToDict):
    config: DecoderConfig
    batch_size: int
    seq_len: int
    parameters: ParameterCounts
    memory: MemoryEstimate
    matmuls: list[Matmul]
    groups: list[GroupTotal]
    forward_flops: int
    """Sum of every forward matmul's 2mnp (see FLOP_CONVENTIONS)."""
    forward_backward_flops: int
    """3 x forward_flops: the usual estimate (backward = 2 x forward), not a measurement."""
    dominant: list[str]
    """Group names, largest first, covering at least half the forward FLOPs."""
    measured: MeasuredFlops | None
    conventions: tuple[str, ...] = FLOP_CONVENTIONS

    def group(self, name: str) -> GroupTotal:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"no FLOP group {name!r}; groups are {list(GROUPS)}")


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
    n_mlp = 3 if cfg.mlp == "swiglu" else 2  # w1 out, (w3 out,) activation out
    mlp_what = "w1, w3 outputs, SiLU product" if cfg.mlp == "swiglu" else "w1 output, activation"
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
    if cfg.mlp == "swiglu":
        out.append(Matmul("ffn.w3", "MLP", BT, D, F, L, "L", "(BT x D)(D x F)"))
    out += [
        Matmul("ffn.w2", "MLP", BT, F, D, L, "L", "(BT x F)(F x D)"),
        Matmul("lm_head (tied)" if cfg.tie_embeddings else "lm_head", "readout",
               BT, D, V, 1, "1", "(BT x D)(D x V)"),
    ]
    return out


def _group_formulas(cfg: DecoderConfig) -> dict[str, str]:
    kv = "4BTD(H + Hkv)Dh" if cfg.kv_heads != cfg.n_heads else "8BTD^2"
    mlp = "6BTDF" if cfg.mlp == "swiglu" else "4BTDF"
    return {
        "attention projections": f"L x {kv}",
        "attention scores + weighted sum": "L x 4BT^2D",
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


def _dominant(groups: list[GroupTotal]) -> list[str]:
    """Largest groups first, until they cover at least half the forward FLOPs."""
    names, covered = [], 0.0
    for group in sorted(groups, key=lambda g: g.flops, reverse=True):
        names.append(group.name)
        covered += group.share
        if covered >= 0.5:
            break
    return names


# --------------------------------------------------------------------------------------------
# Forward matmuls, measured
# --------------------------------------------------------------------------------------------

def _count_flops(run) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        run()
    return {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def measure_forward_flops(cfg: DecoderConfig, batch_size: int,
                          seq_len: int) -> dict[str, dict[str, int]]:
    """Build Decoder(cfg) on the meta device (no storage) and count the FLOPs of one forward
    pass on meta ids (B, T), traced and plain. Returns {"eager": by_op, "sdpa": by_op}."""
    from .model import Decoder

    with torch.device("meta"):  # shapes only: gpt2-xl costs no memory here
        model = Decoder(cfg)
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")  # (B, T)
    eager = _count_flops(lambda: model.run_with_trace(ids))
    sdpa = _count_flops(lambda: model(ids))
    return {"eager": eager, "sdpa": sdpa}


def _measured(cfg: DecoderConfig, batch_size: int, seq_len: int, groups: list[GroupTotal],
              total: int) -> MeasuredFlops:
    counts = measure_forward_flops(cfg, batch_size, seq_len)
    by_op = counts["eager"]
    linear = sum(n for op, n in by_op.items() if op in _LINEAR_OPS)
    attention = sum(n for op, n in by_op.items() if op in _ATTENTION_OPS)
    measured_total = sum(by_op.values())
    want = {g.name: g.flops for g in groups}
    want_linear = total - want["attention scores + weighted sum"]
    differences = []
    if measured_total != total:
        differences.append(f"total: analytic {total:,} vs measured {measured_total:,}")
    if linear != want_linear:
        differences.append(f"mm+addmm {linear:,} vs projections+MLP+readout {want_linear:,}")
    if attention != want["attention scores + weighted sum"]:
        differences.append(f"bmm {attention:,} vs scores+weighted sum "
                           f"{want['attention scores + weighted sum']:,}")
    others = sorted(op for op in by_op if op not in _LINEAR_OPS + _ATTENTION_OPS)
    if others:
        differences.append(f"ops outside the matmul groups: {others}")
    sdpa_total = sum(counts["sdpa"].values())
    if sdpa_total != total:
        differences.append(f"plain forward (SDPA) on meta: {sdpa_total:,} vs analytic {total:,}")
    return MeasuredFlops(
        path=MEASURED_PATH, total=measured_total, by_op=by_op, linear_ops_total=linear,
        attention_ops_total=attention, sdpa_meta_total=sdpa_total,
        matches_analytic=not differences, differences=differences,
    )


# --------------------------------------------------------------------------------------------
# The whole account
# --------------------------------------------------------------------------------------------

def _check_sizes(cfg: DecoderConfig, batch_size: Any, seq_len: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputShapeError(f"batch size B={batch_size!r} must be an integer >= 1")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ContextLengthError(f"sequence length T={seq_len!r} must be an integer >= 1")
    if seq_len > cfg.max_seq_len:
        raise ContextLengthError(
            f"sequence length T={seq_len} exceeds max_seq_len={cfg.max_seq_len}; account a "
            f"config with a longer context instead (e.g. cfg.replace(max_seq_len={seq_len}))")


def account(cfg: DecoderConfig, batch_size: int = 1, seq_len: int | None = None, *,
            measure: bool = True) -> Accounting:
    """Parameters, memory and every forward matmul of a decoder with this config, at (B, T).

    seq_len defaults to cfg.max_seq_len. With measure=True the analytic FLOPs are checked
    against FlopCounterMode on the meta device (no weight is allocated either way)."""
    if not isinstance(cfg, DecoderConfig):
        raise TypeError(f"account needs a DecoderConfig, got {type(cfg).__name__}")
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    _check_sizes(cfg, batch_size, seq_len)
    params = parameter_counts(cfg)
    matmuls = forward_matmuls(cfg, batch_size, seq_len)
    groups = group_totals(matmuls, cfg)
    total = sum(mm.flops for mm in matmuls)
    return Accounting(
        config=cfg,
        batch_size=batch_size,
        seq_len=seq_len,
        parameters=params,
        memory=memory_estimate(cfg, params.total, batch_size, seq_len),
        matmuls=matmuls,
        groups=groups,
        forward_flops=total,
        forward_backward_flops=3 * total,
        dominant=_dominant(groups),
        measured=_measured(cfg, batch_size, seq_len, groups, total) if measure else None,
    )


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


def plot_context_sweep(cfg: DecoderConfig, path, batch_size: int = 1, *, title: str = "",
                       seq_len: int | None = None) -> None:
    """Log-log PNG of each group's forward FLOPs as T doubles: linear groups solid, the
    quadratic group dashed; the model's max_seq_len is marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = 1 if cfg.max_seq_len <= 64 else 16
    points = context_sweep(cfg, batch_size, start=start)
    ts = [t for t, _ in points]
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    # Distinct markers and widths, so groups with equal FLOPs (e.g. projections and a 4D MLP
    # when F = 2D) still show as two lines.
    for name, marker, width in zip(GROUPS, "osD^", (4.0, 2.0, 2.0, 2.0)):
        quadratic = GROUP_SCALING[name] == "quadratic in T"
        ax.plot(ts, [flops[name] for _, flops in points], marker=marker, markersize=4,
                linestyle="--" if quadratic else "-", linewidth=width, alpha=0.9,
                label=f"{name} ({GROUP_SCALING[name]})")
    ax.plot(ts, [sum(flops.values()) for _, flops in points], color="black", linewidth=1,
            label="total forward matmul FLOPs")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ts, [f"{t:,}" for t in ts], rotation=45, fontsize=8)
    ax.minorticks_off()
    # Vertical markers, labelled in axes coordinates so they sit at the bottom of any y range.
    ax.axvline(cfg.max_seq_len, color="grey", linestyle=":", linewidth=1.5)
    ax.text(cfg.max_seq_len, 0.02, f" max_seq_len={cfg.max_seq_len:,}\n (right of it: formulas "
            "extrapolated)", transform=ax.get_xaxis_transform(), color="dimgrey", fontsize=8,
            va="bottom")
    if seq_len is not None and seq_len != cfg.max_seq_len:
        ax.axvline(seq_len, color="tab:red", linestyle=":", linewidth=1.5)
        ax.text(seq_len, 0.55, f" T={seq_len:,}", transform=ax.get_xaxis_transform(),
                color="tab:red", fontsize=8)
    ax.set_xlabel("context length T (doubling)")
    ax.set_ylabel(f"forward FLOPs (B={batch_size}, 2mnp per matmul)")
    ax.set_title(title or "forward matmul FLOPs per group as the context doubles")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


__all__ = [
    "ACTIVATION_ASSUMPTIONS", "Accounting", "ComponentCount", "FLOP_CONVENTIONS", "GROUPS",
    "GroupTotal", "Matmul", "MeasuredFlops", "MemoryEstimate", "MemoryRow", "ParameterCounts",
    "account", "context_sweep", "flops_by_group", "forward_matmuls", "measure_forward_flops",
    "parameter_counts", "plot_context_sweep",
]
