"""Peak memory of `decoder-audit verify` per process: unsharded, and each rank of `--shard`.

    python -m benchmarks.shard_memory --preset gpt2-medium --nproc 2
    python -m benchmarks.shard_memory --preset gpt2-small --dtype bfloat16 --nproc 2
    python -m benchmarks.shard_memory --config deep.json --nproc 2   # weights-dominated

Each audit runs in fresh processes (one, then `torchrun --nproc_per_node N`, gloo on the CPU, one
thread per process in both so the two compute alike). Every process reads its own peak
(`VmHWM`, /proc/self/status: see benchmarks/memory.py on why not ru_maxrss) and its resident
memory after the imports, before the model is built (the baseline), and writes them with its
verdict. Reported per process: peak - baseline, against the weights, 1/N of them, and the
largest weight group FSDP2 gathers at once (one block, or the root: embeddings, final norm and
readout), with the verdicts of both audits (they must agree).

Writes shard_memory.json into out/benchmarks/ (gitignored) or --out DIR (benchmarks/results/
holds the tracked figure) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if __package__ in (None, "") and _ROOT not in sys.path:  # run as a file
    sys.path.insert(0, _ROOT)

from benchmarks.memory import status_mb  # noqa: E402
from benchmarks.store import DEFAULT_OUT, write_json  # noqa: E402

GB = 1e9


def child(out_dir: str, argv: list[str]) -> int:
    """One process: the verify command in-process, then its figures in out_dir/rank<R>.json."""
    from decoder_audit.cli import main

    baseline = status_mb("VmRSS")
    code = main(["verify", *argv, "--json"])
    rank = int(os.environ.get("RANK", "0"))
    figures = {"rank": rank, "exit": code, "baseline_mb": baseline, "peak_mb": status_mb("VmHWM")}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(figures))
    return code


def _launch(out_dir: Path, argv: list[str], nproc: int) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    me = [sys.executable, "-m", "benchmarks.shard_memory", "--child", str(out_dir), "--"]
    if nproc > 1:
        me = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
              "--master_addr", "127.0.0.1", "--master_port", str(29500 + os.getpid() % 1000),
              "-m", "benchmarks.shard_memory", "--child", str(out_dir), "--"]
    proc = subprocess.run([*me, *argv], cwd=_ROOT, env=env, capture_output=True, text=True)
    ranks = sorted(out_dir.glob("rank*.json"))
    if not ranks:
        raise SystemExit(f"no figures came back (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return [json.loads(p.read_text()) for p in ranks]


def weight_figures(cfg, dtype: str, nproc: int) -> dict:
    """Weights, 1/N of them, and the largest group FSDP2 gathers at once, in bytes."""
    import torch

    import decoder_audit as da

    model = da.Decoder(cfg, device="meta", dtype=getattr(torch, dtype))
    size = model.token_embeddings.weight.element_size()

    def group_bytes(module, skip=()) -> int:
        seen = {id(p) for m in skip for p in m.parameters()}
        return size * sum(p.numel() for p in module.parameters() if id(p) not in seen)

    weights = group_bytes(model)
    return {"weights": weights, "per_rank": weights / nproc,
            "largest_gathered": max(group_bytes(model.layers[0]),
                                    group_bytes(model, skip=list(model.layers)))}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--config", help="a DecoderConfig JSON (instead of --preset)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="results folder (default out/benchmarks, which git ignores; "
                             "benchmarks/results is the tracked one)")
    args = parser.parse_args(argv)
    import decoder_audit as da

    source = ["--config", args.config] if args.config else ["--preset", args.preset]
    cfg = da.DecoderConfig.load(args.config) if args.config else da.preset(args.preset)
    verify = [*source, "--dtype", args.dtype]
    with tempfile.TemporaryDirectory() as one_dir, tempfile.TemporaryDirectory() as shard_dir:
        one = _launch(Path(one_dir), verify, 1)
        sharded = _launch(Path(shard_dir), [*verify, "--shard"], args.nproc)
    figures = {"model": " ".join(source), "config": cfg.to_dict(), "dtype": args.dtype,
               "nproc": args.nproc, **weight_figures(cfg, args.dtype, args.nproc),
               "unsharded": one, "sharded": sharded}
    write_json(args.out / "shard_memory.json", figures)
    print(f"| process | exit | peak - baseline GB | / weights ({figures['weights'] / GB:.2f} GB) |")
    print("|---|---|---|---|")
    for label, rows in (("unsharded", one), ("--shard rank", sharded)):
        for row in rows:
            held = (row["peak_mb"] - row["baseline_mb"]) * 2**20
            name = label if label == "unsharded" else f"{label} {row['rank']}"
            print(f"| {name} | {row['exit']} | {held / GB:.2f} | {held / figures['weights']:.2f} |")
    print(f"\n1/{args.nproc} of the weights: {figures['per_rank'] / GB:.2f} GB; the largest group "
          f"gathered at once: {figures['largest_gathered'] / GB:.2f} GB")
    return 0 if {r["exit"] for r in one} == {r["exit"] for r in sharded} else 1


if __name__ == "__main__":
    raise SystemExit(main())
