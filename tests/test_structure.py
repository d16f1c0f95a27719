"""The package's layering and size rules, read from the source by tools/structure.py.

Each rule is also checked against a small package written here that breaks it, so a rule that
stopped seeing its violation would fail too.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import structure  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def ours() -> structure.Structure:
    return structure.read(ROOT / "src")


def test_the_import_graph_has_no_loop(ours):
    assert ours.loops() == []


def test_arrows_point_one_way(ours):
    assert ours.upward() == []


def test_no_function_is_over_the_limit(ours):
    assert ours.long_functions() == []


def test_the_top_level_holds_few_modules_and_every_room_has_a_layer(ours):
    rooms = ours.rooms()
    top = [room for room, modules in rooms.items() if modules == [f"decoder_audit.{room}"]]
    assert len(top) + 1 <= 8, top  # the package's own __init__ counts too
    assert {"model", "references", "accounting", "storage", "text", "generation", "gate",
            "training", "cli"} <= set(rooms)
    assert set(rooms) <= {room for layer in structure.LAYERS for room in layer}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "decoder_audit" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_each_rule_sees_its_violation(tmp_path):
    long_body = "\n".join(f"    x{i} = {i}" for i in range(structure.MAX_FUNCTION_LINES))
    src = _write(tmp_path, {
        "__init__.py": "",
        "model/__init__.py": "",
        "model/decoder.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from .trace import Trace\n",
        "model/trace.py": "from .decoder import Decoder\n",  # a loop through a type-only import
        "training/__init__.py": "", "training/loop.py":
            "from ..cli.common import console\nfrom ..gate.subject import Subject\n"
            f"def long():\n{long_body}\n",
        "cli/__init__.py": "", "cli/common.py": "console = None\n",
        "gate/__init__.py": "from .subject import Subject\n", "gate/subject.py": "Subject = 1\n",
        "config.py": "from .model.decoder import Decoder\n",  # up a layer
        "storage.py": "from .accounting import ledger\n",  # sideways: the same layer
        "accounting/__init__.py": "", "accounting/ledger.py": "",
        "attic.py": "x = 1\n" * (structure.LONG_FILE_LINES + 1),  # a room no layer holds
    })
    broken = structure.read(src)
    assert broken.loops() == [["decoder_audit.model.decoder", "decoder_audit.model.trace"]]
    up = broken.upward()
    assert any("decoder_audit.training.loop imports decoder_audit.cli.common" in line for line in up)
    assert any("decoder_audit.training.loop reaches into decoder_audit.gate.subject" in line
               for line in up)
    assert any(line.startswith("decoder_audit.config imports decoder_audit.model") for line in up)
    assert any(line.startswith("decoder_audit.storage imports decoder_audit.accounting")
               for line in up)
    assert any("'attic'" in line for line in up)
    # the storage import names two modules (accounting and accounting.ledger): two arrows
    assert len(up) == 6, up
    assert len(broken.long_functions()) == 1 and "long()" in broken.long_functions()[0]
    # a long file is reported, and is not among the problems
    assert [line.split("/")[-1] for line in broken.long_files()] == [
        f"attic.py: {structure.LONG_FILE_LINES + 1} lines"]
    # the package's own submodule imports and `import decoder_audit.gate` are not violations
    assert "decoder_audit.gate" not in {t for t in broken.arrows["decoder_audit.gate"]}
