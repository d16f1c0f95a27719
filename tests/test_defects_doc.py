"""docs/defects.md lists every planted defect of the zoos (a mutant added without a line there,
or a line left for a mutant removed, fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import zoo
import zoo_generation
import zoo_styles

DOC = (Path(__file__).resolve().parents[1] / "docs" / "defects.md").read_text()
# planted defect -> the check the catalogue says catches it
LISTED = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| `([^`]+)` \|", DOC, re.M))


def test_every_zoo_mutant_is_in_the_catalogue_with_its_check():
    for case in zoo.MUTANTS + zoo_generation.MUTANTS + zoo.VARIANT_MUTANTS:
        assert LISTED.get(case.name) == case.expect, case.name
    for style, defects in zoo_styles.DEFECTS.items():
        for defect, check in defects.items():
            assert LISTED.get(f"{style}:{defect}") == check, (style, defect)


def _test_module(name: str, folder: str = "gate"):
    """A test module of tests/FOLDER/ by file name, loaded for its tables of defects."""
    import importlib.util

    path = Path(__file__).resolve().parent / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_planted_defect_of_a_hugging_face_family_is_in_the_catalogue():
    pytest.importorskip("transformers")
    for (family, defect), (_, check) in _test_module("test_spec_families").DEFECTS.items():
        assert LISTED.get(f"{family}:{defect}") == check, (family, defect)
    assert LISTED.get("gemma2:window ignored") == "oracle"  # its own test, spec read first


def test_every_planted_defect_of_transformer_lens_is_in_the_catalogue():
    pytest.importorskip("transformer_lens")
    for name, (_, _, check) in _test_module("test_spec_lens").DEFECTS.items():
        assert LISTED.get(f"lens:{name}") == check, name


def test_every_defect_planted_in_the_families_table_is_in_the_catalogue():
    """The generic defects once (planted in every family of the table), each family's own by
    family:defect."""
    pytest.importorskip("transformers")
    module = _test_module("test_families", "references")
    for defect in module.GENERIC:
        assert LISTED.get(f"every family:{defect}") == "oracle", defect
    for (family, defect), (_, check) in module.SPECIFIC.items():
        assert LISTED.get(f"{family}:{defect}") == check, (family, defect)
