"""Where a model comes from, resolved in one place for every command and for the trainer.

A source is one of
    preset       a named configuration (`da.preset_names()`), built with seeded random weights
    config       a DecoderConfig saved as JSON, built likewise
    checkpoint   a checkpoint folder, or a training run folder holding `checkpoint/`: a Decoder's,
                 or the weights of a module trained with --model (factory.json), rebuilt by the
                 factory the user names again (`factory=`, `--model`), as `train --resume` does
                 (`checkpoint_of`, `module_factory`); a Hugging Face folder given here is
                 refused naming what it is (`--hf`)
    hf           a folder written by Hugging Face `save_pretrained`, any family: the model is
                 loaded as it is (causal LMs, and masked LMs for the BERT contrast); its
                 DecoderConfig exists when our converter reads the family (GPT-2, Llama)
    model        FILE.py:FACTORY, a user's own module (FACTORY() returns an nn.Module)
    module       an nn.Module already in hand (the Python API)
The Python API may also pass a DecoderConfig or a preset name; `Source.of` says which it is.

User code (a --model file, a module checkpoint's factory) is run by `load_factory`: whatever it
raises becomes one ConfigError line, and `hard_exits_raise` turns its os._exit into a SystemExit
the command reports instead of ending the process with the code's status.

A folder is data, never code: a module checkpoint's factory.json says which FILE.py:FACTORY built
its model, but only a factory the user names (on the command line, or from Python) is ever run,
and only when it is the code the weights were trained under: factory.json records the SHA-256
of the file's bytes as they were imported (`factory_record`), and a file whose bytes differ, or
another FACTORY, is refused before a line of it runs (`module_factory`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .accounting.memory import check_fits
from .config import DecoderConfig
from .errors import CheckpointError, ConfigError
from .model.decoder import Decoder
from .model.presets import preset
from .storage.checkpoint import (
    CONFIG_FILE,
    FACTORY_FILE,
    checkpoint_folder,
    json_object,
    load_checkpoint,
    load_module_weights,
)

DEFAULT_PRESET = "tiny-368"
KINDS = ("preset", "config", "checkpoint", "hf", "model", "module")
# What a module checkpoint's factory.json says about its model besides the factory.
DECLARED_FIELDS = ("vocab_size", "max_seq_len", "intervention_len")


@dataclass(frozen=True)
class Source:
    kind: str
    value: Any
    # kind "checkpoint": the FILE.py:FACTORY the user named to rebuild a module checkpoint's
    # model (None: such a checkpoint is refused, its own factory.json is never followed).
    factory: str | None = None
    # kind "model": the SHA-256 its file must have (a resumed run's pinned factory), else None.
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown model source kind {self.kind!r}; kinds are {KINDS}")

    @classmethod
    def of(cls, thing: Any) -> "Source":
        """The source a Python caller means: a module, a DecoderConfig, a preset name, or None
        (the tiny-368 teaching model)."""
        if thing is None:
            return cls("preset", DEFAULT_PRESET)
        if isinstance(thing, Source):
            return thing
        if isinstance(thing, nn.Module):
            return cls("module", thing)
        if isinstance(thing, DecoderConfig):
            return cls("config", thing)
        if isinstance(thing, str):
            return cls("preset", thing)
        raise TypeError(f"a model source is a Decoder or other nn.Module, a DecoderConfig or a "
                        f"preset name, got {type(thing).__name__}")

    def config(self) -> DecoderConfig | None:
        """The DecoderConfig this source names, or None for a module that carries none."""
        if self.kind == "preset":
            return preset(self.value)
        if self.kind == "config":
            return self.value if isinstance(self.value, DecoderConfig) else \
                DecoderConfig.load(self.value)
        if self.kind == "checkpoint":
            folder, recorded = checkpoint_of(self.value)
            if recorded is not None:  # a module's weights: its config is the module's own
                if self.factory is None:
                    return None  # only a named factory runs (why_no_config says so)
                config = getattr(self._factory_module(folder, recorded), "config", None)
                return config if isinstance(config, DecoderConfig) else None
            return DecoderConfig.load(folder / CONFIG_FILE)
        if self.kind == "hf":
            return _hf_decoder_config(self.value)[0]
        module = load_factory(self.value) if self.kind == "model" else self.value
        config = getattr(module, "config", None)
        return config if isinstance(config, DecoderConfig) else None

    def build(self, *, seed: int = 0, dtype: torch.dtype | None = None) -> nn.Module:
        """The model: built from `seed` (preset, config), loaded (checkpoint) or imported. A
        preset or config is built directly in `dtype` (a 7B model in bfloat16 never exists in
        float32); every other source comes as it is, for the caller to cast."""
        if self.kind == "module":
            return self.value
        if self.kind == "model":
            return load_factory(self.value, sha256=self.sha256)
        if self.kind == "checkpoint":
            folder, recorded = checkpoint_of(self.value)
            if recorded is not None:
                return load_module_weights(self._factory_module(folder, recorded), folder)
            if self.factory is not None:
                raise ConfigError(f"--model {self.factory!r} rebuilds the module of a --model "
                                  f"run, and {str(folder)!r} is a Decoder checkpoint, which its "
                                  "config.json rebuilds: drop --model")
            return load_checkpoint(folder)
        if self.kind == "hf":
            from .references.hf_models import load_hf_model

            return load_hf_model(self.value)
        config = self.config()
        # V = 10^9 is refused here, not inside the allocator
        check_fits(config, dtype=dtype or torch.float32)
        torch.manual_seed(seed)
        return Decoder(config, dtype=dtype)

    def declared(self) -> dict[str, int | None]:
        """What a module checkpoint recorded about its model in factory.json (vocab_size;
        max_seq_len, None for a model without a hard length limit; intervention_len, the length
        such a model was audited and trained at, when recorded), for the gate and for
        generation, which cannot read them off a module without a DecoderConfig; empty for
        every other source."""
        if self.kind != "checkpoint":
            return {}
        _, factory = checkpoint_of(self.value)
        if factory is None:
            return {}
        return {name: factory.get(name) for name in DECLARED_FIELDS}

    def why_no_config(self) -> str:
        """Why `config()` is None for this source (empty when it is not)."""
        if self.kind == "hf":
            return _hf_decoder_config(self.value)[1]
        if self.kind in ("model", "module") and self.config() is None:
            return "the module carries no DecoderConfig"
        if self.kind == "checkpoint" and self.config() is None:
            spec = (checkpoint_of(self.value)[1] or {}).get("factory")
            if self.factory is None:
                return (f"it holds the weights of a module trained with --model {spec!r} "
                        "(factory.json), and a folder's code is never run")
            return "it holds a module trained with --model, which carries no DecoderConfig"
        return ""

    def _factory_module(self, folder: Path, recorded: dict[str, Any]) -> nn.Module:
        """The module a module checkpoint's weights go into, built by the factory the user
        named (`self.factory`), once it is pinned to the one factory.json records."""
        spec, sha256 = module_factory(folder, recorded, self.factory)
        return load_factory(spec, sha256=sha256)

    @property
    def built_fresh(self) -> bool:
        """Whether `build` initialises new weights (a preset or config), so the model's loss
        before training should be near ln V."""
        return self.kind in ("preset", "config")


def checkpoint_of(path: Any) -> tuple[Path, dict[str, Any] | None]:
    """The checkpoint folder `path` names (a run folder's checkpoint/) and, when it holds a
    module's weights, its factory.json (else None). A Hugging Face folder is refused naming
    what it is and what reads it: its config.json would otherwise be read as ours and its every
    field listed as unknown."""
    folder = checkpoint_folder(path)
    if (folder / FACTORY_FILE).is_file():
        factory = json_object(folder / FACTORY_FILE)
        if factory is None:
            raise CheckpointError(f"{str(folder / FACTORY_FILE)!r} is not a JSON object")
        return folder, factory
    config = json_object(folder / CONFIG_FILE)
    if config is not None and ("model_type" in config or "architectures" in config):
        raise ConfigError(
            f"{str(folder)!r} is a Hugging Face folder (config.json names model_type="
            f"{config.get('model_type')!r}), not a decoder-audit checkpoint: use --hf "
            f"{str(folder)!r} (verify, ledger, account), or convert it first with "
            f"`decoder-audit convert --from-hf {str(folder)!r} --out CKPT` and pass "
            "--checkpoint CKPT")
    return folder, None


def module_factory(folder: Path, recorded: dict[str, Any], named: str | None
                   ) -> tuple[str, str | None]:
    """(the FILE.py:FACTORY that rebuilds a module checkpoint's model, the SHA-256 its file must
    have). Only `named`, the factory the user names, is ever run: factory.json (`recorded`) is
    the folder's word, data that may come from anywhere, so it only pins what `named` must be:
    the same FACTORY, in a file with the bytes the weights were trained under (its SHA-256, for
    a checkpoint that records one). Refused, naming the recorded factory, when none is named;
    a module passed from Python has no factory to name."""
    spec = recorded.get("factory")
    if not isinstance(spec, str) or not spec:
        raise CheckpointError(
            f"{str(folder)!r} holds the weights of a module passed from Python "
            f"({recorded.get('class', 'unknown class')}), which no factory rebuilds: load them "
            "with decoder_audit.storage.checkpoint.load_module_weights(module, folder)")
    name = spec.rpartition(":")[2]
    if named is None:
        raise CheckpointError(
            f"{str(folder)!r} holds the weights of a module trained with --model {spec!r} "
            f"({FACTORY_FILE}); decoder-audit never runs code a folder names: name the file you "
            f"trust to rebuild it, with --model FILE.py:{name} beside the folder (from Python: "
            f"Source('checkpoint', folder, factory='FILE.py:{name}'), or train(module, "
            "resume=folder) with the module it builds)")
    if named.rpartition(":")[2] != name:
        raise CheckpointError(
            f"--model {named!r} names the factory {named.rpartition(':')[2]!r}, and "
            f"{str(folder)!r} was trained from {spec!r} ({FACTORY_FILE}): its weights load "
            f"only into what {name!r} builds")
    recorded_sha = recorded.get(FACTORY_SHA256)
    return named, recorded_sha if isinstance(recorded_sha, str) else None


def factory_record(spec: str) -> dict[str, str | None]:
    """What factory.json records about the FILE.py:FACTORY this process imported: its absolute
    spec and the SHA-256 of the bytes that ran (None if it was never imported)."""
    path, _, name = spec.rpartition(":")
    resolved = str(Path(path).resolve())
    return {"factory": f"{resolved}:{name}", FACTORY_SHA256: _DIGESTS.get(resolved)}


def _hf_decoder_config(folder: Any) -> tuple[DecoderConfig | None, str]:
    """(the DecoderConfig of a Hugging Face folder, "") when our converter reads its family,
    else (None, the converter's reason)."""
    from .references.hf_config import config_from_hf
    from .references.hf_models import read_hf_config

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ConfigError(f"--hf {str(path)!r} has no config.json; not a Hugging Face model folder")
    hf_config = read_hf_config(path, error=ConfigError)  # never runs the folder's code
    try:
        return config_from_hf(hf_config), ""
    except ConfigError as exc:
        return None, str(exc)


# factory.json's key for the SHA-256 of the factory's file (`factory_record`, `module_factory`).
FACTORY_SHA256 = "factory_sha256"

_FACTORY_CACHE: dict[str, nn.Module] = {}
# Every FILE.py this process has run (imported), in order: user code may be running from then on
# (its forward, any thread it started).
_RAN: list[str] = []
# The SHA-256 of the bytes each of them ran (resolved path -> digest).
_DIGESTS: dict[str, str] = {}


def user_code_ran() -> tuple[str, ...]:
    """The --model files (and module checkpoints' factories) this process has imported."""
    return tuple(_RAN)


class HardExit(SystemExit):
    """os._exit(code) called by user code in this process, raised instead of ending it (see
    `hard_exits_raise`): a SystemExit, so whatever reports a sys.exit reports it too."""

    call = "os._exit"


@contextlib.contextmanager
def hard_exits_raise() -> Iterator[Callable[[int], None]]:
    """While the block runs, os._exit(code) in this process raises HardExit(code) instead of
    ending it at once with that status, unflushed and unreported: a user's model that calls it
    would otherwise decide the command's outcome (os._exit(0): "passed", nothing checked). A
    forked child (a DataLoader worker) still exits: os._exit is how it must end. Python's own
    calls only: a C extension's _exit or a signal is not caught. Yields the os._exit it
    replaced, for the caller's own ending."""
    real, pid = os._exit, os.getpid()

    def raise_instead(code: int) -> None:
        if os.getpid() != pid:
            real(code)
        raise HardExit(code)

    os._exit = raise_instead
    try:
        yield real
    finally:
        os._exit = real


def load_factory(spec: str, *, sha256: str | None = None) -> nn.Module:
    """Import FILE.py and call FACTORY() -> nn.Module. Runs the user's code: only point it at
    files you trust. With `sha256`, a file whose bytes have another SHA-256 is refused before
    it runs (CheckpointError). The module is built once per process."""
    if spec in _FACTORY_CACHE:
        _check_pin(spec, _DIGESTS.get(str(Path(spec.rpartition(":")[0]).resolve())), sha256)
        return _FACTORY_CACHE[spec]
    factory, where = load_callable(spec, "--model", "factory", sha256=sha256)
    _refuse_required_arguments(factory, where)
    model = run_user_code(f"{where} failed", factory)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{where} returned {type(model).__name__}, not a torch.nn.Module")
    _refuse_meta(model, where)
    _FACTORY_CACHE[spec] = model
    return model


def load_weights_map(spec: str) -> Callable[..., Any]:
    """FN of FILE.py:FN, a function from a module's state dict to {canonical name: tensor}
    (`verify --weights-map`). Runs the user's code on import, like --model."""
    function, _ = load_callable(spec, "--weights-map", "function")

    def weights_map(state):
        return run_user_code(f"--weights-map {spec!r} failed", lambda: function(state))

    weights_map.__qualname__ = spec  # the report names the user's function, not this wrapper
    return weights_map


def load_callable(spec: str, flag: str, kind: str, *, sha256: str | None = None
                  ) -> tuple[Callable[..., Any], str]:
    """(the callable NAME of FILE.py:NAME, "NAME() in 'FILE.py'"), the file imported once. The
    bytes hashed are the bytes run (read once), refused first if `sha256` names others."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise ConfigError(f"{flag} {spec!r} must look like path/to/file.py:{kind}")
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"{flag} file {str(path)!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"_user_model_{path.stem}", path)
    if module_spec is None:
        raise ConfigError(f"{flag} file {str(path)!r} is not a Python file (FILE.py:{kind})")
    source = path.read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    _check_pin(spec, digest, sha256)
    module = importlib.util.module_from_spec(module_spec)
    _RAN.append(str(path.resolve()))
    _DIGESTS[str(path.resolve())] = digest

    def run_file() -> None:  # the bytes hashed, not a second read of the file
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)

    sys.path.insert(0, str(path.parent.resolve()))  # let the file import its neighbours
    try:
        run_user_code(f"{flag} file {str(path)!r} failed to import", run_file)
    finally:
        sys.path.pop(0)
    found = getattr(module, name, None)
    if not callable(found):
        raise ConfigError(f"{str(path)!r} has no callable {name!r}")
    return found, f"{name}() in {str(path)!r}"


def _check_pin(spec: str, actual: str | None, pinned: str | None) -> None:
    """CheckpointError when a factory's file is not the one a checkpoint pinned."""
    if pinned is not None and actual != pinned:
        raise CheckpointError(
            f"--model {spec!r}: its file is not the one the checkpoint's weights were trained "
            f"under (SHA-256 {str(actual)[:12]}..., {FACTORY_FILE} records {pinned[:12]}...); "
            "it was edited or replaced since: nothing of it was run. Restore that file, or "
            "train the changed model anew")


def run_user_code(what: str, call: Callable[[], Any]) -> Any:
    """Run a user's code; whatever it raises (or a sys.exit, which would end the command with
    its status as if it had finished, or a BaseException of its own, which no `except
    Exception` stops) becomes one ConfigError line naming it. Only Ctrl-C passes through: it is
    the user's, not the code's."""
    try:
        return call()
    except KeyboardInterrupt:
        raise
    except SyntaxError as exc:
        raise ConfigError(f"{what}: SyntaxError at line {exc.lineno}: {exc.msg}") from None
    except SystemExit as exc:  # sys.exit, or os._exit under hard_exits_raise
        call = getattr(exc, "call", "sys.exit")
        raise ConfigError(f"{what}: it called {call}({exc.code!r}) instead of returning a "
                          "module") from None
    except BaseException as exc:  # noqa: BLE001 - any failure in user code is reported
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{what}: {type(exc).__name__}: {first}") from exc


def _refuse_meta(model: nn.Module, what: str) -> None:
    """A module with tensors on the meta device holds shapes without values: every check and
    step would read nothing (or fail moving it). Refused, naming the first such tensor."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    meta = [name for name, tensor in tensors if tensor.is_meta]
    if meta:
        raise ConfigError(f"{what} returned a module with {len(meta)} of its {len(tensors)} "
                          f"tensors on the meta device (first: {meta[0]!r}), which holds no "
                          "values; build it on a real device (cpu) or load its weights first")


def _refuse_required_arguments(factory: Callable[..., Any], what: str) -> None:
    """--model calls FACTORY() with no arguments: one that needs some is refused before."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: just call it
        return
    required = [name for name, p in signature.parameters.items()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                       p.KEYWORD_ONLY)]
    if required:
        raise ConfigError(f"{what} needs arguments {required} (signature {signature}); --model "
                          "calls it with none: give them defaults or add a factory that takes none")
