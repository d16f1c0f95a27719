"""`decoder-audit account --preset NAME`: wall time and peak memory of a fresh process."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from .common import BenchmarkError, Plan
from .memory import run_cli_child


def account_cost(preset_name: str) -> dict[str, Any]:
    """Wall time and peak RSS (VmHWM, see `memory.status_mb`) of `decoder-audit account --preset
    NAME` run as a fresh process through the CLI's own main()."""
    start = time.perf_counter()
    done, peak = run_cli_child(["account", "--preset", preset_name],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or peak is None:
        raise BenchmarkError(f"decoder-audit account --preset {preset_name} failed "
                             f"(exit {done.returncode}): {done.stderr[-2000:]}")
    return {"command": f"decoder-audit account --preset {preset_name}", "seconds": seconds,
            "peak_rss_mb": peak / 2**20}


def measure(plan: Plan) -> dict[str, Any]:
    """The "account" family: gpt2-xl (tiny-368 in --smoke)."""
    result = account_cost("tiny-368" if plan.smoke else "gpt2-xl")
    plan.say(f"account: {result['seconds']:.1f} s, {result['peak_rss_mb']:.0f} MiB")
    return result
