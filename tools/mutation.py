"""Mutation testing of the code that must catch bugs: the gate, the model, the oracle, training.

    .venv/bin/python tools/mutation.py                      # every package below, one after another
    .venv/bin/python tools/mutation.py model oracle         # some of them
    .venv/bin/python tools/mutation.py gate --jobs 2        # parallel workers (default: 2)
    .venv/bin/python tools/mutation.py --commit HEAD model  # the committed code, not the work tree
    .venv/bin/python tools/mutation.py gate --only 'src/decoder_audit/gate/checks/invariance.py'
    .venv/bin/python tools/mutation.py --report model       # print the last run's score again
    .venv/bin/python tools/mutation.py gate --sample 200 --seed 1   # a random sample: an estimate
    .venv/bin/python tools/mutation.py gate --mutants 'decoder_audit.gate.checks.alignment.*'  # named mutants

mutmut (the `dev` extra: `pip install -c constraints.txt -e ".[dev]"`) plants one small change
at a time in the package's source (an operator, a constant, a dropped argument, ...) and runs the
tests that execute the changed function; a mutant no test fails on "survived". Each package runs
in its own scratch folder, build/mutation/<package>/, on a copy of src/ and tests/ taken when it
starts (edits made meanwhile do not leak into the run), mutating only that package's files and
running only its fast test selection below. It prints killed / survived / timeout / untested
per file and the score per package: detected / (detected + survived + untested), where a mutant
is detected when a test fails on it or it makes the tests run past mutmut's time limit (a hang or
a slowdown of 10x), and "untested" means no test of the selection even executes the mutated
function (PIT's and Stryker's "no coverage": counted as not detected, as they do). Mutants judged
equivalent (no input can tell them from the original) are listed with the reason in
tools/mutation_equivalent.txt; the score over the non-equivalent mutants leaves them out. It
writes every survivor's diff to build/mutation/<package>/survivors.txt. Every run starts from
scratch.

--sample N runs a uniform random sample of N of the package's mutants (drawn with --seed from
all of them, after generating them) and reports the score as an estimate with its 95% Wilson
confidence interval; --mutants runs the named ones (globs allowed), e.g. survivors again after
a test was added.

Not part of the test suite or CI: it takes tens of minutes per package on two cores.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import random
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
    deselect: tuple[str, ...] = ()  # node id prefixes left out of the selection (slow, redundant)


PACKAGES = {
    "model": Package(
        ("src/decoder_audit/model/*.py",),
        ("tests/model/", "tests/accounting/test_ledger.py", "tests/generation/test_generate.py"),
        "the decoder against the slow oracle over the config grid, init, RoPE, the input "
        "contract; the generation path (KV cache, padding) against the full forward"),
    "oracle": Package(
        ("src/decoder_audit/references/oracle.py",),
        ("tests/model/test_decoder.py", "tests/references/test_oracle.py",
         # the streamed oracle (the gate's) against the whole one
         "tests/gate/test_scale.py::test_the_streamed_oracle_equals_the_whole_one",
         "tests/gate/test_scale.py::test_each_streamed_piece_comes_under_the_stage_that_reads_it",
         "tests/gate/test_scale.py::"
         "test_the_oracle_reads_weights_in_their_own_dtype_and_one_layer_at_a_time",
         # its RoPE frequencies, per pair, against transformers' for every scaling
         "tests/references/test_hf.py::test_rope_frequencies_equal_transformers_for_every_scaling"),
        "the oracle against the decoder, the CS336 snapshots and hand-written formulas; the "
        "streamed oracle against the whole one; its input contract"),
    "gate": Package(
        ("src/decoder_audit/gate/*.py",),
        tuple(f"tests/gate/test_{name}.py" for name in (
            "zoo", "checks", "generation", "dtypes", "render", "inputs", "invariance",
            "attention", "weights", "reference", "alignment", "tolerances", "spec", "shard"))
        # the two foreign-family tests that judge the output_attentions path against `causal`
        + ("tests/gate/test_foreign.py::test_falcons_output_attentions_path_leak_is_named",
           "tests/gate/test_foreign.py::test_bidirectional_defaults_fail_causal_and_prefix"),
        "every check against its mutants in the zoos, and correct models that must pass "
        "(not the slow foreign-family, conformance and memory-scale tests)",
        # the 16-bit presets are 40% of the selection's time; the bf16 config grid and the zoo
        # in bf16 run the same code in the same dtypes
        deselect=("tests/gate/test_dtypes.py::test_presets_pass_in_16_bit",)),
    "spec": Package(
        ("src/decoder_audit/gate/checks/spec.py", "src/decoder_audit/references/layouts.py",
         "src/decoder_audit/references/layout_types.py",
         "src/decoder_audit/references/spec_weights.py",
         "src/decoder_audit/references/weights_map.py"),
        ("tests/gate/test_spec.py", "tests/gate/test_spec_families.py",
         "tests/gate/test_spec_lens.py", "tests/references/test_hf_families.py"),
        "a declared architecture on modules we did not write: each outside style's correct "
        "model, each planted numerics defect, the layouts against the converter, weights maps; "
        "the Hugging Face families and TransformerLens placed, and written back"),
    "training": Package(
        ("src/decoder_audit/training/*.py",),
        ("tests/training/", "tests/cli/test_train.py"),
        "training runs, refusals, resumption and the run folder; batches, evaluation, the "
        "two-process DDP and FSDP2 runs; the run options, the lock and the run folder"),
}

# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into four outcomes.
OUTCOME = {1: "killed", 3: "killed", 37: "killed", 0: "survived", 33: "untested", 5: "untested",
           34: "untested", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout",
           255: "timeout"}
COLUMNS = ("killed", "timeout", "survived", "untested", "suspicious", "not run")
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"
Z95 = 1.959964  # the standard normal's 97.5% quantile: a two-sided 95% interval


def _config(package: Package, only: list[str] | None) -> str:
    """The [tool.mutmut] table for one package (TOML)."""
    def array(items):
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    selection = list(package.tests)
    for prefix in package.deselect:
        selection += ["--deselect", prefix]
    return "\n".join([
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {array(only or package.mutate)}",
        f"pytest_add_cli_args_test_selection = {array(selection)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        # torch is not fork-safe once it has run ops: fork each worker from a clean server
        'process_isolation = "forkserver"',
        "timeout_multiplier = 10.0",
        "use_git_change_detection = false",
        "",
    ])


def _snapshot(work: Path, package: Package, commit: str | None, only: list[str] | None) -> Path:
    """`work` (build/mutation/<name>[-<tag>]/), emptied, with src/ and tests/ (of the working
    tree, or of `commit`) and a pyproject.toml configuring mutmut for this package."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if commit is None:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for folder in ("src", "tests", "examples"):  # examples: the learner's model and spec
            shutil.copytree(ROOT / folder, work / folder, ignore=ignore)
        pyproject = (ROOT / "pyproject.toml").read_text()
        revision = "working tree"
    else:
        archive = subprocess.run(["git", "archive", commit, "src", "tests", "examples"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        pyproject = subprocess.run(["git", "show", f"{commit}:pyproject.toml"], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout
        revision = subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT,
                                  capture_output=True, text=True, check=True).stdout.strip()
    pyproject = pyproject.split("[tool.mutmut]")[0].rstrip() + "\n\n" + _config(package, only)
    (work / "pyproject.toml").write_text(pyproject)
    (work / "revision.txt").write_text(revision + "\n")
    return work


# mutmut's own first step (mutmut.__main__._run up to create_mutants), without running anything:
# it writes mutants/ and the .meta files that name every mutant
_GENERATE = """
import os
from mutmut.__main__ import create_mutants
from mutmut.mutation.trampoline import set_mutant_under_test
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir
set_mutant_under_test("mutant_generation")
os.makedirs("mutants", exist_ok=True)
copy_src_dir()
copy_also_copy_files()
create_mutants(1)
"""


def _all_mutants(work: Path) -> list[str]:
    """Generate the mutants (without running them) and return all their names, sorted."""
    subprocess.run([sys.executable, "-c", _GENERATE], cwd=work, check=True,
                   capture_output=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return sorted(name for by_outcome in _results(work).values()
                  for names in by_outcome.values() for name in names)


def _run(work: Path, jobs: int, names: list[str]) -> int:
    """mutmut run in `work`: every mutant, or only `names` (names or globs)."""
    mutmut = Path(sys.executable).with_name("mutmut")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    started = time.perf_counter()
    done = subprocess.run([str(mutmut), "run", "--max-children", str(jobs), *names], cwd=work,
                          env=env)
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


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion: (low, high) in [0, 1]. Unlike the
    normal approximation it stays inside [0, 1] and is honest near a score of 100%."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    scale = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def _equivalent() -> dict[str, str]:
    """{mutant name: why it is equivalent} from tools/mutation_equivalent.txt."""
    if not EQUIVALENT.exists():
        return {}
    out = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.strip().partition(" ")
            out[name] = why.strip()
    return out


def _score_line(label: str, detected: int, judged: int, sample: dict | None) -> str:
    score = 100.0 * detected / judged if judged else float("nan")
    line = f"  {label}: {detected}/{judged} = {score:.1f}%"
    if sample is not None:
        low, high = wilson(detected, judged)
        line += (f" (an estimate from a random sample of {sample['size']} of "
                 f"{sample['population']} mutants, seed {sample['seed']}; 95% Wilson interval "
                 f"{100 * low:.1f}% to {100 * high:.1f}%)")
    return line


def _report(name: str, work: Path) -> tuple[int, int]:
    """Print one package's table and score; write its survivors' diffs. Returns (detected,
    judged) where detected = killed + timeout and judged = detected + survived + untested."""
    chosen_file = work / "chosen.json"
    chosen_json = json.loads(chosen_file.read_text()) if chosen_file.exists() else {}
    chosen = set(chosen_json["names"]) if chosen_json else None
    sample = chosen_json.get("sample")
    revision = (work / "revision.txt").read_text().strip() if (work / "revision.txt").exists() \
        else "?"
    print(f"\n{name} ({revision}): {PACKAGES[name].why}")
    print(f"  {'file':<44}" + "".join(f"{c:>11}" for c in COLUMNS))
    totals = dict.fromkeys(COLUMNS, 0)
    undetected: list[str] = []
    for source, by_outcome in _results(work).items():
        if chosen is not None:
            by_outcome = {k: [m for m in v if m in chosen] for k, v in by_outcome.items()}
        counts = {c: len(by_outcome.get(c, [])) for c in COLUMNS}
        if not any(counts[c] for c in COLUMNS[:-1]):
            continue
        for c in COLUMNS:
            totals[c] += counts[c]
        undetected += by_outcome.get("survived", []) + by_outcome.get("untested", [])
        print(f"  {source.removeprefix('src/decoder_audit/'):<44}"
              + "".join(f"{counts[c]:>11}" for c in COLUMNS))
    detected = totals["killed"] + totals["timeout"]
    judged = detected + totals["survived"] + totals["untested"]
    print(f"  {'total':<44}" + "".join(f"{totals[c]:>11}" for c in COLUMNS))
    print(_score_line(f"score {name}", detected, judged, sample)
          + " detected (killed or timed out) of the mutants run")
    if chosen is not None and len(chosen) > judged + totals["suspicious"]:
        print(f"  {len(chosen) - judged - totals['suspicious']} of the {len(chosen)} chosen "
              "mutants did not run (interrupted): mutmut runs those with the fastest tests "
              "first, so the mutants that ran are not a uniform sample")
    equivalent = [m for m in undetected if m in _equivalent()]
    if equivalent:
        print(_score_line(f"score {name} without the {len(equivalent)} equivalent mutants "
                          f"({EQUIVALENT.relative_to(ROOT)})", detected,
                          judged - len(equivalent), sample))
    if undetected:
        (work / "survivors.txt").write_text(_diffs(work, undetected))
        print(f"  survivors' diffs: {(work / 'survivors.txt').relative_to(ROOT)}")
    return detected, judged


def _choose(work: Path, args: argparse.Namespace) -> list[str]:
    """The mutants to run: [] for all of them, else the named ones (globs expanded) or a random
    sample, recorded in chosen.json so that the report counts those only."""
    if not args.mutants and args.sample is None:
        return []
    population = _all_mutants(work)
    sample = None
    if args.mutants:
        names = [m for m in population if any(fnmatch.fnmatchcase(m, g) for g in args.mutants)]
        if not names:
            raise SystemExit(f"--mutants {args.mutants} match none of the {len(population)} "
                             "mutants")
    else:
        names = sorted(random.Random(args.seed).sample(population,
                                                       min(args.sample, len(population))))
        sample = {"seed": args.seed, "population": len(population), "size": len(names)}
        print(f"sample: {len(names)} of {len(population)} mutants (seed {args.seed})",
              flush=True)
    (work / "chosen.json").write_text(json.dumps({"sample": sample, "names": names}, indent=1))
    return names


def _parser() -> argparse.ArgumentParser:
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
                             "'src/decoder_audit/gate/checks/invariance.py'")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="run a uniform random sample of N mutants: an estimate, with its "
                             "95%% confidence interval")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--mutants", nargs="+", metavar="NAME",
                        help="run only these mutants (names or globs, as mutmut prints them)")
    parser.add_argument("--tag", help="use build/mutation/<package>-<tag>/, so that this run "
                        "leaves another run's folder (still running, or kept) alone")
    parser.add_argument("--report", action="store_true",
                        help="only print the last run's results, run nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = args.packages or list(PACKAGES)
    unknown = [name for name in names if name not in PACKAGES]
    if unknown:
        parser.error(f"unknown package(s) {unknown}; choose from {list(PACKAGES)}")
    if args.sample is not None and args.sample < 1:
        parser.error(f"--sample must be at least 1, got {args.sample}")
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        print("mutmut is not installed: pip install -c constraints.txt -e '.[dev]'",
              file=sys.stderr)
        return 2
    for name in names:
        work = SCRATCH / (f"{name}-{args.tag}" if args.tag else name)
        if not args.report:
            print(f"== {name}: mutating {', '.join(args.only or PACKAGES[name].mutate)}; tests "
                  f"{' '.join(PACKAGES[name].tests)}", flush=True)
            _snapshot(work, PACKAGES[name], args.commit, args.only)
            _run(work, args.jobs, _choose(work, args))
        if (work / "mutants").exists():
            _report(name, work)
        else:
            print(f"{name}: no results in {work.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
