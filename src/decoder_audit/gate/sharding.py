"""The gate on a model sharded with FSDP2 (`decoder-audit verify --shard` under torchrun).

Every rank runs the same checks on the same probes against the same weights, so every rank asks
for the same collectives in the same order: the gathers of a block's weights that FSDP2 does
around each forward and backward, and the gathers here, where a check reads a whole weight or
gradient (the oracle, one stage at a time; the tied gradient; the dead-parameter sizes). What a
check concludes is then the same on every rank, and rank 0 reports it.
"""

from __future__ import annotations

import sys
import time

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


# How long a rank whose model call raised waits for every other rank to report the same call
# raising too. Ranks run the same calls in lockstep (they meet at every gather of a block), so
# a failure of the model's is reported by all of them within moments; a peer that does not
# report is inside a collective this rank will never join.
AGREE_TIMEOUT_S = 10.0


class RankFailed(BaseException):
    """A sharded audit's rank raised where its peers did not (their collectives no longer
    match, and a peer waits in one for this rank): a BaseException, so no check takes it for
    the model's evidence; the runner ends the audit with RanksDisagree."""


class RanksDisagree(RuntimeError):
    """A sharded audit stopped: one rank raised where the others did not, so the ranks can no
    longer run the same collectives; the message names the rank, where, and the exception."""


_audits = [0]  # audits begun in this process: the same count on every rank


def new_audit_key() -> str:
    """A key for one audit, the same on every rank (each rank begins the same audits)."""
    _audits[0] += 1
    return f"decoder_audit/audit{_audits[0]}"


def several_ranks(model_sharded: bool) -> bool:
    return model_sharded and dist.is_available() and dist.is_initialized() and \
        dist.get_world_size() > 1


def agree_on_failure(key: str, where: str, exc: BaseException) -> None:
    """On a model sharded over several ranks, after `exc` was raised at `where` (a model call
    or a check, named alike on every rank): returns when every rank reports raising there too
    (the model's own failure, the same everywhere: the ranks' collectives still match, and the
    failure is evidence as it is unsharded); raises RankFailed when some rank does not report
    within AGREE_TIMEOUT_S. The reports go through the process group's store, not a
    collective (a peer blocked in one would never answer)."""
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    said = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    store.set(f"{key}/{where}/{rank}", said)
    others = [f"{key}/{where}/{r}" for r in range(world) if r != rank]
    if not store_reports(store, others, AGREE_TIMEOUT_S):  # the peers ran on
        raise RankFailed(f"rank {rank} raised {said} in {where}, where the other ranks did not "
                         f"(none reported it within {AGREE_TIMEOUT_S:g} s): a sharded audit "
                         "cannot go on once its ranks' collectives differ; rerun without "
                         "--shard to see the model's failure in full") from exc


def store_reports(store, keys: list[str], seconds: float) -> bool:
    """Whether every key appears in `store` within `seconds` (polled: a store's own wait logs a
    warning of its own when it times out)."""
    deadline = time.monotonic() + seconds
    while not store.check(keys):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
