"""Run museum entries: each side of an entry (its buggy release, its fixed release) in a process
of that release's environment (tests/releases.py builds it once into .release-envs/), with this
checkout's decoder_audit first on the path; returns the JSON record inside.py printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .entries import Entry

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import releases  # noqa: E402 - tests/releases.py, found through TESTS

SIDES = ("buggy", "fixed")
TIMEOUT_S = 600  # one entry's side: build, symptom and audit of a tiny model take under a minute


def requirements(entry: Entry, side: str) -> tuple[str, ...]:
    if side not in SIDES:
        raise ValueError(f"side={side!r}: one of {SIDES}")
    return entry.buggy if side == "buggy" else entry.fixed


def environment(entry: Entry, side: str) -> Path:
    """The python of the release environment of one side (built when absent)."""
    return releases.release_python(list(requirements(entry, side)))


def run_side(entry: Entry, side: str) -> dict:
    """The record of one side: {"id", "release", "figure", "audit", "seconds"}; a process that
    exits without a record raises RuntimeError with its last lines."""
    python = environment(entry, side)
    path = os.pathsep.join([str(ROOT / "src"), str(TESTS)])
    started = time.perf_counter()
    done = subprocess.run([str(python), "-m", "museum.inside", entry.id], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"})
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        raise RuntimeError(f"{entry.id} ({side}, {' '.join(requirements(entry, side))}) exited "
                           f"{done.returncode} without a record:\n{tail}")
    record = json.loads(lines[-1])
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def problems(entry: Entry, side: str, record: dict) -> list[str]:
    """What in one side's record disagrees with the table (empty when it agrees): the symptom
    shown on the buggy release and absent on the fixed one, the expected check failing on the
    buggy release as `today` says, the control as `control` says."""
    found: list[str] = []
    audit, figure = record["audit"], record["figure"]
    if side == "buggy" and not figure > entry.threshold:
        found.append(f"symptom {entry.symptom}={figure:.3g} not above {entry.threshold:g}")
    if side == "fixed" and not figure <= entry.tolerance:
        found.append(f"control's symptom {entry.symptom}={figure:.3g} above {entry.tolerance:g}")
    expected = entry.today if side == "buggy" else entry.control
    if (expected == "crash") != ("crash" in audit):
        found.append(f"audit expected {expected!r}, got "
                     f"{audit.get('crash') or ('failures ' + str(audit['failures']))}")
        return found
    if "crash" in audit:
        return found
    failures = set(audit["failures"])
    if expected in ("caught", "both") and entry.check not in failures:
        found.append(f"{entry.check} did not fail (failures: {sorted(failures)})")
    if expected == "missed" and entry.check in failures:
        found.append(f"{entry.check} now fails: the entry is caught (flip today to 'caught')")
    if expected == "fail" and failures <= set(entry.standing):
        found.append(f"the control passes now (failures: {sorted(failures)}): flip control to "
                     "'pass'")
    if expected == "pass" and not failures <= set(entry.standing):
        found.append(f"control failed {sorted(failures - set(entry.standing))}: "
                     f"{[audit['details'][n] for n in sorted(failures - set(entry.standing))]}")
    return found
