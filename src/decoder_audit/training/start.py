"""The gate phase (the full audit on the model exactly as it will be trained, then the device,
AdamW, the resumed state and DDP) and the evidence phase (the run folder, one decoded
input/target pair, a fresh model's initial loss against ln V)."""

from __future__ import annotations

import math

import torch

from ..checkpoint import FACTORY_FILE
from ..errors import ConfigError
from . import distributed
from .gatekeeper import GateRefusal, check_initial_loss, check_tied, run_gate, show_alignment
from .optim import make_optimizer
from .run import Run, evaluation_row, shared_evaluation, write
from .state import CHECKPOINT_FILES, RunFolder, refuse_foreign_entries, restore_training_state


def gate(run: Run, shape: tuple[int, int]) -> None:
    """The gate on the model exactly as it will be trained (no flag skips it); from here on the
    facts come from its report. Then the device, the optimizer, the resumed state and DDP."""
    run.report, run.facts = run_gate(run.model, run.ranks, vocab_size=shape[0],
                                     max_seq_len=shape[1], seed=run.cfg.seed, say=run.say)
    assert (run.facts.vocab_size, run.facts.max_seq_len) == shape, (run.facts, shape)
    if run.opts.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(run.opts.device))
    run.model = run.model.to(run.opts.device)
    check_tied(run.model, run.facts, "after moving the model to its device")
    run.model.train()
    # FSDP2 replaces the Parameters with sharded ones, so the optimizer is built after wrap
    run.trained = distributed.wrap(run.model, run.ranks, run.opts.device)
    run.optimizer, run.scheduler = make_optimizer(run.model, run.cfg)
    # The batch sampler: a CPU generator, so the batches do not depend on the device.
    run.generator = torch.Generator().manual_seed(run.cfg.seed)
    if run.opts.resume_state is not None:
        run.step = restore_training_state(run.opts.resume_state, run.optimizer, run.scheduler,
                                          run.generator, model=run.model)
        if run.step > run.cfg.steps:
            raise ConfigError(f"checkpoint is at step {run.step}, past the run's "
                              f"steps={run.cfg.steps}")
        run.say(f"resumed from {str(run.opts.resume_folder)!r} at step {run.step}/{run.cfg.steps}")
    if run.ranks.sharded:
        check_tied(run.model, run.facts, "after sharding with FSDP2")
        run.say(distributed.describe_shards(run.ranks, run.cfg.batch_size, run.facts.tied))
    elif run.ranks.distributed:
        check_tied(run.trained.module, run.facts, "after wrapping in DistributedDataParallel")
        run.say(f"distributed: {run.ranks.world_size} processes, "
                f"{run.cfg.batch_size // run.ranks.world_size} rows each of a global batch of "
                f"{run.cfg.batch_size}")
    _say_batch_and_precision(run)
    if run.cfg.compile:
        # Compiled lazily: the first training step compiles (step.py turns a compiler failure
        # into a ConfigError). Evaluation and checkpoints use the eager model, same Parameters.
        run.trained = torch.compile(run.trained)


def _say_batch_and_precision(run: Run) -> None:
    cfg = run.cfg
    if cfg.grad_accum > 1:
        run.say(f"gradient accumulation: {cfg.grad_accum} micro-batches of "
                f"{cfg.batch_size // cfg.grad_accum // run.ranks.world_size} rows per process "
                f"make each step's batch of {cfg.batch_size}")
    if cfg.precision == "bf16":
        run.say("precision: bf16 autocast for forward and loss; float32 weights, gradients and "
                "AdamW state; the loss in float32")


def evidence(run: Run) -> None:
    """The run folder, one aligned pair of the first batch, and the initial loss against ln V
    (judged for a fresh model; a resumed run has none)."""
    resumed = run.opts.resume_state is not None
    if run.opts.out is not None:
        run.folder = RunFolder(run.opts.out)
        if run.ranks.is_main:
            run.folder.start(resumed_at=run.step if resumed else None)
    run.eval_batch = tuple(t.to(run.opts.device) for t in run.task.eval_batch())
    show_alignment(run.task, run.generator, run.say)
    if run.folder is not None and run.ranks.is_main:
        task_files = getattr(run.task, "checkpoint_files", dict)()  # e.g. its tokenizer
        refuse_foreign_entries(run.folder.checkpoint, CHECKPOINT_FILES + list(task_files))
    if not resumed:
        run.initial_loss = shared_evaluation(run)
        if not math.isfinite(run.initial_loss):
            raise GateRefusal("initial loss near ln V", f"the model's loss before training is "
                              f"{run.initial_loss} (not finite)", run.report)
        check_initial_loss(run.initial_loss, run.facts, fresh=run.fresh, report=run.report,
                           say=run.say)
        write(run, {"step": 0, **evaluation_row(run, run.initial_loss)})
    floor = run.task.entropy_floor()
    if floor is not None:
        run.say(f"task: {run.task.name}; entropy floor ln(4)/4 = {floor:.4f} nats/token")
    if run.folder is not None and not run.facts.white_box:
        run.say("note: not a decoder-audit Decoder: checkpoints hold its state dict and "
                f"{FACTORY_FILE} (factory {run.factory.get('factory')!r})")
