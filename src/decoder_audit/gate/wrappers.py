"""The wrappers a model is trained in, and what the gate audits inside them.

    inner, notes = unwrapped(model)     # DDP, DataParallel, torch.compile peeled off
    forwarded_to(model)                 # a PEFT model: the base model its forward calls
    adapter_update(module)              # a PEFT layer's adapters that add to its base layer
    with resharded_between_calls(model):   # FSDP2: every module's weights sharded between calls

DistributedDataParallel and DataParallel call the module they wrap; DDP adds the gradients'
all-reduce in backward, a collective every rank must join (a gate that runs on rank 0 alone would
wait in it), and its reducer refuses a second backward before the first is reduced ("Expected to
have finished reduction": the gate's gradient checks take several). torch.compile's
OptimizedModule computes what the module it compiles computes, in a graph compiled per input
shape: the gate's probes come in dozens of shapes, each a recompilation, and AOTAutograd's
donated buffers refuse the retained graph the gradient checks walk. So the gate audits the
module inside each of them, eagerly, and the report says so: a defect of the module (a causal
leak) is found through the wrapper, and a miscompilation by the compiler is not audited.

A PEFT model is not peeled: its forward adds the adapters' updates, which is what trains. What it
declares (V, the length policy, the pad id, the packed forms, use_cache, checkpointing) is its
base model's, whose forward receives every keyword the PEFT model is given.

FSDP2 (`fully_shard`) makes no wrapper: it shards the module in place, and swaps each module's
Parameters between sharded DTensors and gathered tensors around its forward. The root keeps its
weights gathered after a forward by default (training's backward needs them at once), so
between the gate's calls some modules would hold DTensors and others gathered tensors: within
`resharded_between_calls` every module shards its weights again after each forward.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from .sharding import class_name


def unwrapped(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """The module the gate audits for `model` (DistributedDataParallel, DataParallel and
    torch.compile's OptimizedModule peeled off, however nested), and a note for each wrapper."""
    notes = []
    while True:
        inner = _wrapped(model)
        if inner is None:
            return model, notes
        notes.append(_said(model, inner))
        model = inner


def _wrapped(model: nn.Module) -> nn.Module | None:
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # loaded wherever a model is compiled
    if dynamo is not None and isinstance(model, dynamo.OptimizedModule):
        return model._orig_mod
    return None


def _said(wrapper: nn.Module, inner: nn.Module) -> str:
    name = class_name(inner)
    if isinstance(wrapper, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return (f"{type(wrapper).__name__}: the {name} it wraps was audited (the wrapper calls it "
                "and only all-reduces the gradients, across ranks that would have to join the "
                "gate's every backward)")
    return (f"torch.compile: the {name} it compiles was audited, eagerly (the compiled graph "
            "computes the same; each of the probes' shapes would be a recompilation): a "
            "miscompilation is not audited here")


def forwarded_to(model: nn.Module) -> nn.Module:
    """The module whose declarations are `model`'s: a PEFT model's base model (its forward hands
    every keyword on to it), any other module itself."""
    peft = sys.modules.get("peft")  # loaded wherever a model is a PEFT model
    if peft is not None and isinstance(model, peft.PeftModel):
        return model.get_base_model()
    return model


def adapter_update(module: nn.Module) -> list[str]:
    """The adapters of a PEFT tuner layer (LoRA, ...) that add an update to what its base layer
    computes in the forward: active, enabled and not merged into the base weight; [] for any
    other module."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    if tuners is None or not isinstance(module, tuners.BaseTunerLayer):
        return []
    if module.disable_adapters or module.merged:
        return []
    return [name for name in module.active_adapters
            if any(name in getattr(module, layer, {}) for layer in module.adapter_layer_names)]


def is_fsdp(model: nn.Module) -> bool:
    """Sharded in place by FSDP2's fully_shard (the module or one inside it)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported: nothing was sharded
    return fsdp is not None and any(isinstance(m, fsdp.FSDPModule) for m in model.modules())


@contextmanager
def resharded_between_calls(model: nn.Module) -> Iterator[None]:
    """Within the block, every FSDP2 module of `model` reshards its weights after each forward
    (sharded now, too), and FSDP2 gathers the root's weights around `run_with_trace` as around
    forward (ours: the traced pass); each module's setting put back after. Nothing for a model
    FSDP2 did not shard."""
    if not is_fsdp(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # FSDP2 keeps the setting in each module's param groups (set_reshard_after_forward has no
    # reading counterpart): saved and written back as found
    saved = [(state, state._auto_reshard_after_forward,
              [group.post_forward_mesh_info for group in state._fsdp_param_groups])
             for state in (m._get_fsdp_state() for m in modules)]
    traced = isinstance(model, FSDPModule) and callable(getattr(model, "run_with_trace", None)) \
        and "run_with_trace" not in model.__dict__
    try:
        for module in modules:
            module.set_reshard_after_forward(True, recurse=False)
            module.reshard()
        if traced:
            register_fsdp_forward_method(model, "run_with_trace")
        yield
    finally:
        if traced:
            del model.__dict__["run_with_trace"]
        for state, auto, infos in saved:
            state._auto_reshard_after_forward = auto
            for group, info in zip(state._fsdp_param_groups, infos):
                group.post_forward_mesh_info = info


__all__ = ["adapter_update", "forwarded_to", "is_fsdp", "resharded_between_calls", "unwrapped"]
