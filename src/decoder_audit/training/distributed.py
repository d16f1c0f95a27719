"""Processes and devices: the process group under torchrun, each rank's device, DDP.

Under torchrun (WORLD_SIZE > 1) the process group is initialised (gloo on CPU, nccl on CUDA), the
model is wrapped in DistributedDataParallel after the gate, every rank draws the same global batch
and trains on its own contiguous rows (`data.shard`), and DDP averages the gradients (equal rows
per rank, so the average of the ranks' mean losses is the global mean loss). Only rank 0 prints,
writes metrics and checkpoints.

The weights equal single-process training with the same global batch up to float32 summation
order: after 40 steps of the counting task the largest weight difference is 6e-7 (the test allows
1e-5), after 100 steps ~3e-6. Over a full 400-step run the difference grows to ~0.2 while the final
loss agrees to 4 digits: the escape from the loss plateau (steps ~60-150) amplifies last-bit
differences. A single process run on 2 threads instead of 1 diverges from itself by the same
amount (0.19), so this is float32 reordering, not DDP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the run: its rank, how many there are, its GPU index, and whether
    this call created the process group (and so must destroy it)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(device: str, local_rank: int) -> str:
    """"auto": this rank's GPU if there is one, else the CPU; "cuda": this rank's GPU;
    "cuda:N", "cpu". Anything else, or a GPU this machine lacks, is a ConfigError, raised before
    the gate runs."""
    if device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r} is not a device decoder-audit trains on; use cpu, "
                          "cuda, cuda:N or auto")
    if parsed.type == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device!r}: CUDA is not available on this machine "
                          "(torch.cuda.is_available() is False); use --device cpu")
    index = local_rank if parsed.index is None else parsed.index
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s), so there is no cuda:{index}")
    return f"cuda:{index}"


def init_distributed(device: str) -> RankInfo:
    """Join (or create) the process group torchrun describes; one process without torchrun."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank())
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return RankInfo()
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":  # before any collective: each rank owns its own GPU
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend=backend)
    return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank(), owns_group=True)


def close(ranks: RankInfo) -> None:
    if ranks.owns_group:
        dist.destroy_process_group()


def share_from_main(ranks: RankInfo, values: list[Any]) -> list[Any]:
    """Rank 0's `values` on every rank (picklable objects; in place, also returned)."""
    if ranks.distributed:
        dist.broadcast_object_list(values, src=0)
    return values


def wrap(model: nn.Module, ranks: RankInfo, device: str) -> nn.Module:
    """The module the loop calls: DistributedDataParallel over `model` when there are several
    ranks (it averages the gradients in backward), else `model` itself."""
    if not ranks.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[ranks.local_rank] if device.startswith("cuda") else None)


def global_mean(value: torch.Tensor, ranks: RankInfo) -> torch.Tensor:
    """The mean of a scalar over the ranks (the global batch's mean loss, for the log)."""
    if not ranks.distributed:
        return value
    total = value.clone()
    dist.all_reduce(total)
    return total / ranks.world_size


def barrier(ranks: RankInfo) -> None:
    if ranks.distributed:
        dist.barrier()
