"""The gate on a model sharded with FSDP2 (`decoder-audit verify --shard` under torchrun).

Every rank runs the same checks on the same probes against the same weights, so every rank asks
for the same collectives in the same order: the gathers of a block's weights that FSDP2 does
around each forward and backward, and the gathers here, where a check reads a whole weight or
gradient (the oracle, one stage at a time; the tied gradient; the dead-parameter sizes). What a
check concludes is then the same on every rank, and rank 0 reports it.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor: a weight (or gradient) of a model sharded with FSDP2, 1/N of it on this rank.
    Asked of sys.modules: where torch.distributed.tensor was never imported no tensor is one,
    and importing it would bring sympy into every audit (about a second)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a sharded one gathered from every rank (a collective), any other as it
    is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a sharded tensor, any other tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def on_every_rank(flag: bool, like: torch.Tensor) -> bool:
    """`flag` if it holds on every rank (a collective when `like` is sharded): a fact read from
    this rank's pieces alone (two weights with equal values) is the model's only if every rank
    finds it, and every rank must decide it alike."""
    if not is_sharded(like):
        return flag
    vote = torch.tensor([int(flag)], device=local(like).device)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    return bool(vote.item())


def class_name(model: nn.Module) -> str:
    """The model's own class name: FSDP2's fully_shard makes a module an instance of a class it
    derives on the fly (FSDPDecoder), which names the wrapping, not the model."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported: nothing was sharded
    if fsdp is None:
        return type(model).__name__
    own = next((c for c in type(model).__mro__ if not issubclass(c, fsdp.FSDPModule)),
               type(model))
    return own.__name__
