"""The first phase: the model (through `sources.Source`) and the task. The data must fit the
model (the counting task needs V >= 8 and max_seq_len >= 4; byte-level text V >= 256; a
prepared dataset V >= its tokenizer's ids), else ConfigError, before the gate is spent; the
weights must fit in memory before a single one is allocated."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..accounting.memory import check_fits, check_logits_fit
from ..config import DecoderConfig
from ..console import literal
from ..errors import CheckpointError, ConfigError
from ..gate import ModelFacts, TrainingPath, model_facts
from ..sources import Source, factory_record, module_factory
from ..storage.checkpoint import FACTORY_FILE, load_module_weights
from ..text.datasets import TokenDataset, check_tokens
from ..text.tasks import ByteText, CountingTask, TokenText
from ..text.tokenizer import Tokenizer
from . import distributed
from .distributed import RankInfo
from .run import Options, Prepared, Setting
from .settings import TrainConfig

# Below this many parameters, intra-op threading costs more than it gains on CPU.
SMALL_MODEL_PARAMETERS = 1_000_000


def prepare(setting: Setting, model: Any) -> Prepared:
    """Resolve the model, decide its facts (the gate's `model_facts`, once) and the task; the
    data must fit the model's V and max_seq_len, checked before the gate is spent."""
    cfg, opts = setting.cfg, setting.opts
    for note in opts.notes:
        setting.say(f"note: {literal(note)}")
    source, module_weights = _source(model, opts)
    rows = setting.ranks.world_size * cfg.grad_accum
    if cfg.batch_size % rows:
        raise ConfigError(
            f"batch_size={cfg.batch_size} must be divisible by the number of processes "
            f"({setting.ranks.world_size}) times grad_accum ({cfg.grad_accum}) = {rows}, so every "
            "rank's micro-batches hold equal rows")  # before a weight is built
    if source.kind in ("preset", "config", "checkpoint"):
        # before a weight exists
        _check_memory(source.config(), opts.device, setting.ranks, whole=not source.built_fresh)
    if setting.ranks.sharded:  # sharded before the gate, which audits it as it will train
        built = distributed.build_for_training(source, setting.ranks, opts.device, seed=cfg.seed)
    else:
        built = source.build(seed=cfg.seed)
    if module_weights:
        load_module_weights(built, opts.resume_folder)
    _set_threads(built, opts)
    saved = (opts.resume_meta or {}).get("factory") or {}
    facts = model_facts(built, vocab_size=opts.vocab_size or saved.get("vocab_size"),
                        max_seq_len=opts.max_seq_len or saved.get("max_seq_len"),
                        intervention_len=opts.intervention_len or saved.get("intervention_len"))
    # A model with a hard limit trains at it; one without, at the length it is audited at.
    length = facts.max_seq_len or (facts.intervention_len if facts.origin.get(
        "intervention_len") == "argument" else None)
    if length is None:
        raise ConfigError("a model without a DecoderConfig needs vocab_size and max_seq_len "
                          "(--vocab-size/--max-seq-len), or intervention_len "
                          "(--intervention-len) where it has no hard length limit, to be "
                          "audited and trained")
    task = _task(cfg, opts, facts.vocab_size, length)
    # before the gate, whose probe runs at the training shape: a batch whose logits alone
    # outgrow the memory would stall or die there
    check_logits_fit(cfg.batch_size // rows, task.seq_len, facts.vocab_size,
                     element_bytes=2 if cfg.precision == "bf16" else 4, device=opts.device,
                     what=f"batch_size={cfg.batch_size} cannot be trained here "
                          f"({cfg.batch_size // rows} rows per forward with grad_accum="
                          f"{cfg.grad_accum} over {setting.ranks.world_size} process(es): lower "
                          "batch_size or raise grad_accum)")
    # The path training takes, for the gate to audit too: each forward's rows (one micro-batch
    # of one rank), the task's length, the precision.
    if cfg.pack:
        _check_packing(facts, task)
    # train packs through the model's own interface, so the gate checks that form of packing
    facts = replace(facts, training=TrainingPath(
        cfg.batch_size // rows, task.seq_len, cfg.precision, opts.checkpointing, cfg.pack,
        pack_form=facts.packing if cfg.pack else None))
    fresh = opts.expect_fresh and (source.built_fresh or source.kind in ("module", "model"))
    return Prepared(model=built, task=task, facts=facts, fresh=fresh,
                    factory=_factory_of(source, facts.vocab_size, facts.max_seq_len,
                                        facts.intervention_len if length != facts.max_seq_len
                                        else None))


def _task(cfg: TrainConfig, opts: Options, vocab_size: int, max_seq_len: int) -> Any:
    """The task the config names, checked against the model's V and T and, on resume, against
    the data the run started with (a changed file or dataset would not continue the run).

    The tasks get absolute paths, which they record in the checkpoint; a resumed run reads the
    path recorded there, so it finds its data from any working directory (a checkpoint written
    before paths were absolute recorded the path as given: resolved against this directory)."""
    saved = opts.resume_meta or {}

    def located(given: str | None, key: str) -> Path | None:
        recorded = saved.get(key)
        if given is None:
            return None
        if isinstance(recorded, str) and Path(recorded).is_absolute():
            return Path(recorded)
        return Path(given).absolute()

    text, data = located(cfg.text, "text"), located(cfg.data, "data")
    if data is not None:
        task = TokenDataset(data, max_seq_len)
    elif text is not None and cfg.tokenizer is not None:
        task = TokenText(text, max_seq_len, _tokenizer(cfg, opts),
                         val_fraction=cfg.val_fraction, seed=cfg.seed)
    elif text is not None:
        task = ByteText(text, max_seq_len, val_fraction=cfg.val_fraction, seed=cfg.seed)
    else:
        task = CountingTask()
    task.check_model(vocab_size, max_seq_len)
    if saved.get("text_sha256") not in (None, getattr(task, "sha256", None)):
        raise ConfigError(f"the text file {str(text)!r} changed since the checkpoint was "
                          "written (SHA-256 differs); resuming on other data would not continue "
                          "the run")
    if saved.get("data_sha256") not in (None, getattr(task, "sha256", None)):
        raise ConfigError(f"the dataset {str(data)!r} changed since the checkpoint was written "
                          "(its dataset.json's SHA-256 differs); prepare it again or resume on "
                          "the data the run started with")
    if saved and data is not None:  # the tokens themselves: one pass over tokens.bin, on resume
        check_tokens(data, task.header)
    if cfg.data is None and saved.get("tokenizer_sha256") not in (
            None, getattr(getattr(task, "vocab", None), "sha256", None)):
        raise ConfigError(f"the tokenizer {cfg.tokenizer!r} changed since the checkpoint was "
                          "written (SHA-256 differs); its ids would not mean what they meant")
    return task


def _check_packing(facts: ModelFacts, task: Any) -> None:
    """--pack needs a model that takes packed documents and a task whose documents end in an
    end-of-sequence id."""
    if facts.packing is None:
        raise ConfigError(f"--pack: {facts.model} has no packing interface (its forward takes "
                          "neither document_ids nor position_ids with an attention_mask)")
    if end_of_document(task) is None:
        raise ConfigError(f"--pack splits windows into documents at the tokenizer's end-of-"
                          f"sequence id, and the {task.name} task has none (--data or --text "
                          "with --tokenizer whose tokenizer has one)")


def end_of_document(task: Any) -> int | None:
    """The id that ends a document of `task` (its tokenizer's eos_id), or None."""
    if getattr(task, "name", "") == "counting":
        return None  # one sequence per row already
    return getattr(getattr(task, "vocab", None), "eos_id", None)


def _tokenizer(cfg: TrainConfig, opts: Options) -> Tokenizer:
    """The tokenizer of a `text` + `tokenizer` run: on resume, the copy the checkpoint carries
    (its files checked against its manifest, as `sample` reads it), so the run continues with
    the ids it started with wherever the original files went; else the one `cfg.tokenizer`
    names."""
    if opts.resume_folder is not None:
        carried = Tokenizer.from_folder(opts.resume_folder)
        if carried is not None:
            return carried
    return Tokenizer.from_spec(cfg.tokenizer)


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
    named = model.value if isinstance(model, Source) and model.kind == "model" else None
    if model is not None and named is None:
        raise ConfigError("resume rebuilds the model with the factory it was trained from; pass "
                          "that factory (--model FILE.py:FACTORY), not another model")
    if not factory.get("factory"):
        raise CheckpointError(
            f"{str(folder)!r} holds the weights of a module passed from Python "
            f"({factory.get('class', 'unknown class')}), which no factory rebuilds: resume it "
            "from Python with train(module, resume=...)")
    # Only the factory the user named runs, pinned to the one (and the file) the run recorded.
    spec, sha256 = module_factory(folder, factory, named)
    return Source("model", spec, sha256=sha256), True


def _factory_of(source: Source, vocab_size: int | None, max_seq_len: int | None,
                intervention_len: int | None = None) -> dict[str, Any] | None:
    """What rebuilds the model, saved beside its weights when it is not white-box."""
    shape = {"vocab_size": vocab_size, "max_seq_len": max_seq_len,
             "intervention_len": intervention_len}
    if source.kind == "model":  # its absolute FILE.py:FACTORY and the SHA-256 of what ran
        return {**factory_record(str(source.value)), **shape}
    if source.kind == "module":
        cls = type(source.value)
        return {"factory": None, "class": f"{cls.__module__}.{cls.__qualname__}", **shape}
    return None  # a preset, config or checkpoint: a Decoder, saved as one


# Training holds the weights, their gradients and AdamW's two moments: four copies.
TRAINING_COPIES = 4


def _check_memory(cfg: DecoderConfig, device: str, ranks: RankInfo, *,
                  whole: bool = True) -> None:
    """The training state must fit: four copies of the weights, 1/N of them per device when
    sharded over N. `whole`: the model is built (or loaded) whole before it is sharded (a
    checkpoint); a fresh sharded model never is (distributed.build_sharded). On the CPU the
    ranks of one host share its memory, so their shards add up to the four whole copies."""
    what = "training (weights, gradients and AdamW's two moments)"
    if device.startswith("cuda"):
        if whole or not ranks.sharded:
            check_fits(cfg, what="its weights")  # built on the CPU first
        copies: float = TRAINING_COPIES
        if ranks.sharded:
            copies = TRAINING_COPIES / ranks.world_size
            what = (f"training sharded over {ranks.world_size} devices (1/{ranks.world_size} of "
                    "weights, gradients and AdamW's two moments")
            if whole:  # the whole weights reach the device to be sharded
                copies = max(1.0, copies)
                what += ", after the whole weights while sharding"
            what += ")"
        check_fits(cfg, copies=copies, what=what, device=device)
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
