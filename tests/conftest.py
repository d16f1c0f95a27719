"""Shared test fixtures. Everything is offline and seeded."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import torch

# tests/ mirrors the package in folders (tests/model/, tests/gate/, ...); the modules they share
# (helpers, configs, the zoos, cli_support) live here, at the top.
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# Vendored reference data (tests/data/cs336/README.md says where it comes from and its licence).
CS336_REFERENCE = Path(__file__).resolve().parent / "data" / "cs336"

# The suite runs thousands of tiny-tensor ops; with an intra-op thread pool each one pays a
# cross-thread handoff that costs more than the op itself (10-50x slower on a loaded 2-core box).
torch.set_num_threads(1)

# A run started in the background by a shell without job control inherits SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler: the tests of what Ctrl-C does would see
# nothing. They test Python's own behaviour, so the suite runs with it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def cs336_reference() -> Path:
    """The folder of the CS336 snapshots. It is part of the repository: a missing file is an
    error (the test fails), never a reason to skip."""
    return CS336_REFERENCE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
