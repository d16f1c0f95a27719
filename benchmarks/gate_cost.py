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
from decoder_audit.gate import TrainingPath
from decoder_audit.model.decoder import Decoder

from .common import SEED, Plan
from .pair import step_fn, time_interleaved


@dataclass
class _Tally:
    """What the instrumented audit saw."""

    calls: list[tuple[int, int, str]] = field(default_factory=list)  # (B, T, dtype) per pass
    oracle_tokens: int = 0  # tokens through oracle_logits (the float64 reference, not the model)
    check_seconds: dict[str, float] = field(default_factory=dict)  # seconds per gate step
    check_tokens: dict[str, int] = field(default_factory=dict)  # Decoder tokens per gate step
    running: list[str] = field(default_factory=list)  # the gate steps under way, innermost last


@contextmanager
def _instrumented() -> Iterator[_Tally]:
    """For the duration: wrap Decoder._run (forward and run_with_trace, on the gate's working
    copies too) to count passes, the gate's oracle_logits to count its tokens, and the function
    of every check in registry.CHECKS plus Subject.prepare (the float64 working copy) to time
    them. Restored after."""
    from decoder_audit.gate import registry, subject
    from decoder_audit.gate.checks import spec as spec_checks  # where the gate calls oracle_logits

    tally = _Tally()
    original_run, original_oracle = Decoder._run, spec_checks.oracle_logits
    original_checks, original_prepare = dict(registry.CHECKS), subject.Subject.prepare

    def counting_run(self, ids, trace, **options):  # inputs the contract rejects never get here
        out = original_run(self, ids, trace, **options)
        tally.calls.append((int(ids.shape[0]), int(ids.shape[1]), str(out.dtype)))
        step = tally.running[-1] if tally.running else "outside any check"
        tally.check_tokens[step] = tally.check_tokens.get(step, 0) + ids.numel()
        return out

    def counting_oracle(state, config, ids, *args, **kwargs):
        tally.oracle_tokens += ids.numel()
        return original_oracle(state, config, ids, *args, **kwargs)

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            tally.running.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                tally.running.pop()
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


def gate_cost(preset_name: str, threads: int, repeats: int,
              training: TrainingPath | None = None) -> dict[str, Any]:
    """Time da.audit on the preset (with the `training` path declared, when given) with every
    Decoder pass counted (see `_instrumented`), then one forward at the largest shape it ran and
    one at (1, max_seq_len), to express the cost in forward-equivalents."""
    from decoder_audit.gate import audit

    cfg = da.preset(preset_name)
    torch.manual_seed(SEED)
    model = Decoder(cfg)
    with _instrumented() as tally:
        start = time.perf_counter()
        report = audit(model, training=training)
        seconds = time.perf_counter() - start
    tokens = sum(b * t for b, t, _ in tally.calls)
    big_b, big_t, _ = max(tally.calls, key=lambda c: c[0] * c[1])
    f32, f64 = _forward_seconds(model, big_b, big_t, repeats)
    # One full-context sequence in float32: gate_scale's and the docs' unit of the gate's time.
    full32 = (f32 if (big_b, big_t) == (1, cfg.max_seq_len)
              else _forward_seconds(model, 1, cfg.max_seq_len, repeats)[0])
    return {
        "preset": preset_name, "passed": report.passed, "max_seq_len": cfg.max_seq_len,
        "training": None if training is None else dataclasses.asdict(training),
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
        "forward_seconds_full_len_fp32": full32,
        "forward_equivalents_time_full_len_fp32": seconds / full32,
        "gate_report_cost": report.to_dict()["cost"],
        "passes_by_shape": _shape_counts(tally.calls),
        "seconds_by_step": dict(sorted(tally.check_seconds.items(), key=lambda kv: -kv[1])),
        # each step's tokens in forward-equivalents of the gate's own cost line (its longest input)
        "forward_equivalents_by_step": {
            name: n / report.cost_len for name, n in
            sorted(tally.check_tokens.items(), key=lambda kv: -kv[1])},
    }


def measure(plan: Plan) -> dict[str, Any]:
    """The "gate" family: gpt2-small (tiny-368 in --smoke)."""
    result = gate_cost("tiny-368" if plan.smoke else "gpt2-small", plan.threads,
                       1 if plan.smoke else 3)
    plan.say(f"gate: {result['seconds']:.1f} s, "
             f"{result['forward_equivalents_tokens']:.1f} forward-equivalents (tokens)")
    return result


def main(argv: list[str] | None = None) -> int:
    """This family alone: `python -m benchmarks.gate_cost --preset gpt2-small --training 4 256
    --precision bf16 --checkpointing` (from the repository root) audits the preset with that
    training path declared, prints the cost and writes it as JSON to --out."""
    import argparse
    import json
    import os
    from pathlib import Path

    from .store import DEFAULT_OUT

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--training", type=int, nargs=2, metavar=("B", "T"),
                        help="declare a training path of B rows of T tokens")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "gate_cost.json")
    args = parser.parse_args(argv)
    if args.training is None and (args.precision != "fp32" or args.checkpointing):
        parser.error("--precision and --checkpointing declare a training path: give --training B T")
    torch.set_num_threads(args.threads)
    training = (None if args.training is None else
                TrainingPath(*args.training, args.precision, args.checkpointing))
    result = gate_cost(args.preset, args.threads, args.repeats, training)
    result["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.preset}: passed={result['passed']} {result['seconds']:.1f} s = "
          f"{result['forward_equivalents_time_full_len_fp32']:.1f} forward-equivalents "
          f"(1 x {result['max_seq_len']} fp32, {result['forward_seconds_full_len_fp32']:.2f} s); "
          f"tokens / largest pass {result['forward_equivalents_tokens']:.1f}; "
          f"tokens / max_seq_len {result['forward_equivalents_max_len']:.1f}")
    by_step = result["forward_equivalents_by_step"]
    print(f"the gate's own cost line: {result['gate_report_cost']}")
    for name, sec in result["seconds_by_step"].items():
        print(f"  {name:28s} {sec:6.1f} s  {by_step.get(name, 0.0):5.2f} forward-equivalents")
    print("passes: " + ", ".join(f"{k} x{v}" for k, v in result["passes_by_shape"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
