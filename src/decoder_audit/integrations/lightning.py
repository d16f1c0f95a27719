"""The gate inside Lightning: a `Callback` for a LightningModule that holds a decoder.

    trainer = lightning.Trainer(max_steps=..., callbacks=[LightningGate("model")])
    trainer.fit(module, dataloader)           # refused, or gated, before its first step

When training starts, `LightningGate` finds the decoder (the module's attribute it names, or the
one child module that is a decoder: it maps ids to logits), reads the path from the trainer
(rows and length of the first batch; rows per step = rows x accumulate_grad_batches x world
size; the length: the longest row the dataloader can yield, lengths.py; "bf16-mixed" is bf16
autocast, "16-mixed" fp16; packing from the batch: restarting position_ids, or our
Decoder's document_ids; checkpointing from the decoder itself), takes the first batches of the
train dataloader (every random state put back after) and hands them to `RunGate` (gating.py).
The batches are collators' mappings (input_ids, labels, ...), (inputs, targets) pairs whose
target t is scored by logit t, or a `to_batch` function makes them a mapping. A training_step that steps on the decoder's own
labels= loss takes the "model loss" path too: say so with `model_loss=True`. Each training
batch's loss (what training_step returns) is held against the floor and, in the first
`watch_steps` batches, against near zero.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning.pytorch as lightning
import torch
from torch import nn

from ..errors import ConfigError
from ..gate import TrainingPath
from ..objective import logits_of
from .gating import (NEAR_ZERO, WATCH_STEPS, RunGate, RunPlan, batch_size_and_length, ranks_of,
                     readable)
from .lengths import row_length
from .peek import first_batches, preserved_random_state

# Lightning's precision names -> the gate's (the autocast a "-mixed" precision runs under)
PRECISIONS = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32-true": "fp32", "32": "fp32",
              "bf16-true": "fp32", "16-true": "fp32", "64-true": "fp32"}


class LightningGate(lightning.Callback):
    """The gate of a Lightning run (module docstring). `decoder`: the LightningModule's
    attribute holding the decoder (None: its one child module that is a decoder); `batches`:
    how many first batches are audited (default: one optimizer step's); `to_batch`: the
    dataloader's item -> a collator's mapping; `model_loss`: training_step steps on the
    decoder's own labels= loss. The other options are RunGate's."""

    def __init__(self, decoder: str | None = None, *, batches: int | None = None,
                 to_batch: Callable[[Any], Mapping] | None = None, model_loss: bool = False,
                 labels_shifted: bool = False, loss_floor: float | None = None,
                 near_zero: float | None = NEAR_ZERO, watch_steps: int = WATCH_STEPS,
                 audit_options: Mapping[str, Any] | None = None, tokenizer: Any = None,
                 seed: int = 0, say: Callable[..., None] | None = None) -> None:
        if batches is not None and batches < 1:
            raise ValueError(f"batches={batches!r} must be a positive count")
        self.decoder_name, self.batches, self.to_batch = decoder, batches, to_batch or _as_batch
        self.model_loss = model_loss
        self.gate = RunGate(loss_floor=loss_floor, near_zero=near_zero, watch_steps=watch_steps,
                            seed=seed, audit_options=audit_options, tokenizer=tokenizer,
                            labels_shifted=labels_shifted, say=say)
        self._seen = 0

    @property
    def verdict(self):
        return self.gate.verdict

    def on_train_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule
                       ) -> None:
        ranks = ranks_of(trainer.global_rank, trainer.world_size)
        out, refusing = trainer.default_root_dir, self.gate.refusing
        loader = trainer.train_dataloader
        with refusing("training_path", "finding the decoder", ranks, out):
            decoder = find_decoder(pl_module, self.decoder_name)
        with preserved_random_state(loader):
            with refusing("batch_as_sent", "the train dataloader's first batches", ranks, out):
                raw = first_batches(loader, self.batches or trainer.accumulate_grad_batches)
                source = "to_batch= made" if self.to_batch is not _as_batch else \
                    "the train dataloader yielded"
                batches = readable([self.to_batch(item) for item in raw], source)
            with refusing("training_path", "reading the path the trainer takes", ranks, out):
                plan = plan_of(trainer, decoder, batches, model_loss=self.model_loss)
            call = (lambda batch: (decoder(**_on_device(batch, decoder)), None)) \
                if self.model_loss else None
            with refusing("gate", "the gate itself raised", ranks, out):
                self.gate.before_training(decoder, plan, batches, ranks, out, loss_call=call,
                                          forward=lambda batch: _logits(decoder, batch))
        self._seen = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._seen += 1
        if not self.gate.watching(self._seen):
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self.gate.after_step(self._seen, float(loss.detach()))


def find_decoder(module: nn.Module, name: str | None) -> nn.Module:
    """The decoder a LightningModule holds: the attribute `name`, or its one child module with
    a forward over ids (a Hugging Face model, a DecoderConfig, or an input embedding)."""
    if name is not None:
        found = getattr(module, name, None)
        if not isinstance(found, nn.Module):
            raise ConfigError(f"{type(module).__name__}.{name} is "
                              f"{type(found).__name__}, not the decoder module")
        return found
    children = [(n, m) for n, m in module.named_children() if _looks_like_decoder(m)]
    if len(children) != 1:
        raise ConfigError(f"{type(module).__name__} holds {len(children)} modules that look like "
                          f"a decoder ({[n for n, _ in children]}): name the one to audit, "
                          "LightningGate('attribute')")
    return children[0][1]


def _looks_like_decoder(module: nn.Module) -> bool:
    return hasattr(module, "config") or any(isinstance(m, nn.Embedding)
                                            for m in module.modules())


def plan_of(trainer: lightning.Trainer, decoder: nn.Module, batches: Sequence[Mapping], *,
            model_loss: bool = False) -> RunPlan:
    """The path a Lightning trainer takes, read from it and from its first batch."""
    if not batches:
        raise ConfigError("the train dataloader yielded no batch: nothing to train or audit")
    rows, _ = batch_size_and_length(batches[0])
    loader = trainer.train_dataloader
    # (inputs, targets) pairs and to_batch= mappings: the collate_fn's rows are not the batches'
    found = row_length(getattr(loader, "dataset", None), getattr(loader, "collate_fn", None),
                       getattr(loader, "batch_size", None) or rows, batches)
    length = found.seq_len
    precision = PRECISIONS.get(str(trainer.precision))
    if precision is None:
        raise ConfigError(f"Lightning precision {trainer.precision!r} is not one the gate reads "
                          f"({sorted(PRECISIONS)})")
    notes = [f"the run's rows are up to T={length} tokens long: {found.how}"]
    if not model_loss:
        notes.append("training_step is not declared to step on the decoder's own labels= loss "
                     "(LightningGate(model_loss=True)): the 'model loss' path is not audited as "
                     "this run's")
    form = _pack_form(batches[0])
    accumulation, world = trainer.accumulate_grad_batches, trainer.world_size
    path = TrainingPath(rows, length, precision,
                        pack=form is not None, pack_form=form)
    return RunPlan(path, ("training", "model loss") if model_loss else ("training",),
                   global_batch=rows * accumulation * world, accumulation=accumulation,
                   world_size=world, trainer=type(trainer).__name__, notes=tuple(notes),
                   router_aux=bool(getattr(getattr(decoder, "config", None),
                                           "output_router_logits", False)))


def _pack_form(batch: Mapping) -> str | None:
    if isinstance(batch.get("document_ids"), torch.Tensor):
        return "document_ids"
    positions = batch.get("position_ids")
    if isinstance(positions, torch.Tensor) and bool((positions[:, 1:] == 0).any()):
        return "position_ids"
    return None


def _as_batch(item: Any) -> Mapping:
    """A collator's mapping as it is; an (inputs, targets) pair of (B, T) tensors whose targets
    are scored by the logits beside them (nanoGPT's x, y: target t is input t + 1) as the
    mapping of the same batch in the labels convention (label t + 1 is target t; label 0, which
    no logit scores, ignored). The last target has no input beside it to compare with, and is
    left out of the batch checks."""
    if isinstance(item, Mapping):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(
            isinstance(t, torch.Tensor) and t.dim() == 2 for t in item) and \
            item[0].shape == item[1].shape:
        inputs, targets = item
        labels = torch.full_like(targets, -100)  # (B, T)
        labels[:, 1:] = targets[:, :-1]
        return {"input_ids": inputs, "labels": labels}
    raise ConfigError(f"the train dataloader yields {type(item).__name__}: pass "
                      "LightningGate(to_batch=fn) mapping it to input_ids and labels")


def _on_device(batch: Mapping, decoder: nn.Module) -> dict[str, Any]:
    device = next((p.device for p in decoder.parameters()), torch.device("cpu"))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _logits(decoder: nn.Module, batch: Mapping) -> torch.Tensor:
    """The decoder's logits on a batch: a forward that takes keywords gets every entry it names
    but the labels; ids go first."""
    inputs = _on_device(batch, decoder)
    try:
        named = inspect.signature(decoder.forward).parameters
    except (TypeError, ValueError):
        named = {}
    extra = {k: v for k, v in inputs.items() if k in named and k not in (
        "input_ids", "labels", "shift_labels")}
    return logits_of(decoder(inputs["input_ids"], **extra))


__all__ = ["LightningGate", "find_decoder", "plan_of"]
