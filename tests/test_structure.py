"""The package's layering and size rules (issue 10), read from the source by tools/structure.py.

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


# Over the limits today, each still to be split; the list may only shrink: a new entry fails,
# and so does an entry that is no longer over (take it off the list).
KNOWN_OVERSIZED: set[str] = set()


def _key(line: str) -> str:
    """"path: N lines ..." -> "path: file"; "path:LINE name(): N lines ..." -> "path name()"."""
    head = line.split(": ")[0]  # "…/decoder_audit/x.py" or "…/decoder_audit/x.py:12 name()"
    path, _, where = head.partition(".py")
    relative = path.split("decoder_audit/")[-1] + ".py"
    return f"{relative}: file" if not where else f"{relative} {where.split(' ')[1]}"


def test_no_function_or_file_over_the_limits(ours):
    found = {_key(line) for line in ours.oversized()}
    assert found - KNOWN_OVERSIZED == set(), "new functions or files over the limits"
    assert KNOWN_OVERSIZED - found == set(), "no longer over the limits: take them off the list"


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
        "model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from .trace import Trace\n",
        "trace.py": "from .model import Decoder\n",  # a loop through a type-only import
        "training.py": "from .cli.common import console\nfrom .gate.subject import Subject\n"
                       f"def long():\n{long_body}\n",
        "cli/__init__.py": "", "cli/common.py": "console = None\n",
        "gate/__init__.py": "from .subject import Subject\n", "gate/subject.py": "Subject = 1\n",
        "big.py": "x = 1\n" * (structure.MAX_FILE_LINES + 1),
    })
    broken = structure.read(src)
    assert broken.loops() == [["decoder_audit.model", "decoder_audit.trace"]]
    assert broken.upward() == [
        "decoder_audit.training imports the command line (decoder_audit.cli.common)",
        "decoder_audit.training reaches into decoder_audit.gate.subject",
    ]
    oversized = broken.oversized()
    assert len(oversized) == 2
    assert "big.py" in oversized[0] and "training.py" in oversized[1] and "long()" in oversized[1]
    # the package's own submodule imports and `import decoder_audit.gate` are not violations
    assert "decoder_audit.gate" not in {t for t in broken.arrows["decoder_audit.gate"]}
