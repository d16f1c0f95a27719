"""docs/defects.md lists every planted defect of the zoos (a mutant added without a line there,
or a line left for a mutant removed, fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import zoo
import zoo_generation
import zoo_styles

DOC = (Path(__file__).resolve().parents[1] / "docs" / "defects.md").read_text()


def test_every_zoo_mutant_is_in_the_catalogue_with_its_check():
    listed = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| `([^`]+)` \|", DOC, re.M))
    for case in zoo.MUTANTS + zoo_generation.MUTANTS:
        assert listed.get(case.name) == case.expect, case.name
    for style, defects in zoo_styles.DEFECTS.items():
        for defect, check in defects.items():
            assert listed.get(f"{style}:{defect}") == check, (style, defect)
