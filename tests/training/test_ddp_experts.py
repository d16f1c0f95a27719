"""A routed-expert Decoder trains under DistributedDataParallel: 2 CPU processes (gloo, on
127.0.0.1 only), 8 experts of which a step's 2 x 4 tokens per rank reach only some. Before every
expert ran on its tokens, even none, DDP stopped at the second step ("Expected to have
finished reduction in the prior iteration"): an expert no token reached had no gradient."""

from __future__ import annotations

import configs
import pytest
import torch
from helpers import cli_path, torchrun

import decoder_audit as da


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_two_process_ddp_trains_a_routed_decoder(tmp_path):
    # 2 per token: with one, renormalised, every weight is 1 and the router gets no gradient
    cfg = configs.named("moe-sigmoid-bias").replace(n_experts=8, experts_per_token=2,
                                                    n_shared_experts=0)
    cfg.save(tmp_path / "moe.json")
    out = tmp_path / "run"
    proc = torchrun("--no-python", cli_path(), "train", "--config", str(tmp_path / "moe.json"),
                    "--out", str(out), "--steps", "4", "--batch-size", "4", "--no-progress",
                    timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "distributed: 2 processes" in proc.stdout
    trained = da.load_checkpoint(out / "checkpoint")
    assert trained.config == cfg
