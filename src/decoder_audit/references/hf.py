"""Hugging Face transformers as an independent reference: GPT-2 and Llama (and Mistral, read as
Llama), both ways; and the spec a model's config declares.

    from_hf(GPT2LMHeadModel | LlamaForCausalLM) -> Decoder      to_hf(Decoder) -> PreTrainedModel
    load_hf_folder(dir) -> Decoder                              save_hf_folder(decoder, dir)
    hf_reference(any module) -> ("hugging face" | None, why)    hf_spec(model) -> DecoderConfig

`transformers` is the optional extra `hf`; it is imported only inside these functions, so the
core package works without it. Every model we build uses attn_implementation="eager" (HF's
explicit softmax path, the one whose attention weights can be read back).

The config mapping and what it refuses live in `hf_config`; the weight rename tables and the RoPE
row permutation in `hf_weights`: callers import those names from there.

Precision: transformers computes Llama's rotary angles in float32 (and its RMSNorm in float32)
even for a float64 model, which bounds a float64 Llama comparison near 1e-6; GPT-2 in float64
agrees to ~1e-15.

Besides the config fields `hf_config` refuses, a tie flag that disagrees with the model's actual
aliasing is refused with a ConfigError (DEFECTS.md A5).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from ..accounting.ledger import parameter_ledger
from ..config import DecoderConfig
from ..errors import CheckpointError, ConfigError
from ..model.decoder import Decoder
from ..storage.checkpoint import copy_into_parameters, decoder_from_tensors
from ..storage.folder import write_folder_atomically
from .families import FAMILIES, family
from .family_black_box import BLACK_BOX
from .family_errors import InvalidHFConfig
from .hf_config import (
    _transformers,
    config_from_hf,
    config_to_hf,
    family_layout,
    family_of,
    hf_family,
    model_classes,
    quiet,
    spec_classes,
)
from .hf_families import decoder_from_spec_model, hf_model_for
from .hf_models import read_hf_config
from .hf_weights import (
    hf_tensors_to_ours,
    our_tensors_to_hf,
    stored_shapes,
    weight_files,
)


def _check_tie_flag(hf_model: Any) -> None:
    """The declared tie flag must agree with the aliasing actually present (DEFECTS.md A5)."""
    embed, head = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
    actually_tied = embed is not None and head is not None and head.weight is embed.weight
    declared = bool(getattr(hf_model.config, "tie_word_embeddings", False))  # as transformers reads it
    if declared != actually_tied:
        raise ConfigError(f"tie_word_embeddings={declared} but lm_head.weight is "
                          f"{'' if actually_tied else 'not '}the embedding Parameter")


def from_hf(hf_model: Any) -> Decoder:
    """A Decoder holding copies of a Hugging Face model's weights, with the same dtype and device
    (the class decides the family, also for another model_type registered for one of its
    classes). GPT-2 and Llama (and a Mistral without a window) go through the converter's rename
    tables, Llama's RoPE rows permuted into our interleaved pairs; every other class of
    `spec_classes` is read as its config's spec with its weights placed by `hf_families`
    (rotate-half RoPE kept). Raises ConfigError naming any field we cannot express."""
    tf = _transformers()
    family = family_of(hf_model, tf, converter=True)
    cfg = _converter_config(config_from_hf(hf_model.config, family)) if family is not None \
        else None
    _check_tie_flag(hf_model)
    if cfg is not None and converter_family(cfg) is not None:
        source = f"{type(hf_model).__name__} weights"
        return decoder_from_tensors(cfg, hf_tensors_to_ours(cfg, hf_model.state_dict(),
                                                            source=source))
    return decoder_from_spec_model(hf_model, hf_spec(hf_model))


def _converter_config(cfg: DecoderConfig) -> DecoderConfig:
    """cfg as the converter's rename tables write it: RoPE on our interleaved pairs (the
    Llama path permutes each head's q and k rows into them)."""
    return cfg.replace(rope_layout="interleaved") if cfg.pos == "rope" else cfg


def converter_family(cfg: DecoderConfig) -> str | None:
    """"gpt2" or "llama" where the converter's rename tables write cfg (`hf_family`), else
    None: the layouts' families (`hf_families`) take it, or nothing does."""
    try:
        return hf_family(cfg)
    except ConfigError:
        return None


def hf_spec(hf_model: Any) -> DecoderConfig:
    """The architecture a model of `spec_classes` (every family of `families.FAMILIES`, and
    their subclasses) declares in its config, as the spec its own weights are checked against
    where they lie (references.layouts), RoPE in the family's own layout (Llama's rotates
    halves; from_hf instead permutes the rows into our interleaved default). Raises
    ConfigError naming any field we cannot express."""
    tf = _transformers()
    family = family_of(hf_model, tf)
    return config_from_hf(hf_model.config, family)


def hf_layout(hf_model: Any) -> str | None:
    """The name of the layout the model's family keeps its weights in, where its names alone
    would not tell (`families.Family.layout`: GPT-BigCode's c_attn), else None (detected)."""
    return family_layout(hf_model)


def export_changes(cfg: DecoderConfig) -> list[str]:
    """What writing `cfg` in its Hugging Face family changes, one sentence each (empty when the
    round trip gives `cfg` back). GPT-2's Conv1D always has biases: a decoder without them is
    written with zero biases (the function is unchanged) and reads back with them."""
    if converter_family(cfg) != "gpt2" or (cfg.attn_bias and cfg.mlp_bias):
        return []  # the families of hf_families keep every field, or refuse
    flags = [name for name in ("attn_bias", "mlp_bias") if not getattr(cfg, name)]
    before = " and ".join(f"{flag}=false" for flag in flags)
    after = " and ".join(f"{flag}=true" for flag in flags)
    back = cfg.replace(attn_bias=True, mlp_bias=True)
    return [f"GPT-2 always has attention and MLP biases: {before} is written as zero biases (the "
            f"same function), and reading it back gives {after} "
            f"({parameter_ledger(cfg).total:,} -> {parameter_ledger(back).total:,} parameters)"]


def to_hf(decoder: Decoder) -> Any:
    """A Hugging Face model (eager attention, eval mode) holding copies of the decoder's weights,
    in its dtype and on its device: GPT2LMHeadModel or LlamaForCausalLM where the converter's
    tables write the config, else the first family of `hf_families` whose config holds it
    exactly (Qwen3 for a q/k norm, Gemma 2 for soft caps, GPT-NeoX for a parallel block...).
    What GPT-2 cannot keep (its always-present biases, see `export_changes`) is said in a
    UserWarning; a config no family holds is a ConfigError naming both reasons."""
    tf = _transformers()
    if not isinstance(decoder, Decoder):
        raise TypeError(f"to_hf needs a decoder_audit Decoder, got {type(decoder).__name__}")
    cfg = decoder.config
    try:
        family = hf_family(cfg)
    except ConfigError as exc:
        try:
            return hf_model_for(decoder, tf)
        except ConfigError as other:
            raise ConfigError(f"{exc}; and {other}") from None
    for change in export_changes(cfg):
        warnings.warn(change, UserWarning, stacklevel=2)
    hf_config = config_to_hf(cfg)
    model_cls = model_classes(tf)[family]
    like = decoder.token_embeddings.weight
    hf_model = model_cls(hf_config).to(device=like.device, dtype=like.dtype).eval()
    copy_into_parameters(hf_model, our_tensors_to_hf(cfg, dict(decoder.named_parameters())))
    _check_tie_flag(hf_model)
    return hf_model


def hf_reference(model: Any) -> tuple[str | None, str]:
    """Whether `model`'s config is a spec the oracle can check its weights against, decided
    from its class and config alone (no weight is read): ("hugging face", "") when it is, (None,
    why not) when it is not. Raises only for a config no model computes with
    (InvalidHFConfig, a ConfigError: Gemma 2's query_pre_attn_scalar -8).

    It is when the model is an instance of `spec_classes` (GPT-2, Llama, Mistral, Qwen2, Qwen3,
    Gemma or a subclass: the class decides, not `config.model_type`) whose config
    `config_from_hf` expresses. Whether the weights then fit that config is the gate's
    question: weights that do not (a missing final norm, an untied head under
    tie_word_embeddings=True, an extra weight) fail params, tying or oracle."""
    name = type(model).__name__
    tf = sys.modules.get("transformers")
    if tf is None:
        # An instance of a transformers class implies transformers is loaded; importing it here
        # only to answer "no" would cost seconds on every audit of a plain module.
        why = ("transformers is not installed" if find_spec("transformers") is None
               else "transformers is installed but nothing imported it, so no object of its "
                    "classes exists")
        return None, f"{name} is not a Hugging Face model ({why})"
    base = sys.modules.get("transformers.modeling_utils")
    if base is None or not isinstance(model, base.PreTrainedModel):
        # Not a transformers model at all: asking for the converted classes would import their
        # modeling files (seconds) only to answer "no".
        return None, (f"{name} is not a Hugging Face model, so its config declares no spec "
                      "(pass spec=)")
    family = family_of(model, tf)
    if family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        lacks = BLACK_BOX.get(model_type)
        if lacks is not None:
            return None, f"{name} ({model_type}) has what no DecoderConfig expresses: {lacks}"
        return None, (f"{name} is not the class of a family whose config is read as a spec "
                      f"({len(FAMILIES)} families: references/families.py)")
    try:
        config_from_hf(model.config, family)
    except InvalidHFConfig:
        raise  # no model computes with it: refused, not audited as a black box
    except ConfigError as exc:
        return None, f"{name}'s config declares what the oracle does not express: {exc}"
    return "hugging face", ""


def load_hf_folder(folder: str | os.PathLike) -> Decoder:
    """A Decoder from a Hugging Face folder as `save_pretrained` writes it: config.json plus
    model.safetensors (or sharded model-*.safetensors with model.safetensors.index.json). A
    folder holding only pickle weights (pytorch_model.bin) is refused: nothing is unpickled."""
    folder = Path(folder)
    hf_config = read_hf_config(folder)  # never runs the folder's code (trust_remote_code=False)
    cfg = _converter_config(config_from_hf(hf_config))
    # A family the layouts place goes through its own class, also where its config is one the
    # converter writes: Phi-3 with full rotary reads as Llama's config, not with Llama's names.
    entry = family(hf_config.model_type)
    own_class = entry is not None and not entry.converter
    if converter_family(cfg) is None or own_class:
        return from_hf(_spec_model_from_folder(hf_config, folder))
    ours = hf_tensors_to_ours(cfg, _read_hf_weights(folder), source=f"weights in {str(folder)!r}")
    return decoder_from_tensors(cfg, ours)


def _spec_model_from_folder(hf_config: Any, folder: Path) -> Any:
    """The folder's model through its own class's `from_pretrained` (which renames the names
    older releases stored, GPT-NeoX's embed_out): safetensors only, never the folder's code;
    CheckpointError naming a weight missing or left over."""
    tf = _transformers()
    entry = family(hf_config.model_type)
    model_class = None if entry is None else getattr(tf, entry.model_class, None)
    if model_class is None:
        raise ConfigError(f"model_type={hf_config.model_type!r} in {str(folder)!r} is not a "
                          "family the converter reads")
    weight_files(folder)  # pickle weights alone are refused before transformers sees them
    # the stored dtype: `dtype` from 4.56, `torch_dtype` before (where `dtype` is ignored)
    dtype = "dtype" if isinstance(getattr(type(hf_config), "torch_dtype", None), property) \
        else "torch_dtype"
    with quiet(tf):
        model, info = model_class.from_pretrained(
            str(folder), config=hf_config, local_files_only=True, trust_remote_code=False,
            use_safetensors=True, output_loading_info=True, **{dtype: "auto"})
    missing, unexpected = info.get("missing_keys") or [], info.get("unexpected_keys") or []
    if missing or unexpected:
        raise CheckpointError(f"weights in {str(folder)!r} do not fit its config: missing "
                              f"{sorted(missing)}, unexpected {sorted(unexpected)}")
    return model.eval()


def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = weight_files(folder)
    stored_shapes(files)  # a garbled or truncated header is named before any tensor is read
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {exc}") from exc
    return tensors


def is_hf_folder(path: Path) -> bool:
    """A folder `save_pretrained` wrote: its config.json names a model_type."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def save_hf_folder(decoder: Decoder, folder: str | os.PathLike, *,
                   check: Callable[[Path], None] | None = None,
                   extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Write the decoder as a Hugging Face folder (config.json + model.safetensors, via
    `save_pretrained`), swapped into place atomically like our own checkpoints. An existing
    folder is replaced only if it is a Hugging Face folder whose every file is written again
    (a tokenizer.json beside the weights that is not among `extra_files` is never deleted: the
    save refuses). `extra_files` (name -> bytes, e.g. the tokenizer's) are written beside the
    weights in the same swap. `check(tmp)` runs on the complete new folder before it replaces
    anything."""
    hf_model = to_hf(decoder)

    def write(tmp: Path) -> None:
        hf_model.save_pretrained(tmp)
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        if check is not None:
            check(tmp)

    return write_folder_atomically(folder, write, same_kind=is_hf_folder,
                                   what="Hugging Face model folder")


@torch.no_grad()
def max_logit_difference(decoder: Decoder, hf_model: Any, ids: torch.Tensor) -> float:
    """max |ours - HF| over the logits of ids (B, T): the evidence that a conversion held."""
    ours = decoder(ids)
    theirs = hf_model(input_ids=ids).logits
    return (ours - theirs.to(ours.dtype)).abs().max().item()

__all__ = ["export_changes", "from_hf", "hf_layout", "hf_spec", "is_hf_folder", "load_hf_folder", "max_logit_difference",
    "save_hf_folder", "to_hf"]
