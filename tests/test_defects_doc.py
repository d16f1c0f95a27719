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


def test_every_zoo_mutant_is_in_the_catalogue_with_its_check():
    listed = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| `([^`]+)` \|", DOC, re.M))
    for case in zoo.MUTANTS + zoo_generation.MUTANTS + zoo.VARIANT_MUTANTS:
        assert listed.get(case.name) == case.expect, case.name
    for style, defects in zoo_styles.DEFECTS.items():
        for defect, check in defects.items():
            assert listed.get(f"{style}:{defect}") == check, (style, defect)


def test_every_planted_defect_of_a_hugging_face_family_is_in_the_catalogue():
    import importlib.util

    pytest.importorskip("transformers")
    path = Path(__file__).resolve().parent / "gate" / "test_spec_families.py"
    spec = importlib.util.spec_from_file_location("test_spec_families_doc", path)
    families = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(families)
    listed = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| `([^`]+)` \|", DOC, re.M))
    for (family, defect), (_, check) in families.DEFECTS.items():
        assert listed.get(f"{family}:{defect}") == check, (family, defect)
    assert listed.get("gemma2:window ignored") == "oracle"  # its own test, spec read first


def test_every_planted_defect_of_transformer_lens_is_in_the_catalogue():
    import importlib.util

    pytest.importorskip("transformer_lens")
    path = Path(__file__).resolve().parent / "gate" / "test_spec_lens.py"
    spec = importlib.util.spec_from_file_location("test_spec_lens_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    listed = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| `([^`]+)` \|", DOC, re.M))
    for name, (_, _, check) in module.DEFECTS.items():
        assert listed.get(f"lens:{name}") == check, name
