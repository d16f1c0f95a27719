"""The museum's table (tests/museum/entries.py) is well formed and docs/museum.md is written from
it. Fast: nothing here builds an environment or runs a row (.ci/museum does)."""

from __future__ import annotations

import inspect
import re

import pytest

from decoder_audit.gate.registry import CHECK_ORDER
from museum import builders, docs, symptoms
from museum.entries import CONTROL, ENTRIES, FLOOR, TODAY, VIA, Entry

def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def test_docs_page_is_written_from_the_table():
    assert docs.PAGE.read_text() == docs.render(), (
        "docs/museum.md differs from the table: run `python -m tests.museum --write-docs`")


def test_the_museum_holds_twenty_rows_with_unique_ids():
    ids = [e.id for e in ENTRIES]
    assert len(ids) >= 20 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_row_is_well_formed(entry: Entry):
    for requirement in entry.buggy + entry.fixed:
        name, sep, version = requirement.partition("==")
        assert sep and name and _release(version), requirement
    assert _release(entry.fixed_version) > _release(entry.buggy_version), (
        "the control is a later release than the bug's")
    assert entry.today in TODAY and entry.control in CONTROL and entry.via in VIA
    assert entry.check in CHECK_ORDER
    assert set(entry.standing) <= set(CHECK_ORDER)
    if entry.today in ("missed", "crash") or entry.control == "crash":
        assert entry.pending, "a miss or a crash names the work that ends it"
    if entry.today == "both" or entry.control == "fail":
        # a control failing for a second, genuine bug says which, and one the gate
        # wrongly fails names the work that ends it
        assert entry.pending or entry.note
    assert callable(getattr(builders, entry.builder))
    measure = symptoms.SYMPTOMS[entry.symptom]
    assert set(entry.args) <= set(inspect.signature(measure).parameters)
    assert entry.threshold > entry.tolerance >= 0
    assert re.search(r"[\w.-]+/[\w.-]+#\d+", entry.ref), entry.ref


def test_rows_below_the_floor_are_marked_on_the_page():
    below = [e for e in ENTRIES if e.library == "transformers"
             and _release(e.buggy_version)[:2] < FLOOR]
    assert all(e.below_floor for e in below)
    page = docs.render()
    for entry in below:
        assert f"{entry.buggy_version} → {entry.fixed_version} (below floor)" in page
