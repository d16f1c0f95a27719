"""One optimizer step on one global batch, and the progress bar the loop shows."""

from __future__ import annotations

import math
import time
from typing import Any

from ..data import shard
from ..objective import next_token_loss
from . import distributed
from .optim import clip_gradients
from .run import Run, diverged


def progress_bar(run: Run) -> Any:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    shown = run.opts.progress and run.opts.verbose and run.ranks.is_main
    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"),
                    TextColumn("{task.fields[tps]:>9,.0f} tok/s"), TimeElapsedColumn(),
                    console=run.console, disable=not shown)


def train_step(run: Run) -> dict[str, Any]:
    """One optimizer step on one global batch (this rank's rows of it); its metrics row."""
    ranks = run.ranks
    inputs, targets = run.task.batch(run.generator, run.cfg.batch_size)  # global (B, T)
    inputs = shard(inputs, ranks.rank, ranks.world_size).to(run.opts.device)  # (B / ranks, T)
    targets = shard(targets, ranks.rank, ranks.world_size).to(run.opts.device)
    loss = next_token_loss(run.trained, inputs, targets)
    # the global batch's mean loss: logged, and a non-finite one stops the run before it is used
    reported = distributed.global_mean(loss.detach(), ranks).item()
    lr_now = run.optimizer.param_groups[0]["lr"]
    if not math.isfinite(reported):
        diverged(run, "training loss", reported, applied=False)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()  # DDP: gradients averaged over ranks here
    grad_norm = clip_gradients(run.model, run.cfg.grad_clip)  # the norm before clipping
    if not math.isfinite(grad_norm):
        diverged(run, "gradient norm", grad_norm, applied=False)
    run.optimizer.step()
    run.scheduler.step()
    run.step += 1
    elapsed = time.perf_counter() - run.loop_started
    tps = (run.step - run.first_step) * run.tokens_per_step / max(elapsed, 1e-9)
    return {"step": run.step, "loss": reported, "lr": lr_now, "grad_norm": grad_norm,
            "tokens": run.step * run.tokens_per_step, "tokens_per_s": tps, "elapsed_s": elapsed}
