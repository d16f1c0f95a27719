"""Evidence a person can read: the terminal report (rich), report.md and report.json.

Everything here renders an `AuditReport` (passed in as `report`; the class lives in report.py,
which imports this module); nothing recomputes a check. The sections follow the
seeds' deliverable: the shape ledger, the parameter ledger, the causal-intervention results, the
row-sum checks, one decoded aligned example, and the exact command that reruns them.
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..console import literal
from .registry import CHECK_TITLES
from .result import PATHS, CheckResult

_STYLE = {"pass": "green", "FAIL": "bold red", "skip": "yellow"}


def _fmt_tol(tol: float | None) -> str:
    if tol is None:
        return "exact"
    return "0 (exact)" if tol == 0 else f"{tol:.0e}"


def _aligned(pairs: list[dict]) -> tuple[str, str]:
    """`input:` and `target:` lines with each position's tokens in one column."""
    widths = [max(len(p["input"]), len(p["target"])) for p in pairs]
    inp = " ".join(p["input"].ljust(w) for p, w in zip(pairs, widths)).rstrip()
    tgt = " ".join(p["target"].ljust(w) for p, w in zip(pairs, widths)).rstrip()
    return "input:  " + inp, "target: " + tgt


def _shape_rows(check: CheckResult) -> tuple[list[list[str]], str | None]:
    """Shape-ledger rows; with many layers, layer 0 stands for the rest when they all agree."""
    sites = check.evidence.get("sites") or []
    layers = sorted({int(s["site"].split(".")[1]) for s in sites if s["site"].startswith("layers.")})
    show_all = len(layers) <= 2 or any(not s["ok"] for s in sites)
    rows, hidden = [], 0
    for s in sites:
        name = s["site"]
        if not show_all and name.startswith("layers.") and int(name.split(".")[1]) > 0:
            hidden += 1
            continue
        got = "not recorded" if s["got"] is None else str(tuple(s["got"]))
        rows.append([name, "(" + ", ".join(s["declared"]) + ")", got, "ok" if s["ok"] else "MISMATCH"])
    note = (f"layers 1..{layers[-1]}: the same {hidden // max(len(layers) - 1, 1)} sites each, "
            "all as declared") if hidden else None
    return rows, note


def _attention_rows(check: CheckResult) -> list[list[str]]:
    by_layer: dict[int, list[dict]] = {}
    for rec in check.evidence.get("heads", []):
        by_layer.setdefault(rec["layer"], []).append(rec)
    rows = []
    for layer, recs in sorted(by_layer.items()):
        rows.append([str(layer), str(len(recs)),
                     f"{max(r['max_row_sum_error'] for r in recs):.1e}",
                     f"{max(r['max_future_probability'] for r in recs):.3g}",
                     "yes" if all(r["finite"] for r in recs) else "NO"])
    return rows


_CAUSAL_HEADER = ("cut c", "rows < c", "max change rows < c", "rows moved", "change at row c")


def _causal_rows(check: CheckResult) -> list[list[str]]:
    rows = []
    for rec in check.evidence.get("cuts", []):
        compared = f"0..{rec['cut'] - 1}" if rec["cut"] else "none"
        moved = rec["moved_rows"]
        rows.append([str(rec["cut"]), compared, f"{rec['max_change_earlier']:.2e}",
                     "-" if not moved else str(moved[:6])[1:-1] + ("..." if len(moved) > 6 else ""),
                     f"{rec['change_at_cut']:.2e}"])
    return rows


# ---- the verdict ------------------------------------------------------------------------------

def passed_line(checks: list[CheckResult]) -> str:
    """The verdict of a report with no failure, counted: how many checks ran and held, and how
    many did not run, by name ("PASSED: 19 of 27 checks hold; 8 did not run (skipped: ...)").
    A skipped check neither passed nor failed, so "every check holds" would claim what the
    skipped ones never showed."""
    skipped = [c.name for c in checks if c.skipped]
    line = f"PASSED: {len(checks) - len(skipped)} of {len(checks)} checks hold"
    if skipped:
        line += f"; {len(skipped)} did not run (skipped: {', '.join(skipped)})"
    return line + "."


# ---- terminal --------------------------------------------------------------------------------

def _rich_table(title: str, header: tuple[str, ...], rows: list[list[str]],
                justify: str = "left") -> Table:
    table = Table(title=title, title_justify="left")
    for col in header:
        table.add_column(col, justify=justify)
    for row in rows:
        table.add_row(*row)
    return table


def print_report(report, console: Console | None = None, command: str | None = None,
                 sections: bool = True) -> None:
    out = console or Console(width=100)
    out.print(Text(f"decoder-audit gate: {report.model} ({report.mode_label}), "
                   f"V={report.vocab_size}, max_seq_len={report.max_seq_len}, checks in "
                   f"{report.dtype} on {report.device}", style="bold"))
    if sections:
        _print_sections(report, out)
    table = Table(title="acceptance gate (diagnosis order)", title_justify="left", expand=False)
    table.add_column("#", justify="right")
    table.add_column("check")
    table.add_column("", no_wrap=True)
    table.add_column("tolerance", no_wrap=True)
    table.add_column("evidence", overflow="fold")
    for i, check in enumerate(report.checks, start=1):
        table.add_row(str(i), check.name, Text(check.status, style=_STYLE[check.status]),
                      _fmt_tol(check.tolerance), check.detail)
    out.print(table)
    for note in report.notes:
        out.print(f"note: {literal(note)}")
    first = report.first_failure
    if first is None:
        # the verdict and the rerun line are never folded: people grep and copy them whole
        out.print(Text(passed_line(report.checks), style="bold green"), soft_wrap=True)
    else:
        out.print(Text(f"FAILED: first broken contract is '{first.name}' "
                       f"({CHECK_TITLES[first.name]})", style="bold red"), soft_wrap=True)
        out.print(f"  {literal(first.detail)}")
        others = [c.name for c in report.failures[1:]]
        if others:
            out.print(f"  also failing: {', '.join(others)}")
        out.print(f"  paths affected: {_paths_text(report)}")
    out.print(f"cost: {report.seconds:.1f} s, {report.tokens:,} token positions in {report.calls} "
              f"model calls = {report.forward_equivalents:.1f} forward passes at "
              f"T={report.cost_len}")
    slow = sorted((c for c in report.checks if c.seconds >= 0.5), key=lambda c: -c.seconds)
    if slow:
        out.print("  slowest: " + ", ".join(f"{c.name} {c.seconds:.1f} s" for c in slow[:5]))
    if command:
        out.print(f"rerun: {literal(command)}", soft_wrap=True)


def _print_sections(report, out: Console) -> None:
    shapes = report["shapes"]
    if shapes.evidence.get("sites"):
        rows, note = _shape_rows(shapes)
        sizes = ", ".join(f"{k}={v}" for k, v in shapes.evidence.get("sizes", {}).items())
        out.print(_rich_table(f"shape ledger ({sizes})", ("site", "declared", "recorded", ""),
                              rows))
        if note:
            out.print(f"  {literal(note)}")
    params = report["params"]
    if params.evidence.get("rows"):
        ev = params.evidence
        table = Table(title="parameter ledger (analytic, from the config)", title_justify="left")
        table.add_column("component")
        table.add_column("parameters", justify="right")
        table.add_column("formula")
        for name, count, formula in ev["rows"]:
            table.add_row(name, f"{count:,}", formula)
        table.add_row("total", f"{ev['analytic_total']:,}", "", style="bold")
        out.print(table)
        verdict = ("[green]reconciled[/green]" if params.passed else "[red]differs[/red]: "
                   + "; ".join(ev["differences"]))
        out.print(f"  measured unique parameters: {ev['measured_total']:,}; {verdict}")
    causal = report["causal"]
    if causal.evidence.get("cuts"):
        ev = causal.evidence
        out.print(_rich_table(f"causal interventions: T={ev['seq_len']}, tokens from cut c on "
                              f"changed (allowed {ev['allowed']:.1e}, "
                              f"{ev['dtype'].removeprefix('torch.')})",
                              _CAUSAL_HEADER, _causal_rows(causal), justify="right"))
    attention = report["attention_rows"]
    if attention.evidence.get("heads"):
        out.print(_rich_table(f"attention row sums (T={attention.evidence['seq_len']})",
                              ("layer", "heads", "max |row sum - 1|", "max p(future key)",
                               "finite"), _attention_rows(attention), justify="right"))
        stressed = attention.evidence.get("stressed")
        if stressed:
            out.print(f"  stressed ({stressed['how']}): max p(future key) = "
                      f"{stressed['max_future_probability']:.3g}")
    alignment = report["loss_alignment"]
    if alignment.evidence.get("pairs"):
        inp, tgt = _aligned(alignment.evidence["pairs"])
        out.print(Text("aligned example (row t of the logits is scored against target t):",
                       style="bold"))
        out.print(Text(f"  {inp}\n  {tgt}"))


# ---- markdown and json ------------------------------------------------------------------------

def _paths_text(report) -> str:
    """Which paths the failures affect: training refuses only failures of its own path."""
    parts = []
    for path in PATHS:
        names = [c.name for c in report.failures_on(path)]
        parts.append(f"{path}: {', '.join(names) if names else 'none'}")
    return "; ".join(parts)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report, command: str | None = None) -> str:
    first = report.first_failure
    verdict = ("**PASSED**" + passed_line(report.checks).removeprefix("PASSED") if first is None else
               f"**FAILED**: the first broken contract is `{first.name}` "
               f"({CHECK_TITLES[first.name]}).\n\n> {first.detail}\n\nFailures by path: "
               f"{_paths_text(report)}.")
    parts = [
        f"# decoder-audit gate report: {report.model}",
        f"{report.mode_label}, V = {report.vocab_size}, max_seq_len = {report.max_seq_len}, "
        f"checks in {report.dtype} on {report.device}, seed {report.seed}.",
        verdict,
        "## Checks (diagnosis order)",
        _md_table(["#", "check", "verdict", "tolerance", "evidence"],
                  [[str(i), f"`{c.name}`", c.status, _fmt_tol(c.tolerance), c.detail]
                   for i, c in enumerate(report.checks, start=1)]),
    ]
    shapes = report["shapes"]
    if shapes.evidence.get("sites"):
        rows, note = _shape_rows(shapes)
        parts += ["## Shape ledger", _md_table(["site", "declared", "recorded", ""], rows)]
        if note:
            parts.append(note)
    params = report["params"]
    if params.evidence.get("rows"):
        ev = params.evidence
        rows = [[n, f"{c:,}", f] for n, c, f in ev["rows"]] + [["**total**", f"**{ev['analytic_total']:,}**", ""]]
        parts += ["## Parameter ledger", _md_table(["component", "parameters", "formula"], rows),
                  f"Measured unique parameters: {ev['measured_total']:,} "
                  + ("(reconciled)." if params.passed else "— " + "; ".join(ev["differences"]))]
    causal = report["causal"]
    if causal.evidence.get("cuts"):
        ev = causal.evidence
        parts += ["## Causal interventions",
                  f"T = {ev['seq_len']}; for each cut c every token from position c on is changed; "
                  f"rows < c must not move by more than {ev['allowed']:.1e}; row c must move.",
                  _md_table(list(_CAUSAL_HEADER), _causal_rows(causal)),
                  "![dependency matrix](dependency_matrix.png)"]
    attention = report["attention_rows"]
    if attention.evidence.get("heads"):
        parts += ["## Attention row sums",
                  _md_table(["layer", "heads", "max abs(row sum - 1)", "max p(future key)", "finite"],
                            _attention_rows(attention)),
                  "![attention patterns](attention_patterns.png)"]
    alignment = report["loss_alignment"]
    if alignment.evidence.get("pairs"):
        inp, tgt = _aligned(alignment.evidence["pairs"])
        parts += ["## Aligned example", f"```\n{inp}\n{tgt}\n```"]
    if report.failures:
        parts.append("## Evidence of failing checks")
        for c in report.failures:
            parts.append(f"### `{c.name}`\n{c.detail}\n\n```json\n"
                         f"{json.dumps(_trim(c.evidence), indent=2)[:4000]}\n```")
    if report.notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in report.notes)]
    parts.append(f"Cost: {report.seconds:.1f} s, {report.tokens:,} token positions in "
                 f"{report.calls} model calls ({report.forward_equivalents:.1f} forward passes at "
                 f"T = {report.cost_len}).")
    if command:
        parts += ["## Rerun", f"```\n{command}\n```"]
    return "\n\n".join(parts) + "\n"


def _trim(evidence: dict) -> dict:
    """Evidence without the bulky matrices (they are in report.json and the pictures)."""
    return {k: v for k, v in evidence.items() if k not in ("dependency", "sites", "heads")}


def to_json(report, command: str | None = None) -> str:
    data = report.to_dict()
    data["command"] = command
    return json.dumps(data, indent=2, default=str)
