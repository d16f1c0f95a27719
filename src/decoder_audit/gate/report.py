"""`AuditReport`: the gate's verdict on one model, and the files that keep its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import pictures, render
from .facts import ModelFacts
from .result import CheckResult
from .subject import DEFAULT_PROBE_LEN


@dataclass
class AuditReport:
    """The gate's verdict on one model: every check in diagnosis order, and how it ran."""

    checks: list[CheckResult]
    model: str
    mode: str  # "white-box" or "black-box"
    dtype: str  # the dtype the behavioural checks ran in
    vocab_size: int
    max_seq_len: int | None
    seed: int = 0
    seconds: float = 0.0
    tokens: int = 0  # token positions pushed through the model
    calls: int = 0
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    device: str = "cpu"  # where the checks ran (the model's own device)
    input_vocab_size: int | None = None  # ids the model reads, when declared other than V
    facts: ModelFacts | None = None  # what the gate knew of the model (facts.py)

    @property
    def passed(self) -> bool:
        """Every check passed (skipped checks neither pass nor fail; see `skipped`)."""
        return all(c.passed for c in self.checks)

    @property
    def first_failure(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.passed), None)

    @property
    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def failures_on(self, path: str) -> list[CheckResult]:
        """The failures that affect `path` ("training" or "generation")."""
        return [c for c in self.checks if not c.passed and path in c.paths]

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.checks if c.skipped]

    def __getitem__(self, name: str) -> CheckResult:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; checks are {[c.name for c in self.checks]}")

    @property
    def forward_equivalents(self) -> float:
        """Cost in full forward passes of one sequence at the longest length checked."""
        return self.tokens / (self.max_seq_len or DEFAULT_PROBE_LEN)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "passed": self.passed,
            "first_failure": None if first is None else first.name,
            "model": self.model,
            "mode": self.mode,
            "dtype": self.dtype,
            "device": self.device,
            "input_vocab_size": self.input_vocab_size,
            "vocab_size": self.vocab_size,
            "max_seq_len": self.max_seq_len,
            "seed": self.seed,
            "config": self.config,
            "checks": [c.to_dict() for c in self.checks],
            "skipped": [c.name for c in self.skipped],
            "cost": {"seconds": round(self.seconds, 3), "tokens": self.tokens,
                     "model_calls": self.calls,
                     "forward_equivalents": round(self.forward_equivalents, 2)},
            "notes": self.notes,
            "facts": None if self.facts is None else self.facts.to_dict(),
        }

    def to_markdown(self, command: str | None = None) -> str:
        return render.markdown(self, command)

    def write(self, directory: str | Path, command: str | None = None) -> list[Path]:
        """report.md, report.json and the PNG pictures into `directory`; returns the paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in (("report.md", render.markdown(self, command)),
                           ("report.json", render.to_json(self, command) + "\n")):
            path = directory / name
            path.write_text(text)
            written.append(path)
        for name, draw, check in (("dependency_matrix.png", pictures.dependency_png, "causal"),
                                  ("attention_patterns.png", pictures.attention_png,
                                   "attention_rows")):
            path = directory / name
            if draw(self[check], path):
                written.append(path)
        return written

    def summary(self) -> str:
        first = self.first_failure
        verdict = "PASSED" if first is None else f"FAILED at {first.name}: {first.detail}"
        return f"{self.model} ({self.mode}): {verdict}"
