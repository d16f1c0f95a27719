"""docs/integrations.md's example outputs are what examples/trainers/ prints: each `$ python
examples/trainers/...` command of its text block is run (in this process, as its file runs) and
every line shown must be a line it printed. Decimal figures (a loss, a logit difference) are
left open: float32 kernels round differently from one CPU to another; every word, check name,
count and shape is compared as shown."""

from __future__ import annotations

import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "trainers"
FIGURE = re.compile(r"\d+\.\d+(?:e[+-]\d+)?")


def _shown() -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) of each `$ python examples/trainers/` command."""
    page = (ROOT / "docs" / "integrations.md").read_text()
    block = page[page.index("```text\n$ python examples/trainers/trainer.py"):]
    block = block[len("```text\n"):block.index("\n```")]
    runs = re.split(r"^\$ ", block, flags=re.M)[1:]
    return [(run.splitlines()[0], run.splitlines()[1:]) for run in runs]


def _open(line: str) -> str:
    return FIGURE.sub("#", line.rstrip())


@pytest.mark.parametrize("command, shown", _shown(), ids=lambda v: v if isinstance(v, str)
                         else None)
def test_each_example_prints_what_the_page_shows(command, shown, capsys, monkeypatch, tmp_path):
    script, *args = shlex.split(command)[1:]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [script, *args, "--out", str(tmp_path)]
                        if script.endswith("trainer.py") else [script, *args])
    runpy.run_path(str(ROOT / script), run_name="__main__")
    printed = {_open(line) for line in capsys.readouterr().out.splitlines()}
    missing = [line for line in shown if _open(line) not in printed]
    assert not missing, missing
