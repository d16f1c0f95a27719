"""Peak memory per rank of `train --shard` under a per-rank memory budget, against the prediction.

    python -m benchmarks.shard_train_memory                      # 8 ranks, deep-gpt2.json
    python -m benchmarks.shard_train_memory --nproc 2 --budget-mb 0   # measured only, no budget
    python -m benchmarks.shard_train_memory --config CFG.json --nproc 6 --budget-share 0.95

Each rank is a fresh process under `torchrun --nproc_per_node N` (gloo on the CPU, one thread per
process). The budget: after its imports, before the model exists, each rank moves itself into a
memory cgroup of its own (`/sys/fs/cgroup/memory/...`, cgroup v1, or a cgroup v2 `memory.max`)
whose limit is BUDGET bytes, so the kernel charges every page the rank touches from then on and
kills the rank (SIGKILL, the cgroup's OOM killer) if it would hold more, however much memory the
machine has free. Resident memory, not address space: RLIMIT_AS (`ulimit -v`) counts the
reservations torch and glibc map and never touch, and refused the sharded ranks long before their
pages did. Writing a cgroup needs root (or a delegated cgroup); without one the benchmark stops
and says so, and `--budget-mb 0` measures without a budget. By default BUDGET is `--budget-share`
(0.9) of the whole float32 weights: a whole copy of the model cannot be held in any rank (the
control below proves it), so a run that trains under it never held one. Each rank trains through
the Python API (`train(cfg, shard=True, out=None, return_model=False)`: the gate, the steps, no
checkpoint; `--out` runs the command line with a run folder instead, whose checkpoints each rank
writes its own shards of, see docs/distributed.md) and writes its peak resident memory (VmHWM)
and its baseline (VmRSS after the imports) with its exit status; the cgroup's own peak
(`memory.max_usage_in_bytes` / `memory.peak`) and OOM kills are read back by the launcher, also
for a rank the budget killed.

The prediction per rank, over the baseline, is the larger of
  the gate      gate_peak(cfg, float32, world_size=N) less its process baseline (gate/peak.py);
  training      20 P / N bytes (weights, gradients, AdamW's two moments and the step's own
                temporaries, foreach AdamW's denominators: 1/N of each, float32; measured
                unsharded, one process: the step peaks at 4.9 copies of the weights)
                + 2 x the largest group FSDP2 gathers at once (its weights and their gradient,
                whole, until the reduce-scatter) + the activations of one rank's rows
                (accounting's estimate at B / N, T).
The control: one process builds `Decoder(cfg)` whole under the same budget (it must fail).

Writes shard_train_memory.json into out/benchmarks/ (gitignored) or --out-dir DIR, and prints a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if __package__ in (None, "") and _ROOT not in sys.path:  # run as a file
    sys.path.insert(0, _ROOT)

from benchmarks.memory import status_mb  # noqa: E402
from benchmarks.store import DEFAULT_OUT, write_json  # noqa: E402

MB = 2**20
DEFAULT_CONFIG = Path(__file__).with_name("deep-gpt2.json")
# The run each rank trains: the counting task, a few steps, two rows per rank.
STEPS = 3


# The memory hierarchies a rank's cgroup can be made in, each with its files: the limit, the
# peak charge, and the events naming OOM kills (cgroup v1's, else the v2 unified one).
CGROUP_FILES = {
    Path("/sys/fs/cgroup/memory"): ("memory.limit_in_bytes", "memory.max_usage_in_bytes",
                                    "memory.oom_control"),
    Path("/sys/fs/cgroup"): ("memory.max", "memory.peak", "memory.events"),
}


def _cgroup_root() -> Path:
    """Where a rank's memory cgroup is made: a writable memory hierarchy, or a clear error."""
    v1, v2 = CGROUP_FILES
    if (v1 / CGROUP_FILES[v1][0]).exists():
        root = v1
    elif (v2 / "cgroup.controllers").exists() and \
            "memory" in (v2 / "cgroup.controllers").read_text().split():
        root = v2
    else:
        raise SystemExit(f"no memory cgroup to cap a rank's memory ({v1} nor {v2} with the "
                         "memory controller); --budget-mb 0 measures without a budget")
    if not os.access(root, os.W_OK):
        raise SystemExit(f"{root} is not writable (a memory budget needs root or a delegated "
                         "cgroup); --budget-mb 0 measures without a budget")
    return root


def _cap_memory(budget: int, group: Path) -> None:
    """Move this process into `group` (made here) and limit what it holds from now on to
    `budget` bytes. The pages already touched (the imports) stay charged to the cgroup it came
    from, so the limit is all the model, the gate and training may hold."""
    group.mkdir()
    (group / "cgroup.procs").write_text(str(os.getpid()))
    (group / CGROUP_FILES[group.parent][0]).write_text(str(budget))


def _cgroup_figures(group: Path) -> dict:
    """The kernel's peak charge and OOM kills in `group`, then the (empty) group removed."""
    if not group.exists():
        return {}
    _, peak, events = (group / name for name in CGROUP_FILES[group.parent])
    words = events.read_text().split()
    figures = {"cgroup_peak_mb": int(peak.read_text()) / MB if peak.exists() else None,
               "oom_kills": int(words[words.index("oom_kill") + 1]) if "oom_kill" in words else 0}
    group.rmdir()
    return figures


def child(out_dir: str, budget: int, what: str, config: str, nproc: int) -> int:
    """One process: `what` ("train", "cli:RUN_DIR" or "whole") under the budget, then its
    figures in out_dir/rank<R>.json (also when the work failed)."""
    import torch
    import torch.distributed.checkpoint.state_dict  # noqa: F401 - the modules a sharded run
    import torch.distributed.fsdp  # noqa: F401 - imports, mapped before the baseline and the cap
    import torch.distributed.tensor  # noqa: F401

    import decoder_audit as da
    from decoder_audit.training import train

    cfg = da.DecoderConfig.load(config)
    baseline = status_mb("VmRSS")
    rank = int(os.environ.get("RANK", "0"))
    if budget > 0:
        _cap_memory(budget, Path(os.environ["DA_MEMORY_CGROUP"] + f"-rank{rank}"))
    started, error, code = time.perf_counter(), None, 0
    try:
        if what == "whole":
            da.Decoder(cfg)  # the whole float32 copy, as train built it before
        elif what.startswith("cli:"):
            from decoder_audit.cli import main

            code = main(["train", "--config", config, "--shard", "--steps", str(STEPS),
                         "--batch-size", str(2 * nproc), "--warmup", "1", "--no-progress",
                         "--out", what[4:]])
        else:
            train(cfg, shard=True, out=None, return_model=False, steps=STEPS,
                  batch_size=2 * nproc, warmup=1, progress=False, verbose=False)
    except (MemoryError, RuntimeError) as exc:  # the machine refused an allocation, or the
        # run failed (the budget itself kills the process: _launch reads that from its cgroup)
        error, code = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", 1
    figures = {"rank": rank, "exit": code, "error": error, "baseline_mb": baseline,
               "peak_mb": status_mb("VmHWM"), "seconds": time.perf_counter() - started,
               "threads": torch.get_num_threads()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(figures))
    return code


def _launch(out_dir: Path, nproc: int, budget: int, what: str, config: str) -> list[dict]:
    """Run `what` in nproc ranks under the budget; each rank's figures, a rank the budget killed
    (no figures of its own) with its cgroup's."""
    group = (_cgroup_root() / f"decoder-audit-{os.getpid()}-{out_dir.name}") if budget > 0 else None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DA_MEMORY_CGROUP": str(group)}
    me = ["-m", "benchmarks.shard_train_memory", "--child", str(out_dir), str(budget), what,
          config, str(nproc)]
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                     "--master_addr", "127.0.0.1",
                     "--master_port", str(29500 + os.getpid() % 1000)]
    proc = subprocess.run([*launcher, *me], cwd=_ROOT, env=env, capture_output=True, text=True)
    ranks = []
    for rank in range(nproc):
        written = out_dir / f"rank{rank}.json"
        row = json.loads(written.read_text()) if written.exists() else {
            "rank": rank, "exit": proc.returncode or -9, "baseline_mb": None, "peak_mb": None,
            "seconds": None, "error": f"no figures: the process was killed (launcher exit "
                                      f"{proc.returncode})"}
        if group is not None:
            row.update(_cgroup_figures(Path(f"{group}-rank{rank}")))
            if row.get("oom_kills"):
                row["error"] = (f"killed by the memory budget ({budget / MB:,.0f} MiB) after "
                                f"{row['cgroup_peak_mb']:,.0f} MiB")
        ranks.append(row)
    if all(row["peak_mb"] is None and not row.get("oom_kills") for row in ranks):
        raise SystemExit(f"no figures came back (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return ranks


def predicted(cfg, nproc: int) -> dict:
    """The prediction per rank over its baseline (bytes): the gate's, training's, the larger."""
    import torch

    import decoder_audit as da
    from decoder_audit.accounting.memory import weight_bytes
    from decoder_audit.gate import gate_peak

    from benchmarks.shard_memory import weight_figures

    peak = gate_peak(cfg, torch.float32, world_size=nproc)
    gate = peak.total - sum(r.bytes for r in peak.rows if r.name.startswith("process baseline"))
    weights = weight_bytes(cfg)
    gathered = weight_figures(cfg, "float32", nproc)["largest_gathered"]
    rows_per_rank = 2  # batch_size 2 x nproc
    acts = da.account(cfg, batch_size=rows_per_rank, seq_len=4, measure=False)  # counting: T=4
    # weights, gradients, AdamW's two moments and the step's temporaries (foreach AdamW's
    # denominators, one more copy): 1/N each
    training = 5 * weights / nproc + 2 * gathered + acts.memory.activations_total
    return {"weights": weights, "gate": gate, "gate_check": peak.check, "training": training,
            "gathered": gathered, "per_rank": max(gate, training)}


def _table(figures: dict) -> None:
    pred = figures["prediction"]
    print(f"whole float32 weights {pred['weights'] / MB:,.0f} MiB; budget per rank "
          f"{figures['budget'] / MB:,.0f} MiB over its baseline; predicted per rank "
          f"{pred['per_rank'] / MB:,.0f} MiB (gate {pred['gate'] / MB:,.0f} in its "
          f"{pred['gate_check']} check, training {pred['training'] / MB:,.0f})\n")
    print("| process | exit | peak - baseline MiB | / predicted | / whole weights "
          "| cgroup peak MiB | / predicted | s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, rows in (("--shard rank", figures["sharded"]), ("whole copy", figures["whole"])):
        for row in rows:
            name = f"{label} {row['rank']}" if label != "whole copy" else label
            charged = row.get("cgroup_peak_mb")
            cgroup = "- | -" if charged is None else \
                f"{charged:,.0f} | {charged * MB / pred['per_rank']:.2f}"
            if row["peak_mb"] is None:  # killed before it could write its figures
                print(f"| {name} | {row['exit']} | - | - | - | {cgroup} | - | {row['error']}")
                continue
            held = (row["peak_mb"] - row["baseline_mb"]) * MB
            print(f"| {name} | {row['exit']} | {held / MB:,.0f} | {held / pred['per_rank']:.2f} "
                  f"| {held / pred['weights']:.2f} | {cgroup} | {row['seconds']:.0f} |"
                  + (f" {row['error']}" if row["error"] else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], int(argv[2]), argv[3], argv[4], int(argv[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="a DecoderConfig JSON")
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--budget-share", type=float, default=0.9,
                        help="the budget per rank as a share of the whole float32 weights")
    parser.add_argument("--budget-mb", type=float, help="the budget per rank in MiB (0: none)")
    parser.add_argument("--out", action="store_true",
                        help="run the command line with a run folder (its final checkpoint)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT,
                        help="results folder (default out/benchmarks, which git ignores)")
    args = parser.parse_args(argv)
    import decoder_audit as da

    config = str(Path(args.config).resolve())
    cfg = da.DecoderConfig.load(config)
    prediction = predicted(cfg, args.nproc)
    budget = int(args.budget_mb * MB if args.budget_mb is not None
                 else args.budget_share * prediction["weights"])
    with tempfile.TemporaryDirectory() as shard_dir, tempfile.TemporaryDirectory() as one_dir:
        what = f"cli:{Path(shard_dir, 'run')}" if args.out else "train"
        ranks_dir = Path(shard_dir, "ranks")
        ranks_dir.mkdir()
        sharded = _launch(ranks_dir, args.nproc, budget, what, config)
        whole = _launch(Path(one_dir), 1, budget, "whole", config)
    figures = {"config": cfg.to_dict(), "nproc": args.nproc, "budget": budget,
               "prediction": prediction, "sharded": sharded, "whole": whole,
               "command": "python -m benchmarks.shard_train_memory " + " ".join(argv)}
    write_json(args.out_dir / "shard_train_memory.json", figures)
    _table(figures)
    trained = all(row["exit"] == 0 for row in sharded)
    refused = budget <= 0 or all(row["exit"] != 0 for row in whole)
    return 0 if trained and refused else 1


if __name__ == "__main__":
    raise SystemExit(main())
