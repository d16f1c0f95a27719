"""The run folder, and the training state a checkpoint carries so a run can be resumed.

    OUT/metrics.jsonl              one JSON line per step ({"step": 0, "eval_loss": ...} first)
    OUT/loss_curve.png             drawn from metrics.jsonl at the end
    OUT/checkpoint/                the weights (safetensors) and config.json (storage/checkpoint.py), and
        train_state.pt             step, optimizer, scheduler, data sampler and torch RNG states
        trainer.json               the TrainConfig, the task, the world size
        <tokenizer files>          the task's tokenizer and its manifest (tokenizer.py)

Reproducibility. The model is initialised from `seed`; batches come from their own
`torch.Generator(seed)`; nothing else draws random numbers. A checkpoint stores the weights, the
optimizer and scheduler state, the data generator's state and the step, so a run stopped after
step k and resumed from its checkpoint ends bitwise equal to one that never stopped (CPU, same
world size and thread count). train_state.pt is read with `weights_only=True`: only tensors and
plain containers, never arbitrary pickled objects.

    OUT/run.lock                   held while a run writes (lock.py)
    checkpoint/factory.json        instead of config.json for a model that is not a Decoder: what
                                   rebuilds it (its FILE.py:FACTORY); the weights are its state dict

trainer.json also keeps the run options (save_every, eval_every, device, threads) a resumed run
continues with, and model.safetensors records the SHA-256 of trainer.json and train_state.pt: a
replaced or truncated file is refused before it is read. metrics.jsonl is strict JSON (a
non-finite value is written as null); a torn last line, which only a kill mid-write leaves, is
dropped when the run resumes.

A sharded run (FSDP2, distributed.py) writes a sharded checkpoint instead (storage/sharded.py):
every rank writes its own rows of the weights and of AdamW's moments with
torch.distributed.checkpoint into checkpoint/dcp/, no rank gathering the model, and
sharded.json replaces model.safetensors as the holder of the files' SHA-256:

    OUT/checkpoint/config.json, trainer.json, train_state.pt, <tokenizer files>   as above, but
        train_state.pt holds only AdamW's param_groups (its tensors are in dcp/)
    OUT/checkpoint/sharded.json    the manifest: world size, SHA-256 of the config and each file
    OUT/checkpoint/dcp/            .metadata and one __R_0.distcp per rank R

It resumes on any number of ranks, sharded or not: the weights are assembled from their chunks
(`load_checkpoint` reads a sharded folder too) and each rank reads its own rows of AdamW's state
(`load_sharded_state`); the state put back is bitwise the state saved, so a run resumed on the
world size that saved it ends bitwise equal to one that never stopped. An unsharded checkpoint
resumes sharded too (its whole optimizer state sharded again on load). Each kind of save
replaces the other kind's files in the same folder. trainer.json records `sharded`.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, RunFolderError
from ..model.decoder import Decoder
from ..storage.checkpoint import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    FACTORY_FILE,
    WEIGHTS_FILE,
    decoder_from_tensors,
    expected_shapes,
    read_checked_file,
    save_checkpoint,
    save_module_weights,
)
from ..storage.folder import refuse_symlink, refuse_to_lose
from ..storage.sharded import (
    MANIFEST_FILE,
    SHARDS_DIR,
    holds_dtensors,
    is_sharded_checkpoint,
    load_sharded_state,
    optimizer_state,
    save_sharded_checkpoint,
)
from .curve import loss_curve_png
from .settings import TrainConfig

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss_curve.png"
STATE_FILE = "train_state.pt"
TRAINER_FILE = "trainer.json"
# The layout version of trainer.json and train_state.pt.
STATE_FORMAT = 1
# What a training save writes into checkpoint/ (besides the task's own files, e.g. a tokenizer).
CHECKPOINT_FILES = [CONFIG_FILE, WEIGHTS_FILE, FACTORY_FILE, STATE_FILE, TRAINER_FILE,
                    MANIFEST_FILE, SHARDS_DIR]
# In a resumed sharded checkpoint's optimizer entry: the folder its tensors are read from.
SHARDS_KEY = "shards"


# ----------------------------------------------------------------------------------------------
# The run folder
# ----------------------------------------------------------------------------------------------

def run_folder_of(resume: str | os.PathLike) -> Path:
    """The run folder a resume argument names: the folder itself, or the parent of checkpoint/."""
    path = Path(resume)
    return path.parent if path.name == CHECKPOINT_DIR else path


def refuse_finished_run(out: str | os.PathLike) -> None:
    """A fresh run never writes over another run's checkpoint, metrics or loss curve."""
    if (Path(out) / CHECKPOINT_DIR).exists():
        raise ConfigError(f"{str(out)!r} already holds a training run ({CHECKPOINT_DIR}/); "
                          "continue it with resume (--resume), or choose another out folder "
                          "(--out)")
    earlier = [name for name in (METRICS_FILE, PLOT_FILE) if (Path(out) / name).exists()]
    if earlier:
        raise ConfigError(f"{str(out)!r} already holds {earlier} of an earlier run (which left no "
                          "checkpoint to resume); a fresh run would overwrite them: choose "
                          "another out folder (--out) or move them away")


def refuse_foreign_entries(folder: Path, names: list[str]) -> None:
    """Before step 1: the run's checkpoint folder must hold nothing its saves would delete (a
    save replaces the whole folder; one holding a user's file refuses, see storage/checkpoint.py)."""
    refuse_to_lose(folder, names, what="training checkpoint")


@dataclass(frozen=True)
class RunFolder:
    """Where a run writes (rank 0 only): metrics, the loss curve, the checkpoint."""

    path: Path

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def plot(self) -> Path:
        return self.path / PLOT_FILE

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def start(self, resumed_at: int | None) -> None:
        """Create the folder; a fresh run starts an empty log, a resumed one drops the lines
        past its checkpoint (those steps will be redone). Links are refused first."""
        self.refuse_links()
        self.path.mkdir(parents=True, exist_ok=True)
        if resumed_at is None:
            self.metrics.write_text("")
        else:
            truncate_metrics(self.metrics, resumed_at)

    def refuse_links(self) -> None:
        """RunFolderError naming the link and its target if checkpoint/, metrics.jsonl or
        loss_curve.png is a symbolic link: the run would overwrite what a file link points at,
        and its saves would replace a linked checkpoint/ by a real folder, hiding the link."""
        for path, what in ((self.checkpoint, "training checkpoint"),
                           (self.metrics, "metrics log"), (self.plot, "loss curve")):
            refuse_symlink(path, what=what, error=RunFolderError)

    def append(self, row: dict[str, Any]) -> None:
        """One JSON line; a non-finite float is written as null (JSON has no NaN)."""
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(_finite(row), allow_nan=False) + "\n")

    def plot_losses(self, *, floor: float | None, uniform: float) -> Path:
        return plot_losses(self.metrics, self.plot, floor=floor, uniform=uniform)


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in row.items()}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl. A torn last line (a process killed mid-write) is dropped; a
    damaged line before it is a RunFolderError naming it."""
    return [row for _, row in _metric_lines(path)]


def _metric_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    lines = [line for line in path.read_bytes().decode("utf-8", errors="replace").splitlines()
             if line.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row")
        except ValueError:
            if number == len(lines):
                break  # torn by a kill mid-write: that step is redone
            raise RunFolderError(f"{str(path)!r} line {number} is not a metrics row: "
                                 f"{line[:60]!r}") from None
        rows.append((line, row))
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines past the checkpoint a run resumes from (they will be redone), and a
    torn last line."""
    if not path.exists():
        return
    kept = [line for line, row in _metric_lines(path) if row["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def plot_losses(metrics_path: Path, png_path: Path, *, floor: float | None,
                uniform: float) -> Path:
    """Training loss per step, evaluation loss, the entropy floor and ln V, as a PNG."""
    return loss_curve_png(read_metrics(metrics_path), png_path, floor=floor,
                                uniform=uniform)


# ----------------------------------------------------------------------------------------------
# The training state in a checkpoint
# ----------------------------------------------------------------------------------------------

def save_training_checkpoint(model: nn.Module, folder: Path, *, cfg: TrainConfig, step: int,
                             optimizer: torch.optim.Optimizer, scheduler: Any,
                             generator: torch.Generator, task: Any, world_size: int,
                             options: dict[str, Any] | None = None,
                             factory: dict[str, Any] | None = None) -> Path | None:
    """The weights, config.json, train_state.pt and trainer.json, in one atomic swap.

    `model` is white-box (the gate said so): a Decoder, or a module with a DecoderConfig and the
    Decoder's weight names, which is written as the Decoder holding its weights. With `factory`
    (what rebuilds a module that is not white-box, e.g. {"factory": "/abs/model.py:build",
    "vocab_size": V, "max_seq_len": T}) its state dict is written instead, beside factory.json
    (`checkpoint.save_module_weights`). `options` are the run's settings outside the
    TrainConfig (save_every, eval_every, device, threads), which a resumed run keeps.

    A sharded model writes a sharded checkpoint (the module docstring): every rank must call
    this, each writing its own rows; rank 0 returns the folder, the others None."""
    sharded = is_sharded(model)
    if sharded:  # AdamW's tensors go into DCP, its param_groups (plain numbers) stay here
        optimizer_tensors, groups = optimizer_state(model, optimizer)
        saved_optimizer: dict[str, Any] = {"param_groups": groups}
    else:
        saved_optimizer = optimizer.state_dict()
    buffer = io.BytesIO()
    torch.save({
        "step": step,
        "optimizer": saved_optimizer,
        "scheduler": scheduler.state_dict(),
        "data_rng": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }, buffer)
    meta = {"format": STATE_FORMAT, "step": step, "train_config": cfg.to_dict(), **task.state(),
            "world_size": world_size, "sharded": sharded, "entropy_floor": task.entropy_floor(),
            "run_options": dict(options or {})}
    if factory is not None:
        meta["factory"] = factory
    extra_files = {
        **task.checkpoint_files(),  # the tokenizer, so `sample` reads the model as it was trained
        STATE_FILE: buffer.getvalue(),
        TRAINER_FILE: (json.dumps(meta, indent=2) + "\n").encode(),
    }
    if sharded:  # an unsharded checkpoint there before (a resumed run) is replaced
        return save_sharded_checkpoint(model, folder, optimizer_tensors=optimizer_tensors,
                                       extra_files=extra_files, superseded=[WEIGHTS_FILE])
    return _save_weights(model, folder, factory, extra_files=extra_files)


def _save_weights(model: nn.Module, folder: Path, factory: dict[str, Any] | None, *,
                  extra_files: dict[str, bytes]) -> Path:
    if factory is not None:  # not white-box: its state dict, and what rebuilds it
        return save_module_weights(model, folder, factory=factory, extra_files=extra_files)
    # a sharded checkpoint there before (a sharded run resumed unsharded) is replaced
    return save_checkpoint(_as_decoder(model), folder, extra_files=extra_files,
                           superseded=[MANIFEST_FILE, SHARDS_DIR])


def _as_decoder(model: nn.Module) -> Decoder:
    """The Decoder a white-box module's weights describe (the module itself if it is one)."""
    if isinstance(model, Decoder):
        return model
    wanted = expected_shapes(model.config)  # the unique names: a tied readout is not among them
    tensors = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)
               if name in wanted}
    return decoder_from_tensors(model.config, tensors)


_STATE_KEYS = ("step", "optimizer", "scheduler", "data_rng", "torch_rng")


def read_trainer_state(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer.json, train_state.pt) of a checkpoint, each checked against the SHA-256 recorded
    when it was saved. The .pt is read with weights_only=True: only tensors and plain
    containers, never arbitrary pickled objects; anything else is a CheckpointError."""
    meta_path, state_path = folder / TRAINER_FILE, folder / STATE_FILE
    if not meta_path.is_file() or not state_path.is_file():
        raise CheckpointError(f"{str(folder)!r} is not a training checkpoint: it lacks "
                              f"{TRAINER_FILE} or {STATE_FILE}, so it cannot be resumed")
    raw_meta = read_checked_file(folder, TRAINER_FILE)
    try:
        meta = json.loads(raw_meta.decode("utf-8"))
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or not isinstance(meta.get("train_config"), dict):
        raise CheckpointError(f"{str(meta_path)!r} is not a trainer.json that decoder-audit "
                              "train wrote (not a JSON object with train_config)")
    state = _load_state(state_path, read_checked_file(folder, STATE_FILE))
    if is_sharded_checkpoint(folder):  # AdamW's tensors are read from dcp/ on restore
        state["optimizer"] = {**state["optimizer"], SHARDS_KEY: str(folder)}
    return meta, state


def _load_state(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        # Never suggest loading it unsafely: a training state is tensors and plain containers.
        raise CheckpointError(
            f"{str(path)!r} holds a pickled object{what} that is not a training state; it is read "
            "as tensors and plain containers only and is refused unread: resume from a "
            "checkpoint that decoder-audit train wrote") from None
    except (RuntimeError, EOFError, ValueError, OSError):
        raise CheckpointError(f"{str(path)!r} ({len(raw):,} bytes) is truncated or corrupt: not a "
                              "readable training state") from None
    missing = [key for key in _STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointError(f"{str(path)!r} is not a training state decoder-audit train wrote "
                              f"(it lacks {missing})")
    return state


def restore_training_state(state: dict[str, Any], optimizer: torch.optim.Optimizer,
                           scheduler: Any, generator: torch.Generator,
                           model: nn.Module | None = None) -> int:
    """Put a checkpoint's optimizer, scheduler, sampler and torch RNG states back; its step.
    From a sharded checkpoint each rank of a sharded `model` reads its own rows of AdamW's
    state, a plain `model` the whole of it (every rank calls this). From an unsharded one, a
    sharded `model`'s ranks each keep their shard of the whole state."""
    saved = state["optimizer"]
    if SHARDS_KEY in saved:
        if model is None:
            raise CheckpointError("a sharded checkpoint's optimizer state is restored onto its "
                                  "model's Parameters: pass the model")
        load_sharded_state(saved[SHARDS_KEY], model, optimizer=optimizer,
                           param_groups=saved["param_groups"], weights=False)
    elif model is not None and is_sharded(model):
        _load_sharded_optimizer(model, optimizer, saved)
    else:
        optimizer.load_state_dict(saved)
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


# ----------------------------------------------------------------------------------------------
# Sharded (FSDP2) models: the whole state gathered on save, sharded again on resume
# ----------------------------------------------------------------------------------------------

is_sharded = holds_dtensors  # whether FSDP2 has sharded a model (storage/sharded.py)


def gather_full_state(model: nn.Module) -> Decoder | None:
    """A sharded Decoder's whole weights as a plain Decoder on the CPU, on rank 0; None on the
    other ranks. Every rank must call it: it gathers."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict with cpu_offload: only rank 0 receives the tensors, on its CPU
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    if not weights:
        return None
    wanted = expected_shapes(model.config)  # the unique names: a tied readout is not among them
    return decoder_from_tensors(model.config,
                                {name: t for name, t in weights.items() if name in wanted})


def _load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer,
                            numbered: dict[str, Any]) -> None:
    """An unsharded checkpoint's whole optimizer state (`Optimizer.state_dict()`'s layout: the
    parameters numbered in group order) keyed by parameter name, then each rank keeps its
    shard of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    name_of = {id(p): name for name, p in model.named_parameters()}
    order = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = [number for group in numbered["param_groups"] for number in group["params"]]
    if sorted(saved) != list(range(len(order))):
        raise CheckpointError(f"the checkpoint's optimizer state numbers {len(saved)} "
                              f"parameters; this model's optimizer has {len(order)}")
    by_name = {"state": {order[number]: value for number, value in numbered["state"].items()},
               "param_groups": [{**group, "params": [order[n] for n in group["params"]]}
                                for group in numbered["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name,
                             options=StateDictOptions(full_state_dict=True))


def whole_model(model: nn.Module) -> nn.Module | None:
    """`model` as one module: a sharded one gathered into a plain Decoder on rank 0's CPU (every
    rank must call this), any other `model` itself. The other ranks of a sharded run get None:
    their shard, with the hooks that hold it, must be gone before the process group closes."""
    if not is_sharded(model):
        return model
    return gather_full_state(model)
