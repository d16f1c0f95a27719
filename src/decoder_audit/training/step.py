"""One optimizer step on one global batch, and the progress bar the loop shows."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError, LeakageSuspected
from ..gate import packed_call
from ..objective import flatten_for_loss, logits_of
from . import distributed
from .distributed import shard
from .leakstop import leak_message
from .loss import chunked_cross_entropy
from .optim import clip_gradients
from .run import Prepared, Setting, Training, diverged
from .state import RunFolder


def progress_bar(setting: Setting) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shown = setting.opts.progress and setting.opts.verbose and setting.ranks.is_main
    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"),
                    TextColumn("{task.fields[tps]:>9,.0f} tok/s"), TimeElapsedColumn(),
                    console=setting.console, disable=not shown)


def train_step(setting: Setting, prepared: Prepared, training: Training, folder: RunFolder | None,
               loop_started: float) -> dict[str, Any]:
    """One optimizer step on one global batch (this rank's rows of it, in `grad_accum`
    micro-batches): `training` advances by one step; returns its metrics row."""
    cfg, ranks = setting.cfg, setting.ranks
    inputs, targets = prepared.task.batch(training.generator, cfg.batch_size)  # global (B, T)
    inputs = shard(inputs, ranks.rank, ranks.world_size)  # (B / ranks, T)
    targets = shard(targets, ranks.rank, ranks.world_size)
    training.optimizer.zero_grad(set_to_none=True)
    loss, found = _accumulate(setting, training, inputs, targets)
    # the global batch's mean loss: logged, and a non-finite one stops the run before the
    # gradients it produced are applied
    reported = distributed.global_mean(loss, ranks).item()
    lr_now = training.optimizer.param_groups[0]["lr"]
    if not math.isfinite(reported):
        diverged(setting, training, folder, "training loss", reported, applied=False)
    _refuse_leak(setting, training, found, reported)
    grad_norm = clip_gradients(training.model, cfg.grad_clip)  # the norm before clipping
    if not math.isfinite(grad_norm):
        diverged(setting, training, folder, "gradient norm", grad_norm, applied=False)
    training.optimizer.step()
    training.scheduler.step()
    training.step += 1
    elapsed = time.perf_counter() - loop_started
    per_step = prepared.tokens_per_step(cfg)
    tps = (training.step - training.first_step) * per_step / max(elapsed, 1e-9)
    return {"step": training.step, "loss": reported, "lr": lr_now, "grad_norm": grad_norm,
            "tokens": training.step * per_step, "tokens_per_s": tps, "elapsed_s": elapsed}


def _accumulate(setting: Setting, training: Training, inputs: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """Forward and backward over this rank's rows in `grad_accum` micro-batches, leaving in
    .grad the gradient of the mean loss over all its B*T tokens; returns that mean (detached).

    Each micro-batch's loss is a mean over its own tokens, so it is weighted by its share of the
    tokens (tokens_i / tokens): sum_i (tokens_i / tokens) * mean_i = the mean over all tokens,
    and its gradient is the whole batch's. Under DDP only the last backward averages over the
    ranks (no_sync before it), as one backward of the whole batch would."""
    device = setting.opts.device
    packing = training.packing
    micro = inputs.shape[0] // setting.cfg.grad_accum  # rows per micro-batch; prepare checked it
    total = targets.numel()  # B / ranks * T tokens
    mean, found = None, torch.zeros(3, dtype=torch.float64)  # the leak stop's (gain, best, terms)
    for start in range(0, inputs.shape[0], micro):
        part_in = inputs[start:start + micro].to(device)  # (B / ranks / N, T)
        part_target = targets[start:start + micro].to(device)
        last = start + micro >= inputs.shape[0]
        seen: list[torch.Tensor] = []  # the micro-batch's logits, for the leak stop
        with _gradient_sync(training.trained, last):
            loss = _micro_loss(setting, training.trained, part_in, part_target, packing, seen)
            loss = loss * (part_target.numel() / total)
            loss.backward()
        if training.bound is not None and seen:
            found += torch.tensor(training.bound.gain(seen[-1], part_in, part_target),
                                  dtype=torch.float64)
        del seen
        mean = loss.detach() if mean is None else mean + loss.detach()
    return mean, found


def _refuse_leak(setting: Setting, training: Training, found: torch.Tensor, loss: float) -> None:
    """LeakageSuspected when the step's batch beat every causal predictor of the data beyond
    what chance allows (leakstop.py); the sums are the global batch's, over every rank."""
    if training.bound is None:
        return
    ranks = setting.ranks
    if ranks.distributed:  # every rank decides alike, from the sums over all of them
        found = distributed.global_mean(found.to(setting.opts.device), ranks).cpu() \
            * ranks.world_size
    gain, best, terms = (float(v) for v in found)
    if gain >= training.bound.threshold:
        raise LeakageSuspected(leak_message(training.step + 1, gain, best, int(terms),
                                            training.bound, loss, training.bound.vocab),
                               step=training.step + 1, loss=loss, floor=best / max(terms, 1))


def _micro_loss(setting: Setting, trained: Any, inputs: torch.Tensor,
                targets: torch.Tensor, packing: tuple[str, int] | None = None,
                seen: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The mean next-token loss of one micro-batch: the forward under bfloat16 autocast when
    precision is bf16, the cross-entropy always computed in float32 (bf16's 8-bit mantissa
    would round a loss of ~3 nats to 1/64 of a nat), a few rows at a time (loss.py): never a
    float32 copy of all bf16 logits, nor a (B*T, V) log-softmax. `packing` (interface, end
    id): the rows' documents, split after each end id, each read alone (the gate's `packing`
    check proved the interface). The logits (B, T, V) are appended to `seen` (the leak stop
    reads them)."""
    if packing is not None:
        trained = packed_call(trained, packing[0], documents(inputs, packing[1]))
    seen = [] if seen is None else seen
    compiled = setting.cfg.compile
    if setting.cfg.precision == "fp32":
        logits = _compiled_call(compiled, lambda: logits_of(trained(inputs)))  # (B, T, V)
    else:
        device_type = torch.device(setting.opts.device).type
        with torch.autocast(device_type, dtype=torch.bfloat16):
            logits = _compiled_call(compiled, lambda: logits_of(trained(inputs)))  # bf16
    seen.append(logits)
    return chunked_cross_entropy(*flatten_for_loss(logits, targets))


def documents(inputs: torch.Tensor, end_id: int) -> torch.Tensor:
    """Document ids (B, T) of packed rows: a document ends at (and includes) each end id, so
    ids [5, 6, eos, 7, 8] -> documents [0, 0, 0, 1, 1]."""
    ends = (inputs == end_id).long()
    return ends.cumsum(1) - ends  # an end id belongs to the document it ends


def _compiled_call(compiled: bool, call: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`call()`; a torch.compile failure (the first compiled call compiles) is a ConfigError
    saying so, instead of a compiler's traceback."""
    if not compiled:
        return call()
    try:
        return call()
    except Exception as exc:  # noqa: BLE001  (only compiler errors are translated)
        if not type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
            raise
        cause = getattr(exc, "inner_exception", None) or exc  # the backend's own error
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        raise ConfigError(f"--compile: torch.compile failed on this machine "
                          f"({type(cause).__name__}: {first_line}); train without --compile"
                          ) from exc


def _gradient_sync(trained: Any, sync: bool) -> Any:
    """Whether this micro-batch's backward averages the gradients over the ranks: only the
    last's does (DDP: no_sync() before it; FSDP2: set_requires_gradient_sync, which keeps the
    unsharded gradients until then). Nothing to do for one plain process."""
    if hasattr(trained, "set_requires_gradient_sync"):  # FSDP2 (fully_shard)
        trained.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if sync or not hasattr(trained, "no_sync"):
        return contextlib.nullcontext()
    return trained.no_sync()
