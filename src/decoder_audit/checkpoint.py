"""Our checkpoints: one folder holding `model.safetensors` and `config.json`, written atomically.

Layout of a checkpoint folder `ckpt/`:

    ckpt/config.json        the DecoderConfig as JSON (`DecoderConfig.to_json`)
    ckpt/model.safetensors  every unique tensor once; a tied readout is *not* stored again
    ckpt/<extra files>      optional bytes the caller hands in (e.g. the trainer's optimizer state)

Nothing is ever unpickled. Weights are read with safetensors only; a folder that holds
`.pt`/`.bin` pickle weights, or a `model.safetensors` that is really a `torch.save` pickle, is
refused before a byte of it is interpreted. The safetensors metadata carries a SHA-256 digest per
tensor, so a flipped bit inside the data (which safetensors itself cannot see) is caught too.

How a save is made atomic (one writer per folder at a time):

    1. Remove stale temporaries left by an earlier crashed save: `.ckpt.tmp-*` siblings always,
       `.ckpt.old-*` siblings only when `ckpt/` itself exists (otherwise one of them holds the
       previous checkpoint, see 3).
    2. Write every file into a fresh sibling `.ckpt.tmp-<pid>-<random>/`, fsync each file and
       the folder. `ckpt/` is untouched so far.
    3. Rename `ckpt/` (if there is one) to `.ckpt.old-*`, rename the temporary to `ckpt/`, fsync
       the parent after each rename, then delete the `.old` folder.

What a crash leaves behind: during 1-2, the old `ckpt/` plus a stale `.ckpt.tmp-*`; between the
two renames of 3, no `ckpt/` but a complete `.ckpt.old-*`, which `load_checkpoint("ckpt")` finds
and loads (with a warning); after them, the new `ckpt/` plus a stale `.ckpt.old-*`. Every case
loads with `load_checkpoint("ckpt")`, and the next `save_checkpoint` removes the debris.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import secrets
import shutil
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from .config import DecoderConfig
from .errors import CheckpointError, ConfigError
from .model import Decoder

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# A training run folder keeps its latest checkpoint here (see training/state.py).
CHECKPOINT_DIR = "checkpoint"
FORMAT_VERSION = "1"
_DIGEST_PREFIX = "decoder_audit.sha256."
# File names that mean "pickle weights": we refuse them rather than ever calling torch.load.
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")
# torch.save writes a zip archive ("PK\x03\x04"); a bare pickle starts with the PROTO opcode 0x80.
_PICKLE_MAGICS = (b"PK\x03\x04", b"\x80")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


# ----------------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------------

def save_checkpoint(model: Decoder, path: str | os.PathLike, *,
                    extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Write `model` (a Decoder) to the folder `path` atomically and return the folder's Path.

    The tied weight is stored once (as `token_embeddings.weight`), so the file loads in plain
    safetensors without the shared-tensor error. `extra_files` maps plain file names to bytes
    written beside the weights inside the same atomic swap."""
    if not isinstance(model, Decoder):
        raise TypeError(f"save_checkpoint needs a decoder_audit Decoder, got {type(model).__name__}")
    extra = dict(extra_files or {})
    for name, data in extra.items():
        if not isinstance(name, str) or not _EXTRA_NAME.match(name) or name in (WEIGHTS_FILE,
                                                                                  CONFIG_FILE):
            raise CheckpointError(
                f"extra file name {name!r} must be a plain file name (letters, digits, '._-', no "
                f"folders) other than {WEIGHTS_FILE!r} and {CONFIG_FILE!r}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CheckpointError(f"extra file {name!r} must be bytes, got {type(data).__name__}")

    tensors, metadata = _tensors_to_store(model)

    def write(folder: Path) -> None:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata=metadata)
        (folder / CONFIG_FILE).write_text(model.config.to_json() + "\n")
        for name, data in extra.items():
            (folder / name).write_bytes(bytes(data))

    return write_folder_atomically(path, write, marker_files=(CONFIG_FILE, WEIGHTS_FILE))


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
    metadata = {
        "format": "pt",
        "decoder_audit.format": FORMAT_VERSION,
        "decoder_audit.tied": "lm_head.weight=token_embeddings.weight" if tied else "",
    }
    metadata.update({_DIGEST_PREFIX + name: _digest(t) for name, t in tensors.items()})
    return tensors, metadata


def _digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (any dtype: viewed as uint8, so bf16 works too)."""
    raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def write_folder_atomically(path: str | os.PathLike, write: Callable[[Path], None], *,
                            marker_files: tuple[str, ...] = (CONFIG_FILE,)) -> Path:
    """Call `write(tmp_folder)` to fill a fresh sibling folder, fsync it, and swap it into `path`
    (see the module docstring for the steps and what a crash leaves behind).

    An existing `path` is replaced only if it looks like what we write: it must contain at least
    one of `marker_files` (a safety net against replacing an unrelated folder)."""
    path = Path(path).absolute()
    parent, name = path.parent, path.name
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{str(path)!r} exists and is not a folder; refusing to replace it")
    if path.is_dir() and any(path.iterdir()) and not any((path / m).exists() for m in marker_files):
        raise CheckpointError(
            f"{str(path)!r} is a non-empty folder without {' or '.join(marker_files)}; refusing "
            "to replace what does not look like one of our outputs")
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(parent, name, keep_backups=not path.is_dir())

    tmp = parent / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    write(tmp)
    for child in tmp.rglob("*"):
        if child.is_file():
            _fsync(child)
    _fsync(tmp)

    old = None
    if path.exists():
        old = parent / f".{name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(path, old)
        _fsync(parent)
    os.rename(tmp, path)  # a crash before this line leaves the old checkpoint in `old`
    _fsync(parent)
    if old is not None:
        shutil.rmtree(old)
    _remove_stale(parent, name, keep_backups=False)  # backups a crash stranded are superseded
    return path


def _remove_stale(parent: Path, name: str, *, keep_backups: bool) -> None:
    for stale in parent.glob(f".{glob.escape(name)}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if not keep_backups:
        for stale in parent.glob(f".{glob.escape(name)}.old-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _fsync(path: Path) -> None:
    if sys.platform == "win32" and path.is_dir():  # folders cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------

def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """The folder that holds the checkpoint named `path`: `path` itself, or, when a crash in the
    middle of a save left no `path`, the complete backup `.NAME.old-*` beside it."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} is a file; a checkpoint is a folder "
                              f"holding {CONFIG_FILE} and {WEIGHTS_FILE}")
    parent = path.absolute().parent
    backups = sorted(parent.glob(f".{glob.escape(path.name)}.old-*"),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for backup in backups:
        if (backup / CONFIG_FILE).is_file() and (backup / WEIGHTS_FILE).is_file():
            warnings.warn(f"checkpoint {str(path)!r} is missing (a save crashed mid-swap); "
                          f"loading the previous checkpoint from {str(backup)!r}", stacklevel=3)
            return backup
    raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist")


def checkpoint_folder(path: str | os.PathLike) -> Path:
    """The checkpoint a user names: a checkpoint folder itself, or the checkpoint inside a
    training run folder (`DIR/checkpoint`)."""
    path = Path(path)
    if (path / CHECKPOINT_DIR).exists() or not (path / CONFIG_FILE).exists():
        return resolve_checkpoint_dir(path / CHECKPOINT_DIR)
    return path


def load_checkpoint(path: str | os.PathLike, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype | None = None) -> Decoder:
    """Load a checkpoint folder written by `save_checkpoint` into a new Decoder.

    Order: the config is validated, then every stored name and shape is compared with what the
    config implies (missing, unexpected and mismatched names are listed together), then the
    digests are checked, and only then are weights placed into a model. Tying is re-established
    by construction (one Parameter). `dtype=None` keeps the stored dtype, so a round trip gives
    bitwise-equal logits. Raises CheckpointError naming the file on any problem."""
    folder = resolve_checkpoint_dir(path)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE

    # 1. The config, before anything else.
    if not config_path.is_file():
        raise CheckpointError(f"checkpoint {str(folder)!r} has no {CONFIG_FILE}")
    try:
        cfg = DecoderConfig.load(config_path)
    except ConfigError as exc:
        raise CheckpointError(f"{str(config_path)!r}: {exc}") from exc

    # 2. The weights file: safetensors only, never a pickle.
    _refuse_pickles(folder, weights_path)
    try:
        with safe_open(str(weights_path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            stored = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
            # 3. Names and shapes against the config, before a single weight is read.
            expected = expected_shapes(cfg)
            problems = name_and_shape_problems(expected, stored)
            if cfg.tie_embeddings and "lm_head.weight" in stored:
                problems.append("tie_embeddings=True: the readout is token_embeddings.weight, "
                                "stored once")
            if problems:
                raise CheckpointError(f"{str(weights_path)!r} does not fit {str(config_path)!r}: "
                                      + "; ".join(problems))
            tensors = {name: handle.get_tensor(name) for name in expected}
    except SafetensorError as exc:
        raise CheckpointError(f"{str(weights_path)!r} is not a readable safetensors file "
                              f"(corrupted or truncated?): {exc}") from exc

    # 4. Integrity of the data itself (safetensors checks the header, not the bytes).
    bad = [name for name, tensor in tensors.items()
           if _DIGEST_PREFIX + name in metadata and _digest(tensor) != metadata[_DIGEST_PREFIX + name]]
    if bad:
        raise CheckpointError(f"{str(weights_path)!r} is corrupted: the SHA-256 of {bad} does not "
                              "match the digest recorded when it was saved")
    not_float = sorted(n for n, t in tensors.items() if not t.is_floating_point())
    if not_float:
        raise CheckpointError(f"{str(weights_path)!r}: tensors {not_float} are not floating point")

    # 5. Only now a model.
    return decoder_from_tensors(cfg, tensors, device=device, dtype=dtype)


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


def _refuse_pickles(folder: Path, weights_path: Path) -> None:
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
