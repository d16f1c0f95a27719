"""Where a benchmark's results go, and how a results file is updated.

Every benchmark command writes under `out/benchmarks/` by default (`/out/` is in .gitignore), so
a command run as the docs show leaves the git tree clean; the tracked `benchmarks/results/` is
written only when asked for (`--out benchmarks/results`). Wherever it writes, a results file
that already holds rows is merged, never dropped: each row this run measured replaces the row of
the same key (its label, preset or case), every other row is kept where it was, and each row
carries the run that measured it (`"run"`: the UTC time that run started), so a table of rows
from several runs says which is which.

A results file is rewritten after every row (a run stopped half way leaves the rows it
finished), each time whole: written beside its name and moved over it (os.replace), so a
reader sees the previous file or the new one. An existing file that cannot be read as JSON is
refused (BenchmarkError) before anything is measured, never overwritten.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from .common import BenchmarkError

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "out" / "benchmarks"  # gitignored: the default of every command
TRACKED = REPO / "benchmarks" / "results"  # the figures the docs quote: written when asked


def run_stamp() -> str:
    """This run's name in every row it measures: the UTC time it started, to the second."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def previous(path: Path) -> dict[str, Any] | None:
    """The results already at `path` (None when there is no file); BenchmarkError, naming the
    file, when it cannot be read, so a run never replaces what it could not merge."""
    if not path.exists():
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BenchmarkError(f"{str(path)!r} exists but is not readable JSON ({exc}); it would "
                             "be overwritten, not merged: move it, or write elsewhere with "
                             "--out") from None
    if not isinstance(found, dict):
        raise BenchmarkError(f"{str(path)!r} holds {type(found).__name__}, not a results "
                             "object; move it, or write elsewhere with --out")
    return found


def row_key(row: dict[str, Any]) -> str:
    """What names a row across runs: its label (A/B rows, generation, training step), preset
    (gate_scale) or case (gate_peak)."""
    for key in ("label", "preset", "case"):
        if key in row:
            return str(row[key])
    raise BenchmarkError(f"a results row has no label, preset or case: {sorted(row)}")


def merge_rows(old: Iterable[dict[str, Any]], new: Iterable[dict[str, Any]]
               ) -> list[dict[str, Any]]:
    """The old rows with those this run measured put in their place, then this run's new ones,
    in the order it measured them."""
    new = list(new)
    fresh = {row_key(row): row for row in new}
    kept = [fresh.pop(row_key(row), row) for row in old]
    return kept + [row for row in new if row_key(row) in fresh]


def write_text(path: Path, text: str) -> None:
    """`text` at `path`, written beside it and moved over it: the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1) + "\n")


def runs_lines(runs: dict[str, dict[str, Any]], rows: Iterable[dict[str, Any]]) -> list[str]:
    """A Markdown line naming the runs whose rows a merged file holds, when there are several
    (rows written before rows carried their run count as one earlier run)."""
    earlier = any("run" not in row for row in rows)
    if len(runs) + earlier < 2:
        return []
    named = [f"{stamp}: `{about.get('command', '?')}`" for stamp, about in sorted(runs.items())]
    named += ["rows without a `run`: an earlier run"] * earlier
    return [f"Rows of {len(runs) + earlier} runs (each row's `run` in the JSON): "
            + "; ".join(named) + ".", ""]


def skipped_lines(skipped: list[dict[str, Any]]) -> list[str]:
    """The rows a run did not start, past its budget (Markdown)."""
    if not skipped:
        return []
    return ["## Not run: past the budget", "",
            *[f"- {s['family']}: {s['row']}: {s['reason']}" for s in skipped], ""]


class RowFile:
    """A results file of rows (`{..., "rows": [...], "runs": {...}}`) kept up to date as a run
    measures: the rows found there when the run started, merged with this run's after every
    row; `runs` describes each run whose rows are kept (`about`: this run's command)."""

    def __init__(self, path: Path, about: dict[str, Any],
                 render: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.path, self.about, self.render, self.run = path, about, render, run_stamp()
        self.before = previous(path) or {}
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        """One more row of this run (stamped with it), or one it added before and has since
        completed, and the file written again."""
        row["run"] = self.run
        if not any(row is mine for mine in self.rows):
            self.rows.append(row)
        return self.write(record)

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """`record` (the run's own fields) with the merged rows, as JSON at `path` and, with a
        `render`, as Markdown beside it; returns what was written."""
        rows = merge_rows(self.before.get("rows", []), self.rows)
        used = {row.get("run") for row in rows} | {self.run}
        runs = {**self.before.get("runs", {}), self.run: self.about}
        merged = {**record, "rows": rows,
                  "runs": {stamp: about for stamp, about in runs.items() if stamp in used}}
        write_json(self.path, merged)
        if self.render is not None:
            write_text(self.path.with_suffix(".md"), self.render(merged))
        return merged
