"""python -m tests.museum: run the museum's rows (all, or --only ID ...) on both releases and
print each side's record and its disagreements with the table; --write-docs rewrites
docs/museum.md from the table and runs nothing. Exit 1 when a record disagrees."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import docs
from .entries import BY_ID, ENTRIES
from .runner import SIDES, environment, problems, requirements, run_side


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.museum")
    parser.add_argument("--only", nargs="+", metavar="ID", choices=sorted(BY_ID))
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="write every record to FILE")
    parser.add_argument("--build", action="store_true",
                        help="only build the release environments the rows need")
    args = parser.parse_args(argv)
    if args.build:
        return _build([BY_ID[i] for i in args.only] if args.only else ENTRIES)
    if args.write_docs:
        docs.PAGE.write_text(docs.render())
        print(docs.PAGE)
        return 0
    records, disagreements = [], 0
    for entry in [BY_ID[i] for i in args.only] if args.only else ENTRIES:
        for side in SIDES:
            record = run_side(entry, side)
            found = problems(entry, side, record)
            disagreements += bool(found)
            records.append({**record, "side": side, "problems": found})
            audit = record["audit"]
            verdict = audit.get("crash") or ("passed" if audit["passed"] else audit["failures"])
            print(f"{entry.id:34s} {side:5s} {record['release']:8s} {entry.symptom}="
                  f"{record['figure']:.3g}  audit: {verdict}  {record['seconds']}s"
                  + (f"\n    DISAGREES: {found}" if found else ""), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(records, out, indent=1)
    return 1 if disagreements else 0


def _build(entries) -> int:
    """Each distinct environment once, timed (pip runs serially: one pip at a time keeps the
    download cache coherent)."""
    seen: set[tuple[str, ...]] = set()
    for entry in entries:
        for side in SIDES:
            wanted = requirements(entry, side)
            if wanted in seen:
                continue
            seen.add(wanted)
            started = time.perf_counter()
            python = environment(entry, side)
            print(f"{' '.join(wanted):48s} {time.perf_counter() - started:6.1f}s  {python}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
