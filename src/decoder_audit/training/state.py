"""The run folder, and the training state a checkpoint carries so a run can be resumed.

    OUT/metrics.jsonl              one JSON line per step ({"step": 0, "eval_loss": ...} first)
    OUT/loss_curve.png             drawn from metrics.jsonl at the end
    OUT/checkpoint/                the weights (safetensors) and config.json (checkpoint.py), and
        train_state.pt             step, optimizer, scheduler, data sampler and torch RNG states
        trainer.json               the TrainConfig, the task, the world size
        <tokenizer files>          the task's tokenizer and its manifest (tokenizer.py)

Reproducibility. The model is initialised from `seed`; batches come from their own
`torch.Generator(seed)`; nothing else draws random numbers. A checkpoint stores the weights, the
optimizer and scheduler state, the data generator's state and the step, so a run stopped after
step k and resumed from its checkpoint ends bitwise equal to one that never stopped (CPU, same
world size and thread count). train_state.pt is read with `weights_only=True`: only tensors and
plain containers, never arbitrary pickled objects.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import plots
from ..checkpoint import CHECKPOINT_DIR, decoder_from_tensors, expected_shapes, save_checkpoint
from ..errors import CheckpointError, ConfigError
from ..model import Decoder
from .settings import TrainConfig

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss_curve.png"
STATE_FILE = "train_state.pt"
TRAINER_FILE = "trainer.json"
# The layout version of trainer.json and train_state.pt.
STATE_FORMAT = 1


# ----------------------------------------------------------------------------------------------
# The run folder
# ----------------------------------------------------------------------------------------------

def run_folder_of(resume: str | os.PathLike) -> Path:
    """The run folder a resume argument names: the folder itself, or the parent of checkpoint/."""
    path = Path(resume)
    return path.parent if path.name == CHECKPOINT_DIR else path


def refuse_finished_run(out: str | os.PathLike) -> None:
    """A fresh run never writes over another run's checkpoint."""
    if (Path(out) / CHECKPOINT_DIR).exists():
        raise ConfigError(f"{str(out)!r} already holds a training run ({CHECKPOINT_DIR}/); "
                          "continue it with resume (--resume), or choose another out folder "
                          "(--out)")


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
        past its checkpoint (those steps will be redone)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if resumed_at is None:
            self.metrics.write_text("")
        else:
            truncate_metrics(self.metrics, resumed_at)

    def append(self, row: dict[str, Any]) -> None:
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    def plot_losses(self, *, floor: float | None, uniform: float) -> Path:
        return plot_losses(self.metrics, self.plot, floor=floor, uniform=uniform)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines past the checkpoint a run resumes from (they will be redone)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def plot_losses(metrics_path: Path, png_path: Path, *, floor: float | None,
                uniform: float) -> Path:
    """Training loss per step, evaluation loss, the entropy floor and ln V, as a PNG."""
    return plots.loss_curve_png(read_metrics(metrics_path), png_path, floor=floor,
                                uniform=uniform)


# ----------------------------------------------------------------------------------------------
# The training state in a checkpoint
# ----------------------------------------------------------------------------------------------

def save_training_checkpoint(model: nn.Module, folder: Path, *, cfg: TrainConfig, step: int,
                             optimizer: torch.optim.Optimizer, scheduler: Any,
                             generator: torch.Generator, task: Any, world_size: int) -> Path:
    """The weights, config.json, train_state.pt and trainer.json, in one atomic swap.

    `model` is white-box (the gate said so): a Decoder, or a module with a DecoderConfig and the
    Decoder's weight names, which is written as the Decoder holding its weights."""
    buffer = io.BytesIO()
    torch.save({
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data_rng": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }, buffer)
    meta = {"format": STATE_FORMAT, "step": step, "train_config": cfg.to_dict(), **task.state(),
            "world_size": world_size, "entropy_floor": task.entropy_floor()}
    return save_checkpoint(_as_decoder(model), folder, extra_files={
        **task.checkpoint_files(),  # the tokenizer, so `sample` reads the model as it was trained
        STATE_FILE: buffer.getvalue(),
        TRAINER_FILE: (json.dumps(meta, indent=2) + "\n").encode(),
    })


def _as_decoder(model: nn.Module) -> Decoder:
    """The Decoder a white-box module's weights describe (the module itself if it is one)."""
    if isinstance(model, Decoder):
        return model
    wanted = expected_shapes(model.config)  # the unique names: a tied readout is not among them
    tensors = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)
               if name in wanted}
    return decoder_from_tensors(model.config, tensors)


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


def restore_training_state(state: dict[str, Any], optimizer: torch.optim.Optimizer,
                           scheduler: Any, generator: torch.Generator) -> int:
    """Put a checkpoint's optimizer, scheduler, sampler and torch RNG states back; its step."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])
