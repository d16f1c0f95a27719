"""What a sharded checkpoint folder may hold, and DCP's index read without unpickling anything
else (the folder's layout is in storage/sharded.py).

The manifest `sharded.json` covers every file the checkpoint reads. A load refuses, naming the
file, before a weight is read:

- a file in the folder the manifest does not list (a shard copied in from another run, an edit
  that dropped an entry): only `config.json` (checked by its own digest) and the manifest itself
  may be unlisted;
- a listed file that is missing or whose SHA-256 differs from the one recorded at the save;
- a file DCP's index reads that the manifest does not list, or that is not a plain file name
  inside `dcp/` (the index must not send DCP elsewhere on disk);
- a file shorter than the last byte the index places a chunk at (truncated: DCP itself would
  fail deep inside its reader, or read what is there of it).

DCP's `.metadata` is a pickle of its own dataclasses; `index_reader` reads it with an unpickler
that admits those classes, torch.Size, dtypes and paths and refuses any other global.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from ..errors import CheckpointError
from .checkpoint import CONFIG_FILE, SHARDED_MANIFEST

MANIFEST_FILE = SHARDED_MANIFEST
SHARDS_DIR = "dcp"
INDEX_FILE = ".metadata"  # DCP's index, inside SHARDS_DIR
LAYOUT = "decoder_audit.dcp"
LAYOUT_VERSION = 1
MODEL_KEY, OPTIM_KEY = "model", "optim"  # the two top-level keys of the state DCP holds
# The files of a checkpoint folder that the manifest does not list: the config has its digest in
# the manifest, and the manifest is the list itself.
UNLISTED = (CONFIG_FILE, MANIFEST_FILE)
_READ_BLOCK = 1 << 20  # bytes hashed at a time


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any]:
    """sharded.json, checked to be a manifest of this layout; CheckpointError naming it."""
    path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{str(path)!r} is not a readable manifest: {exc}") from exc
    if (not isinstance(manifest, dict) or manifest.get("layout") != LAYOUT
            or not isinstance(manifest.get("files"), dict)):
        raise CheckpointError(f"{str(path)!r} is not the manifest of a decoder-audit sharded "
                              f"checkpoint (layout {LAYOUT!r} with its files' SHA-256)")
    if manifest.get("version") != LAYOUT_VERSION:
        raise CheckpointError(f"{str(path)!r} has layout version {manifest.get('version')!r}; "
                              f"this decoder-audit reads version {LAYOUT_VERSION}")
    return manifest


def check_files(folder: Path, names: Collection[str] | None = None) -> None:
    """CheckpointError naming each file the manifest does not list, and each listed file (of
    `names`; default every one) that is missing or whose bytes differ from the SHA-256 recorded
    when it was saved. The unlisted files are looked for whatever `names` is: it only splits
    the hashing between ranks."""
    recorded = read_manifest(folder)["files"]
    unlisted = unlisted_files(folder, recorded)
    if unlisted:
        raise CheckpointError(
            f"sharded checkpoint {str(folder)!r} holds {unlisted}, which its {MANIFEST_FILE} "
            "does not list (copied in from another checkpoint, or an entry removed from the "
            "manifest); refused unread: every file a checkpoint reads is listed with its SHA-256")
    bad = []
    for name in sorted(recorded if names is None else names):
        path = folder / name
        if name not in recorded or not path.is_file() or file_sha256(path) != recorded[name]:
            bad.append(name)
    if bad:
        raise CheckpointError(f"sharded checkpoint {str(folder)!r} is damaged: {bad} missing, "
                              "replaced or changed since it was saved (SHA-256 differs from "
                              f"{MANIFEST_FILE})")


def unlisted_files(folder: Path, recorded: Mapping[str, str]) -> list[str]:
    """The files under `folder` (as the manifest names them: relative, with '/') that the
    manifest does not list, sorted; the config and the manifest itself excepted."""
    found = (path.relative_to(folder).as_posix() for path in folder.rglob("*")
             if path.is_file() or path.is_symlink())
    return sorted(name for name in found if name not in recorded and name not in UNLISTED)


def check_index_files(folder: Path, index: Any) -> None:
    """Every file DCP's `index` reads chunks from is a plain file of `dcp/` that the manifest
    lists (and so was hashed by `check_files`), at least as long as the last chunk the index
    places in it; CheckpointError naming each file that is not."""
    recorded = read_manifest(folder)["files"]
    ends: dict[str, int] = {}  # file -> the end of its last chunk, in bytes
    for info in index.storage_data.values():
        name = str(getattr(info, "relative_path", ""))
        ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    outside = sorted(name for name in ends if PurePosixPath(name).name != name
                     or name in ("", ".", "..") or "\\" in name)
    if outside:
        raise CheckpointError(f"DCP's index of {str(folder)!r} reads chunks from {outside}, "
                              f"which are not files of {SHARDS_DIR}/; refused unread")
    unlisted = sorted(f"{SHARDS_DIR}/{name}" for name in ends
                      if f"{SHARDS_DIR}/{name}" not in recorded)
    if unlisted:
        raise CheckpointError(
            f"sharded checkpoint {str(folder)!r}: DCP's index reads {unlisted}, which its "
            f"{MANIFEST_FILE} does not list; refused unread: every file a checkpoint reads is "
            "listed with its SHA-256")
    short = [f"{SHARDS_DIR}/{name} holds {size:,} bytes, its chunks end at byte {ends[name]:,}"
             for name in sorted(ends)
             if (size := (folder / SHARDS_DIR / name).stat().st_size) < ends[name]]
    if short:
        raise CheckpointError(f"sharded checkpoint {str(folder)!r} is truncated: "
                              + "; ".join(short) + " (DCP's index); refused unread")


# ----------------------------------------------------------------------------------------------
# DCP's index, read without unpickling anything else
# ----------------------------------------------------------------------------------------------

# The globals DCP's index is made of: its own dataclasses, and torch's Size, dtypes and layouts.
_INDEX_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _INDEX_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(f"DCP's index names {module}.{name}, which is not part of a "
                              "checkpoint's index; refused unread (unpickling it could run "
                              "arbitrary code)")


def index_reader(shards: Path):
    """A FileSystemReader whose index is read by `_IndexUnpickler`, once."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class IndexReader(FileSystemReader):
        index = None

        def read_metadata(self, *args: Any, **kwargs: Any):
            if self.index is None:
                with open(shards / INDEX_FILE, "rb") as handle:
                    try:
                        self.index = _IndexUnpickler(handle).load()
                    except (pickle.UnpicklingError, EOFError, AttributeError) as exc:
                        raise CheckpointError(f"{str(shards / INDEX_FILE)!r} is not DCP's "
                                              f"index (truncated or corrupt): {exc}") from exc
                if getattr(self.index, "storage_meta", None) is None:
                    self.index.storage_meta = StorageMeta()
            return self.index

    return IndexReader(str(shards))


def stored_shapes(folder: Path, reader=None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """name -> (shape, dtype) of every model tensor the checkpoint stores, from DCP's index."""
    index = (reader or index_reader(folder / SHARDS_DIR)).read_metadata()
    prefix = MODEL_KEY + "."
    return {key[len(prefix):]: (tuple(md.size), md.properties.dtype)
            for key, md in index.state_dict_metadata.items() if key.startswith(prefix)}


def dcp_failures(exc: BaseException) -> list[tuple[int, BaseException]]:
    """(rank, the exception it raised) of DCP's CheckpointException, which wraps each failed
    rank's exception with its stack (a tuple of the two, or an object with `.exc`)."""
    failures = getattr(exc, "failures", None) or {}
    found = []
    for rank, failure in sorted(failures.items()):
        error = failure[0] if isinstance(failure, tuple) and failure else getattr(
            failure, "exc", failure)
        found.append((rank, error if isinstance(error, BaseException) else Exception(error)))
    return found


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line: a message of several lines by its detail, the line after
    one that ends "error:" where there is one (torch.load's refusals wrap theirs in advice to
    load with weights_only=False, which is never due here), else its first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((lines[i + 1] for i, line in enumerate(lines[:-1]) if line.endswith("error:")),
                  lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
