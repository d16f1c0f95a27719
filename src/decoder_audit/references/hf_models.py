"""Any Hugging Face model, not only the two families we convert (`hf.py`): load a folder written
by `save_pretrained` whatever its family, and read what the gate must be told about it (the
output and input vocabularies, whether its length is a hard limit) from the model's own config
and structure. Nothing here names a model family: the config's `architectures` entry names the
class, and transformers' Auto mappings find it.

    model = load_hf_model("folder/")          # causal LMs, and masked LMs for the BERT contrast
    facts = audit_facts(model)                # HFFacts(vocab_size, input_vocab_size, max_seq_len, ...)
    da.audit(model, **facts.audit_options())

The length policy. A model with a learned absolute position table (GPT-2's `wpe`, BERT's
position embeddings) cannot represent position P = the table's length: its config length is a
hard limit, and the gate checks that P + 1 tokens are rejected. A model without one (rotary,
ALiBi, relative or recurrent positions) runs at any length; its config length (e.g. Llama's
`max_position_embeddings`) is a training horizon, not a limit it enforces, so it is audited with
max_seq_len=None and every behavioural check covers `intervention_len` positions.

A damaged folder is one line, never a traceback: a size in config.json that is no integer, a
garbled or truncated safetensors file, pickle weights alone (never unpickled), weights whose
shapes or count are not the config's, or a model too large for memory are refused, naming the
file and the field or tensor, before anything the size of the declared model is built: it is
measured on the meta device first (`declare`), a 100,000-layer config by extrapolating 1-3 layers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..accounting.memory import available_bytes
from ..errors import CheckpointError, ConfigError
from .hf_config import _transformers, json_name, quiet, refuse_bad_sizes
from .hf_weights import stored_shapes, weight_files, weights_name
from .hf_windows import text_config

# Config fields that hold a model's context length, in the order they are looked for.
LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")
# A learned position table may carry a few rows beyond the context (OPT and BioGPT offset their
# positions by 2); a table this close to the config length is the position table.
POSITION_TABLE_SLACK = 8


@dataclass(frozen=True)
class HFFacts:
    """What the gate needs to be told about a Hugging Face model."""

    vocab_size: int  # V: the last axis of the logits
    input_vocab_size: int | None  # ids the input embedding accepts, when not V
    pad_token_id: int | None  # the config's padding id: padding, never content
    max_seq_len: int | None  # a hard limit the model enforces, or None
    length_policy: str  # why max_seq_len is what it is, one sentence
    config_length: int | None = None  # the config's context length, whatever it means
    notes: list[str] = field(default_factory=list)

    def audit_options(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "max_seq_len": self.max_seq_len,
                "input_vocab_size": self.input_vocab_size, "pad_token_id": self.pad_token_id}


def config_length(config: Any) -> int | None:
    """The context length a config declares (None when it declares none)."""
    for source in (text_config(config), config):
        for name in LENGTH_FIELDS:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _embedding_rows(module: Any) -> int | None:
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else None


def audit_facts(model: nn.Module) -> HFFacts:
    """V, the input vocabulary and the length policy of a Hugging Face model, read from its
    output and input embeddings and its config (see the module docstring)."""
    config = getattr(model, "config", None)
    text = text_config(config) if config is not None else None
    declared_v = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
    inp = _call(model, "get_input_embeddings")
    out = _call(model, "get_output_embeddings")
    out_rows = _embedding_rows(out) if out is not None else None
    in_rows = _embedding_rows(inp) if inp is not None else None
    vocab_size = out_rows or declared_v or in_rows
    if vocab_size is None:
        raise CheckpointError(f"{type(model).__name__}: no vocabulary size found (no output "
                              "embedding and no vocab_size in its config)")
    notes = []
    if out_rows and declared_v and out_rows != declared_v:
        notes.append(f"the readout has {out_rows} rows where the config says vocab_size="
                     f"{declared_v}: V = {out_rows}, the logits' last axis")
    input_vocab = in_rows if in_rows and in_rows != vocab_size else None
    length = config_length(config) if config is not None else None
    tables = [m for m in model.modules()
              if isinstance(m, nn.Embedding) and m is not inp and length is not None
              and length <= m.num_embeddings <= length + POSITION_TABLE_SLACK]
    if tables:
        table = tables[0]
        # A table with a padding row counts positions from padding_idx + 1 (RoBERTa's 514 rows
        # hold 512 positions): those rows are not positions.
        usable = min(length, table.num_embeddings - (0 if table.padding_idx is None
                                                       else table.padding_idx + 1))
        reserved = (f", rows 0..{table.padding_idx} reserved" if usable < length else "")
        policy = (f"a learned position table ({table.num_embeddings} rows{reserved}) for {usable} "
                  f"positions: T = {usable} is a hard limit, and {usable + 1} tokens must be "
                  "rejected")
        max_seq_len = usable
    else:
        horizon = f" (its config's {length} positions are a horizon, not a limit)" if length else ""
        policy = ("no learned position table (rotary, relative, ALiBi or recurrent positions): "
                  f"no hard length limit{horizon}, audited with max_seq_len=None")
        max_seq_len = None
    pad = getattr(text, "pad_token_id", None) if text is not None else None
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else None
    return HFFacts(vocab_size=int(vocab_size), input_vocab_size=input_vocab, pad_token_id=pad,
                   max_seq_len=max_seq_len, length_policy=policy, config_length=length,
                   notes=notes)


def _call(model: Any, name: str) -> Any:
    getter = getattr(model, name, None)
    try:
        return getter() if callable(getter) else None
    except (NotImplementedError, AttributeError):
        return None


def model_class(config: Any) -> type:
    """The class a saved config names (`architectures`), else the causal-LM class its config
    maps to, else the masked-LM class (the BERT contrast)."""
    tf = _transformers()
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(tf, name, None)
        if isinstance(cls, type):
            return cls
    for auto in (tf.AutoModelForCausalLM, tf.AutoModelForMaskedLM):
        mapping = getattr(auto, "_model_mapping", None)
        try:
            return mapping[type(config)]
        except (KeyError, TypeError):
            continue
    raise CheckpointError(f"no causal or masked language-model class for model_type="
                          f"{getattr(config, 'model_type', None)!r} in this transformers")


def read_hf_config(folder: str | os.PathLike, *, error: type[Exception] = CheckpointError) -> Any:
    """The transformers config of a `save_pretrained` folder, read offline and without ever
    running Python from the folder: always trust_remote_code=False, so transformers never asks
    on stdin whether to run it. A config.json whose `auto_map` is the only way to its classes (a
    model_type this transformers does not know) is refused with `error` naming the folder and
    the entries, before transformers reads it."""
    tf = _transformers()
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise error(f"{str(folder)!r} has no config.json; not a Hugging Face model folder")
    refuse_remote_code(folder, tf, error=error)
    try:
        config = tf.AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                               trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - a typed field's validation error is not a ValueError
        said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise error(f"{str(config_path)!r} is not a readable Hugging Face config: "
                    f"{type(exc).__name__}: {said}") from None
    refuse_bad_sizes(config, config_path, error=error)
    return config


def refuse_remote_code(folder: Path, tf: Any, *, error: type[Exception] = CheckpointError
                       ) -> None:
    """`error` when the folder's config.json needs the folder's own code: an `auto_map` for a
    model_type transformers `tf` has no class of. (With a model_type it knows, trust_remote_code
    =False makes transformers use its own class and ignore the auto_map.)"""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # unreadable: transformers says what is wrong with it
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in getattr(tf, "CONFIG_MAPPING", {}):
        return
    raise error(f"{str(folder)!r} can only be loaded by running its own Python code: "
                f"config.json's auto_map {config['auto_map']!r} names classes for "
                f"model_type={model_type!r}, which transformers {tf.__version__} does not have; "
                "decoder-audit never runs code from a model folder (trust_remote_code=False)")


def load_hf_model(folder: str | os.PathLike) -> nn.Module:
    """The model a `save_pretrained` folder holds, in eval mode, read offline (its config.json
    and safetensors weights only; never the folder's Python, see `read_hf_config`, and never a
    pickle). In order, each before anything larger is built: the config (every size an integer,
    `refuse_bad_sizes`), the weight files' headers (a garbled or truncated file, or pickle
    weights alone, are refused), the model's size on the meta device against the memory
    available, then the load, whose missing, unexpected and mis-shaped tensors are refused.
    Raises ConfigError (the config) or CheckpointError (the weights), each naming the file."""
    folder = Path(folder)
    config = read_hf_config(folder)
    cls = model_class(config)
    files = weight_files(folder)
    refuse_what_cannot_fit(cls, config, folder, files)
    tf = _transformers()
    try:
        with quiet(tf):  # its loading report is ours to give, as one line
            model, info = cls.from_pretrained(
                str(folder), config=config, local_files_only=True, trust_remote_code=False,
                use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True)
    except (OSError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(f"{cls.__name__} could not load {str(folder)!r}: {first}") from exc
    problems = _load_problems(info)
    if problems:
        raise CheckpointError(f"{weights_name(folder, files)} does not fit "
                              f"{str(folder / 'config.json')!r}: " + "; ".join(problems))
    return model.eval()


# ---- the model's size, before it is built -----------------------------------------------------

# Up to this many layers the whole model is built on the meta device to be counted (~1.5 ms a
# layer); beyond, one-, two- and three-layer copies are, and a uniform stack extrapolated: a
# config declaring 100,000 layers would otherwise take minutes to be counted.
FULL_COUNT_LAYERS = 256
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                "I16": 2, "U16": 2}


def refuse_what_cannot_fit(cls: type, config: Any, folder: Path, files: list[Path]) -> None:
    """Before the model is built, from config.json and the weight files' headers: ConfigError
    when the model it declares needs more memory than this machine has (its parameters x the
    bytes of the dtype it loads in); CheckpointError naming the tensors whose stored shapes are
    not the config's, or when the files hold far fewer values than it has parameters (weights of
    another model: 1 layer stored, 100,000 declared). Nothing but meta tensors is allocated."""
    config_path, weights = folder / "config.json", weights_name(folder, files)
    stored = stored_shapes(files)
    declared = declare(cls, config, config_path)
    dtype_name, each = _load_dtype(config, stored)
    need, have = declared.parameters * each, available_bytes("cpu")
    sizes = _sizes_said(config)
    if have is not None and need > have:
        raise ConfigError(
            f"{str(config_path)!r} declares a model that does not fit in memory: "
            f"{cls.__name__} with {declared.parameters:,} parameters x {each} bytes "
            f"({dtype_name}) = {need / 1e9:,.1f} GB, but only {have / 1e9:,.1f} GB is available "
            f"on cpu ({sizes}); nothing was allocated")
    mismatched = _mismatched(declared.shapes or {}, stored, getattr(cls, "base_model_prefix", ""))
    if mismatched:
        raise CheckpointError(f"{weights} does not fit {str(config_path)!r} ({sizes}): "
                              + _mismatched_said(mismatched))
    values = sum(math.prod(shape) for shape, _ in stored.values())
    # Half: what a model may legitimately lack in its files (a parameter transformers fills
    # itself) is small; the precise list of missing tensors comes from the load.
    if getattr(config, "quantization_config", None) is None and values < declared.parameters // 2:
        raise CheckpointError(
            f"{weights} holds {values:,} values in {len(stored)} tensors, far fewer than the "
            f"{declared.parameters:,} parameters {str(config_path)!r} declares ({sizes}): they "
            "are not this config's weights; nothing was allocated")


@dataclass(frozen=True)
class Declared:
    """The model a config declares, measured on the meta device."""

    parameters: int  # unique parameters (a tied readout once)
    shapes: dict[str, tuple[int, ...]] | None  # its state dict's shapes, when built whole


def declare(cls: type, config: Any, config_path: Path) -> Declared:
    """`cls(config)` measured on the meta device: the whole model, or for a very deep one
    copies of 1, 2 and 3 layers, extrapolated when each layer adds the same."""
    layers = getattr(text_config(config), "num_hidden_layers", None)
    if isinstance(layers, int) and layers > FULL_COUNT_LAYERS:
        counts = [_count(_meta_model(cls, config, config_path, depth)) for depth in (1, 2, 3)]
        per_layer = counts[1] - counts[0]
        if counts[2] - counts[1] == per_layer:  # a uniform stack
            return Declared(counts[0] + (layers - 1) * per_layer, None)
    model = _meta_model(cls, config, config_path)
    return Declared(_count(model), {name: tuple(t.shape) for name, t in model.state_dict().items()})


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta_model(cls: type, config: Any, config_path: Path, layers: int | None = None
                ) -> nn.Module:
    if layers is not None:
        config = copy.deepcopy(config)
        text_config(config).num_hidden_layers = layers
    tf = _transformers()
    # Skipping the initialisers: on meta they do nothing, slowly (torch's reference normal_).
    # transformers 5 has them in `initialization`, 4.x in `modeling_utils`.
    skip = next((found for module in ("initialization", "modeling_utils")
                 if callable(found := getattr(getattr(tf, module, None), "no_init_weights",
                                              None))), contextlib.nullcontext)
    try:
        with quiet(tf), torch.device("meta"), skip():
            model = cls(config)
            # no_init_weights skips transformers' init_weights, which also ties the readout to
            # the embedding: tied, the two are one parameter, counted once.
            tie = getattr(model, "tie_weights", None)
            if callable(tie):
                tie()
    except Exception as exc:  # noqa: BLE001 - a config transformers accepted but cannot build
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{str(config_path)!r}: {cls.__name__} cannot be built from it: "
                          f"{type(exc).__name__}: {first}") from None
    return model


def _mismatched(shapes: dict[str, tuple[int, ...]], stored: dict[str, tuple[tuple[int, ...], str]],
                prefix: str) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(name, stored shape, declared shape) of each stored tensor the model has under that name
    (or under its base model's prefix, as a base-model file names it) with another shape.
    Names only one side has are the load's to report: transformers renames some on loading."""
    found = []
    for name, (shape, _) in stored.items():
        wanted = shapes.get(name, shapes.get(f"{prefix}.{name}") if prefix else None)
        if wanted is not None and tuple(wanted) != tuple(shape):
            found.append((name, tuple(shape), tuple(wanted)))
    return sorted(found)


def _mismatched_said(mismatched: list[tuple[str, Any, Any]]) -> str:
    shown = [f"{name} is {tuple(stored)} in the file, the config needs {tuple(wanted)}"
             for name, stored, wanted in mismatched[:SHOWN_NAMES]]
    more = f" and {len(mismatched) - SHOWN_NAMES} more" if len(mismatched) > SHOWN_NAMES else ""
    return f"{len(mismatched)} mis-shaped tensor(s): " + ", ".join(shown) + more


def _load_dtype(config: Any, stored: dict[str, tuple[tuple[int, ...], str]]) -> tuple[str, int]:
    """The dtype from_pretrained loads in (its dtype="auto": the config's, else the first
    floating tensor's in the files) and its bytes per element."""
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(declared, str):
        declared = getattr(torch, declared, None)
    if isinstance(declared, torch.dtype):
        return str(declared).removeprefix("torch."), torch.empty((), dtype=declared).element_size()
    floating = next((dtype for _, dtype in stored.values() if dtype.startswith(("F", "BF"))),
                    "F32")
    return floating, _DTYPE_BYTES.get(floating, 4)


def _sizes_said(config: Any) -> str:
    text = text_config(config)
    said = [f"{json_name(text, name)}={getattr(text, name)}"
            for name in ("num_hidden_layers", "hidden_size", "vocab_size")
            if getattr(text, name, None) is not None]
    return ", ".join(said)


# ---- the load itself -------------------------------------------------------------------------

# A list in a message stops after this many names, with the count.
SHOWN_NAMES = 5


def _load_problems(info: dict[str, Any]) -> list[str]:
    """transformers' loading report as our problems: missing tensors (which it would initialise
    at random), unexpected ones (weights the config has no place for), mis-shaped ones."""
    problems = []
    for kind in ("missing", "unexpected"):
        names = sorted(info.get(f"{kind}_keys") or ())
        if names:
            problems.append(f"{len(names)} {kind} tensor(s) {_first(names)}")
    mismatched = sorted(info.get("mismatched_keys") or ())
    if mismatched:
        problems.append(_mismatched_said(mismatched))
    problems += [str(message).strip().splitlines()[0] for message in info.get("error_msgs") or ()
                 if str(message).strip()]
    return problems


def _first(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
    return f"{names[:SHOWN_NAMES]}{more}"


__all__ = ["Declared", "HFFacts", "audit_facts", "config_length", "declare", "load_hf_model",
           "model_class", "read_hf_config", "refuse_bad_sizes", "refuse_remote_code",
           "refuse_what_cannot_fit"]


def eager_experts(model: Any) -> None:
    """Switch a Hugging Face model's routed experts to their eager loop of ordinary products,
    in place: transformers 5 runs them through torch._grouped_mm by default, which refuses
    float64 (and rounds a token by how many tokens share its expert). A model without that
    switch (ours, releases before it, a plain module) is left as it is."""
    switch = getattr(model, "set_experts_implementation", None)
    can = getattr(model, "_can_set_experts_implementation", None)
    if switch is None or can is None or not can():
        return
    switch("eager")
