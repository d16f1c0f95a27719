"""`train()`: audit first, refuse on any failure, then train what passed. Five phases, in order:

  prepare   (prepare.py) the model (through `sources.Source`) and the task: the data must fit
            the model (the 8-token counting task needs V >= 8 and max_seq_len >= 4; `text=`
            byte-level training needs V >= 256; `data=` a prepared dataset, V >= its
            tokenizer's ids), else ConfigError, before the gate is spent.
  gate      (start.py) the full gate on the model exactly as it will be trained (gatekeeper.py);
            then the device, AdamW with warmup + cosine (optim.py), the resumed state, DDP.
  evidence  (start.py) the run folder, one decoded input/target pair, a fresh model's initial
            loss vs ln V.
  loop      (here; one step in step.py) one global batch per step, gradient clipping, metrics
            as JSON lines, a progress bar, checkpoints every `save_every` steps.
  finish    (finish.py) the final evaluation and checkpoint, the loss curve, the summary.
Each phase returns what the next one needs (run.py): `prepare` the `Prepared` model, task and
facts; `gate` the report and the live `Training` state; `evidence` the `Evidence`; the loop its
`LoopOutcome`; `finish` the `TrainResult`. What the run is and how it is carried out (`Setting`)
is the same throughout.

Before any phase, rank 0 locks the run folder (lock.py: one run per folder) and everything a
user can get wrong is checked: the run options (a resumed run keeps its own save_every,
eval_every, device and threads), the device (one this machine lacks is refused before the gate),
the memory the weights will need (accounting/memory.py, before a single weight is allocated). A loss,
gradient norm or evaluation that becomes NaN or inf stops the run with `TrainingDiverged`
naming the step and the value; nothing non-finite is ever checkpointed, so the last checkpoint on
disk is the last good one.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import DecoderConfig
from ..console import console as make_console
from ..errors import ConfigError
from ..storage.checkpoint import checkpoint_folder
from . import distributed
from .distributed import RankInfo
from .finish import finish
from .lock import RunLock
from .prepare import prepare
from .run import (
    Callback,
    Evidence,
    Options,
    Prepared,
    Setting,
    Training,
    diverged,
    evaluation_row,
    refuse_below_floor,
    resolve_run_options,
    save,
    shared_evaluation,
    write,
)
from .settings import TrainConfig, TrainResult, resumed_settings, settings_from
from .start import evidence, gate
from .state import RunFolder, read_trainer_state, refuse_finished_run, run_folder_of
from .step import progress_bar, train_step

__all__ = ["train"]

# An evaluation this close to the entropy floor (relative) counts as having reached it.
NEAR_FLOOR = 0.05



def train(model: nn.Module | DecoderConfig | str | None = None, config: TrainConfig | None = None,
          *, out: str | os.PathLike | None = None, resume: str | os.PathLike | None = None,
          save_every: int | None = None, eval_every: int | None = None, device: str | None = None,
          progress: bool = True, verbose: bool = True, expect_fresh: bool = True,
          vocab_size: int | None = None, max_seq_len: int | None = None,
          intervention_len: int | None = None, threads: int | str | None = "auto",
          callback: Callback | None = None, shard: bool = False, peak_flops: float | None = None,
          checkpointing: bool = False, return_model: bool = True, **options: Any) -> TrainResult:
    """Audit `model` and, if every check passes, train it. See the module docstring.

    model: a Decoder or any nn.Module mapping ids (B, T) to logits (B, T, V) (foreign modules
        need `vocab_size`, and `max_seq_len` or, without a hard length limit, the
        `intervention_len` they are audited and trained at), a DecoderConfig or preset name
        (built from `seed`), or None: tiny-368, or the checkpoint's model when resuming.
    config / **options: the TrainConfig (options override its fields: steps, seed, batch_size,
        lr, warmup, ...). When resuming, the checkpoint's TrainConfig is used and must agree.
    out: run folder for metrics.jsonl, loss_curve.png and checkpoint/ (rank 0 writes).
    resume: a run folder (or its checkpoint/) to continue; `out` defaults to it.
    save_every: also checkpoint every N steps (0: only at the end); eval_every: evaluate every
        N (50). device: "cpu" (bitwise reproducible), "cuda", "cuda:N" or "auto"; one this
        machine lacks is a ConfigError before the gate. On resume, those left unset (and
        threads) are the run's own; given ones replace them.
    expect_fresh: check that the initial loss is within 10% of ln V (skipped on resume).
    threads: CPU threads (restored afterwards). "auto": 1 for CPU models under 1M parameters,
        whose ops are too small to split, else torch's; None keeps torch's. Bitwise resume needs
        the same thread count.
    callback(step, metrics): called after every step (after its checkpoint, if any).
    shard: FSDP2 (distributed.py): each rank holds 1/N of the weights, gradients and AdamW
        state; under torchrun, or on one process (nothing split). Not a setting of the run:
        its checkpoints are sharded (torch.distributed.checkpoint, each rank its own rows) and
        resume on any world size, sharded or not, and an unsharded run's resume sharded. A sharded run's result holds the whole model, on the CPU, on rank 0.
    checkpointing: activation checkpointing (`gradient_checkpointing_enable()`), proven by the
        gate's `checkpointing` check first; like `shard`, not a setting of the run.
    return_model: False leaves the result's model None: a sharded run then never gathers the
        whole model on rank 0 (its checkpoint, in a run folder, holds the weights); the command
        line's train, which never reads it, passes False.
    peak_flops: the peak FLOP/s the final report's MFU is a share of (a datasheet figure);
        None measures this device's matmul ceiling in the run's precision (throughput.py).

    Raises GateRefusal if any check fails; ConfigError if the data does not fit the model;
    RunFolderError if another run holds `out`; TrainingDiverged if the loss becomes NaN or inf.
    """
    started = time.perf_counter()
    cfg = settings_from(config, options)
    if resume is not None and out is None:
        out = run_folder_of(resume)  # a resumed run writes into its own folder
    given = dict(save_every=save_every, eval_every=eval_every, device=device, threads=threads)
    # One run per folder: rank 0 locks it before anything in it is read or written.
    main_rank = int(os.environ.get("RANK", "0")) == 0
    say = make_console().print if verbose else (lambda *a, **k: None)
    with RunLock(out, say=say) if out is not None and main_rank else contextlib.nullcontext():
        cfg, opts, ranks = _resolve(
            cfg, given, out=out, resume=resume, shard=shard,
            settings_given=config is not None or bool(options), progress=progress,
            verbose=verbose, expect_fresh=expect_fresh, vocab_size=vocab_size,
            max_seq_len=max_seq_len, intervention_len=intervention_len, callback=callback,
            peak_flops=peak_flops, checkpointing=checkpointing, return_model=return_model)
        return _run_closing(model, cfg, opts, ranks, started)


def _run_closing(model: Any, cfg: TrainConfig, opts: Options, ranks: RankInfo,
                 started: float) -> TrainResult:
    """The run, then the threads and the process groups as they were, however it ends. Under
    torchrun a failure is said once (distributed.says_failure), decided while the process group
    still stands; the command line stays quiet on the other ranks."""
    previous_threads = torch.get_num_threads()
    try:
        return _run(model, cfg, opts, ranks, started)
    except BaseException as exc:
        if ranks.distributed and not isinstance(exc, KeyboardInterrupt):
            exc.said_by_another_rank = not distributed.says_failure(ranks, exc)
        raise
    finally:
        torch.set_num_threads(previous_threads)
        distributed.close(ranks)


def _resolve(cfg: TrainConfig, given: dict[str, Any], *, out: Any, resume: Any,
             settings_given: bool, shard: bool = False,
             **how: Any) -> tuple[TrainConfig, Options, RankInfo]:
    """Inside the run folder's lock: a resumed run's settings and run options (the checkpoint's,
    which given ones must agree with or replace), the device and the process group."""
    peak = how.get("peak_flops")
    if peak is not None and not (isinstance(peak, (int, float)) and 0 < peak < float("inf")):
        raise ConfigError(f"peak_flops={peak!r} must be a positive number of FLOP/s")
    resume_folder, resume_meta, resume_state = None, None, None
    if resume is not None:  # the run's identity comes from the checkpoint
        resume_folder = checkpoint_folder(resume)
        resume_meta, resume_state = read_trainer_state(resume_folder)
        cfg = resumed_settings(resume_meta, cfg, given=settings_given)
    elif out is not None:
        refuse_finished_run(out)
    if out is not None:  # a linked checkpoint/ or metrics file is refused before the gate runs
        RunFolder(Path(out)).refuse_links()
    run_options, notes = resolve_run_options(given, (resume_meta or {}).get("run_options"))
    run_device = distributed.resolve_device(run_options["device"], distributed.local_rank())
    ranks = distributed.init_distributed(run_device, shard=shard)
    opts = Options(out=Path(out) if out is not None else None, resume_folder=resume_folder,
                   resume_meta=resume_meta, resume_state=resume_state,
                   save_every=run_options["save_every"], eval_every=run_options["eval_every"],
                   device=run_device, threads=run_options["threads"],
                   run_options=run_options, notes=tuple(notes), **how)
    return cfg, opts, ranks


@dataclass(frozen=True)
class LoopOutcome:
    """What the loop phase hands to `finish`."""

    seconds: float
    reached: tuple[int, float] | None  # (step, seconds) of the first evaluation near the floor
    checkpoint: Path | None  # the last checkpoint the loop wrote


def _run(model: Any, cfg: TrainConfig, opts: Options, ranks: RankInfo,
         started: float) -> TrainResult:
    con = make_console()
    say = con.print if (opts.verbose and ranks.is_main) else (lambda *a, **k: None)
    setting = Setting(cfg=cfg, opts=opts, ranks=ranks, started=started, say=say, console=con)
    prepared = prepare(setting, model)
    report, training = gate(setting, prepared)
    found = evidence(setting, prepared, training, report)
    outcome = _loop(setting, prepared, training, found)
    return finish(setting, prepared, training, found, outcome, report)


def _loop(setting: Setting, prepared: Prepared, training: Training,
          found: Evidence) -> LoopOutcome:
    started = time.perf_counter()
    outcome = LoopOutcome(0.0, None, None)
    if training.step >= setting.cfg.steps:  # a finished run resumed: no bar of empty figures
        return outcome
    bar = progress_bar(setting)
    with bar:
        bar_task = bar.add_task("train", total=setting.cfg.steps, completed=training.step,
                                loss=float("nan"), tps=0.0)
        while training.step < setting.cfg.steps:
            row = train_step(setting, prepared, training, found.folder, started)
            outcome = _record(setting, prepared, training, found, row, outcome)
            bar.update(bar_task, completed=training.step, loss=row["loss"],
                       tps=row["tokens_per_s"])
            if setting.opts.callback is not None:
                setting.opts.callback(training.step, row)
    return replace(outcome, seconds=time.perf_counter() - started)


def _record(setting: Setting, prepared: Prepared, training: Training, found: Evidence,
            row: dict[str, Any], outcome: LoopOutcome) -> LoopOutcome:
    """After a step: evaluate when due (into `row`), log the row (rank 0), checkpoint when due
    (not at the last step: finish does that). Returns the outcome so far."""
    steps, step = setting.cfg.steps, training.step
    reached, checkpoint = outcome.reached, outcome.checkpoint
    refuse_below_floor(row["loss"], prepared.task.entropy_floor(), step, "training loss")
    if step % setting.opts.eval_every == 0 or step == steps:
        value = shared_evaluation(setting.ranks, training.model, found.eval_batch)
        if not math.isfinite(value):
            diverged(setting, training, found.folder, "evaluation loss", value, applied=True)
        row.update(evaluation_row(prepared.task, value))
        floor = prepared.task.entropy_floor()
        refuse_below_floor(value, floor, step, "evaluation loss")
        if (floor is not None and reached is None
                and row["eval_loss"] <= (1 + NEAR_FLOOR) * floor):
            reached = (step, row["elapsed_s"])
    write(setting, found.folder, row)
    if setting.opts.save_every and step % setting.opts.save_every == 0 and step < steps:
        checkpoint = save(setting, prepared, training, found.folder) or checkpoint
    return LoopOutcome(outcome.seconds, reached, checkpoint)
