"""`audit()`: run every check of the gate on a model and collect an `AuditReport`.

    import decoder_audit as da
    report = da.audit(da.Decoder(da.preset("tiny-368")))          # white-box
    report = da.audit(hf_model, vocab_size=V, max_seq_len=T)        # black-box
    report.passed, report.first_failure, report.checks

The runner orders results by the seeds' diagnosis order (registry.py) and names the first
contract that broke. A check that raises, because the model raised inside it, fails with the
exception as its evidence; the gate itself does not crash. The user's model is never modified.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import nn

from .registry import CHECK_ORDER, CHECKS
from .report import AuditReport
from .result import CheckResult, crashed, skipped
from .subject import Subject



def audit(model: nn.Module, *, vocab_size: int | None = None, max_seq_len: int | None = None,
          progress: bool = False, seed: int = 0, checks: Iterable[str] | None = None,
          intervention_len: int | None = None) -> AuditReport:
    """Run the acceptance gate on `model` and return its `AuditReport`.

    White-box when the model carries a `DecoderConfig` as `.config` (vocab_size and max_seq_len
    come from it); otherwise black-box, and `vocab_size` is required. `max_seq_len=None` skips the
    overlength check (listed as skipped). `checks=[names]` runs only those checks (the rest are
    listed as skipped); `intervention_len=T` sets the causal/prefix length (default
    min(max_seq_len, 64)).
    """
    wanted = set(CHECK_ORDER if checks is None else _validate_names(checks))
    subject = Subject(model, vocab_size=vocab_size, max_seq_len=max_seq_len, seed=seed,
                      intervention_len=intervention_len)
    started = time.perf_counter()
    results: dict[str, CheckResult] = {}
    with torch.random.fork_rng(devices=[]):  # the user's global RNG stream is left untouched
        torch.manual_seed(seed)  # for models that draw random numbers themselves
        subject.prepare()
        try:
            with _progress(progress, len(wanted)) as advance:
                for name in CHECK_ORDER:
                    if name not in wanted:
                        results[name] = skipped(name, "not requested")
                        continue
                    advance(name)
                    results[name] = _run_one(name, subject)
                advance(None)
        finally:
            subject.release()
    cfg = subject.cfg
    return AuditReport(
        checks=[results[name] for name in CHECK_ORDER],
        model=type(model).__name__,
        mode="white-box" if subject.whitebox else "black-box",
        dtype=str(subject.dtype).removeprefix("torch."),
        vocab_size=subject.vocab_size,
        max_seq_len=subject.max_seq_len,
        seed=seed,
        seconds=time.perf_counter() - started,
        tokens=subject.tokens,
        calls=subject.calls,
        notes=subject.notes,
        config=None if cfg is None else cfg.to_dict(),
    )


def _run_one(name: str, subject: Subject) -> CheckResult:
    check = CHECKS[name]
    missing = check.missing(subject)
    if missing is not None:
        return skipped(name, missing)
    started = time.perf_counter()
    try:
        result = check.run(subject)
    except Exception as exc:  # the model raised inside the check: that is evidence
        result = crashed(name, exc)
    if not isinstance(result, CheckResult) or result.name != name:
        raise AssertionError(f"check {name} returned {result!r}")
    result.seconds = time.perf_counter() - started
    return result


def _validate_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; checks are {list(CHECK_ORDER)}")
    return names


class _progress:
    """A rich progress bar over the checks, on stderr, shown once the gate has run for a second
    (a fast gate prints nothing extra); a no-op when not asked for."""

    DELAY_S = 1.0

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return lambda name: None
        started = time.perf_counter()
        done = [-1]  # checks finished before the current one

        def advance(name: str | None) -> None:
            done[0] += 1
            if self.bar is None and time.perf_counter() - started >= self.DELAY_S and name:
                self._start(done[0])
            if self.bar is not None:
                self.bar.update(self.task, completed=done[0], description=name or "done")

        return advance

    def _start(self, completed: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("gate: {task.description:<20}"), BarColumn(),
                            TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("", total=self.total, completed=completed)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


__all__ = ["AuditReport", "audit"]
