"""`CheckResult`: what one check of the gate found."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from ..objective import OutputError


# The paths through a model that a failed check can affect, and what runs on each.
PATHS: dict[str, str] = {
    "training": "the full forward and backward a training step takes",
    "generation": "cached and padded decoding",
    "model loss": "the model's own labels= loss, which the trainers that call it take "
                  "(transformers' Trainer, TRL); decoder-audit's train computes its own",
}


@dataclass
class CheckResult:
    """One check's verdict. `evidence` holds JSON-ready facts (which rows moved, by how much,
    for which cut); `tolerance` is the declared tolerance it was judged with (None when the
    check is exact or structural); `skipped` checks are listed but neither pass nor fail."""

    name: str
    passed: bool
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    tolerance: float | None = None
    skipped: bool = False
    arrays: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Large numeric arrays for the pictures (attention patterns); never serialised."""
    seconds: float = field(default=0.0, compare=False)
    """Wall time the check took (set by the runner)."""
    paths: tuple[str, ...] = ()
    """The paths a failure of this check affects (names of PATHS). Empty: the registry's paths
    for the check (the runner fills them in); a check may narrow them to what failed (padding
    through the cache only: generation)."""

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("pass" if self.passed else "FAIL")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "skipped": self.skipped,
            "detail": self.detail,
            "tolerance": self.tolerance,
            "evidence": self.evidence,
            "seconds": round(self.seconds, 3),
            "paths": list(self.paths),
        }


class Verdicts:
    """What a report of checks answers from its `checks` list (AuditReport, BatchReport)."""

    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        """Every check passed (skipped checks neither pass nor fail)."""
        return all(c.passed for c in self.checks)

    @property
    def first_failure(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.passed), None)

    def __getitem__(self, name: str) -> CheckResult:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; checks are {[c.name for c in self.checks]}")


def skipped(name: str, why: str) -> CheckResult:
    return CheckResult(name, True, f"skipped: {why}", {"reason": why}, None, skipped=True)


def crashed(name: str, exc: BaseException) -> CheckResult:
    """The model (or the gate) raised inside a check: the check fails, with the exception as
    evidence. The gate itself carries on."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    # An OutputError is not the model raising: it ran and returned the wrong thing (not logits,
    # or logits of the wrong shape); its message says what.
    detail = str(exc) if isinstance(exc, OutputError) else f"raised {type(exc).__name__}: {exc}"
    return CheckResult(
        name, False, detail,
        {"exception": type(exc).__name__, "message": str(exc),
         "traceback": "".join(frames[-6:])[-3000:]},
    )
