"""Two nodes equal one: `torchrun --nnodes 2 --nproc_per_node 1` (two node processes on this
machine's loopback, c10d rendezvous) runs `verify --shard` and `train --shard` to the same
verdicts, gate summary, loss curve and final weights as `torchrun --nnodes 1 --nproc_per_node 2`.

Both launches make a world of two gloo ranks and run the same collectives on the same rows in
the same order, so nothing may differ, not by a bit: every check's status and detail, every
metrics row's loss, evaluation loss, gradient norm and learning rate, every weight of the final
checkpoint. The CI step `.ci/distributed` runs it (a few minutes on 2 cores); it prints each
difference and exits 1 when there is one.

    PYTHONPATH=src python tests/distributed/two_nodes.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMEOUT_S = 600
# What each launch runs: the audit of two shapes (tied GPT-2-like and an untied GQA Llama), and a
# short training run of the teaching model (its gate, its loss curve, its checkpoint).
VERIFY = (("tiny-368", ["--preset", "tiny-368"]), ("llama-debug", ["--preset", "llama-debug"]))
TRAIN = ["--preset", "tiny-368", "--shard", "--steps", "12", "--batch-size", "16",
         "--warmup", "3", "--eval-every", "4", "--no-progress"]
# metrics.jsonl columns that are arithmetic (the rest, tokens/s and elapsed time, are clocks)
CURVE = ("step", "loss", "eval_loss", "grad_norm", "lr")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli() -> str:
    """The installed `decoder-audit` beside this interpreter."""
    found = Path(sys.executable).parent / "decoder-audit"
    return str(found if found.exists() else shutil.which("decoder-audit") or "decoder-audit")


def torchrun(argv: list[str], *, nnodes: int, nproc: int) -> list[subprocess.CompletedProcess]:
    """`decoder-audit ARGV` under torchrun, `nnodes` node processes of `nproc` ranks each, all
    meeting at one c10d rendezvous on 127.0.0.1; the node processes' results."""
    port, run_id = free_port(), f"two-nodes-{os.getpid()}-{time.monotonic_ns()}"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
              "--nproc_per_node", str(nproc), "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
              "--local-addr", "127.0.0.1", "--no-python", cli(), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(nnodes)]
    done = []
    for node in nodes:
        out, err = node.communicate(timeout=TIMEOUT_S)
        done.append(subprocess.CompletedProcess(launch, node.returncode, out, err))
    return done


def checks(report: Path) -> dict[str, tuple]:
    """Each check's status and detail, by name, from a report.json."""
    data = json.loads(report.read_text())
    return {c["name"]: (c["status"], c["detail"]) for c in data["checks"]} | {
        "(verdict)": (data["passed"], data["first_failure"])}


def curve(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{key: row[key] for key in CURVE if key in row} for row in rows]


def gate_lines(nodes: list[subprocess.CompletedProcess]) -> list[str]:
    """The gate's summary lines a training run printed (rank 0 alone, on whichever node)."""
    text = "".join(node.stdout for node in nodes)
    # less the clock: "gate: 19/19 checks passed (7 skipped) in 0.66 s"
    return [re.sub(r" in [\d.]+ s$", "", line.strip()) for line in text.splitlines()
            if line.startswith("gate: ")]


def differences(one: dict, other: dict, what: str) -> list[str]:
    """One line per key whose values differ between the two (a key missing from one, too)."""
    return [f"{what} {key}: one node {one.get(key)!r}, two nodes {other.get(key)!r}"
            for key in sorted(set(one) | set(other), key=str) if one.get(key) != other.get(key)]


def _weights(folder: Path) -> dict:
    """{name: tensor} of a checkpoint: its model.safetensors, or a sharded one's shards read
    back whole (load_checkpoint)."""
    from safetensors.torch import load_file

    from decoder_audit.storage.checkpoint import load_checkpoint

    if (folder / "model.safetensors").is_file():
        return load_file(folder / "model.safetensors")
    return load_checkpoint(folder).state_dict()


def weight_differences(one: Path, other: Path) -> list[str]:
    """The weights of two checkpoints compared, whichever layout each was saved in (a sharded
    run's: torch.distributed.checkpoint shards; else model.safetensors)."""
    a, b = (_weights(folder) for folder in (one, other))
    found = [f"weights: {sorted(set(a) ^ set(b))} in one checkpoint only"] if set(a) != set(b) \
        else []
    for name in sorted(set(a) & set(b)):
        if not a[name].equal(b[name]):
            worst = (a[name].double() - b[name].double()).abs().max().item()
            found.append(f"weight {name}: differs by up to {worst:.3g}")
    return found


def run(kind: dict, root: Path) -> tuple[dict, list[subprocess.CompletedProcess]]:
    """Every audit and the training run under one launch shape; what they left behind."""
    found, failed = {}, []
    for name, source in VERIFY:
        report = root / f"verify-{name}"
        nodes = torchrun(["verify", *source, "--shard", "--report", str(report)], **kind)
        failed += [n for n in nodes if n.returncode != 0]
        found[f"verify {name}"] = checks(report / "report.json")
    nodes = torchrun(["train", *TRAIN, "--out", str(root / "train")], **kind)
    failed += [n for n in nodes if n.returncode != 0]
    found["train"] = {"gate": gate_lines(nodes), "curve": curve(root / "train")}
    return found, failed


def compare(one: dict, two: dict, one_root: Path, two_root: Path) -> list[str]:
    found = []
    for name, _ in VERIFY:
        found += differences(one[f"verify {name}"], two[f"verify {name}"], f"verify {name}:")
    found += differences(dict(enumerate(one["train"]["gate"])),
                         dict(enumerate(two["train"]["gate"])), "train gate line")
    found += differences({r["step"]: r for r in one["train"]["curve"]},
                         {r["step"]: r for r in two["train"]["curve"]}, "train step")
    found += weight_differences(one_root / "train" / "checkpoint",
                                two_root / "train" / "checkpoint")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep both runs' folders here")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="two-nodes-"))
    started = time.perf_counter()
    try:
        one, one_failed = run({"nnodes": 1, "nproc": 2}, root / "one-node")
        two, two_failed = run({"nnodes": 2, "nproc": 1}, root / "two-nodes")
        for node in one_failed + two_failed:
            print(f"a launch failed (exit {node.returncode}): {' '.join(node.args[-12:])}\n"
                  f"{node.stderr[-2000:]}", file=sys.stderr)
        found = compare(one, two, root / "one-node", root / "two-nodes")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    for line in found:
        print(f"DIFFERENT: {line}")
    steps = len(one["train"]["curve"]) - 1
    print(f"two nodes vs one: {len(VERIFY)} audits ({', '.join(n for n, _ in VERIFY)}), "
          f"{steps} training steps; {len(found)} difference(s); "
          f"{time.perf_counter() - started:.0f} s")
    return 1 if found or one_failed or two_failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
