"""Shared test fixtures. Everything is offline and seeded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# The project's shared/ folder sits beside the checkout (../shared); CI lays a copy there too.
SHARED = Path(os.environ.get("DECODER_AUDIT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
CS336_REFERENCE = SHARED / "reference" / "cs336"

# The suite runs thousands of tiny-tensor ops; with an intra-op thread pool each one pays a
# cross-thread handoff that costs more than the op itself (10-50x slower on a loaded 2-core box).
torch.set_num_threads(1)


@pytest.fixture
def cs336_reference() -> Path:
    if not (CS336_REFERENCE / "snapshots").is_dir():
        pytest.skip(f"CS336 reference data not found at {CS336_REFERENCE} "
                    "(set DECODER_AUDIT_SHARED to the shared/ folder)")
    return CS336_REFERENCE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
