"""`train()`: audit first, refuse on any failure, then train what passed. Five phases, in order:

  prepare   the model (through `sources.Source`) and the task: the data must fit the model (the
            8-token counting task needs V >= 8 and max_seq_len >= 4; `text=` byte-level training
            needs V >= 256; `data=` a prepared dataset, V >= its tokenizer's ids), else
            ConfigError, before the gate is spent.
  gate      the full gate on the model exactly as it will be trained (gatekeeper.py); then the
            device, AdamW with warmup + cosine (optim.py), the resumed state, DDP.
  evidence  the run folder, one decoded input/target pair, a fresh model's initial loss vs ln V.
  loop      one global batch per step, gradient clipping, metrics as JSON lines, a progress
            bar, checkpoints every `save_every` steps.
  finish    the final evaluation and checkpoint, the loss curve, the summary.
The phases share one `Run`: what the run is (`TrainConfig`), how it is carried out (`Options`),
and what the phases have built so far.

Before any phase, rank 0 locks the run folder (lock.py: one run per folder) and everything a
user can get wrong is checked: the run options (a resumed run keeps its own save_every,
eval_every, device and threads), the device (one this machine lacks is refused before the gate),
the memory the weights will need (memory.py, before a single weight is allocated). A loss,
gradient norm or evaluation that becomes NaN or inf stops the run with `TrainingDiverged`
naming the step and the value; nothing non-finite is ever checkpointed, so the last checkpoint on
disk is the last good one.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import FACTORY_FILE, checkpoint_folder, load_module_weights
from ..config import DecoderConfig
from ..console import console as make_console
from ..data import ByteText, CountingTask, shard
from ..datasets import TokenDataset
from ..errors import CheckpointError, ConfigError, TrainingDiverged
from ..memory import check_fits
from ..objective import next_token_loss
from ..sources import Source
from . import distributed
from .distributed import RankInfo
from .gatekeeper import (GateRefusal, ModelFacts, check_initial_loss, check_tied, run_gate,
                         show_alignment)
from .lock import RunLock
from .optim import clip_gradients, make_optimizer
from .settings import TrainConfig, TrainResult, resumed_settings, settings_from
from .state import (CHECKPOINT_FILES, RunFolder, read_trainer_state, refuse_finished_run,
                    refuse_foreign_entries, restore_training_state, run_folder_of,
                    save_training_checkpoint)

# Below this many parameters, intra-op threading costs more than it gains on CPU.
SMALL_MODEL_PARAMETERS = 1_000_000
# An evaluation this close to the entropy floor (relative) counts as having reached it.
NEAR_FLOOR = 0.05

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
        saved as a Decoder checkpoint, any other as its state dict plus its factory."""
        if self.folder is None or not self.ranks.is_main:
            return None
        path = save_training_checkpoint(
            self.model, self.folder.checkpoint, cfg=self.cfg, step=self.step,
            optimizer=self.optimizer, scheduler=self.scheduler, generator=self.generator,
            task=self.task, world_size=self.ranks.world_size, options=self.opts.run_options,
            factory=None if self.facts.white_box else self.factory)
        self.saved_step = self.step
        return path


def train(model: nn.Module | DecoderConfig | str | None = None, config: TrainConfig | None = None,
          *, out: str | os.PathLike | None = None, resume: str | os.PathLike | None = None,
          save_every: int | None = None, eval_every: int | None = None,
          device: str | None = None,
          progress: bool = True, verbose: bool = True, expect_fresh: bool = True,
          vocab_size: int | None = None, max_seq_len: int | None = None,
          threads: int | str | None = "auto", callback: Callback | None = None,
          **options: Any) -> TrainResult:
    """Audit `model` and, if every check passes, train it. See the module docstring.

    model: a Decoder or any nn.Module mapping ids (B, T) to logits (B, T, V) (foreign modules
        need `vocab_size` and `max_seq_len`), a DecoderConfig or preset name (built from `seed`),
        or None: tiny-368, or the checkpoint's model when resuming.
    config / **options: the TrainConfig (options override its fields: steps, seed, batch_size,
        lr, warmup, ...). When resuming, the checkpoint's TrainConfig is used and must agree.
    out: run folder for metrics.jsonl, loss_curve.png and checkpoint/ (rank 0 writes).
    resume: a run folder (or its checkpoint/) to continue; `out` defaults to it.
    save_every: also checkpoint every N steps (0, the default: only at the end). eval_every:
        evaluate every N (default 50).
    device: "cpu" (default; bitwise reproducible), "cuda", "cuda:N" or "auto"; a device this
        machine lacks is a ConfigError before the gate runs.
    save_every, eval_every, device and threads left unset on resume are the run's own (saved
        with its checkpoints); given ones replace them.
    expect_fresh: check that the initial loss is within 10% of ln V (skipped on resume).
    threads: CPU threads for the run (torch.set_num_threads; restored afterwards). "auto": 1
        for CPU models under 1M parameters, whose ops are too small to split (the counting task
        trains ~7x faster on 1 thread than on 2 on a busy 2-core machine), else torch's setting;
        None keeps torch's setting. Bitwise resume needs the same thread count.
    callback(step, metrics): called after every step (after its checkpoint, if any).

    Raises GateRefusal if any check fails; ConfigError if the data does not fit the model;
    RunFolderError if another run holds `out`; TrainingDiverged if the loss becomes NaN or inf.
    """
    started = time.perf_counter()
    cfg = settings_from(config, options)
    if resume is not None and out is None:
        out = run_folder_of(resume)  # a resumed run writes into its own folder
    given = {"save_every": save_every, "eval_every": eval_every, "device": device,
             "threads": threads}
    # One run per folder: rank 0 locks it before anything in it is read or written.
    main_rank = int(os.environ.get("RANK", "0")) == 0
    noop = lambda *a, **k: None  # noqa: E731
    lock = (RunLock(out, say=make_console().print if verbose else noop)
            if out is not None and main_rank else contextlib.nullcontext())
    with lock:
        resume_folder, resume_meta, resume_state = None, None, None
        if resume is not None:  # the run's identity comes from the checkpoint
            resume_folder = checkpoint_folder(resume)
            resume_meta, resume_state = read_trainer_state(resume_folder)
            cfg = resumed_settings(resume_meta, cfg, given=config is not None or bool(options))
        elif out is not None:
            refuse_finished_run(out)
        run_options, notes = resolve_run_options(given, (resume_meta or {}).get("run_options"))
        run_device = distributed.resolve_device(run_options["device"], distributed.local_rank())
        ranks = distributed.init_distributed(run_device)
        opts = Options(out=Path(out) if out is not None else None, resume_folder=resume_folder,
                       resume_meta=resume_meta, resume_state=resume_state,
                       save_every=run_options["save_every"],
                       eval_every=run_options["eval_every"], device=run_device,
                       progress=progress, verbose=verbose, expect_fresh=expect_fresh,
                       vocab_size=vocab_size, max_seq_len=max_seq_len,
                       threads=run_options["threads"], callback=callback,
                       run_options=run_options, notes=tuple(notes))
        previous_threads = torch.get_num_threads()
        try:
            return _run(model, cfg, opts, ranks, started)
        finally:
            torch.set_num_threads(previous_threads)
            distributed.close(ranks)


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


def _run(model: Any, cfg: TrainConfig, opts: Options, ranks: RankInfo,
         started: float) -> TrainResult:
    con = make_console()
    say = con.print if (opts.verbose and ranks.is_main) else (lambda *a, **k: None)
    run = Run(cfg=cfg, opts=opts, ranks=ranks, started=started, say=say, console=con)
    shape = _prepare(run, model)
    _gate(run, shape)
    _evidence(run)
    _loop(run)
    return _finish(run)


# ----------------------------------------------------------------------------------------------
# prepare: the model, the threads, the task
# ----------------------------------------------------------------------------------------------

def _prepare(run: Run, model: Any) -> tuple[int, int]:
    """Resolve the model and the task; the data must fit the model's declared V and
    max_seq_len (returned), checked before the gate is spent."""
    cfg, opts = run.cfg, run.opts
    for note in opts.notes:
        run.say(f"note: {note}")
    source, module_weights = _source(model, opts)
    if source.kind in ("preset", "config", "checkpoint"):
        _check_memory(source.config(), opts.device)  # before a single weight is allocated
    run.model = source.build(seed=cfg.seed)
    if module_weights:
        load_module_weights(run.model, opts.resume_folder)
    run.fresh = opts.expect_fresh and (source.built_fresh or source.kind in ("module", "model"))
    _set_threads(run.model, opts)
    declared = source.config()  # the resolver's answer; the gate decides again, and we check
    saved = (opts.resume_meta or {}).get("factory") or {}
    vocab_size = (declared.vocab_size if declared is not None
                  else opts.vocab_size or saved.get("vocab_size"))
    max_seq_len = (declared.max_seq_len if declared is not None
                   else opts.max_seq_len or saved.get("max_seq_len"))
    run.factory = _factory_of(source, vocab_size, max_seq_len)
    if vocab_size is None or max_seq_len is None:
        raise ConfigError("a model without a DecoderConfig needs vocab_size and max_seq_len "
                          "(--vocab-size/--max-seq-len) to be audited and trained")
    run.task = (TokenDataset(cfg.data, max_seq_len) if cfg.data is not None else
                ByteText(cfg.text, max_seq_len, val_fraction=cfg.val_fraction, seed=cfg.seed)
                if cfg.text is not None else CountingTask())
    run.task.check_model(vocab_size, max_seq_len)
    saved_sha = (opts.resume_meta or {}).get("text_sha256")
    if saved_sha is not None and saved_sha != getattr(run.task, "sha256", None):
        raise ConfigError(f"the text file {cfg.text!r} changed since the checkpoint was written "
                          "(SHA-256 differs); resuming on other data would not continue the run")
    saved_data = (opts.resume_meta or {}).get("data_sha256")
    if saved_data is not None and saved_data != getattr(run.task, "sha256", None):
        raise ConfigError(f"the dataset {cfg.data!r} changed since the checkpoint was written "
                          "(its dataset.json's SHA-256 differs); prepare it again or resume on "
                          "the data the run started with")
    if cfg.batch_size % run.ranks.world_size:
        raise ConfigError(f"batch_size={cfg.batch_size} must be divisible by the number of "
                          f"processes ({run.ranks.world_size}) so every rank gets equal rows")
    return vocab_size, max_seq_len


def _source(model: Any, opts: Options) -> tuple[Source, bool]:
    """The model's source, and whether a module's saved weights must be loaded into it (a
    resumed module that is not a Decoder: rebuilt by its factory, then its state dict)."""
    folder = opts.resume_folder
    if folder is None:
        return Source.of(model), False
    factory = (opts.resume_meta or {}).get("factory")
    if factory is None and not (folder / FACTORY_FILE).is_file():
        if model is not None:
            raise ConfigError("resume loads the model from its checkpoint; do not pass a model too")
        return Source("checkpoint", folder), False
    factory = factory or {}
    if isinstance(model, nn.Module):  # the module a Python caller trained, passed again
        return Source("module", model), True
    if model is not None:
        raise ConfigError("resume rebuilds the model with its saved factory; do not pass a model "
                          "too")
    if not factory.get("factory"):
        raise CheckpointError(
            f"{str(folder)!r} holds the weights of a module passed from Python "
            f"({factory.get('class', 'unknown class')}), which no factory rebuilds: resume it "
            "from Python with train(module, resume=...)")
    return Source("model", factory["factory"]), True


def _factory_of(source: Source, vocab_size: int | None, max_seq_len: int | None
                ) -> dict[str, Any] | None:
    """What rebuilds the model, saved beside its weights when it is not white-box."""
    shape = {"vocab_size": vocab_size, "max_seq_len": max_seq_len}
    if source.kind == "model":
        path, _, name = str(source.value).rpartition(":")
        return {"factory": f"{Path(path).resolve()}:{name}", **shape}
    if source.kind == "module":
        cls = type(source.value)
        return {"factory": None, "class": f"{cls.__module__}.{cls.__qualname__}", **shape}
    return None  # a preset, config or checkpoint: a Decoder, saved as one


# Training holds the weights, their gradients and AdamW's two moments: four copies.
TRAINING_COPIES = 4


def _check_memory(cfg: DecoderConfig, device: str) -> None:
    what = "training (weights, gradients and AdamW's two moments)"
    if device.startswith("cuda"):
        check_fits(cfg, what="its weights")  # built on the CPU first
        check_fits(cfg, copies=TRAINING_COPIES, what=what, device=device)
    else:
        check_fits(cfg, copies=TRAINING_COPIES, what=what)


def _set_threads(model: nn.Module, opts: Options) -> None:
    """torch's intra-op threads for the run (train() restores the previous value)."""
    threads = opts.threads
    if threads == "auto":
        small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS
        threads = 1 if small and opts.device == "cpu" else None
    if threads is not None:
        torch.set_num_threads(int(threads))


# ----------------------------------------------------------------------------------------------
# gate: the audit, then everything the loop needs
# ----------------------------------------------------------------------------------------------

def _gate(run: Run, shape: tuple[int, int]) -> None:
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
    run.optimizer, run.scheduler = make_optimizer(run.model, run.cfg)
    # The batch sampler: a CPU generator, so the batches do not depend on the device.
    run.generator = torch.Generator().manual_seed(run.cfg.seed)
    if run.opts.resume_state is not None:
        run.step = restore_training_state(run.opts.resume_state, run.optimizer, run.scheduler,
                                          run.generator)
        if run.step > run.cfg.steps:
            raise ConfigError(f"checkpoint is at step {run.step}, past the run's "
                              f"steps={run.cfg.steps}")
        run.say(f"resumed from {str(run.opts.resume_folder)!r} at step {run.step}/{run.cfg.steps}")
    run.trained = distributed.wrap(run.model, run.ranks, run.opts.device)
    if run.ranks.distributed:
        check_tied(run.trained.module, run.facts, "after wrapping in DistributedDataParallel")
        run.say(f"distributed: {run.ranks.world_size} processes, "
                f"{run.cfg.batch_size // run.ranks.world_size} rows each of a global batch of "
                f"{run.cfg.batch_size}")


# ----------------------------------------------------------------------------------------------
# evidence: before step 1
# ----------------------------------------------------------------------------------------------

def _evidence(run: Run) -> None:
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
        run.initial_loss = _shared_evaluation(run)
        if not math.isfinite(run.initial_loss):
            raise GateRefusal("initial loss near ln V", f"the model's loss before training is "
                              f"{run.initial_loss} (not finite)", run.report)
        check_initial_loss(run.initial_loss, run.facts, fresh=run.fresh, report=run.report,
                           say=run.say)
        _write(run, {"step": 0, "eval_loss": run.initial_loss})
    floor = run.task.entropy_floor()
    if floor is not None:
        run.say(f"task: {run.task.name}; entropy floor ln(4)/4 = {floor:.4f} nats/token")
    if run.folder is not None and not run.facts.white_box:
        run.say("note: not a decoder-audit Decoder: checkpoints hold its state dict and "
                f"{FACTORY_FILE} (factory {run.factory.get('factory')!r})")


def _write(run: Run, row: dict[str, Any]) -> None:
    if run.ranks.is_main and run.folder is not None:
        run.folder.append(row)


# ----------------------------------------------------------------------------------------------
# loop
# ----------------------------------------------------------------------------------------------

def _loop(run: Run) -> None:
    run.loop_started, run.first_step = time.perf_counter(), run.step
    bar = _progress_bar(run)
    with bar:
        bar_task = bar.add_task("train", total=run.cfg.steps, completed=run.step,
                                loss=float("nan"), tps=0.0)
        while run.step < run.cfg.steps:
            row = _train_step(run)
            _record(run, row)
            bar.update(bar_task, completed=run.step, loss=row["loss"], tps=row["tokens_per_s"])
            if run.opts.callback is not None:
                run.opts.callback(run.step, row)


def _progress_bar(run: Run) -> Any:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    shown = run.opts.progress and run.opts.verbose and run.ranks.is_main
    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"),
                    TextColumn("{task.fields[tps]:>9,.0f} tok/s"), TimeElapsedColumn(),
                    console=run.console, disable=not shown)


def _train_step(run: Run) -> dict[str, Any]:
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
        _diverged(run, "training loss", reported, applied=False)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()  # DDP: gradients averaged over ranks here
    grad_norm = clip_gradients(run.model, run.cfg.grad_clip)  # the norm before clipping
    if not math.isfinite(grad_norm):
        _diverged(run, "gradient norm", grad_norm, applied=False)
    run.optimizer.step()
    run.scheduler.step()
    run.step += 1
    elapsed = time.perf_counter() - run.loop_started
    tps = (run.step - run.first_step) * run.tokens_per_step / max(elapsed, 1e-9)
    return {"step": run.step, "loss": reported, "lr": lr_now, "grad_norm": grad_norm,
            "tokens": run.step * run.tokens_per_step, "tokens_per_s": tps, "elapsed_s": elapsed}


def _record(run: Run, row: dict[str, Any]) -> None:
    """Evaluate when due, log the row (rank 0), checkpoint when due (not at the last step:
    finish does that)."""
    steps, step = run.cfg.steps, run.step
    if step % run.opts.eval_every == 0 or step == steps:
        row["eval_loss"] = _shared_evaluation(run)
        if not math.isfinite(row["eval_loss"]):
            _diverged(run, "evaluation loss", row["eval_loss"], applied=True)
        floor = run.task.entropy_floor()
        if (floor is not None and run.reached is None
                and row["eval_loss"] <= (1 + NEAR_FLOOR) * floor):
            run.reached = (step, row["elapsed_s"])
    _write(run, row)
    if run.opts.save_every and step % run.opts.save_every == 0 and step < steps:
        run.checkpoint = run.save() or run.checkpoint


def _shared_evaluation(run: Run) -> float:
    """Rank 0's evaluation loss, on every rank (so a non-finite one stops every rank)."""
    value = run.evaluate() if run.ranks.is_main else float("nan")
    return distributed.share_from_main(run.ranks, [value])[0]


def _diverged(run: Run, quantity: str, value: float, *, applied: bool) -> None:
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


# ----------------------------------------------------------------------------------------------
# finish
# ----------------------------------------------------------------------------------------------

def _finish(run: Run) -> TrainResult:
    """The final evaluation and checkpoint, the loss curve, the summary."""
    loop_seconds = time.perf_counter() - run.loop_started
    final_loss = _shared_evaluation(run)
    if not math.isfinite(final_loss):
        _diverged(run, "final evaluation loss", final_loss, applied=True)
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
