"""The terminal report (gate/render.py) against hand-written expectations: every row, number
and word of the tables is written out here from the evidence below, so a renderer that drops a
column, renumbers the checks, hides the wrong shape-ledger rows or loses a style fails. Each
test was a surviving mutation of render.py (issue 16) before it existed; they run in
milliseconds on a hand-made AuditReport, with no model."""

from __future__ import annotations

import dataclasses
import errno
import io
import json

import pytest
from helpers import verdict_facts
from rich.console import Console

from decoder_audit.errors import ConfigError
from decoder_audit.gate import CHECK_TITLES, AuditReport, CheckResult, audit_batch, pictures
from decoder_audit.gate.render import markdown, print_report


def _site(name: str, ok: bool = True) -> dict:
    return {"site": name, "declared": ["B", "T", "D"], "got": [2, 3, 8] if ok else None,
            "ok": ok}


def _sites(layers: int, broken: str | None = None) -> list[dict]:
    names = ["embed"] + [f"layers.{i}.{part}" for i in range(layers)
                         for part in ("attn.q", "mlp.out")] + ["logits"]
    return [_site(n, n != broken) for n in names]


# the last target is narrower than its input: the line must not end in padding
PAIRS = [{"input": "<bos>", "target": "A"}, {"input": "A", "target": "B"},
         {"input": "<unk>", "target": "C"}]


def _report(params_pass: bool = False, sites: list[dict] | None = None,
            align_pass: bool = False) -> AuditReport:
    checks = [
        CheckResult("inputs", True, "ids ok", {}, None, seconds=0.7),
        CheckResult("shapes", True, "ledger ok",
                    {"sites": sites if sites is not None else _sites(4),
                     "sizes": {"B": 2, "T": 3}}, 0.0),
        CheckResult("params", params_pass, "ledger" if params_pass else "4 extra", {
            "rows": [("embedding", 1234, "V*D"), ("blocks", 56789, "L*12*D^2")],
            "analytic_total": 58023, "measured_total": 58027,
            "differences": ["measured 4 more", "a bias unaccounted"]}, None, seconds=0.4),
        CheckResult("causal", True, "no leak", {
            "seq_len": 9, "allowed": 1e-9, "dtype": "torch.float64",
            "cuts": [{"cut": 0, "moved_rows": [0, 1, 2], "max_change_earlier": 0.0,
                      "change_at_cut": 1.0},
                     {"cut": 2, "moved_rows": [], "max_change_earlier": 0.0,
                      "change_at_cut": 0.5},
                     {"cut": 1, "moved_rows": list(range(1, 9)), "max_change_earlier": 2e-3,
                      "change_at_cut": 0.25}]}, 1e-9, seconds=2.0),
        CheckResult("attention_rows", True, "skipped: none", {}, None, skipped=True),
        CheckResult("loss_alignment", align_pass, "aligned" if align_pass else "off by one",
                    {"pairs": PAIRS}, 1e-6, seconds=1.1),
    ]
    return AuditReport(checks, model="hand-made", mode="white-box", dtype="float64",
                       vocab_size=11, max_seq_len=16, seconds=1.5, tokens=12345, calls=7,
                       notes=["a note"])


def _text(report: AuditReport, **kwargs) -> list[str]:
    console = Console(width=160, record=True, color_system=None, file=io.StringIO())
    print_report(report, console, **kwargs)
    return console.export_text().splitlines()


def _ansi(report: AuditReport) -> str:
    out = io.StringIO()
    print_report(report, Console(width=160, force_terminal=True, color_system="standard",
                                 file=out))
    return out.getvalue()


def _table(lines: list[str], title: str) -> list[list[str]]:
    """The cells of the table whose title line starts with `title` (header row first)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows, seen = [], False
    for line in lines[start + 1:]:
        boxed = bool(line) and line[0] in "┏┃┡│└"
        if seen and not boxed:
            break
        seen = seen or boxed
        if line[0] in "┃│":
            rows.append([cell.strip() for cell in line[1:-1].replace("┃", "│").split("│")])
    return rows


def test_the_summary_numbers_checks_from_one_with_status_and_tolerance():
    rows = _table(_text(_report()), "acceptance gate (diagnosis order)")
    assert rows == [
        ["#", "check", "", "tolerance", "evidence"],
        ["1", "inputs", "pass", "exact", "ids ok"],
        ["2", "shapes", "pass", "0 (exact)", "ledger ok"],
        ["3", "params", "FAIL", "exact", "4 extra"],
        ["4", "causal", "pass", "1e-09", "no leak"],
        ["5", "attention_rows", "skip", "exact", "skipped: none"],
        ["6", "loss_alignment", "FAIL", "1e-06", "off by one"],
    ]


def test_the_verdict_the_cost_and_the_slowest_checks_slowest_first():
    lines = _text(_report(), command="decoder-audit verify x")
    assert "note: a note" in lines
    first = lines.index(f"FAILED: first broken contract is 'params' ({CHECK_TITLES['params']})")
    assert lines[first + 1:first + 3] == ["  4 extra", "  also failing: loss_alignment"]
    assert ("cost: 1.5 s, 12,345 token positions in 7 model calls = 771.6 forward passes at T=16"
            in lines)
    assert "  slowest: causal 2.0 s, loss_alignment 1.1 s, inputs 0.7 s" in lines
    assert lines[-1] == "rerun: decoder-audit verify x"
    passed = _text(_report(params_pass=True, align_pass=True))
    # 6 checks, attention_rows skipped: 5 held, 1 did not run, and it is named
    assert verdict_facts("\n".join(passed)) == ([5, 6, 1], ["attention_rows"])


def test_the_verdict_counts_the_checks_that_held_and_names_those_that_did_not_run():
    """Issue 44: "every check holds (13 skipped)" when 14 of 27 ran. Every producer of the
    verdict (the terminal, report.md, summary(), a batch report) says the counts."""
    report = _report(params_pass=True, align_pass=True)
    report.checks.append(CheckResult("window", True, "skipped: no window", {}, None,
                                     skipped=True))
    expected = ([5, 7, 2], ["attention_rows", "window"])  # 7 checks, 2 of them skipped
    assert verdict_facts("\n".join(_text(report))) == expected
    assert verdict_facts(markdown(report)) == expected
    assert verdict_facts(report.summary()) == expected
    report.checks = [dataclasses.replace(c, skipped=False) for c in report.checks]
    assert verdict_facts(markdown(report)) == ([7, 7], [])  # every one ran
    batch = audit_batch({"input_ids": [[1, 2, 3]], "labels": [[1, 2, 3]]})
    skipped = [c.name for c in batch.checks if c.skipped]
    assert batch.passed and skipped  # no BOS id, no packing: some did not run
    assert verdict_facts("\n".join(batch.lines())) == (
        [len(batch.checks) - len(skipped), len(batch.checks), len(skipped)], skipped)


def test_tables_are_titled_at_the_left_edge():
    lines = _text(_report())
    for title in ("shape ledger (B=2, T=3)", "parameter ledger (analytic,",
                  "acceptance gate (diagnosis order)", "causal interventions: T=9"):
        assert any(line.startswith(title) for line in lines), title


def test_the_shape_ledger_shows_layer_0_for_identical_layers_and_every_row_otherwise():
    rows = _table(_text(_report()), "shape ledger (B=2, T=3)")
    ok = ["(B, T, D)", "(2, 3, 8)", "ok"]
    assert rows == [["site", "declared", "recorded", ""], ["embed", *ok],
                    ["layers.0.attn.q", *ok], ["layers.0.mlp.out", *ok], ["logits", *ok]]
    assert "  layers 1..3: the same 2 sites each, all as declared" in _text(_report())
    broken = _table(_text(_report(sites=_sites(4, "layers.2.attn.q"))), "shape ledger")
    assert [row[0] for row in broken[1:]] == [s["site"] for s in _sites(4)]
    assert broken[1 + 5] == ["layers.2.attn.q", "(B, T, D)", "not recorded", "MISMATCH"]
    assert not any(line.startswith("  layers 1..") for line in
                   _text(_report(sites=_sites(4, "layers.2.attn.q"))))
    two = _table(_text(_report(sites=_sites(2))), "shape ledger")
    assert [row[0] for row in two[1:]] == [s["site"] for s in _sites(2)]


def test_the_parameter_ledger_rows_total_and_its_verdict():
    lines = _text(_report())
    assert _table(lines, "parameter ledger") == [
        ["component", "parameters", "formula"], ["embedding", "1,234", "V*D"],
        ["blocks", "56,789", "L*12*D^2"], ["total", "58,023", ""]]
    assert ("  measured unique parameters: 58,027; differs: measured 4 more; a bias unaccounted"
            in lines)
    assert "  measured unique parameters: 58,027; reconciled" in _text(_report(params_pass=True))


def test_the_causal_table_lists_each_cut_and_the_rows_that_moved():
    assert _table(_text(_report()), "causal interventions")[1:] == [
        ["0", "none", "0.00e+00", "0, 1, 2", "1.00e+00"],
        ["2", "0..1", "0.00e+00", "-", "5.00e-01"],
        ["1", "0..0", "2.00e-03", "1, 2, 3, 4, 5, 6...", "2.50e-01"]]


def test_the_aligned_example_keeps_each_position_in_one_column():
    lines = _text(_report())
    at = lines.index("aligned example (row t of the logits is scored against target t):")
    assert lines[at + 1:at + 3] == ["  input:  <bos> A <unk>", "  target: A     B C"]


def test_styles_mark_the_status_and_the_verdict():
    """SGR codes (ECMA-48): 1 bold, 31 red, 32 green, 33 yellow."""
    failing = _ansi(_report())
    assert "\x1b[32mpass" in failing and "\x1b[1;31mFAIL" in failing
    assert "\x1b[33mskip" in failing
    assert "\x1b[1;31mFAILED: first broken contract is 'params'" in failing
    assert "\x1b[1maligned example" in failing
    assert "\x1b[1;32mPASSED" in _ansi(_report(params_pass=True,
                                                                  align_pass=True))


def test_numbers_in_the_causal_table_and_the_check_numbers_are_right_aligned():
    # numbers line up by their last digit: "0" under "cut c" sits at the right edge of its cell,
    # and with 17 checks " 1" lines up with "17" (a left-aligned column would read "1 " / "17")
    lines = _text(_report())
    assert ("┃ cut c ┃ rows < c ┃ max change rows < c ┃          rows moved ┃ change at row c ┃"
            in lines)
    assert ("│     0 │     none │            0.00e+00 │             0, 1, 2 │        1.00e+00 │"
            in lines)
    every = AuditReport([CheckResult(name, True, "ok") for name in CHECK_TITLES], model="m",
                        mode="white-box", dtype="float64", vocab_size=11, max_seq_len=16)
    summary = [line for line in _text(every, sections=False) if line[:1] in "┃│"]
    count = len(CHECK_TITLES)  # a header row, then one row per check, numbered from 1
    assert len(summary) == count + 1
    assert summary[0].startswith("┃  # ┃ check ")
    assert summary[1].startswith("│  1 │ inputs ")
    assert summary[count].startswith(f"│ {count} │ loss_alignment ")


def test_the_causal_table_marks_more_than_six_moved_rows_with_an_ellipsis():
    # 6 moved rows are listed whole; from 7 on only the first 6 are, followed by "..."
    report = _report()
    report["causal"].evidence["cuts"] = [
        {"cut": 3, "moved_rows": [3, 4, 5, 6, 7, 8], "max_change_earlier": 0.0,
         "change_at_cut": 1.0},
        {"cut": 2, "moved_rows": [2, 3, 4, 5, 6, 7, 8], "max_change_earlier": 0.0,
         "change_at_cut": 1.0}]
    assert [row[3] for row in _table(_text(report), "causal interventions")[1:]] == [
        "3, 4, 5, 6, 7, 8", "2, 3, 4, 5, 6, 7..."]


def test_the_attention_table_has_one_row_per_layer_under_its_column_names():
    report = _report()
    head = {"max_row_sum_error": 1e-7, "max_future_probability": 0.0, "finite": True}
    report.checks[4] = CheckResult("attention_rows", True, "rows sum to 1", {
        "seq_len": 5,
        "heads": [{**head, "layer": 1, "head": 0, "max_row_sum_error": 2.5e-3,
                   "max_future_probability": 0.5, "finite": False},
                  {**head, "layer": 0, "head": 0},
                  {**head, "layer": 0, "head": 1, "max_row_sum_error": 3e-7,
                   "max_future_probability": 0.00012345}],
        "stressed": {"how": "scores scaled", "max_future_probability": 0.0}}, 1e-6)
    lines = _text(report)
    # layer 0: the worst of its 2 heads in each column; layer 1: its one non-finite head
    assert _table(lines, "attention row sums (T=5)") == [
        ["layer", "heads", "max |row sum - 1|", "max p(future key)", "finite"],
        ["0", "2", "3.0e-07", "0.000123", "yes"],
        ["1", "1", "2.5e-03", "0.5", "NO"]]
    assert "  stressed (scores scaled): max p(future key) = 0" in lines


def test_markdown_numbers_the_checks_from_one():
    md = markdown(_report())
    assert "| # | check | verdict | tolerance | evidence |\n|---|---|---|---|---|\n" in md
    assert "\n| 1 | `inputs` | pass | exact | ids ok |\n" in md
    assert "\n| 6 | `loss_alignment` | FAIL | 1e-06 | off by one |\n" in md


def test_markdown_shows_failing_evidence_as_json_indented_by_two_spaces():
    md = markdown(_report(params_pass=True))
    assert ('### `loss_alignment`\noff by one\n\n```json\n{\n  "pairs": [\n    {\n'
            '      "input": "<bos>",\n      "target": "A"\n    },\n    {\n'
            '      "input": "A",\n      "target": "B"\n    },\n    {\n'
            '      "input": "<unk>",\n      "target": "C"\n    }\n  ]\n}\n```') in md


def test_markdown_cuts_failing_evidence_at_4000_characters():
    report = _report(params_pass=True)
    report.checks[-1] = CheckResult("loss_alignment", False, "off by one", {"log": "y" * 5000})
    # '{' newline, 2 spaces, '"log": "' make 12 characters; 3988 y follow to reach 4000
    block = '{\n  "log": "' + "y" * 3988
    assert f"### `loss_alignment`\noff by one\n\n```json\n{block}\n```" in markdown(report)


def test_write_into_an_existing_folder_writes_the_markdown_and_the_json(tmp_path):
    report = _report()
    assert tmp_path.is_dir()
    # no dependency matrix and no attention patterns in the evidence: no pictures
    assert report.write(tmp_path) == [tmp_path / "report.md", tmp_path / "report.json"]
    assert (tmp_path / "report.md").read_text().startswith(
        "# decoder-audit gate report: hand-made\n")
    data = json.loads((tmp_path / "report.json").read_text())
    assert (data["passed"], data["first_failure"]) == (False, "params")


def _earlier_report(folder):
    """What an earlier `verify --report folder` left: every file the report writes (the
    pictures stand-ins beside a report of ours)."""
    _report(params_pass=True).write(folder)
    for name in ("dependency_matrix.png", "attention_patterns.png"):
        (folder / name).write_bytes(f"earlier {name}\n".encode())
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_write_that_fails_half_way_leaves_the_earlier_report(tmp_path, monkeypatch):
    earlier = _earlier_report(tmp_path)

    def disk_full(check, path):  # half a picture, then the disk is full
        path.write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pictures, "attention_png", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _report().write(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == earlier  # no temporaries


def test_a_symlinked_report_file_is_refused_not_followed(tmp_path):
    outside = tmp_path / "outside.md"
    outside.write_text("not a report\n")
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "report.md").symlink_to(outside)
    with pytest.raises(ConfigError) as refused:
        _report().write(folder)
    assert str(folder / "report.md") in str(refused.value)
    assert outside.read_text() == "not a report\n"
    assert [p.name for p in folder.iterdir()] == ["report.md"]


def test_a_report_file_no_earlier_report_wrote_is_refused_not_replaced(tmp_path):
    """Issue 44: `verify --report DIR` replaced a report.md the user wrote, silently."""
    for name, mine in (("report.md", "# my notes\n"), ("report.json", '{"mine": 1}\n'),
                       ("attention_patterns.png", "my picture")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text(mine)
        with pytest.raises(ConfigError) as refused:
            _report().write(folder)
        assert name in str(refused.value) and str(folder) in str(refused.value)
        assert [p.name for p in folder.iterdir()] == [name]  # nothing written beside it
        assert (folder / name).read_text() == mine


def test_an_earlier_reports_files_are_replaced_and_its_extra_picture_removed(tmp_path):
    earlier = _earlier_report(tmp_path)
    written = _report().write(tmp_path)  # draws no picture: the earlier ones were another run's
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written) == \
        ["report.json", "report.md"]
    assert (tmp_path / "report.md").read_bytes() != earlier["report.md"]
