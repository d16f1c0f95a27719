"""Side-by-side CPU benchmark: our `Decoder` against Hugging Face transformers, same weights.

    python benchmarks/run.py              # the full run (about 8 minutes on 2 cores)
    python benchmarks/run.py --quick      # fewer repeats and a smaller ceiling matmul
    python benchmarks/run.py --threads 1 --out /tmp/bench

What one run measures, in one process and at one thread count (`torch.set_num_threads`):
  1. the machine's ceiling: dense fp32 `torch.mm` GFLOP/s (median of several runs);
  2. per row (a config, a shape, forward or forward + backward): our Decoder and the Hugging
     Face model built from it by `decoder_audit.to_hf` (its logits are checked equal first),
     timed interleaved (A B, then B A, ...) after a warm-up, so drift and the other users of the
     machine hit both sides; medians and min-max, tokens/s, achieved GFLOP/s from the accounting
     module's FLOPs, MFU against the ceiling, and HF time / our time;
  3. peak memory of each side for forward + backward, each in its own fresh subprocess;
  4. the gate's cost on gpt2-small in forward-equivalents (tokens and time);
  5. `decoder-audit account --preset gpt2-xl` wall time and peak memory (a subprocess);
  6. torch.profiler tables (top ops by self CPU time) of both sides for two rows.
Results go to `<out>/benchmark.json`, `<out>/benchmark.md` and `<out>/profiles.md`.

Conventions. FLOPs are `da.account(cfg, B, T).forward_flops` (every forward matmul, a multiply-add
is 2 FLOPs, the attention products counted over the full T x T square); forward + backward is
counted as 3 x forward. Both sides run in eval mode (no dropout: HF GPT-2 would otherwise drop
10%), HF with its default fused attention ("sdpa", the strongest HF baseline on CPU) and
`use_cache=False` (no KV cache is built for a full-sequence pass). The backward loss is the same
cross-entropy against fixed random targets, computed outside both models; gradients are set to
None before every step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import decoder_audit as da
from decoder_audit.model import Decoder

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SEED = 0
# The pair must compute the same function before it is timed: max |ours - HF| over the logits,
# relative to the logit scale. fp32 conversions agree to ~1e-6 of scale; 1e-4 is a real bug.
EQUALITY_TOL = 1e-4


class BenchmarkError(RuntimeError):
    """The benchmark cannot produce an honest comparison (e.g. the two models differ)."""


# ------------------------------------------------------------------------------------------------
# Configurations and rows
# ------------------------------------------------------------------------------------------------

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


# Rows whose both sides are profiled: (config name, batch, seq_len, backward).
PROFILED = {("gpt2-small", 2, 128, True), ("llama-gqa", 4, 256, False)}


# ------------------------------------------------------------------------------------------------
# The machine
# ------------------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_state() -> str:
    """The commit measured, and whether the model file differs from it (results stay traceable)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/decoder_audit"],
                               cwd=root, text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes under src/decoder_audit" if dirty else "")


def machine_info(threads: int) -> dict[str, Any]:
    import transformers

    return {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads_used": threads,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()),
        "git": _git_state(),
        "note": "shared machine: absolute times are noisy; the interleaved ratios are the figures",
    }


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def matmul_ceiling(shapes: list[tuple[int, int, int]], repeats: int) -> dict[str, Any]:
    """fp32 torch.mm GFLOP/s for (m x n)(n x p), 2mnp FLOPs each; the first shape is the ceiling."""
    gen = torch.Generator().manual_seed(SEED)
    results = []
    for m, n, p in shapes:
        a = torch.randn(m, n, generator=gen)
        b = torch.randn(n, p, generator=gen)
        out = torch.empty(m, p)
        torch.mm(a, b, out=out)  # warm-up: first call pays for packing buffers and threads
        gflops = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            gflops.append(2 * m * n * p / (time.perf_counter() - start) / 1e9)
        results.append({"shape": f"({m} x {n})({n} x {p})", "gflops": stats(gflops)})
    return {"ceiling_gflops": results[0]["gflops"]["median"], "ceiling_shape": results[0]["shape"],
            "shapes": results}


# ------------------------------------------------------------------------------------------------
# The pair of models and what one step does
# ------------------------------------------------------------------------------------------------

def hf_fast_attention(hf_model) -> str:
    """Switch the converted model (built with eager attention so weights can be read back) to HF's
    default fused attention, the fastest HF path on CPU. Returns the implementation in use."""
    try:
        hf_model.set_attn_implementation("sdpa")
    except (AttributeError, ValueError, ImportError):
        pass
    return str(getattr(hf_model.config, "_attn_implementation", "unknown"))


def build_pair(cfg: da.DecoderConfig, ids: torch.Tensor) -> tuple[Decoder, Any, dict[str, Any]]:
    """Our seeded Decoder and to_hf(decoder); refuses (BenchmarkError) unless their logits agree."""
    torch.manual_seed(SEED)
    ours = Decoder(cfg).eval()
    theirs = da.to_hf(ours).eval()
    attn = hf_fast_attention(theirs)
    with torch.no_grad():
        a = ours(ids)  # (B, T, V)
        b = theirs(input_ids=ids, use_cache=False).logits  # (B, T, V)
    diff = float((a - b).abs().max())
    scale = float(a.abs().max())
    if not diff <= EQUALITY_TOL * (1.0 + scale):
        raise BenchmarkError(f"{type(theirs).__name__} logits differ from ours by {diff:.3g} "
                             f"(logit scale {scale:.3g}, B={ids.shape[0]} T={ids.shape[1]}); "
                             "refusing to time unequal models")
    check = {"max_abs_logit_diff": diff, "logit_scale": scale, "hf_class": type(theirs).__name__,
             "hf_attention": attn}
    return ours, theirs, check


def step_fn(model, is_hf: bool, ids: torch.Tensor, targets: torch.Tensor | None
            ) -> Callable[[], None]:
    """One timed step: a no-grad forward, or forward + cross-entropy + backward (grads set to None
    first so every step allocates the same)."""
    def logits() -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits if is_hf else model(ids)

    if targets is None:
        def forward() -> None:
            with torch.no_grad():
                logits()
        return forward

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        out = logits()  # (B, T, V)
        F.cross_entropy(out.flatten(0, 1), targets.flatten()).backward()
    return forward_backward


def time_interleaved(ours: Callable[[], None], theirs: Callable[[], None], warmup: int,
                     repeats: int) -> tuple[list[float], list[float]]:
    """Warm both up, then alternate the order each repeat (A B, B A, ...) so neither side always
    runs first; gc is off inside a timed call so a collection never lands in one side's time."""
    for _ in range(warmup):
        ours()
        theirs()
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for r in range(repeats):
        order = (("ours", ours), ("hf", theirs))
        for side, fn in order if r % 2 == 0 else order[::-1]:
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                fn()
                times[side].append(time.perf_counter() - start)
            finally:
                gc.enable()
    return times["ours"], times["hf"]


def profile_table(fn: Callable[[], None], steps: int, rows: int = 15
                  ) -> tuple[str, list[dict[str, Any]]]:
    """torch.profiler over `steps` steps (several, so one preempted step weighs less): the table
    of top ops by self CPU time, and the same as data (times are totals over the steps)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages) or 1.0
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    data = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "self_share": e.self_cpu_time_total / total} for e in top]
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40)
    return table, data


def measure_row(row: Row, warmup: int, repeats: int, ceiling: float, profile: bool
                ) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, row.cfg.vocab_size, (row.batch, row.seq_len), generator=gen)  # (B, T)
    targets = (torch.randint(0, row.cfg.vocab_size, (row.batch, row.seq_len), generator=gen)
               if row.backward else None)  # (B, T)
    ours, theirs, check = build_pair(row.cfg, ids)
    fn_ours = step_fn(ours, False, ids, targets)
    fn_hf = step_fn(theirs, True, ids, targets)
    t_ours, t_hf = time_interleaved(fn_ours, fn_hf, warmup, repeats)
    forward_flops = da.account(row.cfg, batch_size=row.batch, seq_len=row.seq_len,
                               measure=False).forward_flops
    flops = 3 * forward_flops if row.backward else forward_flops
    tokens = row.batch * row.seq_len
    sides = {}
    for side, times in (("ours", t_ours), ("hf", t_hf)):
        s = stats(times)
        achieved = flops / s["median"] / 1e9
        sides[side] = {"seconds": s, "tokens_per_s": tokens / s["median"],
                       "achieved_gflops": achieved, "mfu": achieved / ceiling}
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
        result["profile"] = {}
        for side, fn in (("ours", fn_ours), ("hf", fn_hf)):
            table, data = profile_table(fn, steps=1 if repeats == 1 else 3)
            result["profile"][side] = {"table": table, "top_ops": data}
    del ours, theirs
    gc.collect()
    return result


# ------------------------------------------------------------------------------------------------
# Peak memory, one fresh process per side
# ------------------------------------------------------------------------------------------------

def _status_mb(field: str) -> float:
    """A /proc/self/status memory field in MiB: VmRSS (now) or VmHWM (peak of this process).

    Not getrusage's ru_maxrss: on Linux a child starts with its parent's peak (fork copies the
    address space and execve keeps the counter), so a child of this big process would report the
    parent's peak. VmHWM belongs to the address space that execve creates afresh."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise BenchmarkError(f"/proc/self/status has no {field} (peak memory needs Linux)")


def memory_child(side: str, cfg_json: str, batch: int, seq_len: int, threads: int,
                 steps: int) -> dict[str, Any]:
    """Runs in the child: build one side (random weights: memory does not depend on values), take
    `steps` forward + backward steps, report RSS before the steps and the process peak."""
    import transformers  # both children import it, so their baselines match

    from decoder_audit.references.hf import config_to_hf, hf_family

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    cfg = da.DecoderConfig.from_dict(json.loads(cfg_json))
    if side == "ours":
        model = Decoder(cfg).eval()
    else:
        cls = (transformers.GPT2LMHeadModel if hf_family(cfg) == "gpt2"
               else transformers.LlamaForCausalLM)
        model = cls(config_to_hf(cfg)).eval()
        hf_fast_attention(model)
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen)
    fn = step_fn(model, side == "hf", ids, targets)
    gc.collect()
    before, peak_before = _status_mb("VmRSS"), _status_mb("VmHWM")
    for _ in range(steps):
        fn()
    peak = _status_mb("VmHWM")
    params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return {"side": side, "rss_before_steps_mb": before, "peak_before_steps_mb": peak_before,
            "peak_rss_mb": peak, "step_peak_over_rss_before_mb": peak - before,
            "parameters_mb": params_mb}


def measure_memory(config_name: str, cfg: da.DecoderConfig, batch: int, seq_len: int,
                   threads: int, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"config": config_name, "batch": batch, "seq_len": seq_len,
                           "mode": "forward+backward", "steps": steps}
    for side in ("ours", "hf"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", side,
               json.dumps(cfg.to_dict()), str(batch), str(seq_len), str(threads), str(steps)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchmarkError(f"memory child {side} for {config_name} failed:\n{done.stderr[-2000:]}")
        out[side] = json.loads(done.stdout.strip().splitlines()[-1])
    out["hf_over_ours_peak"] = out["hf"]["peak_rss_mb"] / out["ours"]["peak_rss_mb"]
    return out


# ------------------------------------------------------------------------------------------------
# The gate's cost and `account --preset gpt2-xl`
# ------------------------------------------------------------------------------------------------

def gate_cost(preset_name: str, threads: int, repeats: int) -> dict[str, Any]:
    """Time da.audit on the preset and count every pass through a Decoder (forward and
    run_with_trace, on the gate's working copies too) by wrapping Decoder._run for the duration;
    oracle_logits calls (the slow float64 reference, not the model) are counted separately."""
    from decoder_audit.gate import audit, runner, subject, whitebox

    cfg = da.preset(preset_name)
    torch.manual_seed(SEED)
    model = Decoder(cfg)
    calls: list[tuple[int, int, str]] = []  # (B, T, dtype) of each Decoder pass that ran
    oracle_tokens = [0]
    original_run, original_oracle = Decoder._run, whitebox.oracle_logits

    def counting_run(self, ids, trace):  # inputs the contract rejects never get here
        out = original_run(self, ids, trace)
        calls.append((int(ids.shape[0]), int(ids.shape[1]), str(out.dtype)))
        return out

    def counting_oracle(state, config, ids, *args, **kwargs):
        oracle_tokens[0] += ids.numel()
        return original_oracle(state, config, ids, *args, **kwargs)

    # Seconds per check (and for making the gate's float64 working copy), to show where it goes.
    check_seconds: dict[str, float] = {}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                check_seconds[name] = check_seconds.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    original_checks, original_prepare = dict(runner.CHECKS), subject.Subject.prepare
    Decoder._run, whitebox.oracle_logits = counting_run, counting_oracle
    runner.CHECKS.update({name: timed(name, fn) for name, fn in original_checks.items()})
    subject.Subject.prepare = timed("prepare (working copy)", original_prepare)
    try:
        start = time.perf_counter()
        report = audit(model)
        seconds = time.perf_counter() - start
    finally:
        Decoder._run, whitebox.oracle_logits = original_run, original_oracle
        runner.CHECKS.update(original_checks)
        subject.Subject.prepare = original_prepare
    tokens = sum(b * t for b, t, _ in calls)
    biggest = max(calls, key=lambda c: c[0] * c[1])
    big_b, big_t, _ = biggest
    # Time one forward at the largest shape the gate ran, in float32 (the model's own dtype) and
    # float64 (the dtype of the gate's working copy), interleaved.
    ids = torch.randint(0, cfg.vocab_size, (big_b, big_t), generator=torch.Generator().manual_seed(SEED))
    model.eval()
    model64 = Decoder(cfg, dtype=torch.float64).eval()
    t32, t64 = time_interleaved(step_fn(model, False, ids, None), step_fn(model64, False, ids, None),
                                warmup=1, repeats=repeats)
    del model64
    f32, f64 = statistics.median(t32), statistics.median(t64)
    return {
        "preset": preset_name, "passed": report.passed, "max_seq_len": cfg.max_seq_len,
        "failed_checks": [c.name for c in report.failures],
        "seconds": seconds,
        "decoder_passes": len(calls),
        "tokens": tokens, "largest_pass": {"batch": big_b, "seq_len": big_t, "tokens": big_b * big_t},
        "forward_equivalents_tokens": tokens / (big_b * big_t),
        # The same tokens over one sequence at full context (B=1, T=max_seq_len).
        "forward_equivalents_max_len": tokens / cfg.max_seq_len,
        "oracle_tokens": oracle_tokens[0],
        "forward_seconds_largest_fp32": f32, "forward_seconds_largest_fp64": f64,
        "forward_equivalents_time_fp32": seconds / f32,
        "forward_equivalents_time_fp64": seconds / f64,
        "gate_report_cost": report.to_dict()["cost"],
        "passes_by_shape": _shape_counts(calls),
        "seconds_by_step": dict(sorted(check_seconds.items(), key=lambda kv: -kv[1])),
    }


def _shape_counts(calls: list[tuple[int, int, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for b, t, dtype in calls:
        key = f"B={b} T={t} {dtype.removeprefix('torch.')}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


_ACCOUNT_CHILD = """
import sys
from pathlib import Path
from decoder_audit.cli import main
try:
    rc = main(sys.argv[1:])
finally:
    hwm = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:")]
    print("BENCH-VmHWM-KiB", hwm[0].split()[1], file=sys.stderr)
sys.exit(rc)
"""


def account_cost(preset_name: str) -> dict[str, Any]:
    """Wall time and peak RSS (VmHWM, see `_status_mb`) of `decoder-audit account --preset NAME`
    run as a fresh process through the CLI's own main()."""
    cmd = [sys.executable, "-c", _ACCOUNT_CHILD, "account", "--preset", preset_name]
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    seconds = time.perf_counter() - start
    marks = [line.split()[1] for line in done.stderr.splitlines()
             if line.startswith("BENCH-VmHWM-KiB")]
    if done.returncode != 0 or not marks:
        raise BenchmarkError(f"decoder-audit account --preset {preset_name} failed "
                             f"(exit {done.returncode}): {done.stderr[-2000:]}")
    return {"command": f"decoder-audit account --preset {preset_name}", "seconds": seconds,
            "peak_rss_mb": int(marks[-1]) / 1024}


# ------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------

def _ms(s: dict[str, float]) -> str:
    return f"{s['median'] * 1e3:.0f} ({s['min'] * 1e3:.0f}-{s['max'] * 1e3:.0f})"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    c = results["ceiling"]
    lines = [
        "# decoder-audit vs Hugging Face: CPU benchmark", "",
        f"Command: `{results['command']}`  ",
        f"Machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, {m['threads_used']} threads "
        f"used (both sides), CPU capability {m['cpu_capability']}; torch {m['torch']}, "
        f"transformers {m['transformers']}, Python {m['python']}; code at {m['git']}.  ",
        f"Load average at start: {', '.join(f'{x:.2f}' for x in m['load_average_at_start'])} "
        "(a shared machine: absolute numbers are noisy, the interleaved ratios are what count).  ",
        f"Repeats: {results['repeats']} timed after {results['warmup']} warm-up per side, "
        "interleaved; times are median (min-max) in ms.", "",
        "## Ceiling: dense fp32 matmul", "",
        "| shape | GFLOP/s median (min-max) |", "|---|---|",
    ]
    for s in c["shapes"]:
        g = s["gflops"]
        lines.append(f"| {s['shape']} | {g['median']:.1f} ({g['min']:.1f}-{g['max']:.1f}) |")
    lines += ["", f"Ceiling used for MFU: {c['ceiling_gflops']:.1f} GFLOP/s ({c['ceiling_shape']}).",
              "", "## Our Decoder vs Hugging Face (same weights, logits checked equal first)", "",
              "| row | ours ms | HF ms | HF/ours medians (paired min-max) | HF/ours best | "
              "ours tok/s | HF tok/s | ours GFLOP/s | HF GFLOP/s | ours MFU | HF MFU | "
              "max logit diff |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        o, h, p = r["ours"], r["hf"], r["hf_over_ours_paired"]
        lines.append(
            f"| {r['label']} | {_ms(o['seconds'])} | {_ms(h['seconds'])} | "
            f"**{r['hf_over_ours']:.2f}** ({p['min']:.2f}-{p['max']:.2f}) | "
            f"{r['hf_over_ours_best']:.2f} | {o['tokens_per_s']:.0f} | {h['tokens_per_s']:.0f} | {o['achieved_gflops']:.1f} | "
            f"{h['achieved_gflops']:.1f} | {o['mfu']:.0%} | {h['mfu']:.0%} | "
            f"{r['equality']['max_abs_logit_diff']:.1e} |")
    ratios = [r["hf_over_ours"] for r in results["rows"]]
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    best = [r["hf_over_ours_best"] for r in results["rows"]]
    geo_best = statistics.geometric_mean(best) if best else float("nan")
    lines += ["", f"HF/ours geometric mean over rows: **{geo:.2f}** from medians, {geo_best:.2f} "
              "from best-of times (>1 means ours is faster; tok/s, GFLOP/s and MFU use medians). "
              f"HF runs `{results['rows'][0]['equality']['hf_attention'] if results['rows'] else '?'}`"
              " attention, `use_cache=False`, eval mode; forward+backward FLOPs = 3 x forward.", ""]
    if results.get("memory"):
        lines += ["## Peak memory, forward + backward (fresh process per side)", "",
                  "| config | side | peak RSS MiB | RSS before steps MiB | step peak over it MiB | "
                  "params MiB |", "|---|---|---|---|---|---|"]
        for mem in results["memory"]:
            for side in ("ours", "hf"):
                s = mem[side]
                lines.append(
                    f"| {mem['config']} B={mem['batch']} T={mem['seq_len']} | {side} | "
                    f"{s['peak_rss_mb']:.0f} | {s['rss_before_steps_mb']:.0f} | "
                    f"{s['step_peak_over_rss_before_mb']:.0f} | {s['parameters_mb']:.0f} |")
        lines += ["", "HF peak / our peak: " + ", ".join(
            f"{m_['config']} {m_['hf_over_ours_peak']:.2f}" for m_ in results["memory"]), ""]
    g = results.get("gate")
    if g:
        if "pending" in g:
            lines += ["## The gate's cost", "", f"Pending: {g['pending']}", ""]
        else:
            lines += [
                f"## The gate's cost on {g['preset']}", "",
                f"`da.audit` passed={g['passed']} in {g['seconds']:.1f} s; {g['decoder_passes']} "
                f"Decoder passes, "
                f"{g['tokens']:,} tokens; largest pass B={g['largest_pass']['batch']} "
                f"T={g['largest_pass']['seq_len']}.", "",
                "| measure | forward-equivalents |", "|---|---|",
                f"| tokens / tokens of the largest pass | {g['forward_equivalents_tokens']:.1f} |",
                f"| tokens / one max-length sequence (B=1, T={g['max_seq_len']}) | "
                f"{g['forward_equivalents_max_len']:.1f} |",
                f"| audit time / fp32 forward at the largest shape "
                f"({g['forward_seconds_largest_fp32'] * 1e3:.0f} ms) | "
                f"{g['forward_equivalents_time_fp32']:.1f} |",
                f"| audit time / fp64 forward at the largest shape "
                f"({g['forward_seconds_largest_fp64'] * 1e3:.0f} ms; the gate's working dtype) | "
                f"{g['forward_equivalents_time_fp64']:.1f} |",
                f"| the gate's own cost line (tokens / max_seq_len) | "
                f"{g['gate_report_cost']['forward_equivalents']} |", "",
                f"The oracle (float64, per-head loops) processed {g['oracle_tokens']} tokens on top.",
                "", "| gate step | seconds |", "|---|---|"]
            lines += [f"| {name} | {sec:.1f} |" for name, sec in g["seconds_by_step"].items()]
            lines += ["", "Decoder passes by shape: " + ", ".join(
                f"{k} x{v}" for k, v in g["passes_by_shape"].items()), ""]
    a = results.get("account")
    if a:
        lines += ["## Accounting", "", f"`{a['command']}`: {a['seconds']:.1f} s wall, peak RSS "
                  f"{a['peak_rss_mb']:.0f} MiB (fresh process, imports included).", ""]
    lines.append(f"Total benchmark wall time: {results['wall_seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def profiles_markdown(results: dict[str, Any]) -> str:
    lines = ["# Profiles: top ops by self CPU time (three steps after the timed repeats)", "",
             f"torch {results['machine']['torch']}, {results['machine']['threads_used']} threads.", ""]
    for r in results["rows"]:
        for side, profile in r.get("profile", {}).items():
            lines += [f"## {r['label']}: {side}", "", "```", profile["table"].rstrip(), "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch.set_num_threads for both sides (default: os.cpu_count())")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per side (default 6; "
                   "--quick 4)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps per side "
                   "(default 1)")
    p.add_argument("--quick", action="store_true", help="a short run: 4 repeats, a 1024^3 "
                   "ceiling, no gpt2-small B=4 T=256 row, no gate")
    p.add_argument("--smoke", action="store_true", help="tiny configs, 1 repeat: checks that the "
                   "code runs end to end (the test suite uses it); the numbers mean nothing")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-gate", action="store_true")
    p.add_argument("--skip-account", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    p.add_argument("--memory-child", nargs=6, metavar=("SIDE", "CFG", "B", "T", "THREADS", "STEPS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads={args.threads} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.memory_child:
        side, cfg_json, b, t, threads, steps = args.memory_child
        print(json.dumps(memory_child(side, cfg_json, int(b), int(t), int(threads), int(steps))))
        return {}
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    smoke = args.smoke
    # An even count balances the order: half the repeats run ours first, half HF first.
    repeats = args.repeats or (1 if smoke else 4 if args.quick else 6)
    warmup = args.warmup if args.warmup is not None else (0 if smoke else 1)
    if repeats < 1:
        raise SystemExit(f"--repeats={repeats} must be at least 1")
    rows = smoke_rows() if smoke else full_rows()
    if args.quick:
        rows = [r for r in rows if not (r.config_name == "gpt2-small" and r.batch == 4)]
    command = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results: dict[str, Any] = {"command": command.strip(), "repeats": repeats, "warmup": warmup,
                               "machine": machine_info(args.threads)}

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", flush=True)

    size = 64 if smoke else 1024 if args.quick else 2048
    shapes = [(size, size, size)] + ([] if smoke else [(256, 768, 3072), (1024, 512, 1376)])
    results["ceiling"] = matmul_ceiling(shapes, 3 if smoke else 7)
    ceiling = results["ceiling"]["ceiling_gflops"]
    say(f"ceiling {ceiling:.1f} GFLOP/s")

    results["rows"] = []
    for row in rows:
        profile = not args.no_profile and (
            smoke or (row.config_name, row.batch, row.seq_len, row.backward) in PROFILED)
        r = measure_row(row, warmup, repeats, ceiling, profile)
        results["rows"].append(r)
        say(f"{row.label}: ours {r['ours']['seconds']['median'] * 1e3:.0f} ms, HF "
            f"{r['hf']['seconds']['median'] * 1e3:.0f} ms, HF/ours {r['hf_over_ours']:.2f}")

    results["memory"] = []
    if not args.skip_memory:
        # One forward + backward shape per architecture; the smoke run checks one only.
        seen: dict[str, Row] = {}
        for row in rows:
            if row.backward and row.config_name not in seen:
                seen[row.config_name] = row
        for row in list(seen.values())[:1 if smoke else None]:
            mem = measure_memory(row.config_name, row.cfg, row.batch, row.seq_len, args.threads,
                                 steps=1 if smoke else 2)
            results["memory"].append(mem)
            say(f"memory {row.config_name}: ours {mem['ours']['peak_rss_mb']:.0f} MiB, "
                f"HF {mem['hf']['peak_rss_mb']:.0f} MiB")

    if not args.skip_gate and not args.quick:
        results["gate"] = gate_cost("tiny-368" if smoke else "gpt2-small", args.threads,
                                    1 if smoke else 3)
        say(f"gate: {results['gate']['seconds']:.1f} s, "
            f"{results['gate']['forward_equivalents_tokens']:.1f} forward-equivalents (tokens)")
    if not args.skip_account:
        results["account"] = account_cost("tiny-368" if smoke else "gpt2-xl")
        say(f"account: {results['account']['seconds']:.1f} s, "
            f"{results['account']['peak_rss_mb']:.0f} MiB")

    results["wall_seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmark.json").write_text(json.dumps(results, indent=2) + "\n")
    report = markdown(results)
    (args.out / "benchmark.md").write_text(report)
    (args.out / "profiles.md").write_text(profiles_markdown(results))
    print(report)
    return results


if __name__ == "__main__":
    main()
