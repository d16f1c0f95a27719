"""The gate on a GPU (issue 13): run when a CUDA device is present; without one it says so and
exits 0 (the test suite's CUDA tests skip the same way).

    python -m benchmarks.gpu_checks                 # every check below
    python -m benchmarks.gpu_checks --preset gpt2-medium

1. `audit()` of the preset in bfloat16 on the GPU (the checks on the device, the slow oracle on
   the CPU in float64 layer by layer): passes; seconds; peak GPU memory against the weights.
2. The same with scaled_dot_product_attention restricted to the flash kernel (and then to the
   memory-efficient kernel): the fused paths the gate's fast path takes on a GPU pass too.
3. `decoder-audit verify --device cuda --dtype bfloat16` end to end (exit 0).
4. A few zoo mutants moved to the GPU in bfloat16 are caught by their check.
5. The model comes back untouched: values, requires_grad, .grad, device and dtype.
6. `torchrun --nproc_per_node <GPUs> decoder-audit verify --shard --device cuda --dtype bfloat16`
   (FSDP2 over nccl, one GPU per rank): the same verdicts as check 3's unsharded audit.

Writes gpu_checks.json into out/benchmarks/ (gitignored) or --out DIR; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[1])
if __package__ in (None, "") and _ROOT not in sys.path:  # run as a file
    sys.path.insert(0, _ROOT)
_TESTS = str(Path(_ROOT) / "tests")

import torch  # noqa: E402

import decoder_audit as da  # noqa: E402

from benchmarks.store import DEFAULT_OUT, write_json  # noqa: E402

MUTANTS = ("no_causal_mask", "finite_mask_1e4", "gqa_tiled_not_interleaved", "batch_rows_mixed",
           "normalised_by_length", "false_tying_copy")


def _weights_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _gpu_model(preset: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return da.Decoder(da.preset(preset)).to(device="cuda", dtype=dtype)


def audit_on_gpu(preset: str, dtype: torch.dtype, backend=None) -> dict[str, Any]:
    """Check 1 (backend None) and 2 (a restricted SDPA backend)."""
    model = _gpu_model(preset, dtype)
    weights = _weights_bytes(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    context = nullcontext()
    if backend is not None:
        from torch.nn.attention import sdpa_kernel

        context = sdpa_kernel([backend])
    started = time.perf_counter()
    with context:
        report = da.audit(model)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return {"check": f"audit {preset} {dtype} on cuda"
                     + ("" if backend is None else f", SDPA {backend.name} only"),
            "passed": report.passed, "failures": {c.name: c.detail for c in report.failures},
            "seconds": time.perf_counter() - started, "device": report.device,
            "weights_bytes": weights, "gate_peak_gpu_bytes_over_weights": peak,
            "gate_extra_over_weights": peak / weights,
            "rounding_floor": report["oracle"].evidence.get("rounding_floor"),
            "check_seconds": {c.name: round(c.seconds, 2) for c in report.checks}}


def cli_on_gpu(preset: str) -> dict[str, Any]:
    """Check 3."""
    import contextlib
    import io

    from decoder_audit.cli import main

    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["verify", "--preset", preset, "--device", "cuda", "--dtype", "bfloat16",
                     "--json"])
    data = json.loads(out.getvalue())
    return {"check": f"decoder-audit verify --preset {preset} --device cuda --dtype bfloat16",
            "passed": code == 0 and data["passed"] and data["device"].startswith("cuda"),
            "exit": code, "seconds": time.perf_counter() - started}


def zoo_on_gpu() -> dict[str, Any]:
    """Check 4."""
    sys.path.insert(0, _TESTS)
    import zoo  # noqa: E402 - the tests' mutant zoo

    missed = {}
    for name in MUTANTS:
        case = next(c for c in zoo.MUTANTS if c.name == name)
        model = case.build()
        for tensor in model.parameters():  # keep each mutant's Parameter objects (its defect)
            tensor.data = tensor.data.to("cuda", torch.bfloat16)
        report = da.audit(model, **case.kwargs)
        if case.expect not in [c.name for c in report.failures]:
            missed[name] = report[case.expect].detail
    return {"check": f"zoo mutants {list(MUTANTS)} in bfloat16 on cuda", "passed": not missed,
            "missed": missed}


def model_untouched(preset: str) -> dict[str, Any]:
    """Check 5."""
    model = _gpu_model(preset, torch.bfloat16)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    da.audit(model, checks=["tying_grad", "oracle"])
    same = (all(torch.equal(before[k], v) for k, v in model.state_dict().items())
            and [p.requires_grad for p in model.parameters()] == flags
            and all(p.grad is None for p in model.parameters())
            and all(m.training for m in model.modules())
            and model.lm_head.weight is model.token_embeddings.weight
            and next(model.parameters()).device.type == "cuda")
    return {"check": "the model comes back untouched", "passed": same}


def sharded_on_gpus(preset: str) -> dict[str, Any]:
    """Check 6: the sharded audit over every GPU of the machine (nccl), against the unsharded
    one on the first GPU: the same verdict for every check."""
    import contextlib
    import io
    import os
    import subprocess

    from decoder_audit.cli import main

    flags = ["verify", "--preset", preset, "--device", "cuda", "--dtype", "bfloat16", "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(flags)
    alone = json.loads(out.getvalue())
    gpus = torch.cuda.device_count()
    cli = Path(sys.executable).with_name("decoder-audit")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           str(gpus), "--no-python", str(cli), *flags, "--shard"],
                          capture_output=True, text=True, env={**os.environ})
    seconds = time.perf_counter() - started
    if not proc.stdout.strip():
        return {"check": f"verify --shard over {gpus} GPU(s)", "passed": False,
                "exit": proc.returncode, "error": proc.stderr[-2000:]}
    sharded = json.loads(proc.stdout)
    verdicts = [(c["name"], c["status"]) for c in sharded["checks"]]
    return {"check": f"torchrun --nproc_per_node {gpus} decoder-audit verify --preset {preset} "
                     "--device cuda --dtype bfloat16 --shard",
            "passed": proc.returncode == 0 and verdicts == [(c["name"], c["status"])
                                                            for c in alone["checks"]],
            "exit": proc.returncode, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="results folder (default out/benchmarks, which git ignores)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): the GPU checks did not run")
        return 0
    from torch.nn.attention import SDPBackend

    results = [audit_on_gpu(args.preset, torch.bfloat16)]
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            results.append(audit_on_gpu(args.preset, torch.bfloat16, backend))
        except RuntimeError as exc:  # the kernel refuses this GPU or shape: say so
            results.append({"check": f"SDPA {backend.name} only", "passed": False,
                            "error": str(exc)[:500]})
    for check in (lambda: cli_on_gpu(args.preset), zoo_on_gpu,
                  lambda: model_untouched(args.preset), lambda: sharded_on_gpus(args.preset)):
        results.append(check())
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "checks": results, "passed": all(r["passed"] for r in results)}
    write_json(args.out / "gpu_checks.json", summary)
    for r in results:
        print(f"{'PASS' if r['passed'] else 'FAIL'}  {r['check']}"
              + (f"  ({r['seconds']:.1f} s)" if "seconds" in r else ""))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
