"""The last phase: the final evaluation and checkpoint, the loss curve, the summary."""

from __future__ import annotations

import math
import time

from . import distributed
from .gatekeeper import check_tied
from .run import Run, diverged, perplexity, shared_evaluation
from .settings import TrainResult
from .state import whole_model
from .throughput import throughput


def finish(run: Run) -> TrainResult:
    """The final evaluation and checkpoint, the loss curve, the summary."""
    loop_seconds = time.perf_counter() - run.loop_started
    final_loss = shared_evaluation(run)
    if not math.isfinite(final_loss):
        diverged(run, "final evaluation loss", final_loss, applied=True)
    check_tied(run.model, run.facts, "after training")
    run.checkpoint = run.save() or run.checkpoint
    distributed.barrier(run.ranks)  # the final checkpoint is on disk before any rank returns
    floor = run.task.entropy_floor()
    if run.ranks.is_main and run.folder is not None:
        plot = run.folder.plot_losses(floor=floor, uniform=math.log(run.facts.vocab_size))
        run.say(f"loss curve: {plot}")
    if run.checkpoint is not None:
        run.say(f"checkpoint: {run.folder.checkpoint}")
    seconds = time.perf_counter() - run.started
    run.say(_summary(run, final_loss, floor))
    speed = throughput(run.decoder_config, run.task.seq_len,
                       (run.step - run.first_step) * run.tokens_per_step, loop_seconds,
                       device=run.opts.device, precision=run.cfg.precision,
                       peak_flops=run.opts.peak_flops)
    run.say(f"{run.step - run.first_step} steps, {speed.describe()}; {seconds:.1f} s in all, "
            "gate and checkpoints included")
    run.model = whole_model(run.model)  # sharded: gathered into one Decoder on rank 0
    return TrainResult(model=run.model, config=run.cfg, step=run.step, final_loss=final_loss,
                       initial_loss=run.initial_loss, entropy_floor=floor, seconds=seconds,
                       tokens_per_s=speed.tokens_per_s, out=run.opts.out,
                       checkpoint=run.checkpoint, report=run.report, throughput=speed)


def _summary(run: Run, final_loss: float, floor: float | None) -> str:
    summary = f"final {run.task.eval_label} {final_loss:.4f}"
    if getattr(run.task, "held_out", False):
        summary += f" (perplexity {perplexity(final_loss):,.2f})"
    if floor is not None:
        summary += f" vs entropy floor {floor:.4f} ({final_loss / floor - 1:+.2%})"
        if run.reached is not None:
            summary += (f"\nwithin 5% of the floor from step {run.reached[0]} "
                        f"({run.reached[1]:.1f} s into training)")
    return summary
