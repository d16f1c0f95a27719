"""Mutation testing of the code that must catch bugs: the gate, the model, the oracle, training.

    .venv/bin/python tools/mutation.py                      # every package below, one after another
    .venv/bin/python tools/mutation.py model oracle         # some of them
    .venv/bin/python tools/mutation.py gate --jobs 2        # parallel workers (default: 2)
    .venv/bin/python tools/mutation.py --commit HEAD model  # the committed code, not the work tree
    .venv/bin/python tools/mutation.py gate --only 'src/decoder_audit/gate/invariance.py'
    .venv/bin/python tools/mutation.py --report model       # print the last run's score again

mutmut (the `dev` extra: `pip install -c constraints.txt -e ".[dev]"`) plants one small change
at a time in the package's source (an operator, a constant, a dropped argument, ...) and runs the
tests that execute the changed function; a mutant no test fails on "survived". Each package runs
in its own scratch folder, build/mutation/<package>/, on a copy of src/ and tests/ taken when it
starts (edits made meanwhile do not leak into the run), mutating only that package's files and
running only its fast test selection below. It prints killed / survived / timeout / untested
per file and the score per package: detected / (detected + survived), where a mutant is detected
when a test fails on it or it makes the tests run past mutmut's time limit (a hang or a
slowdown of 10x, counted as caught, as PIT and Stryker do), and writes every survivor's diff to
build/mutation/<package>/survivors.txt. Every run starts from scratch.

Not part of the test suite or CI: it takes tens of minutes per package on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "build" / "mutation"


@dataclass(frozen=True)
class Package:
    mutate: tuple[str, ...]  # glob patterns of the files to mutate, relative to the repository
    tests: tuple[str, ...]  # the fast selection: pytest paths or node ids
    why: str


PACKAGES = {
    "model": Package(
        ("src/decoder_audit/model.py", "src/decoder_audit/layers.py"),
        ("tests/test_model.py", "tests/test_ledger.py", "tests/test_generate.py"),
        "the decoder against the slow oracle over the config grid, init, RoPE, the input "
        "contract; the generation path (KV cache, padding) against the full forward"),
    "oracle": Package(
        ("src/decoder_audit/oracle.py",),
        ("tests/test_model.py",),
        "the oracle against the decoder, the CS336 snapshots and hand-written formulas"),
    "gate": Package(
        ("src/decoder_audit/gate/*.py",),
        ("tests/test_gate_zoo.py", "tests/test_gate_checks.py", "tests/test_gate_generation.py",
         "tests/test_gate_dtypes.py"),
        "every check against its mutants in the zoos, and correct models that must pass "
        "(not the slow foreign-family and memory-scale tests)"),
    "training": Package(
        ("src/decoder_audit/training/*.py",),
        ("tests/test_train.py",),
        "training runs, refusals, resumption and the run folder"),
}

# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into four outcomes.
OUTCOME = {1: "killed", 3: "killed", 37: "killed", 0: "survived", 33: "untested", 5: "untested",
           34: "untested", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout",
           255: "timeout"}


def _config(package: Package, only: list[str] | None) -> str:
    """The [tool.mutmut] table for one package (TOML)."""
    def array(items):
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    return "\n".join([
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {array(only or package.mutate)}",
        f"pytest_add_cli_args_test_selection = {array(package.tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        # torch is not fork-safe once it has run ops: fork each worker from a clean server
        'process_isolation = "forkserver"',
        "timeout_multiplier = 10.0",
        "use_git_change_detection = false",
        "",
    ])


def _snapshot(name: str, package: Package, commit: str | None, only: list[str] | None) -> Path:
    """build/mutation/<name>/, emptied, with src/ and tests/ (of the working tree, or of
    `commit`) and a pyproject.toml configuring mutmut for this package."""
    work = SCRATCH / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if commit is None:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for folder in ("src", "tests"):
            shutil.copytree(ROOT / folder, work / folder, ignore=ignore)
        pyproject = (ROOT / "pyproject.toml").read_text()
    else:
        archive = subprocess.run(["git", "archive", commit, "src", "tests"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        pyproject = subprocess.run(["git", "show", f"{commit}:pyproject.toml"], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout
    pyproject = pyproject.split("[tool.mutmut]")[0].rstrip() + "\n\n" + _config(package, only)
    (work / "pyproject.toml").write_text(pyproject)
    return work


def _run(work: Path, jobs: int) -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    started = time.perf_counter()
    done = subprocess.run([str(mutmut), "run", "--max-children", str(jobs)], cwd=work, env=env)
    print(f"mutmut run: exit {done.returncode} after {time.perf_counter() - started:.0f} s",
          flush=True)
    return done.returncode


def _results(work: Path) -> dict[str, dict[str, list[str]]]:
    """{source file: {outcome: [mutant names]}} from mutmut's .meta files."""
    out: dict[str, dict[str, list[str]]] = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        source = str(meta.relative_to(work / "mutants")).removesuffix(".meta")
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        by_outcome = out.setdefault(source, {})
        for mutant, code in sorted(codes.items()):
            outcome = "not run" if code is None else OUTCOME.get(code, "suspicious")
            by_outcome.setdefault(outcome, []).append(mutant)
    return out


def _diffs(work: Path, names: list[str]) -> str:
    mutmut = Path(sys.executable).with_name("mutmut")
    parts = []
    for name in names:
        shown = subprocess.run([str(mutmut), "show", name], cwd=work, capture_output=True,
                               text=True)
        parts.append(shown.stdout.strip() or f"# {name}: {shown.stderr.strip()}")
    return "\n\n".join(parts) + "\n"


def _report(name: str, work: Path) -> tuple[int, int]:
    """Print one package's table and score; write its survivors' diffs. Returns (detected,
    judged) where detected = killed + timeout and judged = detected + survived."""
    results = _results(work)
    columns = ("killed", "survived", "timeout", "untested", "suspicious", "not run")
    print(f"\n{name}: {PACKAGES[name].why}")
    print(f"  {'file':<44}" + "".join(f"{c:>11}" for c in columns))
    totals = dict.fromkeys(columns, 0)
    survivors: list[str] = []
    for source, by_outcome in results.items():
        counts = {c: len(by_outcome.get(c, [])) for c in columns}
        if not any(counts.values()):
            continue
        for c in columns:
            totals[c] += counts[c]
        survivors += by_outcome.get("survived", [])
        print(f"  {source.removeprefix('src/decoder_audit/'):<44}"
              + "".join(f"{counts[c]:>11}" for c in columns))
    detected = totals["killed"] + totals["timeout"]
    judged = detected + totals["survived"]
    score = 100.0 * detected / judged if judged else float("nan")
    print(f"  {'total':<44}" + "".join(f"{totals[c]:>11}" for c in columns))
    print(f"  score {name}: {detected}/{judged} = {score:.1f}% detected (killed or timed out, "
          "over those and the survivors)")
    if survivors:
        (work / "survivors.txt").write_text(_diffs(work, survivors))
        print(f"  survivors' diffs: {(work / 'survivors.txt').relative_to(ROOT)}")
    return detected, judged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="*", metavar="PACKAGE",
                        help=f"any of {', '.join(PACKAGES)} (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel mutmut workers")
    parser.add_argument("--commit", metavar="REV",
                        help="mutate src/ and tests/ as of this git revision (e.g. HEAD) instead "
                             "of the working tree, so edits in progress stay out")
    parser.add_argument("--only", action="append", metavar="GLOB",
                        help="mutate only these files of the package (repeatable), e.g. "
                             "'src/decoder_audit/gate/invariance.py'")
    parser.add_argument("--report", action="store_true",
                        help="only print the last run's results, run nothing")
    args = parser.parse_args(argv)
    names = args.packages or list(PACKAGES)
    unknown = [name for name in names if name not in PACKAGES]
    if unknown:
        parser.error(f"unknown package(s) {unknown}; choose from {list(PACKAGES)}")
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        print("mutmut is not installed: pip install -c constraints.txt -e '.[dev]'",
              file=sys.stderr)
        return 2
    for name in names:
        work = SCRATCH / name
        if not args.report:
            print(f"== {name}: mutating {', '.join(args.only or PACKAGES[name].mutate)}; tests "
                  f"{' '.join(PACKAGES[name].tests)}", flush=True)
            work = _snapshot(name, PACKAGES[name], args.commit, args.only)
            _run(work, args.jobs)
        if (work / "mutants").exists():
            _report(name, work)
        else:
            print(f"{name}: no results in {work.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
