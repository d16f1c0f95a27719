"""Devices (training/distributed.py): one this machine lacks is refused with its name."""

from __future__ import annotations

import pytest
import torch

import decoder_audit as da
from decoder_audit.training.distributed import resolve_device


@pytest.mark.parametrize("device, says", [
    ("tpu", "'tpu' is not a device decoder-audit trains on"),
    ("cuda:x", "'cuda:x' is not a device"),
])
def test_devices_that_do_not_exist(device, says):
    with pytest.raises(da.ConfigError, match=says):
        resolve_device(device, 0)
    if not torch.cuda.is_available():
        with pytest.raises(da.ConfigError, match="CUDA is not available on this machine"):
            resolve_device("cuda", 0)
    assert resolve_device("cpu", 0) == "cpu"
