"""How `train` under torchrun ends its process groups (issue 26: `torchrun --nproc_per_node 2
decoder-audit train --shard` exited 1 in about 2 of 7 runs, rank 1 aborting at teardown with
"terminate called without an active exception"). `distributed.close` must: wait at a barrier for
every rank, free FSDP2's reference cycles (which hold the groups) while the groups still work,
then destroy the groups this process created, and only those.

(These test training/distributed.py; they belong in tests/training/, which this change could not
edit.)"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist

import decoder_audit as da
from decoder_audit.training import distributed
from decoder_audit.training.distributed import RankInfo


@pytest.fixture
def no_automatic_gc():
    """Reference cycles are freed only by an explicit gc.collect() while the test runs."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


class HoldsTheGroup:
    """Stands for FSDP2's sharded module: a reference cycle (its hooks hold its state) that
    holds the process group until a collection frees it."""

    def __init__(self, calls: list) -> None:
        self.calls, self.me = calls, self

    def __del__(self) -> None:
        self.calls.append("freed")


def test_close_waits_for_every_rank_then_frees_what_holds_the_group_then_destroys_it(
        monkeypatch, no_automatic_gc):
    calls: list = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(distributed.dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(distributed.dist, "monitored_barrier",
                        lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group",
                        lambda group=None: calls.append(("destroy", group)))
    HoldsTheGroup(calls)  # unreachable at once, but alive: a cycle
    distributed.close(RankInfo(rank=1, world_size=2, owns_group=True, sharded=True))
    assert calls == ["barrier", "freed", ("destroy", None)]


def test_close_of_a_failed_run_still_destroys_the_group_when_the_barrier_fails(monkeypatch):
    calls: list = []

    def peer_gone(*args, **kwargs):
        raise RuntimeError("[gloo] Connection closed by peer")

    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(distributed.dist, "monitored_barrier", peer_gone)
    monkeypatch.setattr(distributed.dist, "destroy_process_group",
                        lambda group=None: calls.append(("destroy", group)))
    distributed.close(RankInfo(rank=0, world_size=2, owns_group=True))
    assert calls == [("destroy", None)]


def test_close_on_the_way_out_of_a_failure_does_not_wait_for_peers(monkeypatch):
    calls: list = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(distributed.dist, "monitored_barrier",
                        lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group",
                        lambda group=None: calls.append(("destroy", group)))
    with pytest.raises(ValueError):
        try:
            raise ValueError("rank 0 failed alone; its peer is elsewhere")
        finally:  # as train() calls it
            distributed.close(RankInfo(rank=0, world_size=2, owns_group=True))
    assert calls == [("destroy", None)]


def test_close_ends_the_mesh_group_shard_model_made_and_not_a_group_it_joined(monkeypatch):
    """On a machine with CUDA, a gloo run's device mesh makes a group of its own; a process that
    joined a default group someone else made (owns_group False) ends that one only."""
    from torch.distributed import device_mesh

    real_init = device_mesh.init_device_mesh

    def as_on_a_cuda_host(*args, **kwargs):
        with monkeypatch.context() as patched:
            patched.setattr(torch.cuda, "is_available", lambda: True)
            return real_init(*args, **kwargs)

    monkeypatch.setattr(device_mesh, "init_device_mesh", as_on_a_cuda_host)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ranks = distributed.init_distributed("cpu", shard=True)
        assert not ranks.owns_group  # it joined the group this test made
        model = distributed.shard_model(da.Decoder(da.preset("tiny-368")), ranks, "cpu")
        names = dist.distributed_c10d._world.pg_names
        made = [group for group in names if group is not dist.group.WORLD]
        assert len(made) == 1, names  # the mesh's own group
        del model
        distributed.close(ranks)
        assert dist.is_initialized() and list(names) == [dist.group.WORLD]
    finally:
        dist.destroy_process_group()
