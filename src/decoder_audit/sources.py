"""Where a model comes from, resolved in one place for every command and for the trainer.

A source is one of
    preset       a named configuration (`da.preset_names()`), built with seeded random weights
    config       a DecoderConfig saved as JSON, built likewise
    checkpoint   a checkpoint folder, or a training run folder holding `checkpoint/`
    hf           a folder written by Hugging Face `save_pretrained`, any family: the model is
                 loaded as it is (causal LMs, and masked LMs for the BERT contrast); its
                 DecoderConfig exists when our converter reads the family (GPT-2, Llama)
    model        FILE.py:FACTORY, a user's own module (FACTORY() returns an nn.Module)
    module       an nn.Module already in hand (the Python API)
The Python API may also pass a DecoderConfig or a preset name; `Source.of` says which it is.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .accounting.memory import check_fits
from .config import DecoderConfig
from .errors import ConfigError
from .model.decoder import Decoder
from .model.presets import preset
from .storage.checkpoint import CONFIG_FILE, checkpoint_folder, load_checkpoint

DEFAULT_PRESET = "tiny-368"
KINDS = ("preset", "config", "checkpoint", "hf", "model", "module")


@dataclass(frozen=True)
class Source:
    kind: str
    value: Any

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
            return DecoderConfig.load(checkpoint_folder(self.value) / CONFIG_FILE)
        if self.kind == "hf":
            return _hf_decoder_config(self.value)[0]
        module = load_factory(self.value) if self.kind == "model" else self.value
        config = getattr(module, "config", None)
        return config if isinstance(config, DecoderConfig) else None

    def build(self, *, seed: int = 0) -> nn.Module:
        """The model: built from `seed` (preset, config), loaded (checkpoint) or imported."""
        if self.kind == "module":
            return self.value
        if self.kind == "model":
            return load_factory(self.value)
        if self.kind == "checkpoint":
            return load_checkpoint(checkpoint_folder(self.value))
        if self.kind == "hf":
            from .references.hf_models import load_hf_model

            return load_hf_model(self.value)
        config = self.config()
        check_fits(config)  # V = 10^9 is refused here, not inside the allocator
        torch.manual_seed(seed)
        return Decoder(config)

    def why_no_config(self) -> str:
        """Why `config()` is None for this source (empty when it is not)."""
        if self.kind == "hf":
            return _hf_decoder_config(self.value)[1]
        if self.kind in ("model", "module") and self.config() is None:
            return "the module carries no DecoderConfig"
        return ""

    @property
    def built_fresh(self) -> bool:
        """Whether `build` initialises new weights (a preset or config), so the model's loss
        before training should be near ln V."""
        return self.kind in ("preset", "config")


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


_FACTORY_CACHE: dict[str, nn.Module] = {}


def load_factory(spec: str) -> nn.Module:
    """Import FILE.py and call FACTORY() -> nn.Module. Runs the user's code: only point it at
    files you trust. The module is built once per process."""
    if spec in _FACTORY_CACHE:
        return _FACTORY_CACHE[spec]
    path_text, sep, factory_name = spec.rpartition(":")
    if not sep or not path_text or not factory_name:
        raise ConfigError(f"--model {spec!r} must look like path/to/file.py:factory")
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"--model file {str(path)!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"_user_model_{path.stem}", path)
    if module_spec is None:
        raise ConfigError(f"--model file {str(path)!r} is not a Python file (FILE.py:FACTORY)")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.parent.resolve()))  # let the file import its neighbours
    try:
        _user_code(f"--model file {str(path)!r} failed to import",
                   lambda: module_spec.loader.exec_module(module))
    finally:
        sys.path.pop(0)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ConfigError(f"{str(path)!r} has no callable {factory_name!r}")
    _refuse_required_arguments(factory, f"{factory_name}() in {str(path)!r}")
    model = _user_code(f"{factory_name}() in {str(path)!r} failed", factory)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{factory_name}() in {str(path)!r} returned {type(model).__name__}, "
                          "not a torch.nn.Module")
    _refuse_meta(model, f"{factory_name}() in {str(path)!r}")
    _FACTORY_CACHE[spec] = model
    return model


def _user_code(what: str, call: Callable[[], Any]) -> Any:
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
    except SystemExit as exc:
        raise ConfigError(f"{what}: it called sys.exit({exc.code!r}) instead of returning a "
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
