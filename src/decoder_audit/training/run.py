"""What the phases of a run share, as values each phase returns to the next:

    Setting    what the run is (`TrainConfig`) and how it is carried out (`Options`, resolved from
               the caller's run options and a resumed run's saved ones), its ranks and console;
               the same from the first phase to the last
    Prepared   the model, its facts (decided once, by the gate's `model_facts`), the task
    Training   the live state the loop advances: the model as trained, the optimizer, the
               scheduler, the batch sampler, the step
    Evidence   the run folder, the evaluation batch, the loss before training

and the helpers every phase after `prepare` uses (the shared evaluation, a checkpoint, the
metrics row, the divergence stop)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, LeakageSuspected, TrainingDiverged
from ..gate import ModelFacts
from ..objective import next_token_loss
from . import distributed
from .distributed import RankInfo
from .settings import TrainConfig
from .state import RunFolder, save_training_checkpoint

Callback = Callable[[int, dict[str, Any]], None]


@dataclass(frozen=True)
class Options:
    """How a run is carried out (none of this changes its result)."""

    out: Path | None
    resume_folder: Path | None
    resume_meta: dict[str, Any] | None
    resume_state: dict[str, Any] | None
    save_every: int
    eval_every: int
    device: str
    progress: bool
    verbose: bool
    expect_fresh: bool
    vocab_size: int | None
    max_seq_len: int | None
    intervention_len: int | None
    threads: int | str | None
    callback: Callback | None
    run_options: dict[str, Any] = field(default_factory=dict)
    """save_every, eval_every, device (as asked) and threads: saved with each checkpoint, so a
    resumed run keeps them."""
    notes: tuple[str, ...] = ()
    peak_flops: float | None = None
    """The peak FLOP/s MFU is reported against; None measures a matmul ceiling."""
    checkpointing: bool = False
    """Activation checkpointing on for the training steps (the gate checks it first)."""
    return_model: bool = True
    """The result holds the trained model (a sharded one gathered whole on rank 0), else None."""


@dataclass(frozen=True)
class Setting:
    """What the run is and how it is carried out: the same in every phase."""

    cfg: TrainConfig
    opts: Options
    ranks: RankInfo
    started: float
    say: Callable[..., None]
    console: Any


@dataclass(frozen=True)
class Prepared:
    """The first phase's answer: what is trained, on what, and what the gate knows of it."""

    model: nn.Module
    task: Any
    facts: ModelFacts
    fresh: bool
    """Built with new weights (or a module passed in): its loss before training is judged."""
    factory: dict[str, Any] | None
    """What rebuilds a model that is not white-box, saved beside its weights."""

    def tokens_per_step(self, cfg: TrainConfig) -> int:
        return cfg.batch_size * self.task.seq_len


@dataclass
class Training:
    """The live state the loop advances (the one mutable record: a step changes it)."""

    model: nn.Module
    trained: nn.Module  # what the loop calls: the model, or DDP / torch.compile around it
    optimizer: Any
    scheduler: Any
    generator: torch.Generator  # the batch sampler
    step: int
    first_step: int  # the step this process started from (0, or the resumed one)
    saved_step: int | None = None  # the step of the last checkpoint this run wrote
    packing: tuple[str, int] | None = None  # --pack: (the model's interface, the end id)
    bound: Any = None  # --text, --data: the leak stop's CausalBound (leakstop.py), or None


@dataclass(frozen=True)
class Evidence:
    """The evidence phase's answer: the run folder, the evaluation batch, the loss before."""

    folder: RunFolder | None
    eval_batch: tuple[torch.Tensor, ...]
    initial_loss: float | None


def evaluate(model: nn.Module, eval_batch: tuple[torch.Tensor, ...]) -> float:
    """The task's evaluation loss (exact for counting, fixed windows for text)."""
    model.eval()
    with torch.no_grad():
        value = next_token_loss(model, *eval_batch).item()
    model.train()
    return value


def save(setting: Setting, prepared: Prepared, training: Training,
         folder: RunFolder | None) -> Path | None:
    """Checkpoint the current step (rank 0, a run folder); else None. A white-box model is
    saved as a Decoder checkpoint, any other as its state dict plus its factory. A sharded
    model is gathered to rank 0 first, so every rank takes part."""
    if folder is None or not (setting.ranks.is_main or setting.ranks.sharded):
        return None
    path = save_training_checkpoint(
        training.model, folder.checkpoint, cfg=setting.cfg, step=training.step,
        optimizer=training.optimizer, scheduler=training.scheduler,
        generator=training.generator, task=prepared.task,
        world_size=setting.ranks.world_size, options=setting.opts.run_options,
        factory=None if prepared.facts.whitebox else prepared.factory)
    training.saved_step = training.step
    return path


# Run options: how a run is carried out, outside the TrainConfig. None (threads: "auto") means
# "not given": the checkpoint's value on resume, else the default.
RUN_OPTION_DEFAULTS = {"save_every": 0, "eval_every": 50, "device": "cpu", "threads": "auto"}


def resolve_run_options(given: dict[str, Any], saved: dict[str, Any] | None
                        ) -> tuple[dict[str, Any], list[str]]:
    """The run options (validated) and a note for each given one that changes a resumed run's."""
    saved = dict(saved or {})
    chosen, notes = {}, []
    for name, default in RUN_OPTION_DEFAULTS.items():
        value = given.get(name)
        unset = value == "auto" if name == "threads" else value is None
        if unset:
            value = saved.get(name, default)
        elif name in saved and saved[name] != value:
            notes.append(f"{name}={value!r} replaces the run's {name}={saved[name]!r}")
        chosen[name] = value
    problems = []
    for name, low in (("save_every", 0), ("eval_every", 1)):
        value = chosen[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            problems.append(f"{name}={value!r} must be an integer >= {low}")
    threads = chosen["threads"]
    if threads not in ("auto", None) and (not isinstance(threads, int) or isinstance(threads, bool)
                                          or threads < 1):
        problems.append(f"threads={threads!r} must be an integer >= 1 (or 'auto')")
    if not isinstance(chosen["device"], str):
        problems.append(f"device={chosen['device']!r} must be a string such as 'cpu' or 'cuda'")
    if problems:
        raise ConfigError("; ".join(problems))
    return chosen, notes

def write(setting: Setting, folder: RunFolder | None, row: dict[str, Any]) -> None:
    if setting.ranks.is_main and folder is not None:
        folder.append(row)

def evaluation_row(task: Any, value: float) -> dict[str, float]:
    """The metrics columns of one evaluation: eval_loss, and for a task with a held-out split
    (text, tokens) the same loss as val_loss with val_perplexity = exp(val_loss)."""
    row = {"eval_loss": value}
    if getattr(task, "held_out", False):
        row["val_loss"] = value
        row["val_perplexity"] = perplexity(value)
    return row


def perplexity(loss: float) -> float:
    """exp(loss), inf where that overflows a float (a loss above ~709 nats)."""
    return math.exp(loss) if loss < PERPLEXITY_OVERFLOW else float("inf")


# math.exp overflows a double above ln(1.8e308) = 709.78.
PERPLEXITY_OVERFLOW = 709.0


def shared_evaluation(ranks: RankInfo, model: nn.Module,
                      eval_batch: tuple[torch.Tensor, ...]) -> float:
    """Rank 0's evaluation loss, on every rank (so a non-finite one stops every rank). A
    sharded model's forward pass needs every rank, so all of them evaluate."""
    value = evaluate(model, eval_batch) if ranks.is_main or ranks.sharded else float("nan")
    return distributed.share_from_main(ranks, [value])[0]


def diverged(setting: Setting, training: Training, folder: RunFolder | None, quantity: str,
             value: float, *, applied: bool) -> None:
    """Stop: a NaN or inf never reaches the weights on disk. Says at which step and what value,
    and which checkpoint is the last good one."""
    step = training.step if applied else training.step + 1
    when = (f"after step {step} (step {step} was applied)" if applied
            else f"at step {step} (not applied)")
    last = training.saved_step if training.saved_step is not None else (
        training.first_step if setting.opts.resume_state is not None else None)
    if folder is None:
        kept = "no run folder, so no checkpoint"
    elif last is None:
        kept = ("no checkpoint had been written yet (--save-every N writes one every N "
                "steps)")
    else:
        kept = f"the last good checkpoint, step {last}, is kept in {folder.checkpoint}"
    lr = training.optimizer.param_groups[0]["lr"]
    raise TrainingDiverged(
        f"training diverged: the {quantity} is {value} {when}, learning rate {lr:g}; the run "
        f"stopped and {kept}", step=step, quantity=quantity, value=value)


# A loss this far below the entropy floor (relative) is impossible for a causal model. The
# counting task's evaluation is exact over its sequences, so any causal model's is >= the floor
# up to float rounding (1e-7): 1% leaves room for nothing but a leak. A training batch's loss is
# a sample: a model whose letter guesses happen to match one batch's letters can dip below the
# floor, by less than half of it in a batch of 16 or more (a leak drives it to ~0).
BELOW_FLOOR = {"evaluation loss": 0.01, "loss before training": 0.01, "training loss": 0.5}


def refuse_below_floor(loss: float, floor: float | None, step: int, what: str) -> None:
    """LeakageSuspected when `loss` (`what`: a key of BELOW_FLOOR) is below the task's entropy
    floor (seeds: "loss is near zero before training: target leakage or incorrect shift")."""
    if floor is None or not loss < (1 - BELOW_FLOOR[what]) * floor:
        return
    raise LeakageSuspected(
        f"the {what} at step {step} is {loss:.4g}, below the task's entropy floor {floor:.4f} "
        "that no causal model can reach: the model reads the targets it predicts (a leak the "
        "gate's probes did not reach, or a shift that puts the target in the input); the run "
        "stopped", step=step, loss=loss, floor=floor)
