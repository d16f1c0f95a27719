"""The gate phase (the full audit on the model exactly as it will be trained, then the device,
AdamW, the resumed state and DDP), which returns the live `Training`, and the evidence phase (the
run folder, one decoded input/target pair, a fresh model's initial loss against ln V), which
returns the `Evidence`."""

from __future__ import annotations

import math

import torch

from ..console import literal
from ..errors import ConfigError
from ..gate import AuditReport
from ..storage.checkpoint import FACTORY_FILE
from . import distributed
from .gatekeeper import GateRefusal, check_initial_loss, check_tied, run_gate, show_alignment
from .leakstop import causal_bound
from .optim import make_optimizer
from .prepare import end_of_document
from .run import (
    Evidence,
    Prepared,
    Setting,
    Training,
    evaluation_row,
    refuse_below_floor,
    shared_evaluation,
    write,
)
from .state import CHECKPOINT_FILES, RunFolder, refuse_foreign_entries, restore_training_state


def gate(setting: Setting, prepared: Prepared) -> tuple[AuditReport | None, Training]:
    """The gate on the model exactly as it will be trained (no flag skips it), with the facts
    `prepare` decided: a sharded run's model is sharded already, and every rank audits it.
    Then the device, the optimizer, the resumed state and DDP."""
    cfg, opts, ranks, facts = setting.cfg, setting.opts, setting.ranks, prepared.facts
    report = run_gate(prepared.model, ranks, facts, seed=cfg.seed, say=setting.say)
    if opts.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(opts.device))
    model = prepared.model
    if ranks.sharded:  # sharded on its device before the gate (prepare)
        distributed.ready_to_train(model)
    else:
        model = model.to(opts.device)
        check_tied(model, facts, "after moving the model to its device")
    model.train()
    if opts.checkpointing:  # the gate's `checkpointing` check has proven the switch exists
        model.gradient_checkpointing_enable()
        setting.say("activation checkpointing: each block's activations recomputed in backward")
    # FSDP2 replaces the Parameters with sharded ones, so the optimizer is built after wrap
    trained = distributed.wrap(model, ranks, opts.device)
    optimizer, scheduler = make_optimizer(model, cfg)
    # The batch sampler: a CPU generator, so the batches do not depend on the device.
    generator = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if opts.resume_state is not None:
        step = restore_training_state(opts.resume_state, optimizer, scheduler, generator,
                                      model=model)
        if step > cfg.steps:
            raise ConfigError(f"checkpoint is at step {step}, past the run's steps={cfg.steps}")
        setting.say(f"resumed from {literal(repr(str(opts.resume_folder)))} at step {step}/{cfg.steps}")
    if ranks.sharded:
        check_tied(model, facts, "after sharding with FSDP2")
        setting.say(distributed.describe_shards(ranks, cfg.batch_size, facts.tied))
    elif ranks.distributed:
        check_tied(trained.module, facts, "after wrapping in DistributedDataParallel")
        setting.say(f"distributed: {ranks.world_size} processes, "
                    f"{cfg.batch_size // ranks.world_size} rows each of a global batch of "
                    f"{cfg.batch_size}")
    _say_batch_and_precision(setting)
    if cfg.compile:
        # Compiled lazily: the first training step compiles (step.py turns a compiler failure
        # into a ConfigError). Evaluation and checkpoints use the eager model, same Parameters.
        trained = torch.compile(trained)
    packing = ((facts.packing, end_of_document(prepared.task)) if cfg.pack else None)
    if packing is not None:
        setting.say(f"packing: documents split after id {packing[1]}, each read alone "
                    f"({packing[0]})")
    bound, unarmed = causal_bound(prepared.task, cfg.steps)
    if unarmed:
        setting.say(unarmed)
    return report, Training(model=model, trained=trained, optimizer=optimizer,
                            scheduler=scheduler, generator=generator, step=step,
                            first_step=step, packing=packing, bound=bound)


def _say_batch_and_precision(setting: Setting) -> None:
    cfg = setting.cfg
    if cfg.grad_accum > 1:
        setting.say(f"gradient accumulation: {cfg.grad_accum} micro-batches of "
                    f"{cfg.batch_size // cfg.grad_accum // setting.ranks.world_size} rows per "
                    f"process make each step's batch of {cfg.batch_size}")
    if cfg.precision == "bf16":
        setting.say("precision: bf16 autocast for forward and loss; float32 weights, gradients "
                    "and AdamW state; the loss in float32")


def evidence(setting: Setting, prepared: Prepared, training: Training,
             report: AuditReport | None) -> Evidence:
    """One aligned pair of the first batch, the initial loss against ln V (judged for a fresh
    model; a resumed run has none) and against the task's floor, and then, only once they
    hold, the run folder: a refused run writes nothing, so rerunning it needs no cleaning up."""
    opts, ranks, task = setting.opts, setting.ranks, prepared.task
    resumed = opts.resume_state is not None
    eval_batch = tuple(t.to(opts.device) for t in task.eval_batch())
    show_alignment(task, training.generator, setting.say)
    initial_loss = None
    floor = task.entropy_floor()
    if floor is not None:
        setting.say(f"task: {task.name}; entropy floor ln(4)/4 = {floor:.4f} nats/token")
    if not resumed:
        initial_loss = shared_evaluation(ranks, training.model, eval_batch)
        if not math.isfinite(initial_loss):
            raise GateRefusal("initial loss near ln V", f"the model's loss before training is "
                              f"{initial_loss} (not finite)", report)
        check_initial_loss(initial_loss, prepared.facts.vocab_size, fresh=prepared.fresh,
                           report=report, say=setting.say,
                           logit_std=_logit_std(training.model, eval_batch))
        refuse_below_floor(initial_loss, floor, training.step, "loss before training")
    folder = None
    if opts.out is not None:
        folder = RunFolder(opts.out)
        if ranks.is_main:
            task_files = getattr(task, "checkpoint_files", dict)()  # e.g. its tokenizer
            refuse_foreign_entries(folder.checkpoint, CHECKPOINT_FILES + list(task_files))
            folder.start(resumed_at=training.step if resumed else None)
    if initial_loss is not None:
        write(setting, folder, {"step": 0, **evaluation_row(task, initial_loss)})
    if folder is not None and not prepared.facts.whitebox:
        setting.say("note: not a decoder-audit Decoder: checkpoints hold its state dict and "
                    f"{FACTORY_FILE} (factory {prepared.factory.get('factory')!r})")
    return Evidence(folder=folder, eval_batch=eval_batch, initial_loss=initial_loss)


def _logit_std(model, eval_batch) -> float:
    """The standard deviation of the model's logits on the evaluation inputs: what makes a fresh
    model's loss far above ln V (confident wrong predictions) is a large logit scale."""
    from ..objective import logits_of

    model.eval()
    with torch.no_grad():
        std = float(logits_of(model(eval_batch[0])).float().std())
    model.train()
    return std
