"""Every entry of the museum, on both sides: the buggy release shows its symptom and the plain
call does what the table says (`today`: its check fails, or it is missed, or the gate crashes);
the first fixed release shows no symptom and its audit passes (`control`).

Run by .ci/museum (DA_MUSEUM=1); one test per entry and side, each a process of that release's
environment (tests/releases.py), so a failure names the release it happened in."""

from __future__ import annotations

import pytest

from museum.entries import ENTRIES
from museum.runner import SIDES, problems, run_side


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_entry(entry, side):
    record = run_side(entry, side)
    assert record["release"] == (entry.buggy_version if side == "buggy" else entry.fixed_version)
    found = problems(entry, side, record)
    assert not found, f"{entry.id} on {side} release {record['release']}: {found}"
