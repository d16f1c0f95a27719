"""The run folder's metrics (training/state.py): a torn last line is dropped, a torn middle one named."""

from __future__ import annotations

import pytest

from decoder_audit.errors import RunFolderError
from decoder_audit.training.state import read_metrics, truncate_metrics


def test_a_torn_last_metrics_line_is_dropped_and_a_torn_middle_line_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "eval_loss": 2.0}\n{"step": 1, "loss": 1.9}\n{"step": 2, "lo')
    assert [row["step"] for row in read_metrics(path)] == [0, 1]
    truncate_metrics(path, 1)
    assert path.read_text() == '{"step": 0, "eval_loss": 2.0}\n{"step": 1, "loss": 1.9}\n'
    path.write_text('{"step": 0}\n{"ste\n{"step": 2}\n')
    with pytest.raises(RunFolderError, match=r"line 2 is not a metrics row"):
        read_metrics(path)
