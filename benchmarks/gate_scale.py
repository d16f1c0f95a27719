"""The gate at scale: `da.audit` on tiny-368 and GPT-2 small, medium, large and XL, each preset in
a fresh process, one at a time. Per preset: the gate's seconds; forward-equivalents (the gate's
time over one forward of the same model at its longest probe, B=1 and T=max_seq_len, timed in
the same process after the gate, the best of two); the process's peak resident set (VmHWM,
which counts the model, the interpreter and the gate); bytes per parameter; the gate's own
extra memory over the resident set it started from, as a multiple of the weights; and the
seconds of each check. A plot of peak memory against parameters goes beside the table.

    python -m benchmarks.gate_scale                          # every preset, float32
    python -m benchmarks.gate_scale --presets tiny-368 gpt2-small --dtype bfloat16
    python -m benchmarks.gate_scale --presets gpt2-small --out benchmarks/results
    python benchmarks/run.py --gate-scale ...                # as a family of the full benchmark

Writes gate_scale.json, gate_scale.md and gate_scale.png (gate_scale_<dtype>.* for another
dtype) into out/benchmarks/ (gitignored), or --out DIR (benchmarks/results/ holds the tracked
figures), after every preset: a preset measured replaces its row and the other rows stay
(benchmarks/store.py). `--budget SECONDS` starts no preset after that many seconds.
The child builds the model as `decoder-audit verify --preset NAME [--dtype D]` does (seeded
float32 weights, cast in place) and runs the same `audit()`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[1])
if __package__ in (None, "") and _ROOT not in sys.path:  # run as a file
    sys.path.insert(0, _ROOT)

from benchmarks.common import Plan  # noqa: E402
from benchmarks.store import DEFAULT_OUT, RowFile, runs_lines, skipped_lines  # noqa: E402

PRESETS = ("tiny-368", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")
# Targets of issue 13 on the 2-core, 24 GiB machine.
TARGETS = {"gpt2-xl_peak_gb": 16.0, "gpt2-xl_seconds": 600.0, "gpt2-small_peak_gb": 1.5,
           "forward_equivalents": 10.0}
# Measured with the gate before issue 13 (a float64 working copy plus copies for the tied
# gradient and the stressed attention run), `/usr/bin/time -v decoder-audit verify --preset P`.
BEFORE = {
    "tiny-368": {"peak_gb": 0.326, "source": "measured on this machine (2 cores, loaded)"},
    "gpt2-small": {"peak_gb": 4.60, "seconds": 20.0, "source": "issue 13; 4.60 GB measured again"},
    "gpt2-medium": {"peak_gb": 11.1, "seconds": 55.0, "source": "issue 13"},
    "gpt2-large": {"peak_gb": None, "source": "not run: about 26 GB at 31 bytes per parameter"},
    "gpt2-xl": {"peak_gb": None, "source": "not run: about 50 GB (issue 13)"},
}


def _status_bytes(field: str) -> int:
    """A /proc/self/status memory field (VmRSS now, VmHWM the peak) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(preset: str, dtype_name: str, threads: int) -> dict[str, Any]:
    """In a fresh process: build, audit, time one forward at the longest probe."""
    import torch

    import decoder_audit as da
    from decoder_audit.sources import Source

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    started = time.perf_counter()
    model = Source("preset", preset).build(seed=0)
    model.to(dtype=dtype)  # in place, as verify --dtype does
    build_s = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rss_before = _status_bytes("VmRSS")
    started = time.perf_counter()
    report = da.audit(model)
    gate_s = time.perf_counter() - started
    gate_peak = _status_bytes("VmHWM")
    ids = torch.randint(0, model.config.vocab_size, (1, model.config.max_seq_len),
                        generator=torch.Generator().manual_seed(0))
    model.eval()
    times = []
    with torch.no_grad():
        for _ in range(2):
            t = time.perf_counter()
            model(ids)
            times.append(time.perf_counter() - t)
    forward_s = min(times)
    return {
        "preset": preset, "dtype": dtype_name, "threads": threads, "passed": report.passed,
        "failures": [c.name for c in report.failures], "params": params,
        "weights_bytes": weights, "build_seconds": build_s, "gate_seconds": gate_s,
        "forward_seconds": forward_s, "forward_shape": [1, model.config.max_seq_len],
        "forward_equivalents": gate_s / forward_s,
        "token_forward_equivalents": report.forward_equivalents,
        "peak_rss_bytes": _status_bytes("VmHWM"), "gate_peak_rss_bytes": gate_peak,
        "rss_before_gate_bytes": rss_before,
        "gate_extra_over_weights": (gate_peak - rss_before) / weights,
        "bytes_per_param": _status_bytes("VmHWM") / params,
        "checks": {c.name: round(c.seconds, 2) for c in report.checks if not c.skipped},
        "load_average": os.getloadavg(),
    }


def run_child(preset: str, dtype: str, threads: int, timeout: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.gate_scale", "--child", preset, dtype,
               str(threads)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {"preset": preset, "dtype": dtype, "error": done.stderr[-2000:],
                "wall_seconds": time.perf_counter() - started}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["wall_seconds"] = time.perf_counter() - started  # the whole process, imports included
    return row


def measure(plan: Plan, presets=PRESETS, dtype: str = "float32", threads: int | None = None,
            timeout: float = 3600.0) -> dict[str, Any]:
    """One fresh process per preset, one after another (never two big ones at once), while the
    plan's budget lasts; each row handed to plan.done as it finishes. `plan`: the full
    benchmark's (run.py --gate-scale) or this module's own command line's."""
    threads = threads or plan.threads
    rows = []
    for preset in plan.within_budget("gate_scale", presets, label=str):
        plan.say(f"gate_scale: {preset} ({dtype}, {threads} threads) ...")
        row = run_child(preset, dtype, threads, timeout)
        rows.append(row)
        plan.done("gate_scale", row)
        if "error" in row:
            plan.say(f"gate_scale: {preset} failed: {row['error'][-300:]}")
        else:
            slow = sorted(row["checks"].items(), key=lambda kv: -kv[1])[:5]
            plan.say(f"gate_scale: {preset}: {row['gate_seconds']:.0f} s, "
                     f"{row['forward_equivalents']:.1f} forward-equivalents (forward "
                     f"{row['forward_seconds']:.1f} s), peak {row['peak_rss_bytes'] / 1e9:.2f} "
                     f"GB, passed={row['passed']}; " + ", ".join(f"{k} {v:.0f} s"
                                                                 for k, v in slow))
    return record(dtype, threads) | {"rows": rows}


def record(dtype: str, threads: int) -> dict[str, Any]:
    """A results file's fields besides its rows."""
    return {"dtype": dtype, "threads": threads, "targets": TARGETS, "before": BEFORE}


def section(result: dict[str, Any]) -> list[str]:
    """The table, in Markdown."""
    if not result or not result.get("rows"):
        return []
    lines = [f"## The gate at scale ({result['dtype']}, {result['threads']} threads)", "",
             "| preset | parameters | passed | gate s | forward s (T=max) | forward-equivalents "
             "| peak RSS GB | bytes/param | gate extra / weights | before: peak GB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        before = result["before"].get(row["preset"], {}).get("peak_gb")
        before_text = "-" if before is None else f"{before:.2f}"
        if "error" in row:
            lines.append(f"| {row['preset']} | - | error | - | - | - | - | - | - | {before_text} |")
            continue
        lines.append(
            f"| {row['preset']} | {_count(row['params'])} | {row['passed']} | "
            f"{row['gate_seconds']:.0f} | {row['forward_seconds']:.1f} | "
            f"{row['forward_equivalents']:.1f} | {row['peak_rss_bytes'] / 1e9:.2f} | "
            f"{row['bytes_per_param']:.1f} | {row['gate_extra_over_weights']:.2f} | "
            f"{before_text} |")
    lines += ["", *runs_lines(result.get("runs", {}), result["rows"]),
              "Peak RSS is the whole process (interpreter, torch, the model, the gate); "
              "'gate extra / weights' is the gate's peak above the resident set it started "
              "from, as a multiple of the weights. Seconds per check:", ""]
    for row in result["rows"]:
        if "checks" in row:
            slow = sorted(row["checks"].items(), key=lambda kv: -kv[1])[:6]
            lines.append(f"- {row['preset']}: " + ", ".join(f"{k} {v:.0f} s" for k, v in slow)
                         + f" (load average at the end {row['load_average'][0]:.1f})")
    return lines + ["", *skipped_lines(result.get("skipped", []))]


def _count(params: int) -> str:
    return f"{params:,}" if params < 100_000 else f"{params / 1e6:,.1f}M"


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Peak memory against parameters, log-log, with the weights and 2.5x the weights."""
    rows = [r for r in result["rows"] if "error" not in r]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = [r["params"] for r in rows]
    per = rows[0]["weights_bytes"] / rows[0]["params"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(params, [r["peak_rss_bytes"] / 1e9 for r in rows], "o-", label="gate: peak RSS")
    ax.plot(params, [p * per / 1e9 for p in params], "--", label="the weights")
    ax.plot(params, [2.5 * p * per / 1e9 for p in params], ":", label="2.5 x the weights")
    before = [(r["params"], result["before"][r["preset"]]["peak_gb"]) for r in rows
              if result["before"].get(r["preset"], {}).get("peak_gb")]
    if before:
        ax.plot(*zip(*before), "x", color="red", label="before issue 13")
    for r in rows:
        ax.annotate(r["preset"], (r["params"], r["peak_rss_bytes"] / 1e9),
                    textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("GB")
    ax.set_title(f"decoder-audit gate, {result['dtype']}: peak memory against parameters")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def stem(dtype: str) -> str:
    return "gate_scale" if dtype == "float32" else f"gate_scale_{dtype}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "bfloat16", "float16", "float64"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per preset")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="start no preset after this many seconds (those left are listed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="results folder (default out/benchmarks, which git ignores; "
                             "benchmarks/results is the tracked one); other presets' rows there "
                             "are kept")
    parser.add_argument("--child", nargs=3, metavar=("PRESET", "DTYPE", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        preset, dtype, threads = args.child
        print(json.dumps(child(preset, dtype, int(threads))))
        return 0
    command = "python -m benchmarks.gate_scale " + " ".join(
        argv if argv is not None else sys.argv[1:])
    path = args.out / f"{stem(args.dtype)}.json"
    results = RowFile(path, {"command": command.strip()},
                      render=lambda merged: "\n".join(section(merged)) + "\n")
    fields = record(args.dtype, args.threads)

    def written(family: str, row: dict[str, Any]) -> None:
        plot(results.add(row, fields), path.with_suffix(".png"))

    plan = Plan.standalone(args.threads, 1, budget=args.budget, on_row=written)
    result = measure(plan, presets=args.presets, dtype=args.dtype, threads=args.threads,
                     timeout=args.timeout)
    results.write({**fields, "skipped": plan.skipped})
    print("\n".join(str(p) for p in (path, path.with_suffix(".md"), path.with_suffix(".png"))
                    if p.exists()))
    return 0 if all(r.get("passed") for r in result["rows"]) and not plan.skipped else 1


if __name__ == "__main__":
    raise SystemExit(main())
