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
dataclasses; it is read by an unpickler that admits those classes, torch.Size, dtypes and paths
and refuses any other global (storage.manifest), and each chunk is read with
`torch.load(weights_only=True)`. Only tensors are saved (optimizer hyperparameters go into the
caller's own files), so no chunk is ever a pickled object. The manifest covers every file the
checkpoint reads: a file it does not list, a listed file missing, changed or shorter than DCP's
index says, is refused naming the file before a weight is read (storage.manifest).

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

import errno
import hashlib
import json
import os
import shutil
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
from .manifest import (
    INDEX_FILE,
    LAYOUT,
    LAYOUT_VERSION,
    MANIFEST_FILE,
    MODEL_KEY,
    OPTIM_KEY,
    SHARDS_DIR,
    check_files,
    check_index_files,
    dcp_failures,
    file_sha256,
    index_reader,
    one_line,
    read_manifest,
    stored_shapes,
)


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
    need = [sum(map(len, extra.values()))]  # bytes this save writes, once the ranks said theirs

    def write(folder: Path) -> None:
        shards = folder / SHARDS_DIR
        shards.mkdir()
        talk.announce((str(shards), str(path)))
        stage[0] = "announced"
        need[0] += _write_shards(state, shards, path, talk)
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
        error = exc
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:  # rank 0's own files, fsync
            error = CheckpointError(_no_space(path, need[0] if stage[0] != "before" else None))
        if stage[0] == "before":
            talk.announce(None)  # the peers wait for the folder: there is none
        elif stage[0] == "written":
            talk.announce(f"{type(error).__name__}: {error}")  # they wait for the outcome
        if error is not exc:
            raise error from exc
        raise  # "announced": the shards' write failed, and it raised on every rank
    talk.announce("ok")
    return written


def _save_as_peer(state: dict[str, Any]) -> None:
    talk = _Collective()
    where = talk.announce(None)
    if where is None:
        raise CheckpointError("rank 0 could not begin the sharded save (its error says why); "
                              "nothing was written")
    shards, target = map(Path, where)
    _write_shards(state, shards, target, talk)
    talk.everyone(_own_digests(shards, talk.dist.get_rank()))
    outcome = talk.announce(None)
    if outcome != "ok":
        raise CheckpointError(f"rank 0 could not finish the sharded save ({outcome}); the "
                              "previous checkpoint is kept")


def _write_shards(state: dict[str, Any], shards: Path, target: Path, talk: _Collective) -> int:
    """Every rank's chunks into `shards` (DCP: a failure on any rank raises on every rank),
    once no rank holds a NaN or inf weight (a diverged model is never saved). Returns the
    bytes of the tensors all ranks wrote; a full disk is said as one line naming `target` (the
    checkpoint being saved), the bytes needed and those free."""
    import torch.distributed.checkpoint as dcp

    local = {name: (p.to_local() if hasattr(p, "to_local") else p)
             for name, p in state[MODEL_KEY].items()}
    found = talk.everyone((non_finite_names(local), _tensor_bytes(state)))
    bad = sorted({name for names, _ in found for name in names})
    if bad:
        raise CheckpointError(f"refusing to save: tensors {bad} hold NaN or inf (a diverged "
                              "model)")
    need = sum(size for _, size in found)
    try:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(shards), sync_files=True),
                 no_dist=talk.dist is None)
    except dcp.api.CheckpointException as exc:  # raised on every rank, naming the failed ones
        failures = dcp_failures(exc)
        if any(isinstance(error, OSError) and error.errno in _DISK_FULL for _, error in failures):
            raise CheckpointError(_no_space(target, need)) from None
        said = "; ".join(f"rank {rank}: {one_line(error)}" for rank, error in failures)
        raise CheckpointError(f"the sharded save failed ({said or one_line(exc)}); the previous "
                              "checkpoint is kept") from None
    return need


# What a full disk raises: no space left, or the user's quota reached.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _tensor_bytes(state: Mapping[str, Any]) -> int:
    """The bytes of this rank's own rows of every tensor in `state` (nested mappings)."""
    total = 0
    for value in state.values():
        if isinstance(value, Mapping):
            total += _tensor_bytes(value)
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            total += local.numel() * local.element_size()
    return total


def _no_space(target: Path, need: int | None) -> str:
    """The one line a full disk during the save of `target` gets: the bytes the save needs (at
    least its tensors'; DCP adds a header per chunk) and those free on that filesystem."""
    where = next((p for p in (target, *target.parents) if p.exists()), target)
    try:
        free = f"{shutil.disk_usage(where).free:,} bytes are free there"
    except OSError:
        free = "the free space could not be read"
    needs = (f"the save needs at least {need:,} bytes for its tensors and " if need is not None
             else "")
    return (f"no space left on the device holding {str(target)!r}: {needs}{free}; nothing was "
            "replaced, the previous checkpoint is kept: free some space and save again")


def _own_digests(shards: Path, rank: int) -> dict[str, str] | str:
    """SHA-256 of the files this rank wrote (its `__R_*.distcp`; rank 0 also DCP's index), or
    the error that kept it from reading them back."""
    try:
        mine = sorted(shards.glob(f"__{rank}_*.distcp"))
        if rank == 0:
            mine.append(shards / INDEX_FILE)
        return {p.name: file_sha256(p) for p in mine}
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _raise_if_failed(found: dict[str, str] | str) -> dict[str, str]:
    if isinstance(found, str):
        raise CheckpointError(f"a rank could not hash the chunks it wrote: {found}")
    return found


def _tensors_only():
    """DCP's default load planner, refusing a stored non-tensor (which it would unpickle)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            raise CheckpointError(f"{read_item.dest_index.fqn!r} is stored as pickled bytes, "
                                  "not a tensor; refused unread")

    return TensorsOnly()


def _checked_layout(folder: Path, cfg: DecoderConfig, reader) -> dict[str, Any]:
    """The stored model tensors' (shape, dtype), once they fit what `cfg` implies, the config
    is the one saved and every file DCP's index reads is listed in the manifest and long enough
    (all compared before a weight is read)."""
    recorded = read_manifest(folder).get(CONFIG_DIGEST)
    if recorded != config_digest(cfg):
        raise CheckpointError(
            f"{str(folder / CONFIG_FILE)!r} was changed after the checkpoint was saved: the "
            f"config's SHA-256 differs from the one recorded in {MANIFEST_FILE} (these weights "
            "were trained under another config); restore the saved config.json")
    check_index_files(folder, reader.read_metadata())
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
    reader = index_reader(folder / SHARDS_DIR)
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
    chunk it needs (DCP's warning that it assumes so is the intent here, not news). A failure
    inside DCP (which wraps each rank's with its stack) is one CheckpointError naming the
    shards; ours (a pickled value refused) is raised as it is."""
    import torch.distributed.checkpoint as dcp

    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, planner=_tensors_only(), no_dist=no_dist)
    except dcp.api.CheckpointException as exc:
        failures = dcp_failures(exc)
        ours = next((error for _, error in failures if isinstance(error, CheckpointError)), None)
        if ours is not None:
            raise ours from None
        shards = Path(str(reader.path))
        files = sorted({f"{SHARDS_DIR}/{info.relative_path}"
                        for info in reader.read_metadata().storage_data.values()})
        said = "; ".join(f"rank {rank}: {one_line(error)}" for rank, error in failures)
        raise CheckpointError(f"sharded checkpoint {str(shards.parent)!r} could not be read "
                              f"from {files} ({said or one_line(exc)}): corrupt chunks") from None


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
    reader = index_reader(folder / SHARDS_DIR)
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
    reader = index_reader(folder / SHARDS_DIR)
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
