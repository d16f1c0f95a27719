"""`verify --shard` under torchrun ends with one line however a rank fails: a failure of one
rank alone reaches the run (the rank says it, naming itself, and exits; torchrun stops the
others) instead of leaving a peer in a collective for gloo's 30 minutes; a failure every rank
shares is said once, by rank 0."""

from __future__ import annotations

import textwrap
import time

import pytest
import torch
from helpers import cli_path, torchrun

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed missing")

FAILS_ON_RANK_1 = textwrap.dedent("""
    import os
    import decoder_audit as da

    class FailsOnRank1(da.Decoder):
        def forward(self, *args, **kwargs):
            if os.environ.get("RANK") == "1":
                raise RuntimeError("rank 1's forward broke")
            return super().forward(*args, **kwargs)

    def build():
        return FailsOnRank1(da.preset("tiny-368"))

    def plain():
        import torch
        return torch.nn.Linear(5, 5)
""")


def _ours(stderr: str) -> list[str]:
    """decoder-audit's own lines (torchrun adds its report of the failed ranks after them)."""
    return [line for line in stderr.splitlines() if line.startswith("decoder-audit verify")]


def test_a_failure_of_one_rank_ends_the_run_with_one_line_naming_it(tmp_path):
    factory = tmp_path / "models.py"
    factory.write_text(FAILS_ON_RANK_1)
    started = time.monotonic()
    proc = torchrun("--no-python", cli_path(), "verify", "--model", f"{factory}:build",
                    "--shard", timeout=240)
    assert time.monotonic() - started < 180  # not gloo's 30 minutes
    assert proc.returncode != 0 and proc.stdout == ""
    lines = _ours(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "rank 1" in lines[0] and "rank 1's forward broke" in lines[0]


def test_a_failure_every_rank_shares_is_said_once_by_rank_0(tmp_path):
    factory = tmp_path / "models.py"
    factory.write_text(FAILS_ON_RANK_1)
    proc = torchrun("--no-python", cli_path(), "verify", "--model", f"{factory}:plain",
                    "--vocab-size", "5", "--shard", timeout=240)
    lines = _ours(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Linear" in lines[0] and "--shard" in lines[0] and "rank" not in lines[0]


def test_train_says_a_failure_every_rank_shares_once(tmp_path):
    factory = tmp_path / "models.py"
    factory.write_text(FAILS_ON_RANK_1)
    proc = torchrun("--no-python", cli_path(), "train", "--model", f"{factory}:plain",
                    "--vocab-size", "5", "--max-seq-len", "4", "--shard", "--steps", "1",
                    "--out", str(tmp_path / "run"), timeout=240)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("decoder-audit train")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert "Linear" in lines[0] and "--shard" in lines[0]
