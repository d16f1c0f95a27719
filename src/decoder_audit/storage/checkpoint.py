"""Our checkpoints: one folder holding `model.safetensors` and `config.json`, written atomically.

Layout of a checkpoint folder `ckpt/`:

    ckpt/config.json        the DecoderConfig as JSON (`DecoderConfig.to_json`)
    ckpt/model.safetensors  every unique tensor once; a tied readout is *not* stored again
    ckpt/<extra files>      optional bytes the caller hands in (e.g. the trainer's optimizer state)

The safetensors metadata records a SHA-256 per tensor (`DIGEST_PREFIX + name`), one of the
config's canonical JSON (`CONFIG_DIGEST`) and one per extra file (`FILE_DIGEST_PREFIX + name`),
so a flipped bit inside the data (which safetensors itself cannot see), an edited `config.json`
(e.g. mlp relu -> gelu, same shapes) or a replaced or truncated extra file is caught when it is
read. Weights holding NaN or inf are refused on save and on load.

Nothing is ever unpickled. A folder that holds `.pt`/`.bin` pickle weights, or a
`model.safetensors` that is really a `torch.save` pickle, is refused before a byte of it is
interpreted.

The atomic swap into place, and what a crash leaves behind, is `storage.folder`'s. Every crash
case loads with `load_checkpoint("ckpt")`, and the next `save_checkpoint` removes the debris.

A module that is not a Decoder (a user's `--model FILE.py:FACTORY`) is saved by
`save_module_weights`: its state dict in `model.safetensors` (shared tensors once) and
`factory.json` naming the factory that rebuilds it; `load_module_weights` reads it back.

Nothing a user had on disk is lost: a folder is replaced only when it is one of ours of the same
kind and every entry in it will be written again; anything else there (a `NOTES.md`, a training
checkpoint's `train_state.pt` under a plain save, a Hugging Face folder under a checkpoint save)
makes the save refuse, naming the entries, before anything is moved.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ..config import DecoderConfig
from ..errors import CheckpointError, ConfigError
from ..model.decoder import Decoder
from .folder import stranded_copies, write_folder_atomically

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# A module that is not a Decoder: the factory that rebuilds it (save_module_weights).
FACTORY_FILE = "factory.json"
# A training run folder keeps its latest checkpoint here (see training/state.py).
CHECKPOINT_DIR = "checkpoint"
FORMAT_VERSION = "1"
# A sharded checkpoint's manifest (storage/sharded.py): its weights are in dcp/, not WEIGHTS_FILE.
SHARDED_MANIFEST = "sharded.json"
# The readers of other layouts of a checkpoint folder, by the file that marks each: registered
# by the module that writes the layout (storage/sharded.py, which builds on this one) when the
# storage package is imported, so that load_checkpoint reads every checkpoint we write.
LAYOUT_READERS: dict[str, Callable[..., Decoder]] = {}
DIGEST_PREFIX = "decoder_audit.sha256."
CONFIG_DIGEST = "decoder_audit.config_sha256"
FILE_DIGEST_PREFIX = "decoder_audit.file_sha256."
ALIAS_PREFIX = "decoder_audit.alias."
# File names that mean "pickle weights": we refuse them rather than ever calling torch.load.
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")
# torch.save writes a zip archive ("PK\x03\x04"); a bare pickle starts with the PROTO opcode 0x80.
_PICKLE_MAGICS = (b"PK\x03\x04", b"\x80")


def is_checkpoint_folder(path: Path) -> bool:
    """A decoder-audit checkpoint: a config.json that is not a Hugging Face config, or a
    factory.json (a module's weights)."""
    if (path / FACTORY_FILE).is_file():
        return True
    config = json_object(path / CONFIG_FILE)
    return config is not None and "model_type" not in config and "architectures" not in config


def json_object(path: Path) -> dict | None:
    """The JSON object in the file `path`; None when it is absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---- digests -----------------------------------------------------------------------------------

def digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (any dtype: viewed as uint8, so bf16 works too)."""
    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_digest(cfg: DecoderConfig) -> str:
    """SHA-256 of the config's canonical JSON (sorted keys): any change of a field changes it,
    re-formatting the file does not."""
    return sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode())


def check_digests(weights_path: Path, tensors: Mapping[str, torch.Tensor],
                  metadata: Mapping[str, str]) -> None:
    """CheckpointError naming the tensors whose bytes differ from the digests recorded at save."""
    bad = [name for name, tensor in tensors.items()
           if DIGEST_PREFIX + name in metadata and digest(tensor) != metadata[DIGEST_PREFIX + name]]
    if bad:
        raise CheckpointError(f"{str(weights_path)!r} is corrupted: the SHA-256 of {bad} does not "
                              "match the digest recorded when it was saved")


def non_finite_names(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors holding NaN or inf, sorted."""
    return sorted(name for name, t in tensors.items()
                  if t.is_floating_point() and not bool(torch.isfinite(t).all()))


def refuse_non_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """NaN or inf weights are a diverged model, never a checkpoint worth keeping or sampling."""
    bad = non_finite_names(tensors)
    if bad:
        raise CheckpointError(f"{what}: tensors {bad} hold NaN or inf (a diverged model)")


def read_checked_file(folder: str | os.PathLike, name: str) -> bytes:
    """An extra file of a checkpoint, checked against the SHA-256 recorded when it was saved
    (files saved before digests were recorded are returned as they are)."""
    folder = Path(folder)
    path = folder / name
    data = path.read_bytes()
    if (folder / SHARDED_MANIFEST).is_file():  # a sharded checkpoint: its manifest holds them
        recorded = ((json_object(folder / SHARDED_MANIFEST) or {}).get("files") or {}).get(name)
        if recorded is not None and recorded != sha256(data):
            raise CheckpointError(f"{str(path)!r} ({len(data):,} bytes) is not the file saved "
                                  "with this checkpoint: its SHA-256 differs from the one "
                                  f"recorded in {SHARDED_MANIFEST} (replaced, edited or "
                                  "truncated)")
        return data
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt", device="cpu") as handle:
            recorded = (handle.metadata() or {}).get(FILE_DIGEST_PREFIX + name)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{str(folder / WEIGHTS_FILE)!r} is not a readable safetensors "
                              f"file (corrupted or truncated?): {exc}") from exc
    if recorded is not None and recorded != sha256(data):
        raise CheckpointError(f"{str(path)!r} ({len(data):,} bytes) is not the file saved with "
                              "this checkpoint: its SHA-256 differs from the one recorded in "
                              f"{WEIGHTS_FILE} (replaced, edited or truncated)")
    return data


# ---- never a pickle ----------------------------------------------------------------------------

def refuse_pickles(folder: Path, weights_path: Path) -> None:
    """CheckpointError unless `weights_path` exists and is not a pickle (by name or by content)."""
    if not weights_path.is_file():
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(
                f"checkpoint {str(folder)!r} has no {WEIGHTS_FILE} but pickle weights {pickles}; "
                "decoder-audit never unpickles checkpoints (unpickling runs arbitrary code). "
                "Re-save the weights with safetensors")
        raise CheckpointError(f"checkpoint {str(folder)!r} has no {WEIGHTS_FILE}")
    with open(weights_path, "rb") as handle:
        head = handle.read(9)
    # A safetensors file opens with an 8-byte little-endian header length and then "{"; only
    # when that is absent do we look for pickle magic (a header length may start with 0x80).
    if head[8:9] != b"{" and any(head.startswith(magic) for magic in _PICKLE_MAGICS):
        raise CheckpointError(
            f"{str(weights_path)!r} is a torch.save/pickle file, not safetensors; refused without "
            "unpickling it (unpickling runs arbitrary code)")


_EXTRA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


# ----------------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------------

def save_checkpoint(model: Decoder, path: str | os.PathLike, *,
                    extra_files: Mapping[str, bytes] | None = None,
                    check: Callable[[Path], None] | None = None,
                    superseded: Collection[str] = ()) -> Path:
    """Write `model` (a Decoder) to the folder `path` atomically and return the folder's Path.

    The tied weight is stored once (as `token_embeddings.weight`), so the file loads in plain
    safetensors without the shared-tensor error. `extra_files` maps plain file names to bytes
    written beside the weights inside the same atomic swap. `check(folder)`, if given, runs on
    the complete new folder before it replaces anything; if it raises, nothing is replaced and
    nothing is left behind. An existing `path` is replaced only if it is a checkpoint whose every
    entry is written again (see `write_folder_atomically`), or is one of `superseded` (entries
    of ours another kind of checkpoint holds: a sharded one's shards, which this one replaces)."""
    if not isinstance(model, Decoder):
        raise TypeError(f"save_checkpoint needs a decoder_audit Decoder, got {type(model).__name__}")
    extra = checked_extra_files(extra_files, reserved=(WEIGHTS_FILE, CONFIG_FILE, FACTORY_FILE))
    tensors, metadata = _tensors_to_store(model)
    metadata.update({FILE_DIGEST_PREFIX + name: sha256(data) for name, data in extra.items()})

    def write(folder: Path) -> None:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata=metadata)
        (folder / CONFIG_FILE).write_text(model.config.to_json() + "\n")
        for name, data in extra.items():
            (folder / name).write_bytes(data)
        if check is not None:
            check(folder)

    return write_folder_atomically(path, write, same_kind=is_checkpoint_folder, what="checkpoint",
                                   names=(WEIGHTS_FILE, CONFIG_FILE, *extra),
                                   superseded=superseded)


def checked_extra_files(extra_files: Mapping[str, bytes] | None, *,
                         reserved: tuple[str, ...]) -> dict[str, bytes]:
    extra = dict(extra_files or {})
    for name, data in extra.items():
        if not isinstance(name, str) or not _EXTRA_NAME.match(name) or name in reserved:
            raise CheckpointError(
                f"extra file name {name!r} must be a plain file name (letters, digits, '._-', no "
                f"folders) other than {' and '.join(repr(r) for r in reserved)}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CheckpointError(f"extra file {name!r} must be bytes, got {type(data).__name__}")
    return {name: bytes(data) for name, data in extra.items()}


def _tensors_to_store(model: Decoder) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Unique tensors by name (the tied readout dropped) and the safetensors metadata."""
    cfg = model.config
    tied = cfg.tie_embeddings
    if tied and model.lm_head.weight is not model.token_embeddings.weight:
        raise CheckpointError(
            "config says tie_embeddings=True but lm_head.weight is not the token_embeddings.weight "
            "Parameter; refusing to save a model whose tying is broken")
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # the same Parameter as token_embeddings.weight: stored once
        tensors[name] = tensor.detach().to("cpu").contiguous()
    refuse_non_finite(tensors, "refusing to save")
    metadata = weights_metadata(cfg)
    metadata.update({DIGEST_PREFIX + name: digest(t) for name, t in tensors.items()})
    return tensors, metadata


def weights_metadata(cfg: DecoderConfig) -> dict[str, str]:
    """The safetensors metadata of a Decoder checkpoint before its per-tensor digests: the
    format, how the readout is tied, the config's digest."""
    return {
        "format": "pt",
        "decoder_audit.format": FORMAT_VERSION,
        "decoder_audit.tied": ("lm_head.weight=token_embeddings.weight" if cfg.tie_embeddings
                               else ""),
        CONFIG_DIGEST: config_digest(cfg),
    }


# ---- modules that are not a Decoder ------------------------------------------------------------

def save_module_weights(module: nn.Module, path: str | os.PathLike, *,
                        factory: Mapping[str, object],
                        extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Save any module's state dict to the folder `path` atomically: `model.safetensors` (a
    tensor shared under several names is stored once, the other names recorded as aliases) and
    `factory.json` (`factory`: what rebuilds the module, e.g. {"factory": "/abs/model.py:build"}).
    `load_module_weights(factory_built_module, path)` reads it back."""
    extra = checked_extra_files(extra_files, reserved=(WEIGHTS_FILE, CONFIG_FILE, FACTORY_FILE))
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], torch.dtype], str] = {}
    for name, tensor in module.state_dict(keep_vars=False).items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tensor.dtype)
        if key in seen:  # a tied weight: the same storage under a second name
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.detach().to("cpu").contiguous()
    refuse_non_finite(tensors, "refusing to save")
    factory_json = (json.dumps(dict(factory), indent=2) + "\n").encode()
    metadata = {"format": "pt", "decoder_audit.format": FORMAT_VERSION,
                FILE_DIGEST_PREFIX + FACTORY_FILE: sha256(factory_json)}
    metadata.update({DIGEST_PREFIX + name: digest(t) for name, t in tensors.items()})
    metadata.update({ALIAS_PREFIX + name: target for name, target in aliases.items()})
    metadata.update({FILE_DIGEST_PREFIX + name: sha256(data) for name, data in extra.items()})

    def write(folder: Path) -> None:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata=metadata)
        (folder / FACTORY_FILE).write_bytes(factory_json)
        for name, data in extra.items():
            (folder / name).write_bytes(data)

    return write_folder_atomically(path, write, same_kind=is_checkpoint_folder, what="checkpoint",
                                   names=(WEIGHTS_FILE, FACTORY_FILE, *extra))


def load_module_weights(module: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Copy the weights `save_module_weights` wrote into `module` (built by the same factory);
    names, shapes and digests must all match. Returns the module."""
    folder = resolve_checkpoint_dir(path)
    weights_path = folder / WEIGHTS_FILE
    refuse_pickles(folder, weights_path)
    try:
        with safe_open(str(weights_path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except SafetensorError as exc:
        raise CheckpointError(f"{str(weights_path)!r} is not a readable safetensors file "
                              f"(corrupted or truncated?): {exc}") from exc
    check_digests(weights_path, tensors, metadata)
    refuse_non_finite(tensors, f"{str(weights_path)!r}")
    for key, target in metadata.items():
        if key.startswith(ALIAS_PREFIX) and target in tensors:
            tensors[key[len(ALIAS_PREFIX):]] = tensors[target]
    wanted = module.state_dict()
    problems = name_and_shape_problems({n: tuple(t.shape) for n, t in wanted.items()},
                                       {n: tuple(t.shape) for n, t in tensors.items()})
    if problems:
        raise CheckpointError(f"{str(weights_path)!r} does not fit {type(module).__name__}: "
                              + "; ".join(problems))
    module.load_state_dict(tensors)
    return module


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------

class StrandedCopyWarning(UserWarning):
    """A checkpoint was missing and the complete copy an interrupted save left was read instead.
    Ours: the command line says it in one line of its own (cli: `one_line_warnings`)."""


def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """The folder that holds the checkpoint named `path`: `path` itself, or, when a save stopped
    between its renames and left no `path`, the newest complete copy beside it (the new
    checkpoint it had finished writing before the old one it moved aside; `stranded_copies`)."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} is a file; a checkpoint is a folder "
                              f"holding {CONFIG_FILE} and {WEIGHTS_FILE}")
    for copy in stranded_copies(path):
        weights = (copy / WEIGHTS_FILE).is_file() or (copy / SHARDED_MANIFEST).is_file()
        if weights and ((copy / CONFIG_FILE).is_file()
                                                or (copy / FACTORY_FILE).is_file()):
            warnings.warn(f"checkpoint {str(path)!r} is missing (a save stopped between its "
                          f"renames); loading the newest complete copy it left, {str(copy)!r}",
                          StrandedCopyWarning, stacklevel=3)
            return copy
    raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist")


def checkpoint_folder(path: str | os.PathLike) -> Path:
    """The checkpoint a user names: a checkpoint folder itself, or the checkpoint inside a
    training run folder (`DIR/checkpoint`)."""
    path = Path(path)
    if (path / CONFIG_FILE).exists() or (path / FACTORY_FILE).exists():
        return path
    if not path.is_dir():  # a backup a crashed save left, or "does not exist" / "is a file"
        return resolve_checkpoint_dir(path)
    run_checkpoint = path / CHECKPOINT_DIR
    if (not run_checkpoint.exists()
            and not stranded_copies(run_checkpoint)):
        raise CheckpointError(
            f"{str(path)!r} is neither a checkpoint (no {CONFIG_FILE}) nor a training run folder "
            f"(no {CHECKPOINT_DIR}/)")
    return resolve_checkpoint_dir(run_checkpoint)


def load_checkpoint(path: str | os.PathLike, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype | None = None) -> Decoder:
    """Load a checkpoint folder written by `save_checkpoint` into a new Decoder.

    Order: the config is validated, then every stored name and shape is compared with what the
    config implies (missing, unexpected and mismatched names are listed together), then the
    digests are checked, and only then are weights placed into a model. Tying is re-established
    by construction (one Parameter). `dtype=None` keeps the stored dtype, so a round trip gives
    bitwise-equal logits. Raises CheckpointError naming the file on any problem."""
    folder = resolve_checkpoint_dir(path)
    for marker, read in LAYOUT_READERS.items():  # another layout: a sharded run's, assembled
        if (folder / marker).is_file():
            return read(folder, device=device, dtype=dtype)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    cfg = read_config(folder)  # 1. the config, before anything else
    refuse_pickles(folder, weights_path)  # 2. the weights file: safetensors only, never a pickle
    tensors, metadata = _read_fitting_tensors(cfg, config_path, weights_path)  # 3.

    # 4. Integrity of the data itself (safetensors checks the header, not the bytes), and of the
    #    config: one edited field with the same shapes (mlp relu -> gelu) changes the model.
    check_digests(weights_path, tensors, metadata)
    recorded = metadata.get(CONFIG_DIGEST)
    if recorded is not None and recorded != config_digest(cfg):
        raise CheckpointError(
            f"{str(config_path)!r} was changed after the checkpoint was saved: the config's "
            f"SHA-256 differs from the one recorded in {WEIGHTS_FILE} (these weights were "
            "trained under another config); restore the saved config.json")
    not_float = sorted(n for n, t in tensors.items() if not t.is_floating_point())
    if not_float:
        raise CheckpointError(f"{str(weights_path)!r}: tensors {not_float} are not floating point")
    refuse_non_finite(tensors, f"{str(weights_path)!r}")

    # 5. Only now a model.
    return decoder_from_tensors(cfg, tensors, device=device, dtype=dtype)


def read_config(folder: Path) -> DecoderConfig:
    """The validated config of the checkpoint in `folder`; a module's weights (factory.json)
    are refused with how to read them instead."""
    config_path = folder / CONFIG_FILE
    if not config_path.is_file() and (folder / FACTORY_FILE).is_file():
        factory = (json_object(folder / FACTORY_FILE) or {}).get("factory")
        raise CheckpointError(
            f"{str(folder)!r} holds the weights of a module that is not a Decoder (factory.json: "
            f"{factory!r}), not a Decoder checkpoint: rebuild the module with its factory and "
            "read them with decoder_audit.storage.checkpoint.load_module_weights(module, folder), or "
            "continue its training with `decoder-audit train --resume`")
    if not config_path.is_file():
        raise CheckpointError(f"checkpoint {str(folder)!r} has no {CONFIG_FILE}")
    try:
        return DecoderConfig.load(config_path)
    except ConfigError as exc:
        raise CheckpointError(f"{str(config_path)!r}: {exc}") from exc


def _read_fitting_tensors(cfg: DecoderConfig, config_path: Path, weights_path: Path
                          ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The stored tensors and the safetensors metadata, once every stored name and shape fits
    what `cfg` implies: the header is compared before a single weight is read."""
    try:
        with safe_open(str(weights_path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            stored = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
            expected = expected_shapes(cfg)
            problems = name_and_shape_problems(expected, stored)
            if cfg.tie_embeddings and "lm_head.weight" in stored:
                problems.append("tie_embeddings=True: the readout is token_embeddings.weight, "
                                "stored once")
            if problems:
                raise CheckpointError(f"{str(weights_path)!r} does not fit {str(config_path)!r}: "
                                      + "; ".join(problems))
            return {name: handle.get_tensor(name) for name in expected}, metadata
    except SafetensorError as exc:
        raise CheckpointError(f"{str(weights_path)!r} is not a readable safetensors file "
                              f"(corrupted or truncated?): {exc}") from exc


def expected_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every unique tensor a Decoder with this config stores (meta device)."""
    model = Decoder(cfg, device="meta")
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def name_and_shape_problems(expected: Mapping[str, tuple[int, ...]],
                            got: Mapping[str, tuple[int, ...]]) -> list[str]:
    """The missing, unexpected and mismatched names of `got` against `expected` (name -> shape),
    one entry per kind; empty when they fit."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    mismatched = sorted(f"{n} is {tuple(got[n])}, the config needs {tuple(expected[n])}"
                        for n in set(expected) & set(got) if tuple(got[n]) != tuple(expected[n]))
    return (([f"missing {missing}"] if missing else [])
            + ([f"unexpected {unexpected}"] if unexpected else [])
            + (["mismatched shapes: " + ", ".join(mismatched)] if mismatched else []))


def copy_into_parameters(module: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy `tensors` into `module`'s unique Parameters (a tied weight appears once); the names
    and shapes must match exactly."""
    params = dict(module.named_parameters())
    problems = name_and_shape_problems({n: p.shape for n, p in params.items()},
                                       {n: t.shape for n, t in tensors.items()})
    if problems:
        raise CheckpointError(f"the tensors do not fit {type(module).__name__}: "
                              + "; ".join(problems))
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)


def decoder_from_tensors(cfg: DecoderConfig, tensors: Mapping[str, torch.Tensor], *,
                         device: torch.device | str | None = None,
                         dtype: torch.dtype | None = None) -> Decoder:
    """A Decoder holding copies of `tensors` (our unique-parameter names), built without
    initialising: on the meta device, then empty storage (where Decoder re-ties), then filled.
    `device` and `dtype` default to those of token_embeddings.weight."""
    like = tensors["token_embeddings.weight"]
    model = Decoder(cfg, device="meta", dtype=dtype or like.dtype)
    model.to_empty(device=device or like.device)
    copy_into_parameters(model, tensors)
    return model
