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

With `shard` (FSDP2, `torch.distributed.fsdp.fully_shard`) each block is sharded, then the root
(the embeddings, final norm and readout, one group): every Parameter becomes a DTensor split
along dim 0 over the ranks, so each rank holds 1/N of the weights, gradients and AdamW state and
gathers a block's weights just before using it. The gradients are reduce-scattered as averages,
the same arithmetic as DDP up to float32 summation order (tests/test_train_shard.py). A tied
readout stays the embedding's Parameter: FSDP2 puts one sharded Parameter back into every module
that held the shared one, which `shard_model` checks. One process may shard too (a one-rank
group on an in-process store): nothing is split, but the run takes the sharded code path.
Checkpoints of a sharded run are sharded (storage/sharded.py: each rank writes its own rows with
torch.distributed.checkpoint), and either kind of run resumes the other's on any world size.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from ..gate import store_reports
from ..model.decoder import Decoder


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the run: its rank, how many there are, its GPU index, whether
    this call created the process group (and so must destroy it), and whether the model is
    sharded (FSDP2: then every rank takes part in each forward pass, evaluation and save)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False
    sharded: bool = False

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


def init_distributed(device: str, *, shard: bool = False) -> RankInfo:
    """Join (or create) the process group torchrun describes; one process without torchrun.
    With `shard` one process gets a one-rank group too (FSDP2 needs one), on an in-process
    store: no address or port is opened."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank(), sharded=shard)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and not shard:
        return RankInfo()
    if not dist.is_available():
        raise ConfigError("--shard needs torch.distributed, which this PyTorch build lacks "
                          "(torch.distributed.is_available() is False)")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":  # before any collective: each rank owns its own GPU
        torch.cuda.set_device(local_rank())
    if world_size <= 1:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(backend=backend)
    return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank(), owns_group=True,
                    sharded=shard)


# How long a rank waits at the barrier that ends a run for its peers to reach it (rank 0 turns a
# sharded model's gathered weights into a Decoder first): past it, a rank whose peer failed still
# tears its own group down and reports its own error.
TEARDOWN_BARRIER_TIMEOUT = timedelta(minutes=5)

# The groups shard_model's device mesh created beside the default one (on a machine with CUDA, a
# gloo run's mesh makes its own, "mesh_default"): this process made them, so close() ends them.
_MESH_GROUPS: list[Any] = []


def close(ranks: RankInfo) -> None:
    """End the process groups this process created, in an order that lets every rank exit
    cleanly (with the groups left to interpreter exit, a rank whose gloo threads were still
    running aborted there: "terminate called without an active exception", exit 1):
      1. a barrier: no rank tears its connections down while a peer is still inside the run's
         last collective (a sharded run's final gather); skipped on the way out of a failure
         (close runs in train's `finally`), where a peer may never come;
      2. gc.collect(): FSDP2's sharded modules are reference cycles (its hooks hold its state),
         alive until a collection, and their DTensors, FSDP state and device mesh hold the
         groups: freed here, while the groups still work, not at interpreter exit;
      3. the groups destroyed: all of them when this process created the default group (the
         mesh's go first, destroy_process_group ends them newest first), else only the mesh
         groups shard_model made: a group this process joined is its creator's to end."""
    created = list(_MESH_GROUPS)
    _MESH_GROUPS.clear()
    if not (ranks.owns_group or created) or not (dist.is_available() and dist.is_initialized()):
        return
    if ranks.distributed and sys.exc_info()[1] is None:  # a run that ended, not one failing
        _teardown_barrier()
    gc.collect()
    if ranks.owns_group:
        dist.destroy_process_group()
        return
    for group in reversed(created):
        dist.destroy_process_group(group)


def _teardown_barrier() -> None:
    """Every rank at the end of the run before any ends its group. Bounded on gloo (a monitored
    barrier) and never raising: close() runs on the way out of a failed run too, where its own
    error is the one to report."""
    with contextlib.suppress(Exception):  # a peer that failed: its error is reported, not this
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=TEARDOWN_BARRIER_TIMEOUT)
        else:
            dist.barrier()


# How long a failing rank other than 0 waits for rank 0 to report a failure of its own before
# it says its failure itself: the same failure on every rank is said once, by rank 0; a failure
# of this rank alone is said by it (rank 0 is then inside a collective it will never finish, and
# torchrun stops it when this rank exits).
FAILURE_WAIT_S = 5.0


def says_failure(ranks: RankInfo, exc: BaseException) -> bool:
    """Whether this rank is the one to say `exc`, the error its run ended with (one line for
    the whole run): always in one process; under torchrun rank 0 says its own, and another
    rank its own only when rank 0 reports none within FAILURE_WAIT_S, or when it raised where
    the others did not (RanksDisagree: rank 0 is stuck in a collective). Every failing rank
    records its failure in the process group's store first."""
    if not ranks.distributed or not (dist.is_available() and dist.is_initialized()):
        return True
    from ..gate import RanksDisagree

    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"decoder_audit/failed/{ranks.rank}", type(exc).__name__)
        if ranks.is_main or isinstance(exc, RanksDisagree):
            return True
        return not store_reports(store, ["decoder_audit/failed/0"], FAILURE_WAIT_S)
    except Exception:  # noqa: BLE001 - no store: this rank says it
        return True


def hold_store_for_peers(ranks: RankInfo) -> None:
    """On rank 0, once it has said the run's failure: wait (at most FAILURE_WAIT_S) until every
    other rank has recorded its own. The group's store lives in this process, so a rank 0 that
    ended at once left a slower rank no store to read its report from, or no group to join:
    that rank then said a failure of its own (the gloo error of a peer gone)."""
    if not (ranks.distributed and ranks.is_main and dist.is_available() and dist.is_initialized()):
        return
    with contextlib.suppress(Exception):  # no store: nothing to hold
        store = dist.distributed_c10d._get_default_store()
        store_reports(store, [f"decoder_audit/failed/{rank}"
                              for rank in range(1, ranks.world_size)], FAILURE_WAIT_S)


def abandon(code: int) -> None:
    """End this failed rank's process now, without waiting for its peers (a peer may be inside
    a collective that will never complete: the process group's teardown and the interpreter's
    exit would wait on it); torchrun then stops the other ranks. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    # the interpreter's own _exit: os._exit is turned into an exception while a command runs
    # (sources.hard_exits_raise: user code must not end the command), and this is not user code
    (sys.modules.get("posix") or sys.modules["nt"])._exit(code)


def share_from_main(ranks: RankInfo, values: list[Any]) -> list[Any]:
    """Rank 0's `values` on every rank (picklable objects; in place, also returned)."""
    if ranks.distributed:
        dist.broadcast_object_list(values, src=0)
    return values


def wrap(model: nn.Module, ranks: RankInfo, device: str) -> nn.Module:
    """The module the loop calls: `model` sharded in place by FSDP2 (`ranks.sharded`; its
    Parameters are replaced, so the optimizer must be built after this), else
    DistributedDataParallel over `model` when there are several ranks (it averages the
    gradients in backward), else `model` itself."""
    if ranks.sharded:
        from torch.distributed.fsdp import FSDPModule

        # sharded before the gate (build_for_training), so the gate audited it as it trains
        return model if isinstance(model, FSDPModule) else shard_model(model, ranks, device)
    if not ranks.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[ranks.local_rank] if device.startswith("cuda") else None)


def refuse_unshardable(model: nn.Module) -> None:
    """--shard splits a decoder-audit Decoder, whose blocks it knows (model.layers); any other
    module is refused, before the gate is spent on it."""
    if not isinstance(model, Decoder):
        cls = type(model)
        raise ConfigError(f"--shard shards a decoder-audit Decoder (fully_shard on each of its "
                          f"blocks, then the root); {cls.__module__}.{cls.__qualname__} is not "
                          "one: train it without --shard (under torchrun: DDP)")


def shard_model(model: nn.Module, ranks: RankInfo, device: str, *,
                reshard_root: bool = False) -> nn.Module:
    """FSDP2 in place: fully_shard on each block, then on the root over a 1-D mesh of all the
    ranks. A tied readout must still be the embedding's Parameter afterwards (now one DTensor),
    else RuntimeError: two copies would drift apart. FSDP2 keeps the root's weights gathered
    from a forward to its backward (training's next step needs them at once); `reshard_root`
    shards them again after every forward, so that between calls every module holds its
    sharded Parameter, the one the gate's checks find and ask gradients for."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    refuse_unshardable(model)
    mesh = init_device_mesh(torch.device(device).type, (ranks.world_size,))
    group = mesh.get_group()
    if group is not dist.group.WORLD and group not in _MESH_GROUPS:
        _MESH_GROUPS.append(group)  # the mesh made a group of its own: close() ends it
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=True if reshard_root else None)
    # The gate's traced pass enters through run_with_trace, not forward: FSDP2 must gather the
    # root's weights (embeddings, final norm, readout) around it as it does around forward.
    register_fsdp_forward_method(model, "run_with_trace")
    if model.config.tie_embeddings and model.lm_head.weight is not model.token_embeddings.weight:
        raise RuntimeError("weight tying broken by fully_shard: lm_head.weight is no longer the "
                           "token_embeddings.weight Parameter")
    return model


def build_sharded(cfg: DecoderConfig, ranks: RankInfo, device: str, *, seed: int,
                  dtype: torch.dtype | None = None, reshard_root: bool = False) -> Decoder:
    """A Decoder of `cfg` sharded with FSDP2 as it is built: it is laid out on the meta device,
    sharded, and only then allocated, so each rank holds 1/N of the weights, plus one whole
    weight at a time while they are drawn. The weights equal those of
    `torch.manual_seed(seed); Decoder(cfg, dtype=dtype)`, bit for bit, on every rank count."""
    model = Decoder(cfg, device="meta", dtype=dtype)
    shard_model(model, ranks, device, reshard_root=reshard_root)
    model.to_empty(device=device)
    _draw_shards(model, seed)
    return model


def build_for_training(source: Any, ranks: RankInfo, device: str, *, seed: int) -> Decoder:
    """The model of a sharded run, sharded on `device` before the gate audits it: a preset or
    config built sharded (`build_sharded`: no rank ever holds the whole model); a checkpoint (a
    resumed run, train --checkpoint) or a --model's Decoder loaded whole, moved to the device,
    then sharded. Every module reshards its weights after each forward while the gate runs
    (its checks find the sharded Parameters between calls); `ready_to_train` restores FSDP2's
    training default after it. Any module but a Decoder is refused, before the gate is spent."""
    from ..gate import allocate_large_blocks_apart

    # every block's weights are gathered and freed at each call, the gate's and each step's: in
    # their own mmaps, freed to the OS at once, not in heap fragments that keep the peak up
    allocate_large_blocks_apart()
    if source.built_fresh:
        model = build_sharded(source.config(), ranks, device, seed=seed, reshard_root=True)
    elif (folder := _sharded_checkpoint(source)) is not None:
        model = load_sharded_for_training(folder, ranks, device)
    else:
        model = source.build(seed=seed)
        refuse_unshardable(model)
        model.to(device)
        shard_model(model, ranks, device, reshard_root=True)
    _finish_fsdp_setup(model)
    return model


def _sharded_checkpoint(source: Any):
    """The folder of a sharded Decoder checkpoint the source names (a resumed sharded run,
    train --checkpoint on one), else None."""
    if source.kind != "checkpoint":
        return None
    from ..sources import checkpoint_of
    from ..storage.sharded import is_sharded_checkpoint

    folder, recorded = checkpoint_of(source.value)
    return folder if recorded is None and is_sharded_checkpoint(folder) else None


def load_sharded_for_training(folder: Any, ranks: RankInfo, device: str) -> Decoder:
    """A sharded checkpoint's Decoder sharded as it is loaded: laid out on the meta device,
    sharded, allocated, and each rank reads only its own rows of the stored tensors
    (`load_sharded_state`), whatever the world size that wrote them: no rank holds the whole
    model, as in `build_sharded`. Stored in one dtype (the embedding's), built in it."""
    from ..storage.checkpoint import read_config
    from ..storage.sharded import load_sharded_state, stored_shapes

    folder = Path(folder)
    cfg = read_config(folder)
    _, dtype = stored_shapes(folder)["token_embeddings.weight"]
    model = Decoder(cfg, device="meta", dtype=dtype)
    shard_model(model, ranks, device, reshard_root=True)
    model.to_empty(device=device)
    load_sharded_state(folder, model)
    return model


def _finish_fsdp_setup(model: nn.Module) -> None:
    """What FSDP2 sets up on a model's first forward (the root found, each group's shards laid
    out, the state-dict hooks that shard a gathered group again before its weights are read),
    done now, before the gate: the gate gives a model back as it took it and removes the
    hooks a model registers on itself when called, and a checkpoint of a model whose hooks
    the gate removed read the gathered root weights, not the optimizer's sharded ones."""
    from torch.distributed.fsdp import fully_shard

    fully_shard.state(model)._lazy_init()  # noqa: SLF001 - FSDP2 has no public form of it


def ready_to_train(model: nn.Module) -> None:
    """After the gate: the root group (embeddings, final norm, readout) keeps its weights
    gathered from each forward to its backward, FSDP2's default for the root, which the next
    step's backward needs at once (no second gather per step)."""
    model.set_reshard_after_forward(False, recurse=False)


@torch.no_grad()
def _draw_shards(model: Decoder, seed: int) -> None:
    """Decoder.reset_parameters on a sharded model: the same modules, in the same order, each
    drawing its whole weights from the same generator (a module's own reset_parameters, run on
    whole stand-ins for its sharded Parameters), of which each rank keeps its own rows. A weight
    two modules share (the tied readout) is its first module's draw, as in Decoder."""
    from torch.distributed.tensor import distribute_tensor

    torch.manual_seed(seed)
    drawn: set[int] = set()
    for module in model.modules():
        if module is model or not hasattr(module, "reset_parameters"):
            continue
        sharded = dict(module.named_parameters(recurse=False))
        stand_ins = {name: torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device)
                     for name, p in sharded.items()}
        module._parameters.update(stand_ins)  # plain tensors for the length of one draw
        try:
            module.reset_parameters()
        finally:
            module._parameters.update(sharded)
        for name, param in sharded.items():
            if id(param) not in drawn:
                drawn.add(id(param))
                # each rank keeps its own rows: no communication (src_data_rank=None)
                mine = distribute_tensor(stand_ins[name], param.device_mesh, param.placements,
                                         src_data_rank=None)
                param.to_local().copy_(mine.to_local())


def describe_shards(ranks: RankInfo, batch_size: int, tied: bool) -> str:
    """The line a sharded run prints before step 1."""
    line = (f"sharded (FSDP2): {ranks.world_size} process(es), each holding 1/{ranks.world_size} "
            f"of the weights, gradients and AdamW state and {batch_size // ranks.world_size} "
            f"rows of a global batch of {batch_size}")
    return line + ("; the tied embedding and readout are one sharded Parameter" if tied else "")


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


def shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous slice of a global batch (B rows -> B / world_size rows)."""
    if tensor.shape[0] % world_size:
        raise ConfigError(f"global batch size {tensor.shape[0]} is not divisible by the "
                          f"world size {world_size}")
    per_rank = tensor.shape[0] // world_size
    return tensor[rank * per_rank:(rank + 1) * per_rank]
