"""The evidence of a trainer's gate: `<output_dir>/decoder-audit/`, written once by rank 0 and
swapped in whole: report.md and report.json (the writer `decoder-audit verify --report` uses; its
pictures where the run is refused), gate.json (the path, the run's own checks, every batch
report, the verdict) and batches.md (each first batch, and the data's lineage). Nothing else of
the output folder is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..storage.folder import write_folder_atomically

REPORT_FOLDER = "decoder-audit"
"""The folder of the run's output directory the gate's evidence goes into (nothing else there
is written)."""


def write_evidence(verdict: Any, out_dir: str | Path | None) -> Path | None:
    """The verdict (gating.Verdict) into <out_dir>/decoder-audit, swapped in whole; None without
    out_dir or a verdict."""
    if out_dir is None or verdict is None:
        return None

    def write(folder: Path) -> None:
        if verdict.report is not None:  # its pictures where the run is refused
            verdict.report.write(folder, draw=bool(verdict.refused))
        (folder / "gate.json").write_text(json.dumps(verdict.to_dict(), indent=2,
                                                     default=str) + "\n")
        merged = getattr(verdict.adapters, "merged", None)
        if merged is not None:  # a PEFT model's merged base, beside the live audit
            merged.write(folder / "merged", draw=bool(verdict.refused))
        (folder / "batches.md").write_text("\n\n".join(
            [f"## batch {i}\n\n```\n" + "\n".join(b.lines()) + "\n```"
             for i, b in enumerate(verdict.batches)]
            + [f"## lineage: {c.status}\n\n{c.detail}\n\n```\n"
               + "\n".join(c.evidence["lines"]) + "\n```"
               for c in verdict.checks if c.name == "lineage" and "lines" in c.evidence])
            + "\n")

    folder = Path(out_dir) / REPORT_FOLDER
    # an earlier gate's report and pictures may be dropped: a refusal before the model was
    # audited writes none
    earlier = [p.name for p in folder.iterdir()] if _is_gate_folder(folder) else []
    return write_folder_atomically(folder, write, same_kind=_is_gate_folder,
                                   what="trainer gate report", superseded=earlier)


def _is_gate_folder(folder: Path) -> bool:
    try:
        return json.loads((folder / "gate.json").read_text()).get("kind") == "trainer gate"
    except (OSError, ValueError, AttributeError):
        return False
