"""What every benchmark module shares: the seed, the refusal error, summary statistics, and the
`Plan` of one run (decided once from the command line and handed to every result family)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

SEED = 0


class BenchmarkError(RuntimeError):
    """The benchmark cannot produce an honest comparison (e.g. the two models differ)."""


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


@dataclass(frozen=True)
class Plan:
    """The settings of one run. Families read it; none of them parses the command line."""

    smoke: bool  # tiny configs, one repeat: the test suite's end-to-end check
    quick: bool  # the short run (fewer repeats, no gpt2-small B=4 row, no gate)
    threads: int  # torch.set_num_threads for both sides
    repeats: int  # timed repeats per side
    warmup: int  # untimed warm-up steps per side
    profile: bool  # profile the rows that ask for it (off with --no-profile)
    skip: frozenset[str]  # families turned off by --skip-<key>
    ceiling: float  # dense fp32 matmul GFLOP/s, the denominator of MFU
    started: float  # time.perf_counter() at the start of the run

    @classmethod
    def standalone(cls, threads: int, repeats: int, skip: frozenset[str] = frozenset()
                   ) -> "Plan":
        """The plan of one family run alone from its own command line (`python -m
        benchmarks.<family>`): full shapes, one warm-up step, no profile, no ceiling."""
        return cls(smoke=False, quick=False, threads=threads, repeats=repeats, warmup=1,
                   profile=False, skip=skip, ceiling=0.0, started=time.perf_counter())

    def say(self, msg: str) -> None:
        """A progress line stamped with the seconds since the run started."""
        print(f"[{time.perf_counter() - self.started:6.1f}s] {msg}", flush=True)
