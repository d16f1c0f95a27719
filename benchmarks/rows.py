"""The A/B rows: which configs and shapes are compared, and the timing of one row.

A row is a config, a shape (B, T) and a mode (forward, or forward + backward). Its pair is built
and checked equal (`pair.build_pair`), timed interleaved, and reported as medians and min-max,
tokens/s, achieved GFLOP/s from the accounting module's FLOPs, MFU against the ceiling, and
HF time / our time (ratio of medians, per-pair ratios, best-of ratio).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Callable

import torch

import decoder_audit as da

from .common import SEED, Plan, stats
from .pair import build_pair, step_fn, time_interleaved
from .profiles import profile_sides

# A Llama-style shape with grouped-query attention (2 query heads per KV head).
LLAMA_GQA = da.DecoderConfig(
    vocab_size=32000, d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, d_ff=1376,
    max_seq_len=2048, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", pos="rope",
    rope_theta=10000.0, attn_bias=False, mlp_bias=False, tie_embeddings=False,
)

# Tiny stand-ins with the same three architectures, for --smoke (the test suite's run).
SMOKE_CONFIGS = {
    "gpt2-tiny": da.preset("gpt2-small").replace(
        vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32),
    "llama-gqa-tiny": LLAMA_GQA.replace(
        vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=88, max_seq_len=32),
    "cs336-tiny": da.preset("cs336-small").replace(
        vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32),
}


@dataclass(frozen=True)
class Row:
    config_name: str
    cfg: da.DecoderConfig
    batch: int
    seq_len: int
    backward: bool

    @property
    def mode(self) -> str:
        return "forward+backward" if self.backward else "forward"

    @property
    def label(self) -> str:
        return f"{self.config_name} B={self.batch} T={self.seq_len} {self.mode}"


def full_rows() -> list[Row]:
    gpt2, cs336 = da.preset("gpt2-small"), da.preset("cs336-small")
    return [
        Row("gpt2-small", gpt2, 2, 128, True),
        Row("gpt2-small", gpt2, 2, 128, False),
        Row("gpt2-small", gpt2, 4, 256, False),
        Row("llama-gqa", LLAMA_GQA, 4, 256, False),
        Row("llama-gqa", LLAMA_GQA, 4, 256, True),
        Row("cs336-small", cs336, 2, 128, True),
        Row("cs336-small", cs336, 2, 128, False),
    ]


def smoke_rows() -> list[Row]:
    return [Row(name, cfg, 2, 8, backward) for name, cfg in SMOKE_CONFIGS.items()
            for backward in (True, False)]


def plan_rows(plan: Plan) -> list[Row]:
    """The rows this run compares (--quick: without gpt2-small B=4 T=256, each at half the
    batch and half the length, about a quarter of the work, and so none of them profiled)."""
    if plan.smoke:
        return smoke_rows()
    rows = full_rows()
    if plan.quick:
        rows = [Row(r.config_name, r.cfg, max(1, r.batch // 2), r.seq_len // 2, r.backward)
                for r in rows if not (r.config_name == "gpt2-small" and r.batch == 4)]
    return rows


# Rows whose both sides are profiled: (config name, batch, seq_len, backward).
PROFILED = {("gpt2-small", 2, 128, True), ("llama-gqa", 4, 256, False)}


def _inputs(row: Row) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Seeded token ids, and the fixed random targets of the backward loss (None for forward)."""
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, row.cfg.vocab_size, (row.batch, row.seq_len), generator=gen)  # (B, T)
    targets = (torch.randint(0, row.cfg.vocab_size, (row.batch, row.seq_len), generator=gen)
               if row.backward else None)  # (B, T)
    return ids, targets


def _side_figures(times: list[float], flops: int, tokens: int, ceiling: float) -> dict[str, Any]:
    """One side's times, and the rates derived from their median."""
    s = stats(times)
    achieved = flops / s["median"] / 1e9
    return {"seconds": s, "tokens_per_s": tokens / s["median"], "achieved_gflops": achieved,
            "mfu": achieved / ceiling}


def measure_row(row: Row, warmup: int, repeats: int, ceiling: float, profile: bool
                ) -> dict[str, Any]:
    ids, targets = _inputs(row)
    ours, theirs, check = build_pair(row.cfg, ids)
    fns: dict[str, Callable[[], None]] = {"ours": step_fn(ours, False, ids, targets),
                                          "hf": step_fn(theirs, True, ids, targets)}
    t_ours, t_hf = time_interleaved(fns["ours"], fns["hf"], warmup, repeats)
    forward_flops = da.account(row.cfg, batch_size=row.batch, seq_len=row.seq_len,
                               measure=False).forward_flops
    flops = 3 * forward_flops if row.backward else forward_flops
    tokens = row.batch * row.seq_len
    sides = {"ours": _side_figures(t_ours, flops, tokens, ceiling),
             "hf": _side_figures(t_hf, flops, tokens, ceiling)}
    paired = [h / o for o, h in zip(t_ours, t_hf)]
    result = {
        "label": row.label, "config": row.config_name, "batch": row.batch,
        "seq_len": row.seq_len, "mode": row.mode, "tokens": tokens,
        "flops": flops, "flops_convention": ("3 x forward (accounting module)" if row.backward
                                             else "forward (accounting module)"),
        "equality": check, "ours": sides["ours"], "hf": sides["hf"],
        "hf_over_ours": sides["hf"]["seconds"]["median"] / sides["ours"]["seconds"]["median"],
        "hf_over_ours_paired": stats(paired),
        # Best-of ratio: on a shared machine the fastest run of each side is the least disturbed.
        "hf_over_ours_best": sides["hf"]["seconds"]["min"] / sides["ours"]["seconds"]["min"],
    }
    if profile:
        result["profile"] = profile_sides(fns, steps=1 if repeats == 1 else 3)
    del ours, theirs, fns
    gc.collect()
    return result


def measure_rows(plan: Plan) -> list[dict[str, Any]]:
    """The "rows" family: every row of the run, in order, while the budget lasts; profiled are
    all rows in --smoke, else those in PROFILED."""
    results = []
    for row in plan.within_budget("rows", plan_rows(plan)):
        profile = plan.profile and (
            plan.smoke or (row.config_name, row.batch, row.seq_len, row.backward) in PROFILED)
        r = measure_row(row, plan.warmup, plan.repeats, plan.ceiling, profile)
        results.append(r)
        plan.done("rows", r)
        plan.say(f"{row.label}: ours {r['ours']['seconds']['median'] * 1e3:.0f} ms, HF "
                 f"{r['hf']['seconds']['median'] * 1e3:.0f} ms, HF/ours {r['hf_over_ours']:.2f}")
    return results
