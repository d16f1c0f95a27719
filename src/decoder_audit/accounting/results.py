"""The accounting's result types and conventions: what `account` returns, as frozen dataclasses
that turn into JSON-ready dicts with `to_dict()`.

Shape letters: B batch, T sequence length, D d_model, H query heads, Hkv KV heads, Dh head width,
F FFN width, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..config import DecoderConfig

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
    routed_experts: int = 0
    """The routed experts' parameters in all layers (E experts x their MLP per routed layer);
    0 without experts."""
    active: int = 0
    """The parameters one token's forward reads: the total less the routed experts it is not
    sent to, (E - k) per routed layer. Embeddings, attention, norms, router and shared experts
    count; the published "active" figures (Mixtral's 12.9B) are this. = total without experts."""


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
    measure_skipped: str | None = None
    """Why a measurement asked for was not made (a config with more experts than are built on
    the meta device, a forward with a tensor too large for torch); None when it was made or
    not asked for."""
    conventions: tuple[str, ...] = FLOP_CONVENTIONS

    def group(self, name: str) -> GroupTotal:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"no FLOP group {name!r}; groups are {list(GROUPS)}")
