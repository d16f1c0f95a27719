"""Gated training: audit first, refuse on any failure, then train what passed.

    train(model)                      one process
    torchrun --nproc_per_node N ...   the same code under DistributedDataParallel

Order of a run, each step before the next:
  1. Arguments and task: the data must fit the model (the 8-token counting task needs V >= 8 and
     max_seq_len >= 4; `text=` byte-level training needs V >= 256), else ConfigError.
  2. The full gate (`decoder_audit.audit`). Any failed check raises `GateRefusal` naming the first
     failed check: nothing is trained, no file is written. There is no switch to skip it.
  3. The loss-alignment evidence (one decoded input/target pair) and, for a fresh model, the
     initial loss, which must lie within 10% of ln V (a model that already "knows" the targets
     before training is leaking them; one far above ln V is broken). Refused like a gate failure.
  4. AdamW over the unique Parameters (the tied embedding/readout weight once, in one group),
     warmup + cosine learning rate, gradient clipping, one global batch per step.
  5. Metrics as JSON lines, a progress bar, checkpoints every `save_every` steps and at the end,
     a loss-curve PNG.

Reproducibility. The model is initialised from `seed`; batches come from their own
`torch.Generator(seed)`; nothing else draws random numbers. A checkpoint stores the weights
(safetensors), the optimizer and scheduler state, the data generator's state and the step, so a
run stopped after step k and resumed from its checkpoint ends bitwise equal to one that never
stopped (CPU, same world size).

Distributed. Under torchrun (WORLD_SIZE > 1) the process group is initialised (gloo on CPU, nccl
on CUDA), the model is wrapped in DistributedDataParallel after the gate, every rank draws the same
global batch and trains on its own contiguous rows (`data.shard`), and DDP averages the gradients
(equal rows per rank, so the average of the ranks' mean losses is the global mean loss). Only rank
0 prints, writes metrics and checkpoints. The weights equal single-process training with the same
global batch up to float32 summation order: after 40 steps of the counting task the largest weight
difference is 6e-7 (the test allows 1e-5), after 100 steps ~3e-6. Over a full 400-step run the
difference grows to ~0.2 while the final loss agrees to 4 digits: the escape from the loss plateau
(steps ~60-150) amplifies last-bit differences. A single process run on 2 threads instead of 1
diverges from itself by the same amount (0.19), so this is float32 reordering, not DDP.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import (CHECKPOINT_DIR, CONFIG_FILE, checkpoint_folder, load_checkpoint,
                         save_checkpoint)
from .config import DecoderConfig
from .console import console as make_console
from .data import ByteText, CountingTask, shard
from .errors import CheckpointError, ConfigError
from .gate import audit
from .objective import next_token_loss
from .model import Decoder, Embedding
from .sources import Source

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss_curve.png"
STATE_FILE = "train_state.pt"
TRAINER_FILE = "trainer.json"
# A fresh model is close to uniform over V: its loss must lie within this fraction of ln V.
INITIAL_LOSS_TOLERANCE = 0.10
# Below this many parameters, intra-op threading costs more than it gains on CPU.
SMALL_MODEL_PARAMETERS = 1_000_000
# Default peak learning rates: the 368-parameter model tolerates a large one; text models do not.
DEFAULT_LR = {"counting": 3e-2, "bytes": 3e-3}


class GateRefusal(RuntimeError):
    """Training refused: a gate check (or the initial-loss check) failed. Nothing was trained."""

    def __init__(self, check: str, detail: str, report: Any = None) -> None:
        super().__init__(f"training refused: check {check!r} failed: {detail}")
        self.check, self.detail, self.report = check, detail, report


@dataclass(frozen=True)
class TrainConfig:
    """What defines a run's result. A resumed run must use the same values (checked)."""

    steps: int = 400
    """Optimizer steps in the whole run (the cosine schedule spans them)."""
    seed: int = 0
    """Seeds the model's initialisation and the batch sampler."""
    batch_size: int = 64
    """Global batch (sequences per step, summed over all ranks)."""
    lr: float | None = None
    """Peak learning rate; None picks 3e-2 for the counting task and 3e-3 for text."""
    warmup: int = 20
    """Linear warmup steps: lr * (s + 1) / warmup for step s < warmup."""
    min_lr_ratio: float = 0.1
    """The cosine decays from lr to lr * min_lr_ratio at the last step."""
    weight_decay: float = 0.1
    """AdamW decoupled decay on matrices; never on norms or biases."""
    decay_embeddings: bool = False
    """Also decay embeddings (and therefore a tied readout)."""
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""
    text: str | None = None
    """A text file for byte-level training; None trains the counting task."""
    val_fraction: float = 0.1
    """Share of the text file kept for validation (its last bytes)."""

    def __post_init__(self) -> None:
        problems = []
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name}={value!r} must be a positive integer")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            problems.append(f"warmup={self.warmup!r} must be an integer >= 0")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and self.lr > 0):
            problems.append(f"lr={self.lr!r} must be > 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")
        if self.weight_decay < 0 or self.grad_clip < 0:
            problems.append(f"weight_decay={self.weight_decay} and grad_clip={self.grad_clip} "
                            "must be >= 0")
        if problems:
            raise ConfigError("invalid TrainConfig: " + "; ".join(problems))

    @property
    def task_name(self) -> str:
        return "bytes" if self.text is not None else "counting"

    @property
    def peak_lr(self) -> float:
        return float(self.lr) if self.lr is not None else DEFAULT_LR[self.task_name]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        data = dict(data)
        data["betas"] = tuple(data["betas"])
        return cls(**data)


@dataclass
class TrainResult:
    model: nn.Module
    """The trained model (unwrapped from DDP)."""
    config: TrainConfig
    step: int
    """Steps completed."""
    final_loss: float
    """Evaluation loss at the end: the exact expected loss over the counting task's sequences,
    or the mean loss over fixed validation windows for text."""
    initial_loss: float | None
    entropy_floor: float | None
    seconds: float
    """Wall time of the whole call: gate, training, evaluation, checkpoints."""
    tokens_per_s: float
    out: Path | None
    checkpoint: Path | None
    report: Any
    """The gate's AuditReport (rank 0; None on other ranks)."""


# ----------------------------------------------------------------------------------------------
# Pieces a run is built from (each usable and tested on its own)
# ----------------------------------------------------------------------------------------------

def param_groups(model: nn.Module, weight_decay: float, *, decay_embeddings: bool = False
                 ) -> list[dict[str, Any]]:
    """AdamW groups over the model's *unique* Parameters: matrices decay; norms, biases and
    (unless `decay_embeddings`) embeddings do not. A tied readout is the embedding Parameter, so
    it appears once, in the embedding's group."""
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, (nn.Embedding, Embedding))
                     for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # duplicates (the tie) removed by identity
        if not param.requires_grad:
            continue
        is_embedding = id(param) in embedding_ids
        if param.dim() < 2 or name.endswith("bias") or (is_embedding and not decay_embeddings):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # One optimizer state per unique Parameter: nothing listed twice, nothing left out.
    listed = [id(p) for g in groups for p in g["params"]]
    unique = {id(p) for p in model.parameters() if p.requires_grad}
    assert len(listed) == len(set(listed)) == len(unique), "a Parameter is in two groups or none"
    return groups


def lr_lambda(steps: int, warmup: int, min_lr_ratio: float) -> Callable[[int], float]:
    """Multiplier of the peak lr before optimizer step s (0-based): linear warmup over `warmup`
    steps, then a half cosine from 1 down to min_lr_ratio at the last step."""

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - 1 - warmup))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_optimizer(model: nn.Module, cfg: TrainConfig
                   ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    groups = param_groups(model, cfg.weight_decay, decay_embeddings=cfg.decay_embeddings)
    optimizer = torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=cfg.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.steps, cfg.warmup, cfg.min_lr_ratio))
    return optimizer, scheduler


def check_tied(model: nn.Module, when: str) -> None:
    """A tied Decoder's readout must be the embedding Parameter itself (DEFECTS.md A1-A3)."""
    if isinstance(model, Decoder) and model.config.tie_embeddings:
        if model.lm_head.weight is not model.token_embeddings.weight:
            raise RuntimeError(f"weight tying broken {when}: lm_head.weight is no longer the "
                               "token_embeddings.weight Parameter")


# ----------------------------------------------------------------------------------------------
# Distributed helpers
# ----------------------------------------------------------------------------------------------

@dataclass
class _Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _init_distributed(device: str) -> _Dist:
    if dist.is_available() and dist.is_initialized():
        return _Dist(dist.get_rank(), dist.get_world_size(),
                     int(os.environ.get("LOCAL_RANK", "0")))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return _Dist()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":  # before any collective: each rank owns its own GPU
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    return _Dist(dist.get_rank(), dist.get_world_size(), local_rank, owns_group=True)


def _resolve_device(device: str, local_rank: int) -> str:
    if device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    return device


# ----------------------------------------------------------------------------------------------
# The gate
# ----------------------------------------------------------------------------------------------

def _gate(model: nn.Module, dist_info: _Dist, *, vocab_size, max_seq_len, seed, say) -> Any:
    """Rank 0 audits; every rank learns the verdict; a failure raises GateRefusal everywhere."""
    report, verdict = None, [True, "", ""]
    if dist_info.is_main:
        say("[bold]gate[/bold]: running the full audit before any training ...")
        start = time.perf_counter()
        try:
            report = audit(model, vocab_size=vocab_size, max_seq_len=max_seq_len, progress=False,
                           seed=seed)
        except Exception as exc:  # the gate should never crash; if it does, nothing trains
            if dist_info.world_size == 1:
                raise
            verdict = [False, "gate", f"the gate itself raised {exc!r}"]
    if report is not None:
        if not report.passed:
            failure = report.first_failure
            verdict = [False, failure.name, failure.detail]
        ran = [c for c in report.checks if not c.skipped]
        passed = sum(1 for c in ran if c.passed)
        skipped = len(report.checks) - len(ran)
        say(f"gate: {passed}/{len(ran)} checks passed"
            + (f" ({skipped} skipped)" if skipped else "")
            + f" in {time.perf_counter() - start:.2f} s")
        say("  " + ", ".join(c.name + ("" if c.passed else " [red]FAILED[/red]") for c in ran))
    if dist_info.world_size > 1:
        dist.broadcast_object_list(verdict, src=0)
    if not verdict[0]:
        raise GateRefusal(verdict[1], verdict[2], report)
    return report


# ----------------------------------------------------------------------------------------------
# Checkpoint state
# ----------------------------------------------------------------------------------------------

def read_trainer_state(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer.json, train_state.pt) of a checkpoint; the .pt is read with weights_only=True,
    so only tensors and plain containers are accepted, never arbitrary pickled objects."""
    meta_path, state_path = folder / TRAINER_FILE, folder / STATE_FILE
    if not meta_path.is_file() or not state_path.is_file():
        raise CheckpointError(f"{str(folder)!r} is not a training checkpoint: it lacks "
                              f"{TRAINER_FILE} or {STATE_FILE}, so it cannot be resumed")
    meta = json.loads(meta_path.read_text())
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    return meta, state


def _save(model, folder: Path, *, cfg: TrainConfig, step: int, optimizer, scheduler,
          generator: torch.Generator, task, world_size: int) -> Path:
    buffer = io.BytesIO()
    torch.save({
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data_rng": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }, buffer)
    meta = {"format": 1, "step": step, "train_config": cfg.to_dict(), **task.state(),
            "world_size": world_size, "entropy_floor": task.entropy_floor()}
    return save_checkpoint(model, folder, extra_files={
        STATE_FILE: buffer.getvalue(),
        TRAINER_FILE: (json.dumps(meta, indent=2) + "\n").encode(),
    })


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines past the checkpoint a run resumes from (they will be redone)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def plot_losses(metrics_path: Path, png_path: Path, *, floor: float | None,
                uniform: float) -> Path:
    """Training loss per step, evaluation loss, the entropy floor and ln V, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    train_rows = [r for r in rows if "loss" in r]
    ax.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], lw=1,
            label="train loss")
    evals = [r for r in rows if "eval_loss" in r]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", ms=3,
                label="eval loss")
    ax.axhline(uniform, color="grey", ls=":", label=f"ln V = {uniform:.3f} (uniform)")
    if floor is not None:
        ax.axhline(floor, color="green", ls="--", label=f"entropy floor = {floor:.4f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("training loss")
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

def _resolve_model(model, resume_folder: Path | None, seed: int) -> tuple[nn.Module, bool]:
    """(model, built_fresh_here)."""
    if resume_folder is not None:
        if model is not None:
            raise ConfigError("resume loads the model from its checkpoint; do not pass a model too")
        return load_checkpoint(resume_folder), False
    source = Source.of(model)
    return source.build(seed=seed), source.built_fresh or source.kind == "module"


def train(model: nn.Module | DecoderConfig | str | None = None, config: TrainConfig | None = None,
          *, out: str | os.PathLike | None = None, resume: str | os.PathLike | None = None,
          save_every: int = 0, eval_every: int = 50, device: str = "cpu",
          progress: bool = True, verbose: bool = True, expect_fresh: bool = True,
          vocab_size: int | None = None, max_seq_len: int | None = None,
          threads: int | str | None = "auto",
          callback: Callable[[int, dict[str, Any]], None] | None = None,
          **options: Any) -> TrainResult:
    """Audit `model` and, if every check passes, train it. See the module docstring.

    model: a Decoder or any nn.Module mapping ids (B, T) to logits (B, T, V) (foreign modules
        need `vocab_size` and `max_seq_len`), a DecoderConfig or preset name (built from `seed`),
        or None: tiny-368, or the checkpoint's model when resuming.
    config / **options: the TrainConfig (options override its fields: steps, seed, batch_size,
        lr, warmup, ...). When resuming, the checkpoint's TrainConfig is used and must agree.
    out: run folder for metrics.jsonl, loss_curve.png and checkpoint/ (rank 0 writes).
    resume: a run folder (or its checkpoint/) to continue; `out` defaults to it.
    save_every: also checkpoint every N steps (0: only at the end). eval_every: evaluate every N.
    device: "cpu" (default; bitwise reproducible), "cuda" or "auto".
    expect_fresh: check that the initial loss is within 10% of ln V (skipped on resume).
    threads: CPU threads for the run (torch.set_num_threads; restored afterwards). "auto": 1
        for CPU models under 1M parameters, whose ops are too small to split (the counting task
        trains ~7x faster on 1 thread than on 2 on a busy 2-core machine), else torch's setting;
        None keeps torch's setting. Bitwise resume needs the same thread count.
    callback(step, metrics): called after every step (after its checkpoint, if any).

    Raises GateRefusal if any check fails; ConfigError if the data does not fit the model.
    """
    start_time = time.perf_counter()
    try:
        cfg = dataclasses.replace(config or TrainConfig(), **options)
    except TypeError as exc:
        raise TypeError(f"train: unknown option ({exc}); options are the TrainConfig fields "
                        f"{[f.name for f in dataclasses.fields(TrainConfig)]}") from None
    if save_every < 0 or eval_every < 1:
        raise ConfigError(f"save_every={save_every} must be >= 0 and eval_every={eval_every} >= 1")

    # Resuming: the run's identity comes from the checkpoint.
    resume_folder, resume_meta, resume_state = None, None, None
    if resume is not None:
        resume_folder = checkpoint_folder(resume)
        resume_meta, resume_state = read_trainer_state(resume_folder)
        saved = TrainConfig.from_dict(resume_meta["train_config"])
        if config is not None or options:
            differ = [f"{f.name}: checkpoint {getattr(saved, f.name)!r}, given "
                      f"{getattr(cfg, f.name)!r}" for f in dataclasses.fields(TrainConfig)
                      if getattr(saved, f.name) != getattr(cfg, f.name)]
            if differ:
                raise ConfigError("a resumed run must keep its training settings; these differ: "
                                  + "; ".join(differ))
        cfg = saved
        if out is None:
            out = Path(resume) if Path(resume).name != CHECKPOINT_DIR else Path(resume).parent

    if resume is None and out is not None and (Path(out) / CHECKPOINT_DIR).exists():
        raise ConfigError(f"{str(out)!r} already holds a training run ({CHECKPOINT_DIR}/); "
                          "continue it with resume (--resume), or choose another out folder "
                          "(--out)")
    run_device = _resolve_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    dist_info = _init_distributed(run_device)
    previous_threads = torch.get_num_threads()
    try:
        return _run(model, cfg, dist_info, out=Path(out) if out is not None else None,
                    resume_folder=resume_folder, resume_meta=resume_meta,
                    resume_state=resume_state, save_every=save_every, eval_every=eval_every,
                    run_device=run_device, progress=progress, verbose=verbose,
                    expect_fresh=expect_fresh, vocab_size=vocab_size, max_seq_len=max_seq_len,
                    threads=threads, callback=callback, start_time=start_time)
    finally:
        torch.set_num_threads(previous_threads)
        if dist_info.owns_group:
            dist.destroy_process_group()


def _run(model, cfg: TrainConfig, dist_info: _Dist, *, out, resume_folder, resume_meta,
         resume_state, save_every, eval_every, run_device, progress, verbose, expect_fresh,
         vocab_size, max_seq_len, threads, callback, start_time) -> TrainResult:

    con = make_console()
    say = con.print if (verbose and dist_info.is_main) else (lambda *a, **k: None)
    model, fresh = _resolve_model(model, resume_folder, cfg.seed)
    fresh = fresh and expect_fresh
    if threads == "auto":
        small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS
        threads = 1 if small and run_device == "cpu" else None
    if threads is not None:
        torch.set_num_threads(int(threads))  # train() restores the previous value

    # 1. The data must fit the model.
    model_cfg = getattr(model, "config", None)
    white_box = isinstance(model_cfg, DecoderConfig)
    V = model_cfg.vocab_size if white_box else vocab_size
    T = model_cfg.max_seq_len if white_box else max_seq_len
    if V is None or T is None:
        raise ConfigError("a model without a DecoderConfig needs vocab_size and max_seq_len "
                          "(--vocab-size/--max-seq-len) to be audited and trained")
    task = (ByteText(cfg.text, T, val_fraction=cfg.val_fraction, seed=cfg.seed)
            if cfg.text is not None else CountingTask())
    task.check_model(V, T)
    saved_sha = (resume_meta or {}).get("text_sha256")
    if saved_sha is not None and saved_sha != getattr(task, "sha256", None):
        raise ConfigError(f"the text file {cfg.text!r} changed since the checkpoint was written "
                          "(SHA-256 differs); resuming on other data would not continue the run")
    if cfg.batch_size % dist_info.world_size:
        raise ConfigError(f"batch_size={cfg.batch_size} must be divisible by the number of "
                          f"processes ({dist_info.world_size}) so every rank gets equal rows")

    # 2. The gate, on the model exactly as it will be trained. No flag skips this.
    report = _gate(model, dist_info, vocab_size=None if white_box else V,
                   max_seq_len=None if white_box else T, seed=cfg.seed, say=say)

    if run_device.startswith("cuda"):
        torch.cuda.set_device(torch.device(run_device))
    model = model.to(run_device)
    check_tied(model, "after moving the model to its device")
    model.train()

    optimizer, scheduler = make_optimizer(model, cfg)
    # The batch sampler: a CPU generator, so the batches do not depend on the device.
    generator = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if resume_state is not None:
        optimizer.load_state_dict(resume_state["optimizer"])
        scheduler.load_state_dict(resume_state["scheduler"])
        generator.set_state(resume_state["data_rng"])
        torch.set_rng_state(resume_state["torch_rng"])
        step = int(resume_state["step"])
        if step > cfg.steps:
            raise ConfigError(f"checkpoint is at step {step}, past the run's steps={cfg.steps}")
        say(f"resumed from {str(resume_folder)!r} at step {step}/{cfg.steps}")

    trained = model
    if dist_info.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        trained = DDP(model, device_ids=[dist_info.local_rank] if run_device.startswith("cuda")
                      else None)
        check_tied(trained.module, "after wrapping in DistributedDataParallel")
        say(f"distributed: {dist_info.world_size} processes, "
            f"{cfg.batch_size // dist_info.world_size} rows each of a global batch of "
            f"{cfg.batch_size}")

    metrics_path = out / METRICS_FILE if out is not None else None
    if dist_info.is_main and out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume_state is not None:
            _truncate_metrics(metrics_path, step)
        else:
            metrics_path.write_text("")

    eval_in, eval_tgt, eval_w = (t.to(run_device) for t in task.eval_batch())

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            value = next_token_loss(model, eval_in, eval_tgt, eval_w).item()
        model.train()
        return value

    # 3. Evidence before step 1: one aligned pair from the first batch (a copy of the sampler, so
    #    looking does not move it), and the initial loss against ln V.
    peek_in, peek_tgt = task.batch(torch.Generator().set_state(generator.get_state()), 1)
    uniform = math.log(V)
    say("loss alignment (first sequence of the next batch):")
    for line in task.describe_pair(peek_in[0], peek_tgt[0]):
        say("  " + line)
    initial_loss = None
    if resume_state is None:
        initial_loss = evaluate()
        ok = abs(initial_loss - uniform) <= INITIAL_LOSS_TOLERANCE * uniform
        verdict = ("ok" if ok else "[red]FAILED[/red]" if fresh
                   else "not a fresh model: not checked")
        say(f"initial loss {initial_loss:.4f} vs ln V = {uniform:.4f} (tolerance "
            f"+/-{INITIAL_LOSS_TOLERANCE:.0%} = {INITIAL_LOSS_TOLERANCE * uniform:.3f}): {verdict}")
        if fresh and not ok:
            raise GateRefusal(
                "initial loss near ln V",
                f"a fresh model's loss is {initial_loss:.4f}, more than "
                f"{INITIAL_LOSS_TOLERANCE:.0%} away from ln V = {uniform:.4f}; far below suggests "
                "the targets leak into the inputs, far above a broken model", report)
        if dist_info.is_main and metrics_path is not None:
            with metrics_path.open("a") as handle:
                handle.write(json.dumps({"step": 0, "eval_loss": initial_loss}) + "\n")
    floor = task.entropy_floor()
    if floor is not None:
        say(f"task: {task.name}; entropy floor ln(4)/4 = {floor:.4f} nats/token")

    # 4. The loop.
    ckpt_folder = out / CHECKPOINT_DIR if out is not None else None
    can_save = ckpt_folder is not None and isinstance(model, Decoder)
    if out is not None and not can_save:
        say("note: checkpoints need a decoder-audit Decoder; this model's weights are not saved")
    tokens_per_step = cfg.batch_size * task.seq_len
    loop_start, first_step, last_loss = time.perf_counter(), step, float("nan")
    reached = None  # (step, seconds) of the first evaluation within 5% of the entropy floor
    checkpoint = None

    def save(at_step: int) -> Path | None:
        if can_save and dist_info.is_main:
            return _save(model, ckpt_folder, cfg=cfg, step=at_step, optimizer=optimizer,
                         scheduler=scheduler, generator=generator, task=task,
                         world_size=dist_info.world_size)
        return None

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.4f}"),
                   TextColumn("{task.fields[tps]:>9,.0f} tok/s"), TimeElapsedColumn(),
                   console=con, disable=not (progress and verbose and dist_info.is_main))
    with bar:
        bar_task = bar.add_task("train", total=cfg.steps, completed=step, loss=float("nan"),
                                tps=0.0)
        while step < cfg.steps:
            inputs, targets = task.batch(generator, cfg.batch_size)  # global (B, T)
            inputs = shard(inputs, dist_info.rank, dist_info.world_size).to(run_device)
            targets = shard(targets, dist_info.rank, dist_info.world_size).to(run_device)
            loss = next_token_loss(trained, inputs, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP: gradients averaged over ranks here
            grad_norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                         if cfg.grad_clip > 0 else torch.tensor(float("nan")))
            lr_now = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            step += 1

            reported = loss.detach()
            if dist_info.world_size > 1:  # the global batch's mean loss, for the log only
                reported = reported.clone()
                dist.all_reduce(reported)
                reported /= dist_info.world_size
            last_loss = reported.item()
            elapsed = time.perf_counter() - loop_start
            tps = (step - first_step) * tokens_per_step / max(elapsed, 1e-9)
            row = {"step": step, "loss": last_loss, "lr": lr_now, "grad_norm": float(grad_norm),
                   "tokens": step * tokens_per_step, "tokens_per_s": tps,
                   "elapsed_s": elapsed}
            if step % eval_every == 0 or step == cfg.steps:
                row["eval_loss"] = evaluate() if dist_info.is_main else float("nan")
                if floor is not None and reached is None and row["eval_loss"] <= 1.05 * floor:
                    reached = (step, elapsed)
            if dist_info.is_main and metrics_path is not None:
                with metrics_path.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
            if save_every and step % save_every == 0 and step < cfg.steps:
                checkpoint = save(step) or checkpoint
            bar.update(bar_task, completed=step, loss=last_loss, tps=tps)
            if callback is not None:
                callback(step, row)

    loop_seconds = time.perf_counter() - loop_start
    final_loss = evaluate()
    check_tied(model, "after training")
    checkpoint = save(step) or checkpoint
    tps = (step - first_step) * tokens_per_step / max(loop_seconds, 1e-9)
    if dist_info.world_size > 1:
        dist.barrier()  # the final checkpoint is on disk before any rank returns
    if dist_info.is_main and metrics_path is not None:
        plot = plot_losses(metrics_path, out / PLOT_FILE, floor=floor, uniform=uniform)
        say(f"loss curve: {plot}")
    if checkpoint is not None:
        say(f"checkpoint: {ckpt_folder}")
    summary = f"final {task.eval_label} {final_loss:.4f}"
    if floor is not None:
        summary += f" vs entropy floor {floor:.4f} ({final_loss / floor - 1:+.2%})"
        if reached is not None:
            summary += (f"\nwithin 5% of the floor from step {reached[0]} "
                        f"({reached[1]:.1f} s into training)")
    seconds = time.perf_counter() - start_time
    say(f"{summary}")
    say(f"{step - first_step} steps in {loop_seconds:.1f} s ({tps:,.0f} tokens/s); "
        f"{seconds:.1f} s in all, gate and checkpoints included")
    return TrainResult(model=model, config=cfg, step=step, final_loss=final_loss,
                       initial_loss=initial_loss, entropy_floor=floor, seconds=seconds,
                       tokens_per_s=tps, out=out, checkpoint=checkpoint, report=report)
