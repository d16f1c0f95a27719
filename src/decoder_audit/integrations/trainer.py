"""The gate inside transformers' `Trainer` and TRL's `SFTTrainer`:

    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    gate_trainer(trainer, loss_floor=None)        # adds a TrainerGate to its callbacks
    trainer.train()                                # refused, or gated, before its first step

When training begins, `TrainerGate` reads the path from the trainer itself (`plan_of`): rows and
length of the first batch, the global batch (per device x accumulation x world size), bf16,
gradient checkpointing (the argument, or switched on in the model), and how the collator packs:
`DataCollatorWithFlattening` and TRL's padding-free collator (SFT `packing=True` or
`padding_free=True`) send restarting position_ids (and flash attention's cu_seq_lens, which the
model reads only where it runs a flash attention implementation). It takes the first batches the
dataloader yields (one optimizer step's micro-batches; every random state put back after, so the
run trains on exactly what it would have), and hands them to `RunGate` (gating.py) with the
model's own loss called as `Trainer.compute_loss` calls it, with the trainer's
num_items_in_batch, where the trainer takes that loss. Each step's loss (the sum of its
micro-batches' losses, what the trainer logs) is held against the floor and near zero.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import DataCollatorWithFlattening, Trainer, TrainerCallback

from ..errors import ConfigError
from ..gate import TrainingPath
from .gating import (NEAR_ZERO, WATCH_STEPS, RunGate, RunPlan, batch_size_and_length, facts_of,
                     ranks_of, readable)
from .lengths import RunLength, row_length
from .lineage import MAX_TOKENS, batch_lineage, check_lineage, sft_lineage
from .losses import model_inputs
from .peek import first_batches, preserved_random_state


def gate_trainer(trainer: Trainer, **options: Any) -> TrainerGate:
    """Add a TrainerGate (with `options`: loss_floor=, near_zero=, watch_steps=, batches=,
    audit_options=, say=, source=) to `trainer`'s callbacks; returns it."""
    gate = TrainerGate(trainer, **options)
    trainer.add_callback(gate)
    return gate


class TrainerGate(TrainerCallback):
    """The gate of a `Trainer` run (module docstring). `batches`: how many first batches are
    audited (default: one optimizer step's, gradient_accumulation_steps); `source`: the dataset
    an SFTTrainer was given, for the data's lineage (lineage.py); the other options are
    RunGate's. `gate.verdict` keeps what was found."""

    def __init__(self, trainer: Trainer, *, batches: int | None = None,
                 loss_floor: float | None = None, near_zero: float | None = NEAR_ZERO,
                 watch_steps: int = WATCH_STEPS, audit_options: Mapping[str, Any] | None = None,
                 seed: int = 0, say: Any = None, source: Any = None) -> None:
        if batches is not None and batches < 1:
            raise ValueError(f"batches={batches!r} must be a positive count")
        self.trainer, self.batches, self.source = trainer, batches, source
        self.gate = RunGate(loss_floor=loss_floor, near_zero=near_zero, watch_steps=watch_steps,
                            seed=seed, audit_options=audit_options,
                            tokenizer=getattr(trainer, "processing_class", None),
                            say=say)
        self._step_losses: list[float] = []
        self._first_step = 0
        self._restore: Any = None

    @property
    def verdict(self):
        return self.gate.verdict

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None,
                       **kwargs):
        trainer = self.trainer
        model = model if model is not None else trainer.model
        ranks, out = ranks_of(args.process_index, args.world_size), args.output_dir
        refusing = self.gate.refusing
        with preserved_random_state(train_dataloader), without_mixed_precision(model):
            with refusing("batch_as_sent", "the trainer's first batches", ranks, out):
                batches = readable(first_batches(train_dataloader, self.batches or
                                                 args.gradient_accumulation_steps),
                                   "the trainer's dataloader yielded")
            with refusing("training_path", "reading the path the trainer takes", ranks, out):
                plan = plan_of(trainer, model, batches)
                call = model_loss_call(trainer, model, batches) if "model loss" in plan.paths \
                    else None
                flags = trainer_flags(trainer)
                lineage = lineage_check(trainer, batches, self.source)
            with refusing("gate", "the gate itself raised", ranks, out):
                self.gate.before_training(model, plan, batches, ranks, out, loss_call=call,
                                          forward=lambda batch: model(
                                              **model_inputs(batch, model), **flags),
                                          extra=[lineage])
        self._first_step = state.global_step
        self._record_step_losses()

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step - self._first_step
        loss, self._step_losses = sum(self._step_losses), []
        if self.gate.watching(step):
            self.gate.after_step(step, loss)
        elif self._restore is not None:
            self._stop_recording()

    def on_train_end(self, args, state, control, **kwargs):
        self._stop_recording()

    def _record_step_losses(self) -> None:
        """Each micro-batch's loss as `training_step` returns it to the loop (the loop adds them
        up into the step's logged loss): the trainer's own figure, per step."""
        trainer, original = self.trainer, self.trainer.training_step

        def recorded(*args, **kwargs):
            loss = original(*args, **kwargs)
            self._step_losses.append(float(loss.detach()))
            return loss

        trainer.training_step = recorded
        self._restore = original

    def _stop_recording(self) -> None:
        if self._restore is not None:
            self.trainer.training_step = self._restore
            self._restore = None


@contextmanager
def without_mixed_precision(model: nn.Module) -> Iterator[None]:
    """The model's forward without the autocast accelerate wraps it in for bf16 or fp16
    (`Accelerator.prepare_model` keeps the plain one as `_original_forward`): the gate's checks
    run in the model's dtype, with its tolerances, and its autocast check audits the forward
    under bf16 autocast, the path the run takes. Put back on leaving."""
    plain = model.__dict__.get("_original_forward")
    if plain is None:
        yield
        return
    wrapped = model.__dict__.get("forward")
    model.forward = plain
    try:
        yield
    finally:
        if wrapped is None:
            del model.forward
        else:
            model.forward = wrapped


# ---- what the trainer will do -------------------------------------------------------------------

def plan_of(trainer: Trainer, model: nn.Module, batches: Sequence[Mapping]) -> RunPlan:
    """The path `trainer` takes, read from its arguments, its collator and its first batch."""
    args = trainer.args
    if not batches:
        raise ConfigError("the trainer's dataloader yielded no batch: nothing to train or audit")
    rows, _ = batch_size_and_length(batches[0])
    length = run_length(trainer, batches)
    notes = [f"the run's rows are up to T={length.seq_len} tokens long: {length.how}"]
    pack_form, said = _pack_form(trainer.data_collator, model, batches[0])
    notes += said
    takes_loss, why = takes_model_loss(trainer, batches[0])
    if why:
        notes.append(why)
    checkpointing = getattr(args, "activation_checkpointing",  # transformers >= 5.x's name
                            getattr(args, "gradient_checkpointing", False))
    path = TrainingPath(rows, length.seq_len, precision_of(args),
                        checkpointing=bool(checkpointing),
                        pack=pack_form is not None, pack_form=pack_form)
    world, accumulation = args.world_size, args.gradient_accumulation_steps
    return RunPlan(path, ("training", "model loss") if takes_loss else ("training",),
                   global_batch=args.per_device_train_batch_size * accumulation * world,
                   accumulation=accumulation, world_size=world,
                   trainer=type(trainer).__name__, notes=tuple(notes),
                   router_aux=adds_router_aux(trainer, model))


def precision_of(args: Any) -> str:
    """The autocast the Trainer's forward runs under (accelerate's mixed precision): "bf16",
    "fp16", or "fp32" (none)."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def run_length(trainer: Trainer, batches: Sequence[Mapping]) -> RunLength:
    """The longest row the trainer's dataloader can yield (lengths.py): from its dataset's
    examples and its collator, or its declared max_length (SFTConfig's), never below the first
    batches'."""
    return row_length(trainer.train_dataset, trainer.data_collator, trainer.args.train_batch_size,
                      batches, declared=getattr(trainer.args, "max_length", None))


def _pack_form(collator: Any, model: nn.Module, batch: Mapping) -> tuple[str | None, list[str]]:
    """The form of packed rows the model reads from this collator's batches (gate.packing),
    or None when it does not pack; and what the report should say about it."""
    positions, mask = batch.get("position_ids"), batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        return "4d_mask", []
    restarts = isinstance(positions, torch.Tensor) and bool((positions[:, 1:] == 0).any())
    flattening = isinstance(collator, DataCollatorWithFlattening) or getattr(
        collator, "padding_free", False)
    if not (restarts or flattening) or positions is None:
        return None, []
    said = [f"the collator ({type(collator).__name__}) sends an attention_mask beside the "
            "restarting position_ids: the packing probe sends the position_ids alone, and "
            "batch_as_sent judges the rows with the mask, as sent"] \
        if isinstance(mask, torch.Tensor) else []
    if "cu_seq_lens_q" not in batch:
        return "position_ids", said
    if "flash_kwargs" in facts_of(model, **_vocab(model)).packing_forms:
        return "flash_kwargs", said
    return "position_ids", said + [f"the collator ({type(collator).__name__}) sends cu_seq_lens too; "
                            f"{type(model).__name__} does not run a flash attention "
                            "implementation, so its attention reads the documents from the "
                            "position_ids: that form is audited"]


def _vocab(model: nn.Module) -> dict[str, Any]:
    """A V for facts read only for the packed forms, where the model's config has none."""
    config = getattr(model, "config", None)
    return {} if hasattr(config, "vocab_size") or hasattr(model, "get_base_model") \
        else {"vocab_size": 1}


def lineage_check(trainer: Trainer, batches: Sequence[Mapping], source: Any) -> Any:
    """`lineage` (lineage.py): an SFTTrainer's rows against the source examples it was given
    (`source=`), or transformers' Trainer's first batches against its dataset."""
    if _is_sft(trainer):
        found = None if source is None else sft_lineage(trainer, source)
        why = ("SFTTrainer keeps only its packed rows: pass gate_trainer(trainer, source=the "
               "dataset it was given) to count what packing and truncation did to it"
               if source is None else "the source's tokens or the rows could not be read, or "
               f"hold more than {MAX_TOKENS:,} tokens (too many to match before the first step)")
        return check_lineage(found, why)
    return check_lineage(batch_lineage(trainer.train_dataset, list(batches)),
                         "the dataset's input_ids cannot be read (not a datasets.Dataset or a "
                         f"list of examples), or hold more than {MAX_TOKENS:,} tokens")


def _is_sft(trainer: Trainer) -> bool:
    return any(cls.__name__ == "SFTTrainer" for cls in type(trainer).__mro__)


def trainer_flags(trainer: Trainer) -> dict[str, Any]:
    """The keywords the trainer adds to every batch it passes the model, beside the collator's:
    TRL's SFTTrainer passes use_cache=False, and output_router_logits=True where its router
    aux loss is on (its compute_loss). transformers' Trainer adds none (it turns the cache off
    in the config: TrainingArguments.use_cache)."""
    if not _is_sft(trainer):
        return {}
    return {"use_cache": False} | ({"output_router_logits": True}
                                   if getattr(trainer, "aux_loss_enabled", False) else {})


def adds_router_aux(trainer: Trainer, model: nn.Module) -> bool:
    """Whether the loss the trainer steps on adds a routed model's load-balancing loss: the
    model's config turns output_router_logits on (transformers' MoE families add coef x aux_loss
    to their own loss then), or the trainer passes it (SFTTrainer, router_aux_loss_coef)."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "output_router_logits", False)) or \
        "output_router_logits" in trainer_flags(trainer)


def takes_model_loss(trainer: Trainer, batch: Mapping) -> tuple[bool, str]:
    """Whether the trainer steps on the model's own labels= loss (`Trainer.compute_loss`
    without a compute_loss_func or label smoothing, on batches with labels), and why not."""
    kind = type(trainer).__name__
    if "labels" not in batch:
        return False, "the batches hold no labels: the model's own loss is not asked for"
    if type(trainer).compute_loss is not Trainer.compute_loss:
        return False, (f"{kind} computes its own loss (its compute_loss), not the model's "
                       "labels= loss: the 'model loss' path is not this run's")
    if trainer.compute_loss_func is not None or trainer.label_smoother is not None:
        return False, (f"{kind} computes the loss from the logits (compute_loss_func or label "
                       "smoothing): the 'model loss' path is not this run's")
    return True, ""


def model_loss_call(trainer: Trainer, model: nn.Module, batches: Sequence[Mapping]):
    """The model's own loss on a batch as `Trainer.compute_loss` calls it: num_items_in_batch
    (the trainer's count over these micro-batches, `get_batch_samples`) passed where the model
    accepts loss kwargs."""
    _, items = trainer.get_batch_samples(iter(list(batches)), len(batches), trainer.args.device)
    passed = items if trainer.model_accepts_loss_kwargs and items is not None else None

    def call(batch: Mapping) -> tuple[Any, float | None]:
        inputs = dict(batch)
        if passed is not None:
            inputs["num_items_in_batch"] = passed
        return model(**inputs), None if passed is None else float(passed)

    return call


__all__ = ["TrainerGate", "gate_trainer", "model_loss_call", "plan_of", "takes_model_loss"]
