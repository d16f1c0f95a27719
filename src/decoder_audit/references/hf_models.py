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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import CheckpointError
from .hf_config import _transformers

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


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    try:
        return getter() if callable(getter) else config
    except Exception:  # noqa: BLE001 - a composite config without a text part: use it whole
        return config


def config_length(config: Any) -> int | None:
    """The context length a config declares (None when it declares none)."""
    for source in (_text_config(config), config):
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
    text = _text_config(config) if config is not None else None
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
        return tf.AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                             trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise error(f"{str(config_path)!r} is not a readable Hugging Face config: "
                    f"{exc}") from exc


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
    and weights only; never the folder's Python, see `read_hf_config`). Raises CheckpointError
    when the folder is not one."""
    folder = Path(folder)
    config = read_hf_config(folder)
    cls = model_class(config)
    try:
        model = cls.from_pretrained(str(folder), config=config, local_files_only=True,
                                    trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{cls.__name__} could not load {str(folder)!r}: {exc}") from exc
    return model.eval()


__all__ = ["HFFacts", "audit_facts", "config_length", "load_hf_model", "model_class",
           "read_hf_config", "refuse_remote_code"]
