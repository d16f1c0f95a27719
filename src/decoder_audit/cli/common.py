"""What the subcommands share: the model-source flags and the terminal console.

A model comes from exactly one of `--preset NAME`, `--config FILE.json`, `--checkpoint DIR` or
`--model FILE.py:FACTORY` (a user's own module; `--vocab-size`/`--max-seq-len` describe it when it
has no `config`). With none given, the tiny-368 teaching model is used.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import torch
from rich.console import Console
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from ..presets import preset, preset_names

DEFAULT_PRESET = "tiny-368"


def console() -> Console:
    # 100 columns is the width our tables are designed for; wider terminals get no benefit.
    return Console(width=100)


def add_model_source(parser, *, foreign: bool = True, checkpoint: bool = True) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--preset", metavar="NAME",
                       help=f"a named configuration (default {DEFAULT_PRESET}): "
                            f"{', '.join(preset_names())}")
    group.add_argument("--config", metavar="FILE.json", help="a DecoderConfig saved as JSON")
    if checkpoint:
        group.add_argument("--checkpoint", metavar="DIR", help="a decoder-audit checkpoint folder")
    if foreign:
        group.add_argument("--model", metavar="FILE.py:FACTORY",
                           help="your own model: FACTORY() in FILE.py returns an nn.Module")
        parser.add_argument("--vocab-size", type=int, metavar="V",
                            help="vocabulary size of a --model without a DecoderConfig")
        parser.add_argument("--max-seq-len", type=int, metavar="T",
                            help="longest input of a --model without a DecoderConfig")


def config_from_args(args) -> DecoderConfig | None:
    """The DecoderConfig the flags name, or None for a foreign --model."""
    if getattr(args, "model", None):
        config = getattr(load_factory(args.model), "config", None)
        return config if isinstance(config, DecoderConfig) else None
    if getattr(args, "checkpoint", None):
        from ..checkpoint import CONFIG_FILE, resolve_checkpoint_dir

        return DecoderConfig.load(resolve_checkpoint_dir(args.checkpoint) / CONFIG_FILE)
    if getattr(args, "config", None):
        return DecoderConfig.load(args.config)
    return preset(getattr(args, "preset", None) or DEFAULT_PRESET)


def model_from_args(args, *, seed: int = 0) -> nn.Module:
    """Build (seeded random weights), load or import the model the flags name."""
    from ..model import Decoder

    if getattr(args, "model", None):
        return load_factory(args.model)
    if getattr(args, "checkpoint", None):
        from ..checkpoint import load_checkpoint

        return load_checkpoint(args.checkpoint)
    torch.manual_seed(seed)
    return Decoder(config_from_args(args))


def source_flags(args) -> list[str]:
    """The flags that name this model again, for the "rerun with" line of a report."""
    for flag in ("model", "checkpoint", "config", "preset"):
        value = getattr(args, flag, None)
        if value:
            flags = [f"--{flag}", str(value)]
            for extra in ("vocab_size", "max_seq_len"):
                if getattr(args, extra, None) is not None:
                    flags += [f"--{extra.replace('_', '-')}", str(getattr(args, extra))]
            return flags
    return ["--preset", DEFAULT_PRESET]


def rerun_command(subcommand: str, args, *extra: str) -> str:
    return shlex.join(["decoder-audit", subcommand, *source_flags(args), *extra])


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
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.parent.resolve()))  # let the file import its neighbours
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ConfigError(f"{str(path)!r} has no callable {factory_name!r}")
    model = factory()
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{factory_name}() in {str(path)!r} returned {type(model).__name__}, "
                          "not a torch.nn.Module")
    _FACTORY_CACHE[spec] = model
    return model
