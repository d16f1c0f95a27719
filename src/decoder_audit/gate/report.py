"""`AuditReport`: the gate's verdict on one model, and the files that keep its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import pictures, render
from .facts import ModelFacts
from .result import CheckResult, Verdicts
from .subject import DEFAULT_PROBE_LEN


@dataclass
class AuditReport(Verdicts):
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
    longest: int = 0  # the longest input (T) the model ran, as measured: the cost's unit
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    device: str = "cpu"  # where the checks ran (the model's own device)
    input_vocab_size: int | None = None  # ids the model reads, when declared other than V
    facts: ModelFacts | None = None  # what the gate knew of the model (facts.py)

    @property
    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def failures_on(self, path: str) -> list[CheckResult]:
        """The failures that affect `path` (a name of result.PATHS)."""
        return [c for c in self.checks if not c.passed and path in c.paths]

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.checks if c.skipped]

    @property
    def mode_label(self) -> str:
        """How the gate saw the model, for people: white-box (our DecoderConfig), its weights
        placed on a declared spec (a Hugging Face model's own config, or spec=: the ledger and
        the oracle ran on them, so not black-box), or black-box (behaviour only)."""
        placement = getattr(self.facts, "placement", None)
        if self.mode != "black-box" or placement is None:
            return self.mode
        return f"declared spec, {placement.layout} layout: ledger and oracle on its weights"

    @property
    def cost_len(self) -> int:
        """The T the cost is counted at: the longest input the model ran (measured by the
        subject as the checks sent them), else the length limit, else the default probe
        length (a report built by hand)."""
        return self.longest or self.max_seq_len or DEFAULT_PROBE_LEN

    @property
    def forward_equivalents(self) -> float:
        """Cost in full forward passes of one sequence at the longest length checked."""
        return self.tokens / self.cost_len

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
                     "model_calls": self.calls, "longest_input": self.cost_len,
                     "forward_equivalents": round(self.forward_equivalents, 2)},
            "notes": self.notes,
            "facts": None if self.facts is None else self.facts.to_dict(),
        }

    def to_markdown(self, command: str | None = None) -> str:
        return render.markdown(self, command)

    def write(self, directory: str | Path, command: str | None = None, *,
              draw: bool = True) -> list[Path]:
        """report.md, report.json and the PNG pictures (unless `draw` is False: the figures
        they draw are in report.json) into `directory`; returns the paths.

        Every file is first written to a temporary file in `directory`, and only once all of
        them are complete is each moved over its name (os.replace): a write that fails half way
        (a full disk) leaves the earlier report as it was, and no temporary file. A report file
        that is a symbolic link, or one no earlier report wrote (a report.md of the user's
        own), is refused (ConfigError naming it), never written over: `refuse_to_overwrite`.
        An earlier report's picture this one does not draw is removed (another model's)."""
        import os
        import tempfile

        directory = Path(directory)
        self.refuse_to_overwrite(directory)
        directory.mkdir(parents=True, exist_ok=True)

        def text(make):
            return lambda path: path.write_text(make()) is not None  # always written

        writers = {  # name -> writes the file at a path; False when there is nothing to draw
            "report.md": text(lambda: render.markdown(self, command)),
            "report.json": text(lambda: render.to_json(self, command) + "\n"),
            "dependency_matrix.png": lambda p: pictures.dependency_png(self["causal"], p),
            "attention_patterns.png": lambda p: pictures.attention_png(self["attention_rows"], p),
        }
        if not draw:
            writers = {name: writer for name, writer in writers.items()
                       if not name.endswith(".png")}
        mask = os.umask(0)
        os.umask(mask)
        staged: dict[str, Path] = {}
        try:
            for name, writer in writers.items():
                # the same suffix: matplotlib picks a picture's format from it
                fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.",
                                                 suffix=f".tmp{Path(name).suffix}")
                os.close(fd)
                staged[name] = Path(temporary)
                if not writer(staged[name]):
                    staged.pop(name).unlink()  # no such evidence: no picture
            for name, temporary in staged.items():
                os.chmod(temporary, 0o666 & ~mask)  # mkstemp makes 0600; give the default
                os.replace(temporary, directory / name)
            for name in set(PICTURES) - set(staged):  # an earlier report's: another model's
                (directory / name).unlink(missing_ok=True)
        finally:
            for temporary in staged.values():
                temporary.unlink(missing_ok=True)  # still there only when something failed
        return [directory / name for name in staged]

    @staticmethod
    def refuse_to_overwrite(directory: str | Path) -> None:
        """ConfigError naming a file of `directory` that `write` would replace and must not: a
        symbolic link (never written through), or a report.md, report.json or picture that no
        earlier gate report wrote (a user's own). Ours are recognised by their content:
        report.md by its title, report.json by its keys, the pictures when a text of ours is
        beside them (they are written together). `verify --report` asks before the gate runs."""
        import os

        from ..errors import ConfigError

        directory = Path(directory)
        for name in (*TEXTS, *PICTURES):
            if (directory / name).is_symlink():
                raise ConfigError(
                    f"{str(directory / name)!r} is a symbolic link to "
                    f"{os.readlink(directory / name)!r}; the report is never written through a "
                    "link (nothing was written): remove it or choose another --report folder")
        present = [name for name in (*TEXTS, *PICTURES) if (directory / name).exists()]
        ours = {name for name in TEXTS if name in present and _is_ours(directory / name)}
        foreign = [name for name in present
                   if name not in ours and not (ours and name in PICTURES)]
        if foreign:
            them = "it" if len(foreign) == 1 else "them"
            raise ConfigError(
                f"{str(directory)!r} holds {', '.join(foreign)}, which no earlier decoder-audit "
                f"gate report wrote: the report would replace {them}, so nothing was written; "
                f"move {them} or choose another --report folder")

    def summary(self) -> str:
        first = self.first_failure
        verdict = render.passed_line(self.checks) if first is None else \
            f"FAILED at {first.name}: {first.detail}"
        return f"{self.model} ({self.mode_label}): {verdict}"


# What `AuditReport.write` puts in a folder: the text, then the pictures (drawn when there is
# evidence for them).
TEXTS = ("report.md", "report.json")
PICTURES = ("dependency_matrix.png", "attention_patterns.png")
MARKDOWN_TITLE = "# decoder-audit gate report: "  # render.markdown's first line
JSON_KEYS = {"passed", "first_failure", "model", "mode", "checks"}  # in every to_dict


def _is_ours(path: Path) -> bool:
    """Whether report.md or report.json at `path` is one `AuditReport.write` wrote."""
    import json

    try:
        if path.suffix == ".md":
            with path.open(encoding="utf-8") as handle:
                return handle.readline().startswith(MARKDOWN_TITLE)
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and JSON_KEYS <= data.keys()
