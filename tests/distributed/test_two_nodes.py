"""The two-node check's comparison (tests/distributed/two_nodes.py, run by .ci/distributed):
it must name a difference in a loss, a check's verdict or a weight, down to the last bit, and
find none between equal runs. The launches themselves are .ci/distributed's (minutes)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
import two_nodes  # noqa: E402


def test_a_loss_one_bit_apart_is_a_difference():
    row = {"step": 3, "loss": 1.25, "eval_loss": 1.5, "grad_norm": 0.5, "lr": 0.01}
    nudged = {**row, "loss": float(torch.nextafter(torch.tensor(1.25, dtype=torch.float64),
                                                   torch.tensor(2.0, dtype=torch.float64)))}
    assert two_nodes.differences({3: row}, {3: dict(row)}, "step") == []
    found = two_nodes.differences({3: row}, {3: nudged}, "step")
    assert len(found) == 1 and "3" in found[0] and "1.25" in found[0]


def test_a_check_verdict_or_a_missing_check_is_a_difference():
    one = {"causal": ("pass", "ok"), "oracle": ("pass", "ok")}
    assert two_nodes.differences(one, {"causal": ("fail", "ok"), "oracle": ("pass", "ok")},
                                 "verify")[0].startswith("verify causal")
    assert "oracle" in two_nodes.differences(one, {"causal": ("pass", "ok")}, "verify")[0]


def test_a_weight_one_bit_apart_is_a_difference(tmp_path):
    weights = {"w": torch.ones(3)}
    changed = {"w": torch.tensor([1.0, float(torch.nextafter(torch.tensor(1.0),
                                                             torch.tensor(2.0))), 1.0])}
    for name, tensors in (("a", weights), ("b", weights), ("c", changed)):
        (tmp_path / name).mkdir()
        save_file(tensors, tmp_path / name / "model.safetensors")
    assert two_nodes.weight_differences(tmp_path / "a", tmp_path / "b") == []
    found = two_nodes.weight_differences(tmp_path / "a", tmp_path / "c")
    assert len(found) == 1 and "w" in found[0]
