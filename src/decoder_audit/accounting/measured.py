"""The measured cross-check of the analytic FLOPs.

The model is built on the meta device (shapes only) and run under
`torch.utils.flop_counter.FlopCounterMode`. The measured path is `run_with_trace`, the eager
attention path whose q @ k^T and pattern @ v are explicit matmuls the counter sees. A routed
layer on meta multiplies every token by its k experts' gathered matrices (model/mlp.py), which
the counter sees as bmm: those are compared with the analytic experts beside the attention core. (On real CPU
tensors the fused `F.scaled_dot_product_attention` kernel is invisible to the counter; on meta it
falls back to the math path and is counted too, which is recorded as a second measurement.)
"""

from __future__ import annotations

import torch

from ..config import DecoderConfig
from .analytic import forward_matmuls
from .results import GroupTotal, MeasuredFlops

# The measurement builds the Decoder on the meta device, and a routed layer holds each of its E
# experts as a module of its own (model/mlp.py): building them is Python's work, of the order
# of a millisecond and 10 kB each (issue 44: E = 10^5 took 97 s and 2.7 GB; 10^9 never ends).
# Beyond this many expert modules in all layers (DeepSeek-V3's 58 x 256 = 14,848 fit) the
# measured FLOPs and the measured ledger are not built: the analytic count, a formula in E,
# is given alone.
MAX_MEASURED_EXPERTS = 1 << 14
# torch sizes a tensor's storage in int64 bytes; the meta forward holds tensors of 8 bytes an
# element at most (the ids), so none may hold more elements than this.
MAX_META_ELEMENTS = ((1 << 63) - 1) // 8

MEASURED_PATH = ("run_with_trace (eager attention: explicit q @ k^T and pattern @ v matmuls), "
                 "model built on the meta device, counted by torch.utils.flop_counter."
                 "FlopCounterMode")
_LINEAR_OPS = ("aten.mm", "aten.addmm")  # what F.linear becomes (addmm when there is a bias)
_ATTENTION_OPS = ("aten.bmm", "aten.baddbmm")  # batched per-head products


def expert_modules(cfg: DecoderConfig) -> int:
    """The expert modules a Decoder with this config holds: E in each routed layer."""
    return (cfg.n_experts or 0) * sum(cfg.routes(i) for i in range(cfg.n_layers))


def unbuildable(cfg: DecoderConfig) -> str | None:
    """Why a Decoder with this config is not built on the meta device to be measured (too many
    expert modules), or None."""
    modules = expert_modules(cfg)
    if modules <= MAX_MEASURED_EXPERTS:
        return None
    routed = modules // cfg.n_experts
    return (f"n_experts={cfg.n_experts:,} in {routed} routed layer{'s' * (routed > 1)} is "
            f"{modules:,} expert modules to build on the meta device, more than the "
            f"{MAX_MEASURED_EXPERTS:,} a measurement builds; the analytic count, a formula in "
            "E, is given alone")


def unmeasurable(cfg: DecoderConfig, batch_size: int, seq_len: int) -> str | None:
    """Why one forward at (B, T) is not measured on the meta device, or None: the model is not
    built (`unbuildable`), or one of the forward's tensors would hold more elements than torch
    can size (the logits, the attention pattern, a routed layer's gathered experts, ...)."""
    why = unbuildable(cfg)
    if why is not None:
        return why
    B, T = batch_size, seq_len
    tensors = [("the logits", "B*T*V", B * T * cfg.vocab_size),
               ("the attention pattern", "B*H*T*T", B * cfg.n_heads * T * T),
               ("the MLP's hidden layer", "B*T*F", B * T * cfg.d_ff),
               ("the attention heads", "B*T*H*Dh", B * T * cfg.n_heads * cfg.head_dim)]
    if cfg.routed:
        tensors += [("the router's logits", "B*T*E", B * T * cfg.n_experts),
                    ("the gathered expert matrices", "B*T*k*Fe*D",
                     B * T * cfg.experts_per_token * cfg.expert_dim * cfg.d_model)]
    name, formula, elements = max(tensors, key=lambda tensor: tensor[2])
    if elements <= MAX_META_ELEMENTS:
        return None
    return (f"at B={B:,}, T={T:,} {name} would hold {formula} = {elements:,} elements, more "
            f"than a tensor can ({MAX_META_ELEMENTS:,}, its bytes an int64): the meta-device "
            "forward is not measured, the analytic count is given alone")


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
    from ..model.decoder import Decoder

    model = Decoder(cfg, device="meta")  # shapes only: gpt2-xl costs no memory here
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")  # (B, T)
    eager = _count_flops(lambda: model.run_with_trace(ids))
    sdpa = _count_flops(lambda: model(ids))
    return {"eager": eager, "sdpa": sdpa}


def measured_flops(cfg: DecoderConfig, batch_size: int, seq_len: int, groups: list[GroupTotal],
                   total: int) -> MeasuredFlops:
    """Measure one forward at (B, T) and compare it with the analytic `groups` and `total`:
    F.linear ops against projections + MLP + readout, bmm against scores + weighted sum."""
    counts = measure_forward_flops(cfg, batch_size, seq_len)
    by_op = counts["eager"]
    linear = sum(n for op, n in by_op.items() if op in _LINEAR_OPS)
    attention = sum(n for op, n in by_op.items() if op in _ATTENTION_OPS)
    measured_total = sum(by_op.values())
    want = {g.name: g.flops for g in groups}
    # on meta the routed experts' products are batched over (token, choice) pairs: bmm
    experts = sum(mm.flops for mm in forward_matmuls(cfg, batch_size, seq_len)
                  if mm.name.startswith("ffn.experts."))
    want_batched = want["attention scores + weighted sum"] + experts
    want_linear = total - want_batched
    differences = []
    if measured_total != total:
        differences.append(f"total: analytic {total:,} vs measured {measured_total:,}")
    if linear != want_linear:
        differences.append(f"mm+addmm {linear:,} vs projections+MLP+readout {want_linear:,}"
                           + (" (routed experts apart)" if experts else ""))
    if attention != want_batched:
        differences.append(f"bmm {attention:,} vs scores+weighted sum"
                           + (" + routed experts" if experts else "") + f" {want_batched:,}")
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
