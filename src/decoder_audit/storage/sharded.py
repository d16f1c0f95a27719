"""Sharded checkpoints: a model sharded with FSDP2 saved by every rank at once with
`torch.distributed.checkpoint` (DCP, as torchtitan saves), no rank ever holding the whole model,
and read back on any number of ranks (DCP reshards on load) or in one plain process.

Layout of a sharded checkpoint folder `ckpt/`:

    ckpt/config.json             the DecoderConfig as JSON, as in an unsharded checkpoint
    ckpt/sharded.json            the manifest: the layout's version, the world size that wrote it,
                                 the config's SHA-256 and one SHA-256 per file below
    ckpt/dcp/.metadata           DCP's index: every tensor's shape, dtype and where each rank's
                                 chunk of it lies
    ckpt/dcp/__R_0.distcp        rank R's chunks: its rows of every weight (the tied readout
                                 stored once, as token_embeddings.weight) and of AdamW's moments
    ckpt/<extra files>           bytes the caller hands in (the trainer's state, a tokenizer)

Nothing is unpickled beyond DCP's own index. DCP writes `.metadata` as a pickle of its own
dataclasses; it is read here by an unpickler that admits those classes, torch.Size, dtypes and
paths and refuses any other global, and each chunk is read with `torch.load(weights_only=True)`.
Only tensors are saved (optimizer hyperparameters go into the caller's own files), so no chunk
is ever a pickled object.

Atomic as every folder of ours (storage.folder): rank 0 takes the lock and makes the temporary
folder, every rank writes its chunks into it, rank 0 writes the rest, fsyncs it and swaps it in
only once every rank has reported its chunks written and hashed. An exception on any rank, or a
rank killed mid-save, leaves the previous checkpoint in place, untouched and loadable (what a
killed run leaves is a marked temporary folder, removed by the next save). Every rank must call
`save_sharded_checkpoint`; it returns the folder on rank 0 and None on the others.

Reading: `load_sharded_state` fills a model's Parameters in place (sharded or plain) and its
optimizer's state; `load_sharded_decoder` builds a whole Decoder in one process (what `sample`,
`verify --checkpoint` and `convert --to-hf` need); `export_safetensors` writes one
`model.safetensors` streaming one tensor at a time, so the peak is about one whole tensor and
its chunks, never the model.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import DecoderConfig
from ..errors import CheckpointError
from ..model.decoder import Decoder
from .checkpoint import (
    CONFIG_DIGEST,
    CONFIG_FILE,
    DIGEST_PREFIX,
    LAYOUT_READERS,
    SHARDED_MANIFEST,
    WEIGHTS_FILE,
    checked_extra_files,
    config_digest,
    expected_shapes,
    is_checkpoint_folder,
    name_and_shape_problems,
    non_finite_names,
    read_config,
    refuse_non_finite,
    sha256,
    weights_metadata,
)
from .folder import write_folder_atomically

MANIFEST_FILE = SHARDED_MANIFEST
SHARDS_DIR = "dcp"
LAYOUT = "decoder_audit.dcp"
LAYOUT_VERSION = 1
MODEL_KEY, OPTIM_KEY = "model", "optim"  # the two top-level keys of the state DCP holds
_READ_BLOCK = 1 << 20  # bytes hashed at a time


def is_sharded_checkpoint(folder: str | os.PathLike) -> bool:
    return (Path(folder) / MANIFEST_FILE).is_file()


def holds_dtensors(model: nn.Module) -> bool:
    """Whether FSDP2 has sharded `model` (its Parameters are DTensors). When the DTensor module
    was never imported, nothing can have made one: an unsharded run does not pay for importing
    it."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None:
        return False
    return any(isinstance(p, dtensor.DTensor) for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# What is saved: unique Parameters by name, AdamW's tensors by the name of their Parameter
# ----------------------------------------------------------------------------------------------

def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the optimizer's tensors keyed by parameter name, each rank's own rows of them; its
    param_groups, with parameter names for indices). The tensors go into DCP; the groups are
    plain numbers the caller stores with its own state (no pickled object in DCP). A value in
    the state that is not a tensor is refused: DCP would pickle it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(resharded(model), optimizer, options=StateDictOptions(
        full_state_dict=False))
    odd = sorted(f"{name}.{key}" for name, values in state["state"].items()
                 for key, value in values.items() if not isinstance(value, torch.Tensor))
    if odd:
        raise CheckpointError(f"the optimizer's state holds values that are not tensors ({odd}); "
                              "a sharded checkpoint stores tensors only")
    return state["state"], state["param_groups"]


def _unique_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> Parameter, each once: a tied readout is token_embeddings.weight, stored once.
    A sharded model's are its sharded Parameters (`resharded` first)."""
    resharded(model)
    return dict(model.named_parameters())


def resharded(model: nn.Module) -> nn.Module:
    """`model` with every FSDP2 group's sharded Parameters in place. FSDP2 keeps the root's
    weights gathered after a forward pass until the backward that needs them, so after an
    evaluation the root's modules hold whole plain tensors, which are not what is saved (nor
    what the optimizer steps)."""
    if "torch.distributed.fsdp" in sys.modules:  # else nothing can have been sharded
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
    return model


# ----------------------------------------------------------------------------------------------
# Saving (every rank)
# ----------------------------------------------------------------------------------------------

def save_sharded_checkpoint(model: Decoder, path: str | os.PathLike, *,
                            optimizer_tensors: Mapping[str, Any] | None = None,
                            extra_files: Mapping[str, bytes] | None = None,
                            superseded: Collection[str] = ()) -> Path | None:
    """Write the sharded `model` (FSDP2, every Parameter a DTensor; a plain model on one rank
    works too) and `optimizer_tensors` (`optimizer_state`'s first part) to the folder `path`,
    atomically, every rank writing its own chunks. Collective: every rank calls it with its own
    shards; rank 0 returns the folder, the others None. `extra_files` (rank 0's) are written
    beside, their SHA-256 in the manifest. `superseded`: entries of an earlier checkpoint of
    ours at `path` that this one may drop (an unsharded checkpoint's model.safetensors)."""
    import torch.distributed as dist

    cfg = model.config
    if cfg.tie_embeddings and model.lm_head.weight is not model.token_embeddings.weight:
        raise CheckpointError(
            "config says tie_embeddings=True but lm_head.weight is not the token_embeddings.weight "
            "Parameter; refusing to save a model whose tying is broken")
    state: dict[str, Any] = {MODEL_KEY: _unique_parameters(model)}
    if optimizer_tensors is not None:
        state[OPTIM_KEY] = {"state": dict(optimizer_tensors)}
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank != 0:
        _save_as_peer(state)
        return None
    extra = checked_extra_files(extra_files, reserved=(WEIGHTS_FILE, CONFIG_FILE, MANIFEST_FILE,
                                                       SHARDS_DIR))
    return _save_as_main(state, cfg, Path(path), extra, superseded)


class _Collective:
    """The messages rank 0 and its peers exchange around one save, in the same order on every
    rank, so that a failure anywhere ends the save on every rank instead of leaving one waiting:
    the shards' folder (or None: rank 0 failed before it made one), the ranks' findings (NaN
    weights, then the SHA-256 of the files each wrote), rank 0's outcome."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist if dist.is_available() and dist.is_initialized() else None
        self.world = self.dist.get_world_size() if self.dist else 1

    def announce(self, value: Any) -> Any:
        box = [value]
        if self.dist is not None and self.world > 1:
            self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def everyone(self, value: Any) -> list[Any]:
        if self.dist is None or self.world == 1:
            return [value]
        values: list[Any] = [None] * self.world
        self.dist.all_gather_object(values, value)
        return values


def _save_as_main(state: dict[str, Any], cfg: DecoderConfig, path: Path,
                  extra: dict[str, bytes], superseded: Collection[str]) -> Path:
    talk = _Collective()
    stage = ["before"]  # how far the peers got with us: what they still wait for on a failure

    def write(folder: Path) -> None:
        shards = folder / SHARDS_DIR
        shards.mkdir()
        talk.announce(str(shards))
        stage[0] = "announced"
        _write_shards(state, shards, talk)
        stage[0] = "written"
        files = {f"{SHARDS_DIR}/{name}": digest for found in talk.everyone(_own_digests(shards, 0))
                 for name, digest in _raise_if_failed(found).items()}
        (folder / CONFIG_FILE).write_text(cfg.to_json() + "\n")
        for name, data in extra.items():
            (folder / name).write_bytes(data)
            files[name] = sha256(data)
        manifest = {"layout": LAYOUT, "version": LAYOUT_VERSION, "world_size": talk.world,
                    CONFIG_DIGEST: config_digest(cfg), "files": dict(sorted(files.items()))}
        (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")

    names = (CONFIG_FILE, MANIFEST_FILE, SHARDS_DIR, *extra)
    try:
        written = write_folder_atomically(path, write, same_kind=is_checkpoint_folder,
                                          what="checkpoint", names=names,
                                          superseded=superseded)
    except BaseException as exc:
        if stage[0] == "before":
            talk.announce(None)  # the peers wait for the folder: there is none
        elif stage[0] == "written":
            talk.announce(f"{type(exc).__name__}: {exc}")  # they wait for the outcome
        raise  # "announced": the shards' write failed, and it raised on every rank
    talk.announce("ok")
    return written


def _save_as_peer(state: dict[str, Any]) -> None:
    talk = _Collective()
    shards = talk.announce(None)
    if shards is None:
        raise CheckpointError("rank 0 could not begin the sharded save (its error says why); "
                              "nothing was written")
    _write_shards(state, Path(shards), talk)
    talk.everyone(_own_digests(Path(shards), talk.dist.get_rank()))
    outcome = talk.announce(None)
    if outcome != "ok":
        raise CheckpointError(f"rank 0 could not finish the sharded save ({outcome}); the "
                              "previous checkpoint is kept")


def _write_shards(state: dict[str, Any], shards: Path, talk: _Collective) -> None:
    """Every rank's chunks into `shards` (DCP: a failure on any rank raises on every rank),
    once no rank holds a NaN or inf weight (a diverged model is never saved)."""
    import torch.distributed.checkpoint as dcp

    local = {name: (p.to_local() if hasattr(p, "to_local") else p)
             for name, p in state[MODEL_KEY].items()}
    bad = sorted({name for found in talk.everyone(non_finite_names(local)) for name in found})
    if bad:
        raise CheckpointError(f"refusing to save: tensors {bad} hold NaN or inf (a diverged "
                              "model)")
    try:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(shards), sync_files=True),
                 no_dist=talk.dist is None)
    except dcp.api.CheckpointException as exc:  # raised on every rank, naming the failed ones
        failures = getattr(exc, "failures", {}) or {}
        said = "; ".join(f"rank {rank}: {_cause(failure)}"
                         for rank, failure in sorted(failures.items()))
        raise CheckpointError(f"the sharded save failed ({said or exc}); the previous "
                              "checkpoint is kept") from exc


def _cause(failure: Any) -> str:
    """The error a rank raised inside DCP (wrapped with its traceback there)."""
    error = getattr(failure, "exc", failure)
    return f"{type(error).__name__}: {error}"


def _own_digests(shards: Path, rank: int) -> dict[str, str] | str:
    """SHA-256 of the files this rank wrote (its `__R_*.distcp`; rank 0 also DCP's index), or
    the error that kept it from reading them back."""
    try:
        mine = sorted(shards.glob(f"__{rank}_*.distcp"))
        if rank == 0:
            mine.append(shards / ".metadata")
        return {p.name: file_sha256(p) for p in mine}
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _raise_if_failed(found: dict[str, str] | str) -> dict[str, str]:
    if isinstance(found, str):
        raise CheckpointError(f"a rank could not hash the chunks it wrote: {found}")
    return found


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# The manifest, DCP's index, read without unpickling anything else
# ----------------------------------------------------------------------------------------------

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
    """CheckpointError naming each file (of `names`; default every one the manifest lists) that
    is missing or whose bytes differ from the SHA-256 recorded when it was saved."""
    recorded = read_manifest(folder)["files"]
    bad = []
    for name in sorted(recorded if names is None else names):
        path = folder / name
        if name not in recorded or not path.is_file() or file_sha256(path) != recorded[name]:
            bad.append(name)
    if bad:
        raise CheckpointError(f"sharded checkpoint {str(folder)!r} is damaged: {bad} missing, "
                              "replaced or changed since it was saved (SHA-256 differs from "
                              f"{MANIFEST_FILE})")


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


def _reader(shards: Path):
    """A FileSystemReader whose index is read by `_IndexUnpickler`, once."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class IndexReader(FileSystemReader):
        index = None

        def read_metadata(self, *args: Any, **kwargs: Any):
            if self.index is None:
                with open(shards / ".metadata", "rb") as handle:
                    try:
                        self.index = _IndexUnpickler(handle).load()
                    except (pickle.UnpicklingError, EOFError, AttributeError) as exc:
                        raise CheckpointError(f"{str(shards / '.metadata')!r} is not DCP's "
                                              f"index (truncated or corrupt): {exc}") from exc
                if getattr(self.index, "storage_meta", None) is None:
                    self.index.storage_meta = StorageMeta()
            return self.index

    return IndexReader(str(shards))


def _tensors_only():
    """DCP's default load planner, refusing a stored non-tensor (which it would unpickle)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            raise CheckpointError(f"{read_item.dest_index.fqn!r} is stored as pickled bytes, "
                                  "not a tensor; refused unread")

    return TensorsOnly()


def stored_shapes(folder: Path, reader=None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """name -> (shape, dtype) of every model tensor the checkpoint stores, from DCP's index."""
    index = (reader or _reader(folder / SHARDS_DIR)).read_metadata()
    prefix = MODEL_KEY + "."
    return {key[len(prefix):]: (tuple(md.size), md.properties.dtype)
            for key, md in index.state_dict_metadata.items() if key.startswith(prefix)}


def _checked_layout(folder: Path, cfg: DecoderConfig, reader) -> dict[str, Any]:
    """The stored model tensors' (shape, dtype), once they fit what `cfg` implies and the
    config is the one saved (compared before a weight is read)."""
    recorded = read_manifest(folder).get(CONFIG_DIGEST)
    if recorded != config_digest(cfg):
        raise CheckpointError(
            f"{str(folder / CONFIG_FILE)!r} was changed after the checkpoint was saved: the "
            f"config's SHA-256 differs from the one recorded in {MANIFEST_FILE} (these weights "
            "were trained under another config); restore the saved config.json")
    stored = stored_shapes(folder, reader)
    problems = name_and_shape_problems(expected_shapes(cfg),
                                       {name: shape for name, (shape, _) in stored.items()})
    if problems:
        raise CheckpointError(f"sharded checkpoint {str(folder)!r} does not fit its "
                              f"{CONFIG_FILE}: " + "; ".join(problems))
    return stored


# ----------------------------------------------------------------------------------------------
# Loading: into a model (any world size), a whole Decoder, one tensor at a time
# ----------------------------------------------------------------------------------------------

def load_sharded_state(folder: str | os.PathLike, model: nn.Module, *,
                       optimizer: torch.optim.Optimizer | None = None,
                       param_groups: list[dict[str, Any]] | None = None,
                       weights: bool = True) -> None:
    """Fill `model`'s Parameters in place (`weights`) and `optimizer`'s state (with
    `param_groups`, `optimizer_state`'s second part, saved by the caller) from the sharded
    checkpoint in `folder`. A model sharded with FSDP2 reads only its own rows, whatever the
    world size that wrote them (collective: every rank calls it); a plain model reads the whole
    tensors in this process alone. The files are checked against the manifest first (each rank
    one share of them) and the names and shapes against the config."""
    folder = Path(folder)
    sharded = holds_dtensors(model)
    _check_files_shared(folder, sharded)
    reader = _reader(folder / SHARDS_DIR)
    _checked_layout(folder, read_config(folder), reader)
    state: dict[str, Any] = {}
    if weights:
        state[MODEL_KEY] = _unique_parameters(model)
    if optimizer is not None:
        tensors, groups = optimizer_state(model, optimizer)  # AdamW's state made, then filled
        state[OPTIM_KEY] = {"state": tensors}
    _load(state, reader, no_dist=not sharded)
    if optimizer is not None:
        _set_optimizer(model, optimizer, tensors, groups, param_groups)


def _load(state: dict[str, Any], reader, *, no_dist: bool) -> None:
    """DCP's load into `state`'s tensors, in place; `no_dist`: this process alone reads every
    chunk it needs (DCP's warning that it assumes so is the intent here, not news)."""
    import torch.distributed.checkpoint as dcp

    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, planner=_tensors_only(), no_dist=no_dist)


def _set_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, Any],
                   groups: list[dict[str, Any]], saved: list[dict[str, Any]] | None) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if saved is None:
        raise CheckpointError("restoring an optimizer from a sharded checkpoint needs its "
                              "param_groups, which the training state carries")
    names = sorted(n for group in groups for n in group["params"])
    if sorted(n for group in saved for n in group["params"]) != names:
        raise CheckpointError(f"the checkpoint's optimizer groups name other parameters than "
                              f"this model's optimizer ({len(names)} parameters)")
    set_optimizer_state_dict(model, optimizer, {"state": tensors, "param_groups": saved},
                             options=StateDictOptions(full_state_dict=False))


def _check_files_shared(folder: Path, sharded: bool) -> None:
    """`check_files`, each rank of a sharded model checking its share of the files and every
    rank raising if any rank found one damaged; one process checks them all."""
    talk = _Collective() if sharded else None
    if talk is None or talk.world == 1:
        check_files(folder)
        return
    rank = talk.dist.get_rank()
    names = sorted(read_manifest(folder)["files"])[rank::talk.world]
    try:
        check_files(folder, names)
        found = None
    except CheckpointError as exc:
        found = str(exc)
    failures = [f for f in talk.everyone(found) if f is not None]
    if failures:
        raise CheckpointError(failures[0])


def load_sharded_decoder(folder: str | os.PathLike, *, device: torch.device | str = "cpu",
                         dtype: torch.dtype | None = None) -> Decoder:
    """The whole Decoder a sharded checkpoint holds, read in this process alone (no process
    group needed): its config, the files checked against the manifest, names and shapes against
    the config, then each tensor assembled from its chunks in place."""
    folder = Path(folder)
    cfg = read_config(folder)
    check_files(folder)
    reader = _reader(folder / SHARDS_DIR)
    stored = _checked_layout(folder, cfg, reader)
    model = Decoder(cfg, device="meta", dtype=stored["token_embeddings.weight"][1])
    model.to_empty(device="cpu")
    _load({MODEL_KEY: _unique_parameters(model)}, reader, no_dist=True)
    refuse_non_finite(dict(model.named_parameters()), f"sharded checkpoint {str(folder)!r}")
    return model.to(device=device, dtype=dtype)


def sharded_tensors(folder: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of every model tensor, one at a time, in the order of the config's
    unique Parameters: each is assembled from its chunks and handed over before the next is
    read, so no more than one whole tensor is held. The files are checked first."""
    folder = Path(folder)
    cfg = read_config(folder)
    check_files(folder)
    reader = _reader(folder / SHARDS_DIR)
    stored = _checked_layout(folder, cfg, reader)
    for name in expected_shapes(cfg):
        shape, dtype = stored[name]
        tensor = torch.empty(shape, dtype=dtype)
        _load({MODEL_KEY: {name: tensor}}, reader, no_dist=True)
        yield name, tensor


# ----------------------------------------------------------------------------------------------
# Export: one safetensors file, streamed
# ----------------------------------------------------------------------------------------------

# safetensors' names of the dtypes a checkpoint holds
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                       torch.bfloat16: "BF16"}


def export_safetensors(folder: str | os.PathLike, out: str | os.PathLike, *,
                       extra_files: Mapping[str, bytes] | None = None) -> Path:
    """The sharded checkpoint in `folder` as an unsharded checkpoint folder `out`
    (model.safetensors + config.json, as `save_checkpoint` writes it: `load_checkpoint` reads
    it), written atomically and one tensor at a time: the header is laid out from DCP's index,
    then each tensor is assembled, hashed and appended, and the digests are written into the
    header last (they have a fixed width). The written file is then read back one tensor at a
    time against those digests before it replaces anything."""
    from .checkpoint import check_digests

    folder = Path(folder)
    cfg = read_config(folder)
    extra = checked_extra_files(extra_files, reserved=(WEIGHTS_FILE, CONFIG_FILE))
    stored = stored_shapes(folder)

    def write(target: Path) -> None:
        weights = target / WEIGHTS_FILE
        _stream_safetensors(folder, cfg, stored, weights)
        (target / CONFIG_FILE).write_text(cfg.to_json() + "\n")
        for name, data in extra.items():
            (target / name).write_bytes(data)
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt", device="cpu") as handle:
            metadata = handle.metadata()
            for name in handle.keys():  # one tensor at a time
                check_digests(weights, {name: handle.get_tensor(name)}, metadata)

    return write_folder_atomically(out, write, same_kind=is_checkpoint_folder, what="checkpoint",
                                   names=(WEIGHTS_FILE, CONFIG_FILE, *extra))


def _stream_safetensors(folder: Path, cfg: DecoderConfig, stored: Mapping[str, Any],
                        weights: Path) -> None:
    """model.safetensors: an 8-byte little-endian header length, the JSON header (dtype, shape
    and byte range of each tensor, the metadata), then the tensors' bytes back to back."""
    header: dict[str, Any] = {}
    offset = 0
    for name in expected_shapes(cfg):
        shape, dtype = stored[name]
        size = dtype.itemsize * int(torch.Size(shape).numel())
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    metadata = weights_metadata(cfg)
    metadata.update({DIGEST_PREFIX + name: "0" * 64 for name in header})  # filled in below
    with open(weights, "wb") as handle:
        handle.write(_header_bytes(header, metadata))
        for name, tensor in sharded_tensors(folder):
            refuse_non_finite({name: tensor}, "refusing to export")
            raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
            metadata[DIGEST_PREFIX + name] = hashlib.sha256(raw).hexdigest()  # as digest()
            handle.write(raw.tobytes() if not raw.flags.c_contiguous else raw.data)
            del tensor, raw
        final = _header_bytes(header, metadata)
        handle.seek(0)
        handle.write(final)  # the same length: every digest is 64 hex digits


def _header_bytes(header: dict[str, Any], metadata: dict[str, str]) -> bytes:
    """safetensors' header: its JSON padded with spaces to a multiple of 8 bytes, after its
    length as a little-endian u64."""
    text = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


LAYOUT_READERS[MANIFEST_FILE] = load_sharded_decoder  # load_checkpoint reads sharded folders too
