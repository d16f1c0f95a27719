"""The gate inside a distributed Trainer run (torchrun, 2 CPU processes): each process runs the
gate once, rank 0 audits the model and writes the report once, each rank audits its own batches,
and every rank refuses when any rank's batches fail, naming the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from helpers import torchrun  # noqa: E402

SCRIPT = Path(__file__).with_name("ddp_trainer.py")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_two_processes_gate_once_each_report_once_and_refuse_together(tmp_path):
    proc = torchrun(str(SCRIPT), str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["gates"] for r in ranks] == [1, 1]  # once per process
    assert [r["model_report"] for r in ranks] == [True, False]  # rank 0 audits the model
    # rank 1's batches are wrong, rank 0's right: both refuse before any step, naming shift
    assert [r["refused"] for r in ranks] == ["shift", "shift"]
    assert [r["step"] for r in ranks] == [0, 0]
    assert ranks[0]["world_size"] == 2 and ranks[0]["global_batch"] == 2 * 1 * 2
    written = [p.name for p in tmp_path.iterdir()]
    assert sorted(written) == ["decoder-audit", "rank0.json", "rank1.json"]
    verdict = json.loads((tmp_path / "decoder-audit" / "gate.json").read_text())
    assert verdict["refused"] == ranks[0]["failed"] == ranks[1]["failed"]
    assert verdict["refused"][0] == "shift" and verdict["model"]["passed"] is True
    assert proc.stderr.count("gate: ") - proc.stderr.count("gate: running") >= 1
