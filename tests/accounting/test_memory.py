"""Will it fit (accounting/memory.py): checked from the analytic count, before allocating."""

from __future__ import annotations

import pytest

import decoder_audit as da
from decoder_audit.accounting.memory import check_fits


def test_memory_is_checked_from_the_analytic_count():
    cfg = da.preset("tiny-368")
    check_fits(cfg, available=368 * 4)  # exactly fits
    with pytest.raises(da.ConfigError, match=r"need 0.0 GB \(368 parameters x 4 bytes x 4\), "
                                             r"but only 0.0 GB is available"):
        check_fits(cfg, copies=4, what="training", available=368 * 4)
