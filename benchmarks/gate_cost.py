"""The gate's cost: `da.audit` timed on a preset, every pass through a Decoder counted, and the
total expressed in forward-equivalents (tokens, and time against one forward at the largest
shape the gate ran, in float32 and in the gate's working float64)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

import decoder_audit as da
from decoder_audit.model.decoder import Decoder

from .common import SEED, Plan
from .pair import step_fn, time_interleaved


@dataclass
class _Tally:
    """What the instrumented audit saw."""

    calls: list[tuple[int, int, str]] = field(default_factory=list)  # (B, T, dtype) per pass
    oracle_tokens: int = 0  # tokens through oracle_logits (the float64 reference, not the model)
    check_seconds: dict[str, float] = field(default_factory=dict)  # seconds per gate step


@contextmanager
def _instrumented() -> Iterator[_Tally]:
    """For the duration: wrap Decoder._run (forward and run_with_trace, on the gate's working
    copies too) to count passes, the gate's oracle_logits to count its tokens, and the function
    of every check in registry.CHECKS plus Subject.prepare (the float64 working copy) to time
    them. Restored after."""
    from decoder_audit.gate import registry, subject
    from decoder_audit.gate import spec as spec_checks  # where the gate calls oracle_logits

    tally = _Tally()
    original_run, original_oracle = Decoder._run, spec_checks.oracle_logits
    original_checks, original_prepare = dict(registry.CHECKS), subject.Subject.prepare

    def counting_run(self, ids, trace, **options):  # inputs the contract rejects never get here
        out = original_run(self, ids, trace, **options)
        tally.calls.append((int(ids.shape[0]), int(ids.shape[1]), str(out.dtype)))
        return out

    def counting_oracle(state, config, ids, *args, **kwargs):
        tally.oracle_tokens += ids.numel()
        return original_oracle(state, config, ids, *args, **kwargs)

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                tally.check_seconds[name] = (tally.check_seconds.get(name, 0.0)
                                             + time.perf_counter() - start)
        return wrapper

    Decoder._run, spec_checks.oracle_logits = counting_run, counting_oracle
    registry.CHECKS.update({name: dataclasses.replace(check, run=timed(name, check.run))
                            for name, check in original_checks.items()})
    subject.Subject.prepare = timed("prepare (working copy)", original_prepare)
    try:
        yield tally
    finally:
        Decoder._run, spec_checks.oracle_logits = original_run, original_oracle
        registry.CHECKS.update(original_checks)
        subject.Subject.prepare = original_prepare


def _forward_seconds(model: Decoder, batch: int, seq_len: int, repeats: int
                     ) -> tuple[float, float]:
    """Median seconds of one forward at (batch, seq_len) in float32 (the model's own dtype) and
    float64 (the dtype of the gate's working copy), timed interleaved."""
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len),
                        generator=torch.Generator().manual_seed(SEED))
    model.eval()
    model64 = Decoder(cfg, dtype=torch.float64).eval()
    t32, t64 = time_interleaved(step_fn(model, False, ids, None),
                                step_fn(model64, False, ids, None), warmup=1, repeats=repeats)
    return statistics.median(t32), statistics.median(t64)


def _shape_counts(calls: list[tuple[int, int, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for b, t, dtype in calls:
        key = f"B={b} T={t} {dtype.removeprefix('torch.')}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def gate_cost(preset_name: str, threads: int, repeats: int) -> dict[str, Any]:
    """Time da.audit on the preset with every Decoder pass counted (see `_instrumented`), then
    one forward at the largest shape it ran, to express the cost in forward-equivalents."""
    from decoder_audit.gate import audit

    cfg = da.preset(preset_name)
    torch.manual_seed(SEED)
    model = Decoder(cfg)
    with _instrumented() as tally:
        start = time.perf_counter()
        report = audit(model)
        seconds = time.perf_counter() - start
    tokens = sum(b * t for b, t, _ in tally.calls)
    big_b, big_t, _ = max(tally.calls, key=lambda c: c[0] * c[1])
    f32, f64 = _forward_seconds(model, big_b, big_t, repeats)
    return {
        "preset": preset_name, "passed": report.passed, "max_seq_len": cfg.max_seq_len,
        "failed_checks": [c.name for c in report.failures],
        "seconds": seconds,
        "decoder_passes": len(tally.calls),
        "tokens": tokens,
        "largest_pass": {"batch": big_b, "seq_len": big_t, "tokens": big_b * big_t},
        "forward_equivalents_tokens": tokens / (big_b * big_t),
        # The same tokens over one sequence at full context (B=1, T=max_seq_len).
        "forward_equivalents_max_len": tokens / cfg.max_seq_len,
        "oracle_tokens": tally.oracle_tokens,
        "forward_seconds_largest_fp32": f32, "forward_seconds_largest_fp64": f64,
        "forward_equivalents_time_fp32": seconds / f32,
        "forward_equivalents_time_fp64": seconds / f64,
        "gate_report_cost": report.to_dict()["cost"],
        "passes_by_shape": _shape_counts(tally.calls),
        "seconds_by_step": dict(sorted(tally.check_seconds.items(), key=lambda kv: -kv[1])),
    }


def measure(plan: Plan) -> dict[str, Any]:
    """The "gate" family: gpt2-small (tiny-368 in --smoke)."""
    result = gate_cost("tiny-368" if plan.smoke else "gpt2-small", plan.threads,
                       1 if plan.smoke else 3)
    plan.say(f"gate: {result['seconds']:.1f} s, "
             f"{result['forward_equivalents_tokens']:.1f} forward-equivalents (tokens)")
    return result
