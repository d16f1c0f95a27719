"""The checkpoint folder's format: its file names, the digests recorded in the safetensors
metadata and their checks, and the refusal of pickles. `checkpoint.py` saves and loads with it.

The safetensors metadata records a SHA-256 per tensor (`DIGEST_PREFIX + name`), one of the
config's canonical JSON (`CONFIG_DIGEST`) and one per extra file (`FILE_DIGEST_PREFIX + name`),
so a flipped bit inside the data (which safetensors itself cannot see), an edited `config.json`
(e.g. mlp relu -> gelu, same shapes) or a replaced or truncated extra file is caught when it is
read. Weights holding NaN or inf are refused on save and on load.

Nothing is ever unpickled. A folder that holds `.pt`/`.bin` pickle weights, or a
`model.safetensors` that is really a `torch.save` pickle, is refused before a byte of it is
interpreted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import DecoderConfig
from .errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# A module that is not a Decoder: the factory that rebuilds it (save_module_weights).
FACTORY_FILE = "factory.json"
# A training run folder keeps its latest checkpoint here (see training/state.py).
CHECKPOINT_DIR = "checkpoint"
FORMAT_VERSION = "1"
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


def refuse_non_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """NaN or inf weights are a diverged model, never a checkpoint worth keeping or sampling."""
    bad = sorted(name for name, t in tensors.items()
                 if t.is_floating_point() and not bool(torch.isfinite(t).all()))
    if bad:
        raise CheckpointError(f"{what}: tensors {bad} hold NaN or inf (a diverged model)")


def read_checked_file(folder: str | os.PathLike, name: str) -> bytes:
    """An extra file of a checkpoint, checked against the SHA-256 recorded when it was saved
    (files saved before digests were recorded are returned as they are)."""
    folder = Path(folder)
    path = folder / name
    data = path.read_bytes()
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
