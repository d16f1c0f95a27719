"""`decoder-audit account --preset NAME`: wall time and peak memory of a fresh process."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from .common import BenchmarkError, Plan

# The child runs the CLI's own main() and reports its peak RSS (VmHWM, see memory.status_mb) on
# stderr, even when main() fails.
_ACCOUNT_CHILD = """
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


def account_cost(preset_name: str) -> dict[str, Any]:
    """Wall time and peak RSS (VmHWM, see `memory.status_mb`) of `decoder-audit account --preset
    NAME` run as a fresh process through the CLI's own main()."""
    cmd = [sys.executable, "-c", _ACCOUNT_CHILD, "account", "--preset", preset_name]
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    seconds = time.perf_counter() - start
    marks = [line.split()[1] for line in done.stderr.splitlines()
             if line.startswith("BENCH-VmHWM-KiB")]
    if done.returncode != 0 or not marks:
        raise BenchmarkError(f"decoder-audit account --preset {preset_name} failed "
                             f"(exit {done.returncode}): {done.stderr[-2000:]}")
    return {"command": f"decoder-audit account --preset {preset_name}", "seconds": seconds,
            "peak_rss_mb": int(marks[-1]) / 1024}


def measure(plan: Plan) -> dict[str, Any]:
    """The "account" family: gpt2-xl (tiny-368 in --smoke)."""
    result = account_cost("tiny-368" if plan.smoke else "gpt2-xl")
    plan.say(f"account: {result['seconds']:.1f} s, {result['peak_rss_mb']:.0f} MiB")
    return result
