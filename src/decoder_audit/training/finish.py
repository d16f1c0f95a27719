"""The last phase: the final evaluation and checkpoint, the loss curve, the summary."""

from __future__ import annotations

import math
import time

from . import distributed
from .gatekeeper import check_tied
from .run import Run, diverged, shared_evaluation
from .settings import TrainResult


def finish(run: Run) -> TrainResult:
    """The final evaluation and checkpoint, the loss curve, the summary."""
    loop_seconds = time.perf_counter() - run.loop_started
    final_loss = shared_evaluation(run)
    if not math.isfinite(final_loss):
        diverged(run, "final evaluation loss", final_loss, applied=True)
    check_tied(run.model, run.facts, "after training")
    run.checkpoint = run.save() or run.checkpoint
    tps = (run.step - run.first_step) * run.tokens_per_step / max(loop_seconds, 1e-9)
    distributed.barrier(run.ranks)  # the final checkpoint is on disk before any rank returns
    floor = run.task.entropy_floor()
    if run.ranks.is_main and run.folder is not None:
        plot = run.folder.plot_losses(floor=floor, uniform=math.log(run.facts.vocab_size))
        run.say(f"loss curve: {plot}")
    if run.checkpoint is not None:
        run.say(f"checkpoint: {run.folder.checkpoint}")
    summary = f"final {run.task.eval_label} {final_loss:.4f}"
    if floor is not None:
        summary += f" vs entropy floor {floor:.4f} ({final_loss / floor - 1:+.2%})"
        if run.reached is not None:
            summary += (f"\nwithin 5% of the floor from step {run.reached[0]} "
                        f"({run.reached[1]:.1f} s into training)")
    seconds = time.perf_counter() - run.started
    run.say(summary)
    run.say(f"{run.step - run.first_step} steps in {loop_seconds:.1f} s ({tps:,.0f} tokens/s); "
            f"{seconds:.1f} s in all, gate and checkpoints included")
    return TrainResult(model=run.model, config=run.cfg, step=run.step, final_loss=final_loss,
                       initial_loss=run.initial_loss, entropy_floor=floor, seconds=seconds,
                       tokens_per_s=tps, out=run.opts.out, checkpoint=run.checkpoint,
                       report=run.report)
