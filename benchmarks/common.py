"""What every benchmark module shares: the seed, the refusal error, summary statistics, and the
`Plan` of one run (decided once from the command line and handed to every result family)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, TypeVar

Item = TypeVar("Item")

SEED = 0


class BenchmarkError(RuntimeError):
    """The benchmark cannot produce an honest comparison (e.g. the two models differ)."""


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


@dataclass(frozen=True)
class Plan:
    """The settings of one run. Families read it; none of them parses the command line.

    The budget: a family walks its rows through `within_budget`, which stops starting rows once
    `budget` seconds have passed since `started` (a row under way finishes) and records each row
    it did not start in `skipped`, saying so; after each row the family calls `done`, which hands
    the row to `on_row` (the entry point writes the results files then)."""

    smoke: bool  # tiny configs, one repeat: the test suite's end-to-end check
    quick: bool  # the short run (fewer and shorter rows, no gate, a budget)
    threads: int  # torch.set_num_threads for both sides
    repeats: int  # timed repeats per side
    warmup: int  # untimed warm-up steps per side
    profile: bool  # profile the rows that ask for it (off with --no-profile)
    skip: frozenset[str]  # families turned off by --skip-<key>
    ceiling: float  # dense fp32 matmul GFLOP/s, the denominator of MFU
    started: float  # time.perf_counter() at the start of the run
    budget: float | None = None  # seconds from `started` after which no row starts
    on_row: Callable[[str, dict[str, Any]], None] | None = None  # (family, row) after each row
    skipped: list[dict[str, Any]] = field(default_factory=list)  # rows not started, and why

    @classmethod
    def standalone(cls, threads: int, repeats: int, skip: frozenset[str] = frozenset(),
                   budget: float | None = None,
                   on_row: Callable[[str, dict[str, Any]], None] | None = None) -> "Plan":
        """The plan of one family run alone from its own command line (`python -m
        benchmarks.<family>`): full shapes, one warm-up step, no profile, no ceiling."""
        return cls(smoke=False, quick=False, threads=threads, repeats=repeats, warmup=1,
                   profile=False, skip=skip, ceiling=0.0, started=time.perf_counter(),
                   budget=budget, on_row=on_row)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def over_budget(self) -> bool:
        return self.budget is not None and self.elapsed() > self.budget

    def within_budget(self, family: str, items: Iterable[Item],
                      label: Callable[[Item], str] = lambda item: item.label) -> Iterator[Item]:
        """The items whose turn comes before the budget is spent; each later one is recorded
        in `skipped` (and said) instead of started."""
        for item in items:
            if self.over_budget():
                self.skip_row(family, label(item))
                continue
            yield item

    def skip_row(self, family: str, what: str) -> None:
        why = f"past the budget of {self.budget:g} s ({self.elapsed():.0f} s gone)"
        self.skipped.append({"family": family, "row": what, "reason": why})
        self.say(f"skipped {family}: {what}: {why}")

    def done(self, family: str, row: dict[str, Any]) -> None:
        """A row of `family` is finished: hand it on (written to disk before the next starts)."""
        if self.on_row is not None:
            self.on_row(family, row)

    def say(self, msg: str) -> None:
        """A progress line stamped with the seconds since the run started."""
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)
