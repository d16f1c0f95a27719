"""One run as the phases share it: what it is (`TrainConfig`), how it is carried out (`Options`,
resolved from the caller's run options and a resumed run's saved ones), what the phases have
built so far (`Run`), and the helpers every phase after `prepare` uses (the shared evaluation,
the metrics row, the divergence stop)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, TrainingDiverged
from ..objective import next_token_loss
from . import distributed
from .distributed import RankInfo
from .gatekeeper import ModelFacts
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
    threads: int | str | None
    callback: Callback | None
    run_options: dict[str, Any] = field(default_factory=dict)
    """save_every, eval_every, device (as asked) and threads: saved with each checkpoint, so a
    resumed run keeps them."""
    notes: tuple[str, ...] = ()
    peak_flops: float | None = None
    """The peak FLOP/s MFU is reported against; None measures a matmul ceiling."""


@dataclass
class Run:
    """One run as the phases build it up."""

    cfg: TrainConfig
    opts: Options
    ranks: RankInfo
    started: float
    say: Callable[..., None]
    console: Any
    model: nn.Module | None = None
    fresh: bool = False
    task: Any = None
    report: Any = None
    facts: ModelFacts | None = None
    trained: nn.Module | None = None  # what the loop calls: the model, or DDP around it
    optimizer: Any = None
    scheduler: Any = None
    generator: torch.Generator | None = None
    step: int = 0
    folder: RunFolder | None = None
    eval_batch: tuple[torch.Tensor, ...] = ()
    initial_loss: float | None = None
    loop_started: float = 0.0
    first_step: int = 0
    reached: tuple[int, float] | None = None  # first evaluation near the entropy floor
    checkpoint: Path | None = None
    factory: dict[str, Any] | None = None  # what rebuilds a model that is not white-box
    decoder_config: Any = None  # the model's DecoderConfig, when it has one (FLOPs for MFU)
    saved_step: int | None = None  # the step of the last checkpoint this run wrote

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.task.seq_len

    def evaluate(self) -> float:
        """The task's evaluation loss (exact for counting, fixed windows for text)."""
        self.model.eval()
        with torch.no_grad():
            value = next_token_loss(self.model, *self.eval_batch).item()
        self.model.train()
        return value

    def save(self) -> Path | None:
        """Checkpoint the current step (rank 0, a run folder); else None. A white-box model is
        saved as a Decoder checkpoint, any other as its state dict plus its factory. A sharded
        model is gathered to rank 0 first, so every rank takes part."""
        if self.folder is None or not (self.ranks.is_main or self.ranks.sharded):
            return None
        path = save_training_checkpoint(
            self.model, self.folder.checkpoint, cfg=self.cfg, step=self.step,
            optimizer=self.optimizer, scheduler=self.scheduler, generator=self.generator,
            task=self.task, world_size=self.ranks.world_size, options=self.opts.run_options,
            factory=None if self.facts.white_box else self.factory)
        self.saved_step = self.step
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

def write(run: Run, row: dict[str, Any]) -> None:
    if run.ranks.is_main and run.folder is not None:
        run.folder.append(row)

def evaluation_row(run: Run, value: float) -> dict[str, float]:
    """The metrics columns of one evaluation: eval_loss, and for a task with a held-out split
    (text, tokens) the same loss as val_loss with val_perplexity = exp(val_loss)."""
    row = {"eval_loss": value}
    if getattr(run.task, "held_out", False):
        row["val_loss"] = value
        row["val_perplexity"] = perplexity(value)
    return row


def perplexity(loss: float) -> float:
    """exp(loss), inf where that overflows a float (a loss above ~709 nats)."""
    return math.exp(loss) if loss < PERPLEXITY_OVERFLOW else float("inf")


# math.exp overflows a double above ln(1.8e308) = 709.78.
PERPLEXITY_OVERFLOW = 709.0


def shared_evaluation(run: Run) -> float:
    """Rank 0's evaluation loss, on every rank (so a non-finite one stops every rank). A
    sharded model's forward pass needs every rank, so all of them evaluate."""
    value = run.evaluate() if run.ranks.is_main or run.ranks.sharded else float("nan")
    return distributed.share_from_main(run.ranks, [value])[0]


def diverged(run: Run, quantity: str, value: float, *, applied: bool) -> None:
    """Stop: a NaN or inf never reaches the weights on disk. Says at which step and what value,
    and which checkpoint is the last good one."""
    step = run.step if applied else run.step + 1
    when = (f"after step {step} (step {step} was applied)" if applied
            else f"at step {step} (not applied)")
    last = run.saved_step if run.saved_step is not None else (
        run.first_step if run.opts.resume_state is not None else None)
    if run.folder is None:
        kept = "no run folder, so no checkpoint"
    elif last is None:
        kept = ("no checkpoint had been written yet (--save-every N writes one every N "
                "steps)")
    else:
        kept = f"the last good checkpoint, step {last}, is kept in {run.folder.checkpoint}"
    lr = run.optimizer.param_groups[0]["lr"]
    raise TrainingDiverged(
        f"training diverged: the {quantity} is {value} {when}, learning rate {lr:g}; the run "
        f"stopped and {kept}", step=step, quantity=quantity, value=value)
