"""Peak memory of each side for forward + backward, each side in its own fresh process.

The parent runs `run.py --memory-child SIDE CFG B T THREADS STEPS` once per side; the child
(`memory_child`) builds one side, takes the steps and prints its RSS before them and its peak.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import decoder_audit as da
from decoder_audit.model.decoder import Decoder

from .common import SEED, BenchmarkError, Plan
from .pair import hf_fast_attention, step_fn
from .rows import Row, plan_rows

RUN_PY = Path(__file__).resolve().with_name("run.py")


def status_mb(field: str) -> float:
    """A /proc/self/status memory field in MiB: VmRSS (now) or VmHWM (peak of this process).

    Not getrusage's ru_maxrss: on Linux a child starts with its parent's peak (fork copies the
    address space and execve keeps the counter), so a child of this big process would report the
    parent's peak. VmHWM belongs to the address space that execve creates afresh."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise BenchmarkError(f"/proc/self/status has no {field} (peak memory needs Linux)")


# A fresh process that runs the CLI's own main() and reports its peak RSS (VmHWM, see
# status_mb) on stderr, even when main() fails (a failing gate exits 1 and is still measured).
_CLI_CHILD = """
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


def run_cli_child(argv: list[str], **run) -> tuple[subprocess.CompletedProcess, int | None]:
    """`decoder-audit ARGV` in a fresh process (`run`: subprocess.run's options), and its peak
    RSS in bytes (None when the child died before it could say)."""
    done = subprocess.run([sys.executable, "-c", _CLI_CHILD, *argv], text=True, check=False,
                          **run)
    marks = [line.split()[1] for line in (done.stderr or "").splitlines()
             if line.startswith("BENCH-VmHWM-KiB")]
    return done, int(marks[-1]) * 1024 if marks else None


def memory_child(side: str, cfg_json: str, batch: int, seq_len: int, threads: int,
                 steps: int) -> dict[str, Any]:
    """Runs in the child: build one side (random weights: memory does not depend on values), take
    `steps` forward + backward steps, report RSS before the steps and the process peak."""
    import transformers  # both children import it, so their baselines match

    from decoder_audit.references.hf_config import config_to_hf, hf_family

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
    before, peak_before = status_mb("VmRSS"), status_mb("VmHWM")
    for _ in range(steps):
        fn()
    peak = status_mb("VmHWM")
    params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return {"side": side, "rss_before_steps_mb": before, "peak_before_steps_mb": peak_before,
            "peak_rss_mb": peak, "step_peak_over_rss_before_mb": peak - before,
            "parameters_mb": params_mb}


def measure_memory(config_name: str, cfg: da.DecoderConfig, batch: int, seq_len: int,
                   threads: int, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"label": f"{config_name} B={batch} T={seq_len} forward+backward",
                           "config": config_name, "batch": batch, "seq_len": seq_len,
                           "mode": "forward+backward", "steps": steps}
    for side in ("ours", "hf"):
        cmd = [sys.executable, str(RUN_PY), "--memory-child", side,
               json.dumps(cfg.to_dict()), str(batch), str(seq_len), str(threads), str(steps)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchmarkError(f"memory child {side} for {config_name} failed:\n"
                                 f"{done.stderr[-2000:]}")
        out[side] = json.loads(done.stdout.strip().splitlines()[-1])
    out["hf_over_ours_peak"] = out["hf"]["peak_rss_mb"] / out["ours"]["peak_rss_mb"]
    return out


def memory_rows(plan: Plan) -> list[Row]:
    """The first forward + backward row of each architecture; --smoke and --quick the first
    only."""
    seen: dict[str, Row] = {}
    for row in plan_rows(plan):
        if row.backward and row.config_name not in seen:
            seen[row.config_name] = row
    return list(seen.values())[:1 if plan.smoke or plan.quick else None]


def measure_memory_rows(plan: Plan) -> list[dict[str, Any]]:
    """The "memory" family: peak memory of both sides for each of `memory_rows(plan)`."""
    results = []
    for row in plan.within_budget("memory", memory_rows(plan)):
        mem = measure_memory(row.config_name, row.cfg, row.batch, row.seq_len, plan.threads,
                             steps=1 if plan.smoke else 2)
        results.append(mem)
        plan.done("memory", mem)
        plan.say(f"memory {row.config_name}: ours {mem['ours']['peak_rss_mb']:.0f} MiB, "
                 f"HF {mem['hf']['peak_rss_mb']:.0f} MiB")
    return results
