"""The machine a run measured: what it is (CPU, versions, load, code version) and its ceiling,
the dense fp32 matmul GFLOP/s that MFU is measured against (and the same in bf16, which says
whether the CPU multiplies bf16 in hardware: `lscpu` lists avx512_bf16 or amx_bf16 where it does);
and the record a family's own command line writes."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .common import SEED, stats
from .store import RowFile, runs_lines, skipped_lines


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


def matmul_ceiling(shapes: list[tuple[int, int, int]], repeats: int,
                   dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """torch.mm GFLOP/s in `dtype` for (m x n)(n x p), 2mnp FLOPs each; the first shape is the
    ceiling."""
    gen = torch.Generator().manual_seed(SEED)
    results = []
    for m, n, p in shapes:
        a = torch.randn(m, n, generator=gen).to(dtype)
        b = torch.randn(n, p, generator=gen).to(dtype)
        out = torch.empty(m, p, dtype=dtype)
        torch.mm(a, b, out=out)  # warm-up: first call pays for packing buffers and threads
        gflops = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            gflops.append(2 * m * n * p / (time.perf_counter() - start) / 1e9)
        results.append({"shape": f"({m} x {n})({n} x {p})", "gflops": stats(gflops)})
    return {"ceiling_gflops": results[0]["gflops"]["median"], "ceiling_shape": results[0]["shape"],
            "shapes": results}


def ceiling(smoke: bool, quick: bool) -> dict[str, Any]:
    """The run's ceiling: a cube of 2048 (1024 with --quick, 64 with --smoke), plus two products
    shaped like the models' (GPT-2 small's MLP, the Llama GQA shape's) listed beside it."""
    size = 64 if smoke else 1024 if quick else 2048
    shapes = [(size, size, size)] + ([] if smoke else [(256, 768, 3072), (1024, 512, 1376)])
    return matmul_ceiling(shapes, 3 if smoke else 7)


class FamilyFile:
    """What a family's own command line (`python -m benchmarks.<family> ...`) leaves at `out`
    (.json: the command, `machine` as `machine_info` gave it at the start, the fp32 and bf16
    1024^3 matmul ceilings measured then, the load average at the last write, the rows, merged
    with those already there (`store.RowFile`), the rows skipped past the budget; and the same
    name in .md: the command, one machine line, the family's section). Written after every row
    (`add`, a Plan's on_row) and at the end (`finish`)."""

    def __init__(self, out: Path, machine: dict[str, Any],
                 section: Callable[[list[dict[str, Any]]], list[str]]) -> None:
        command = f"python -m benchmarks.{Path(sys.argv[0]).stem} " + " ".join(sys.argv[1:])
        ceilings = {name: matmul_ceiling([(1024, 1024, 1024)], 5, dtype)["ceiling_gflops"]
                    for name, dtype in (("float32", torch.float32),
                                        ("bfloat16", torch.bfloat16))}
        self.record = {"command": command.strip(), "machine": machine,
                       "ceiling_1024_gflops": ceilings, "skipped": []}
        self.section = section
        self.file = RowFile(out, {"command": self.record["command"]}, render=self.markdown)

    def add(self, family: str, row: dict[str, Any]) -> None:
        self.record["load_average_at_end"] = list(os.getloadavg())
        self.file.add(row, self.record)

    def finish(self, skipped: list[dict[str, Any]]) -> dict[str, Any]:
        self.record.update(load_average_at_end=list(os.getloadavg()), skipped=skipped)
        return self.file.write(self.record)

    def markdown(self, record: dict[str, Any]) -> str:
        machine, ceilings = record["machine"], record["ceiling_1024_gflops"]
        start = ", ".join(f"{x:.2f}" for x in machine["load_average_at_start"])
        end = ", ".join(f"{x:.2f}" for x in record.get("load_average_at_end", []))
        return "\n".join([
            f"Command: `{record['command']}`  ",
            f"Machine: {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, "
            f"{machine['threads_used']} threads; torch {machine['torch']}, transformers "
            f"{machine['transformers']}; code at {machine['git']}; 1024^3 matmul "
            f"{ceilings['float32']:.0f} GFLOP/s fp32, {ceilings['bfloat16']:.0f} bf16; load "
            f"average {start} at the start, {end} at the end.", "",
            *runs_lines(record["runs"], record["rows"]),
            *self.section(record["rows"]), *skipped_lines(record.get("skipped", []))]) + "\n"
