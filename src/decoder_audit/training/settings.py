"""What a run is: `TrainConfig` (the settings that define its result) and `TrainResult`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError

# Default peak learning rates: the 368-parameter model tolerates a large one; text models do not.
DEFAULT_LR = {"counting": 3e-2, "bytes": 3e-3, "tokens": 3e-3}
# Training precisions: fp32, or bfloat16 autocast around forward and loss over float32 weights.
PRECISIONS = ("fp32", "bf16")
# One seed range for the library and every command: torch takes [-2^63, 2^64), numpy's legacy
# seeding [0, 2^32), and the gate derives its checks' streams as seed * 1000003 + salt, which
# must stay below 2^64.
SEED_MAX = (1 << 32) - 1
SEED_BOUND = "2^32 - 1: what torch, numpy and Python's random all take as a seed"


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
    """Peak learning rate; None picks 3e-2 for the counting task and 3e-3 for text and data."""
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
    """Share of the text file kept for validation (its last bytes); a prepared dataset (`data`)
    declares its own held-out split."""
    data: str | None = None
    """A token dataset folder written by `decoder-audit prepare` (text/datasets.py); None: `text` or
    the counting task."""
    tokenizer: str | None = None
    """With `text`: the tokenizer that encodes it (a tokenizer.json, or a folder with GPT-2's
    vocab.json + merges.txt; what `--tokenizer` accepts); None trains on raw bytes."""
    grad_accum: int = 1
    """Micro-batches per optimizer step: each of batch_size / grad_accum rows, their gradients
    summed with weights that give the update of the whole batch at once."""
    precision: str = "fp32"
    """fp32, or bf16: forward and loss under torch.autocast(bfloat16), the loss in float32,
    the weights and AdamW's state kept in float32."""
    compile: bool = False
    """torch.compile the model for the training steps (evaluation stays eager)."""
    pack: bool = False
    """Pack documents: each training window is split at the tokenizer's end-of-sequence id into
    documents, each read alone (positions restart, no token reads another document) through the
    model's packing interface; the target of a document's last token is still the next
    document's first (as in unpacked training). Evaluation stays unpacked, so the losses of
    packed and unpacked runs compare."""

    def __post_init__(self) -> None:
        problems = []
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name}={value!r} must be a positive integer")
        if (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                or not 0 <= self.seed <= SEED_MAX):
            problems.append(f"seed={self.seed!r} must be an integer from 0 to {SEED_MAX} "
                            f"({SEED_BOUND})")
        # NaN compares False with every bound below, so it would pass them all: refused first
        not_finite = []
        numbers = {"lr": self.lr, "min_lr_ratio": self.min_lr_ratio,
                   "weight_decay": self.weight_decay, "grad_clip": self.grad_clip,
                   "val_fraction": self.val_fraction, "betas": self.betas}
        for name, value in numbers.items():
            values = value if isinstance(value, (tuple, list)) else (value,)
            if any(v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                          and math.isfinite(v)) for v in values):
                not_finite.append(f"{name}={value!r} must be finite numbers" if name == "betas"
                                  else f"{name}={value!r} must be a finite number")
        if not_finite:  # the bounds below compare them
            raise ConfigError("invalid TrainConfig: " + "; ".join(problems + not_finite))
        if not isinstance(self.warmup, int) or self.warmup < 0:
            problems.append(f"warmup={self.warmup!r} must be an integer >= 0")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and self.lr > 0):
            problems.append(f"lr={self.lr!r} must be > 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")
        if self.weight_decay < 0 or self.grad_clip < 0:
            problems.append(f"weight_decay={self.weight_decay} and grad_clip={self.grad_clip} "
                            "must be >= 0")
        if self.text is not None and self.data is not None:
            problems.append(f"text={self.text!r} and data={self.data!r}: train on one of them")
        if self.tokenizer is not None and self.text is None:
            problems.append(f"tokenizer={self.tokenizer!r} encodes text=FILE; a prepared dataset "
                            "(data=) carries its own tokenizer")
        problems += self._batch_problems()
        if problems:
            raise ConfigError("invalid TrainConfig: " + "; ".join(problems))

    def _batch_problems(self) -> list[str]:
        problems = []
        accum = self.grad_accum
        if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
            problems.append(f"grad_accum={accum!r} must be a positive integer")
        elif isinstance(self.batch_size, int) and self.batch_size % accum:
            problems.append(f"batch_size={self.batch_size} is not divisible by grad_accum={accum}:"
                            f" every micro-batch must hold batch_size / grad_accum rows")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} must be one of {list(PRECISIONS)}")
        if not isinstance(self.compile, bool):
            problems.append(f"compile={self.compile!r} must be True or False")
        return problems

    @property
    def task_name(self) -> str:
        if self.data is not None or self.tokenizer is not None:
            return "tokens"
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

    def differences(self, other: "TrainConfig") -> list[str]:
        """One line per field whose value differs, `name: checkpoint X, given Y` (self is the
        checkpoint's)."""
        return [f"{f.name}: checkpoint {getattr(self, f.name)!r}, given {getattr(other, f.name)!r}"
                for f in dataclasses.fields(TrainConfig)
                if not _same(f.name, getattr(self, f.name), getattr(other, f.name))]


# Fields that name files: stored absolute, so a resumed run reads the same file from any
# working directory, and compared as the files they name.
PATH_FIELDS = ("text", "data")


def _same(name: str, saved: Any, given: Any) -> bool:
    if name in PATH_FIELDS and saved is not None and given is not None:
        return Path(saved).resolve() == Path(given).resolve()
    return saved == given


def settings_from(config: TrainConfig | None, options: dict[str, Any]) -> TrainConfig:
    """`config` (default TrainConfig()) with `options` replacing its fields; file paths made
    absolute."""
    try:
        cfg = dataclasses.replace(config or TrainConfig(), **options)
    except TypeError as exc:
        raise TypeError(f"train: unknown option ({exc}); options are the TrainConfig fields "
                        f"{[f.name for f in dataclasses.fields(TrainConfig)]}") from None
    absolute = {name: str(Path(getattr(cfg, name)).absolute()) for name in PATH_FIELDS
                if getattr(cfg, name) is not None}
    return dataclasses.replace(cfg, **absolute) if absolute else cfg


def resumed_settings(meta: dict[str, Any], cfg: TrainConfig, *, given: bool) -> TrainConfig:
    """The checkpoint's TrainConfig; settings given for the resumed run must agree with it."""
    try:
        saved = TrainConfig.from_dict(meta["train_config"])
    except (TypeError, KeyError, ValueError) as exc:
        raise ConfigError(f"the checkpoint's train_config cannot be read back ({exc})") from None
    differ = saved.differences(cfg) if given else []
    if differ:
        raise ConfigError("a resumed run must keep its training settings; these differ: "
                          + "; ".join(differ))
    return saved


@dataclass
class TrainResult:
    model: nn.Module | None
    """The trained model (unwrapped from DDP); None on the ranks other than 0 of a sharded
    run, where rank 0 holds it whole."""
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
    throughput: Any = None
    """The loop's tokens, seconds, tokens/s and MFU (training/throughput.py)."""
