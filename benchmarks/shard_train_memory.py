"""Peak memory per rank of `train --shard` under a per-rank memory budget, against the prediction.

    python -m benchmarks.shard_train_memory                      # 8 ranks, deep-gpt2.json
    python -m benchmarks.shard_train_memory --nproc 2 --budget-mb 0   # measured only, no budget
    python -m benchmarks.shard_train_memory --config CFG.json --nproc 6 --budget-share 0.95

Each rank is a fresh process under `torchrun --nproc_per_node N` (gloo on the CPU, one thread per
process, MALLOC_ARENA_MAX=1 so that glibc's per-thread arenas do not reserve address space the
budget would count). The budget: each rank caps its own address space (RLIMIT_AS, `ulimit -v`)
at what it has mapped after its imports plus BUDGET bytes, before the model exists, so an
allocation past it fails in that rank however much memory the machine has free. By default
BUDGET is `--budget-share` (0.9) of the whole float32 weights: a whole copy of the model cannot
be allocated in any rank (the control below proves it), so a run that trains under it never held
one. Each rank trains through the Python API (`train(cfg, shard=True, out=None,
return_model=False)`: the gate, the steps, no checkpoint; `--out` runs the command line with a
run folder instead, whose checkpoints each rank writes its own shards of, see
docs/distributed.md) and writes its peak resident memory (VmHWM) and its baseline (VmRSS after the
imports) with its exit status.

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
import resource
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


def _cap_address_space(budget: int) -> None:
    """RLIMIT_AS at what this process has mapped now plus `budget` bytes (0: no cap)."""
    if budget <= 0:
        return
    mapped = int(status_mb("VmSize") * MB)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, resource.RLIM_INFINITY))


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
    _cap_address_space(budget)
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
    except (MemoryError, RuntimeError) as exc:  # the budget refused an allocation
        error, code = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", 1
    rank = int(os.environ.get("RANK", "0"))
    figures = {"rank": rank, "exit": code, "error": error, "baseline_mb": baseline,
               "peak_mb": status_mb("VmHWM"), "seconds": time.perf_counter() - started,
               "threads": torch.get_num_threads()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(figures))
    return code


def _launch(out_dir: Path, nproc: int, budget: int, what: str, config: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    me = ["-m", "benchmarks.shard_train_memory", "--child", str(out_dir), str(budget), what,
          config, str(nproc)]
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                     "--master_addr", "127.0.0.1",
                     "--master_port", str(29500 + os.getpid() % 1000)]
    proc = subprocess.run([*launcher, *me], cwd=_ROOT, env=env, capture_output=True, text=True)
    ranks = sorted(out_dir.glob("rank*.json"))
    if not ranks:
        raise SystemExit(f"no figures came back (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return [json.loads(p.read_text()) for p in ranks]


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
    print("| process | exit | peak - baseline MiB | / predicted | / whole weights | s |")
    print("|---|---|---|---|---|---|")
    for label, rows in (("--shard rank", figures["sharded"]), ("whole copy", figures["whole"])):
        for row in rows:
            held = (row["peak_mb"] - row["baseline_mb"]) * MB
            name = f"{label} {row['rank']}" if label != "whole copy" else label
            print(f"| {name} | {row['exit']} | {held / MB:,.0f} | {held / pred['per_rank']:.2f} "
                  f"| {held / pred['weights']:.2f} | {row['seconds']:.0f} |"
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
