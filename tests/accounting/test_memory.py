"""Will it fit (accounting/memory.py): checked from the analytic count, before allocating."""

from __future__ import annotations

import pytest

import decoder_audit as da
from decoder_audit.accounting.memory import check_fits, check_logits_fit
from decoder_audit.training import train


def test_memory_is_checked_from_the_analytic_count():
    cfg = da.preset("tiny-368")
    check_fits(cfg, available=368 * 4)  # exactly fits
    with pytest.raises(da.ConfigError, match=r"need 0.0 GB \(368 parameters x 4 bytes x 4\), "
                                             r"but only 0.0 GB is available"):
        check_fits(cfg, copies=4, what="training", available=368 * 4)


def test_a_forwards_logits_are_checked_against_the_memory_before_anything_runs():
    """3 rows x 5 tokens x 7 values x 4 bytes = 420 bytes: 420 fit, 419 do not."""
    check_logits_fit(3, 5, 7, element_bytes=4, available=420)
    with pytest.raises(da.ConfigError) as caught:
        check_logits_fit(3, 5, 7, element_bytes=4, available=419, what="batch_size=3")
    assert "batch_size=3" in str(caught.value) and "7 values" in str(caught.value)


def test_a_batch_whose_logits_outgrow_the_machine_is_refused_before_the_gate(tmp_path, capsys):
    """train --batch-size 10^18 stalled in the gate's training-shape probe (10^18 rows cut to
    what the memory holds: hundreds of millions of rows of the tiny model); its logits alone
    (10^18 x 4 x 8 x 4 bytes) exceed any machine, so it is refused naming the value, before a
    weight is built or the run folder is written."""
    out = tmp_path / "run"
    with pytest.raises(da.ConfigError) as caught:
        train("tiny-368", out=out, steps=1, batch_size=10**18, progress=False, verbose=False)
    assert f"batch_size={10**18}" in str(caught.value)
    assert not out.exists()
    assert "gate:" not in capsys.readouterr().out
