"""Side-by-side CPU benchmark: our `Decoder` against Hugging Face transformers, same weights.

    python benchmarks/run.py              # the full run (tens of minutes on 2 cores)
    python benchmarks/run.py --quick      # short rows, and no row starts after 300 s
    python benchmarks/run.py --budget 600 --out benchmarks/results   # update the tracked files

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
Results go to `<out>/benchmark.json`, `<out>/benchmark.md` and `<out>/profiles.md`, written
again after every row (a run stopped half way keeps what it finished); `<out>` is
out/benchmarks/ unless --out says otherwise (git ignores out/; the tracked figures are in
benchmarks/results/). Rows already in `<out>` are kept: a row this run measured replaces the one
of the same label, the others stay, each with the run that measured it (benchmarks/store.py).
`--budget SECONDS` (300 with --quick) stops starting rows once that much time has passed; the
rows it did not start are listed in both files and said as they are passed over.

Conventions. FLOPs are `da.account(cfg, B, T).forward_flops` (every forward matmul, a multiply-add
is 2 FLOPs, the attention products counted over the full T x T square); forward + backward is
counted as 3 x forward. Both sides run in eval mode (no dropout: HF GPT-2 would otherwise drop
10%), HF with its default fused attention ("sdpa", the strongest HF baseline on CPU) and
`use_cache=False` (no KV cache is built for a full-sequence pass). The backward loss is the same
cross-entropy against fixed random targets, computed outside both models; gradients are set to
None before every step.

This file is the entry point only: it parses the command line into a `Plan`, measures the
machine, then walks FAMILIES (rows, memory, gate, account), each measured by its own module in
this folder, and hands the results to `report.write`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_ROOT = str(Path(__file__).resolve().parents[1])
# Run as a file (`python benchmarks/run.py`): put the repository root on the path so that the
# `benchmarks` package, which holds the modules this entry point walks, can be imported.
if __package__ in (None, "") and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402

from benchmarks import (  # noqa: E402
    account_cost,
    gate_cost,
    gate_scale,
    generation,
    machine,
    memory,
    report,
    rows,
    store,
    training_step,
)
from benchmarks.common import Plan  # noqa: E402

QUICK_BUDGET = 300.0  # seconds: --quick starts no row after this, unless --budget says otherwise


@dataclass(frozen=True)
class Family:
    """One kind of result: `measure(plan)` goes into results[key] (JSON-ready) and
    `section(results[key])` renders it in benchmark.md.

    To add a family (generation rows, a gate-cost table, ...): a module with `measure(plan)`, a
    section in report.py, and one line in FAMILIES; a `--skip-<key>` flag in parse_args, if
    wanted, is honoured by that name. The order of FAMILIES is the order of the keys in
    benchmark.json and of the sections in benchmark.md."""

    key: str
    measure: Callable[[Plan], Any]
    section: report.Section
    runs: Callable[[Plan], bool] = lambda plan: True  # whether this run wants it, besides --skip
    skipped: Any = None  # stored under key when the family does not run (None: key left out)
    single: bool = False  # one figure, not rows walked through plan.within_budget
    # A family whose result holds its rows under "rows" (gate_scale): what results[key] is
    # before its first row, so that each row is written inside it as it finishes.
    start: Callable[[Plan], dict[str, Any]] | None = None


FAMILIES = (
    Family("rows", rows.measure_rows, report.rows_section),
    Family("memory", memory.measure_memory_rows, report.memory_section, skipped=[]),
    Family("gate", gate_cost.measure, report.gate_section, runs=lambda plan: not plan.quick,
           single=True),
    Family("account", account_cost.measure, report.account_section, single=True),
    Family("generation", generation.measure, generation.section, skipped=[]),
    Family("training_step", training_step.measure, training_step.section, skipped=[]),
    # Opt-in (--gate-scale): the gate on tiny-368 and GPT-2 small to XL, a fresh process each.
    Family("gate_scale", gate_scale.measure, gate_scale.section,
           start=lambda plan: gate_scale.record("float32", plan.threads) | {"rows": []}),
)


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
                   "ceiling, no gpt2-small B=4 T=256 row and the others at half B and half T "
                   "(not profiled), memory of one config, "
                   f"{generation.QUICK_NEW_TOKENS}-token generation rows at one prompt length, "
                   f"training steps at B, T = {training_step.QUICK_SHAPE} without torch.compile, "
                   f"no gate; and a budget of {QUICK_BUDGET:g} s")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no row after this many seconds since the run began (a row under "
                        f"way finishes; those not started are listed); default none, "
                        f"{QUICK_BUDGET:g} with --quick")
    p.add_argument("--smoke", action="store_true", help="tiny configs, 1 repeat: checks that the "
                   "code runs end to end (the test suite uses it); the numbers mean nothing")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-gate", action="store_true")
    p.add_argument("--skip-account", action="store_true")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--skip-training-step", dest="skip_training_step", action="store_true")
    p.add_argument("--gate-scale", dest="skip_gate_scale", action="store_false",
                   help="also run the gate-at-scale table (benchmarks/gate_scale.py: GPT-2 "
                        "small to XL, each preset in its own process; tens of minutes)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--out", type=Path, default=store.DEFAULT_OUT,
                   help="results folder (default out/benchmarks, which git ignores; "
                        "benchmarks/results is the tracked one); rows already there are kept")
    p.add_argument("--memory-child", nargs=6, metavar=("SIDE", "CFG", "B", "T", "THREADS", "STEPS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads={args.threads} must be at least 1")
    if args.budget is not None and not args.budget >= 0:
        p.error(f"--budget={args.budget} must be a number of seconds >= 0")
    if args.budget is None and args.quick:
        args.budget = QUICK_BUDGET
    return args


def repeats_and_warmup(args: argparse.Namespace) -> tuple[int, int]:
    """Timed repeats and warm-up steps per side (defaults depend on --smoke and --quick)."""
    # An even count balances the order: half the repeats run ours first, half HF first.
    repeats = args.repeats or (1 if args.smoke else 4 if args.quick else 6)
    warmup = args.warmup if args.warmup is not None else (0 if args.smoke else 1)
    if repeats < 1:
        raise SystemExit(f"--repeats={repeats} must be at least 1")
    return repeats, warmup


def run_families(plan: Plan, results: dict[str, Any], flush: Callable[[], None]) -> None:
    """Measure each family in table order into results[key] (or its `skipped` value), while the
    budget lasts (a family of rows walks them through plan.within_budget, which names each one
    it does not start); the rows of a family are written as they finish (plan.on_row), and each
    family's result when it ends."""
    for family in FAMILIES:
        if family.key in plan.skip or not family.runs(plan):
            if family.skipped is not None:
                results[family.key] = copy.deepcopy(family.skipped)
            continue
        if family.single and plan.over_budget():
            plan.skip_row(family.key, "its one figure")
            continue
        if family.start is not None:
            results[family.key] = family.start(plan)
        measured = family.measure(plan)
        if isinstance(measured, dict):
            measured["run"] = results["run"]
        results[family.key] = measured
        flush()


class Results:
    """The run's results as written: this run's figures merged with the rows already in
    `out` (store.merge_rows, each family by its rows' labels; a one-figure family this run did
    not measure keeps its earlier figure), rewritten whole after every row."""

    def __init__(self, out: Path, results: dict[str, Any]) -> None:
        self.out, self.results = out, results
        self.before = store.previous(out / "benchmark.json") or {}

    def on_row(self, key: str, row: dict[str, Any]) -> None:
        row["run"] = self.results["run"]
        rows = self.results.setdefault(key, [])
        rows = rows["rows"] if isinstance(rows, dict) else rows  # a family's start(): its rows
        if not any(row is mine for mine in rows):  # a row completed later is written again
            rows.append(row)
        self.flush()

    def merged(self) -> dict[str, Any]:
        merged = {**self.before, **self.results}
        for family in FAMILIES:
            old, new = self.before.get(family.key), self.results.get(family.key)
            if isinstance(old, list) or isinstance(new, list):
                merged[family.key] = store.merge_rows(old or [], new or [])
            elif isinstance(old, dict) and isinstance(new, dict) and "rows" in new:
                merged[family.key] = {**old, **new, "rows": store.merge_rows(
                    old.get("rows", []), new["rows"])}
            elif not new and old:
                merged[family.key] = old
        used = {self.results["run"]} | {
            row.get("run") for family in FAMILIES for row in _rows_of(merged.get(family.key))}
        runs = {**self.before.get("runs", {}),
                self.results["run"]: {"command": self.results["command"]}}
        merged["runs"] = {stamp: about for stamp, about in runs.items() if stamp in used}
        return merged

    def flush(self) -> dict[str, Any]:
        self.results["wall_seconds"] = time.perf_counter() - self.results["_started"]
        merged = {k: v for k, v in self.merged().items() if not k.startswith("_")}
        report.write(self.out, merged, [(f.key, f.section) for f in FAMILIES])
        return merged


def _rows_of(value: Any) -> list[dict[str, Any]]:
    """The rows of a family's result: a list of rows, a result holding "rows", or one figure."""
    if isinstance(value, dict):
        return value["rows"] if "rows" in value else [value]
    return value if isinstance(value, list) else []


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.memory_child:
        side, cfg_json, b, t, threads, steps = args.memory_child
        print(json.dumps(memory.memory_child(side, cfg_json, int(b), int(t), int(threads),
                                             int(steps))))
        return {}
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    repeats, warmup = repeats_and_warmup(args)
    command = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results: dict[str, Any] = {"command": command.strip(), "run": store.run_stamp(),
                               "repeats": repeats, "warmup": warmup, "budget": args.budget,
                               "finished": False, "skipped": [], "_started": started,
                               "machine": machine.machine_info(args.threads)}
    written = Results(args.out, results)  # an unreadable benchmark.json is refused here
    results["ceiling"] = machine.ceiling(args.smoke, args.quick)
    plan = Plan(smoke=args.smoke, quick=args.quick, threads=args.threads, repeats=repeats,
                warmup=warmup, profile=not args.no_profile,
                skip=frozenset(f.key for f in FAMILIES if getattr(args, f"skip_{f.key}", False)),
                ceiling=results["ceiling"]["ceiling_gflops"], started=started,
                budget=args.budget, on_row=written.on_row, skipped=results["skipped"])
    plan.say(f"ceiling {plan.ceiling:.1f} GFLOP/s" + (f"; budget {plan.budget:g} s"
                                                      if plan.budget is not None else ""))
    written.flush()  # the machine and the ceiling, before the first row
    run_families(plan, results, written.flush)
    results["finished"] = True
    merged = written.flush()
    print(report.markdown(merged, [(f.key, f.section) for f in FAMILIES]))
    return merged


if __name__ == "__main__":
    main()
