"""The README's deterministic outputs are what the commands print (a stale figure is a defect):
the verify example's verdict, counts and rerun line, and the presets table's parameter counts."""

from __future__ import annotations

import re
from pathlib import Path

from decoder_audit.cli import main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_verify_example_is_what_verify_prints(capsys):
    block = README[README.index("A passing run ends like this"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    assert main(["verify", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    verdict, cost, rerun = [line for line in block.strip().splitlines()]
    assert verdict in printed and rerun in printed
    counts = re.sub(r"cost: [\d.]+ s, ", "", cost)  # the seconds are the machine's
    assert counts in printed, (counts, [line for line in printed.splitlines() if "cost" in line])


def test_the_presets_table_counts_are_the_ledgers(capsys):
    import decoder_audit as da

    rows = re.findall(r"^\| `([\w-]+)` \|.*\| ([\d,]+) \|$", README, re.M)
    assert len(rows) == len(da.preset_names())
    for name, count in rows:
        assert da.parameter_ledger(da.preset(name)).total == int(count.replace(",", "")), name


def test_the_learner_example_is_what_verify_prints(capsys):
    block = README[README.index("is a hand-written tied GPT and its spec"):]
    command = block[block.index("```bash") + 7:]
    command, rest = command[:command.index("```")].strip(), command[command.index("```") + 3:]
    verdict = rest[rest.index("```") + 3:]
    verdict = verdict[:verdict.index("```")].strip()
    args = command.split()[1:]
    assert main([*args, "--no-progress"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    assert verdict in printed


def test_the_spec_mutant_count_is_the_zoos():
    import zoo_styles

    count = sum(len(defects) for defects in zoo_styles.DEFECTS.values())
    found = re.search(r"(\d+) mutants\), the gate with the spec catches (\d+) of (\d+)", README)
    assert found and {int(n) for n in found.groups()} == {count}
