"""The last phase: the final evaluation and checkpoint, the loss curve, the summary."""

from __future__ import annotations

import math
import time
from typing import Any

from ..console import literal
from ..gate import AuditReport
from . import distributed
from .gatekeeper import check_tied
from .run import (
    Evidence,
    Prepared,
    Setting,
    Training,
    diverged,
    perplexity,
    save,
    shared_evaluation,
)
from .settings import TrainResult
from .state import read_metrics, whole_model
from .throughput import throughput


def finish(setting: Setting, prepared: Prepared, training: Training, found: Evidence,
           outcome: Any, report: AuditReport | None) -> TrainResult:
    """The final evaluation and checkpoint, the loss curve, the summary."""
    ranks, task, folder = setting.ranks, prepared.task, found.folder
    final_loss = shared_evaluation(ranks, training.model, found.eval_batch)
    if not math.isfinite(final_loss):
        diverged(setting, training, folder, "final evaluation loss", final_loss, applied=True)
    check_tied(training.model, prepared.facts, "after training")
    steps = training.step - training.first_step
    # a finished run resumed trained nothing: its checkpoint stays as it is, byte for byte
    if steps:
        checkpoint = save(setting, prepared, training, folder) or outcome.checkpoint
    else:
        checkpoint = None if folder is None else folder.checkpoint
    distributed.barrier(ranks)  # the final checkpoint is on disk before any rank returns
    floor = task.entropy_floor()
    if ranks.is_main and folder is not None:
        plot = folder.plot_losses(floor=floor, uniform=math.log(prepared.facts.vocab_size))
        setting.say(f"loss curve: {literal(plot)}")
    if checkpoint is not None:
        setting.say(f"checkpoint: {literal(folder.checkpoint)}")
    seconds = time.perf_counter() - setting.started
    setting.say(_summary(task, final_loss, floor, outcome.reached))
    speed = throughput(prepared.facts.config, task.seq_len,
                       steps * prepared.tokens_per_step(setting.cfg), outcome.seconds,
                       device=setting.opts.device, precision=setting.cfg.precision,
                       peak_flops=setting.opts.peak_flops)
    if steps:
        setting.say(f"{steps} steps, {speed.describe()}; {seconds:.1f} s in all, gate and "
                    "checkpoints included")
    else:  # a finished run resumed: no step ran now, so no speed of its own to report
        setting.say(_already_finished(training.step, folder))
    # sharded: gathered into one Decoder on rank 0, unless the caller wants none
    model = whole_model(training.model) if setting.opts.return_model else None
    return TrainResult(model=model, config=setting.cfg, step=training.step,
                       final_loss=final_loss, initial_loss=found.initial_loss,
                       entropy_floor=floor, seconds=seconds, tokens_per_s=speed.tokens_per_s,
                       out=setting.opts.out, checkpoint=checkpoint, report=report,
                       throughput=speed)


def _already_finished(step: int, folder: Any) -> str:
    """What a resumed run that had already reached its last step says instead of a speed: the
    figures of its last step, as metrics.jsonl recorded them."""
    rows = read_metrics(folder.metrics) if folder is not None and folder.metrics.is_file() else []
    last = next((row for row in reversed(rows) if row.get("step") == step), None)
    said = f"the run had already finished at step {step}: nothing was trained now"
    if last is not None and isinstance(last.get("loss"), (int, float)):
        said += (f"; its last step's figures (metrics.jsonl): loss {last['loss']:.4f}, "
                 f"{last.get('tokens_per_s') or 0:,.0f} tokens/s")
    return said


def _summary(task: Any, final_loss: float, floor: float | None,
             reached: tuple[int, float] | None) -> str:
    summary = f"final {task.eval_label} {final_loss:.4f}"
    if getattr(task, "held_out", False):
        summary += f" (perplexity {perplexity(final_loss):,.2f})"
    if floor is not None:
        summary += f" vs entropy floor {floor:.4f} ({final_loss / floor - 1:+.2%})"
        if reached is not None:
            summary += (f"\nwithin 5% of the floor from step {reached[0]} "
                        f"({reached[1]:.1f} s into training)")
    return summary
