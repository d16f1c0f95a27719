"""What the subcommands share: the model-source flags (resolved by `decoder_audit.sources`).

A model comes from exactly one of `--preset NAME`, `--config FILE.json`, `--checkpoint DIR`,
`--hf DIR` (a Hugging Face `save_pretrained` folder, for the commands that take one) or
`--model FILE.py:FACTORY` (a user's own module; `--vocab-size`/`--max-seq-len` describe it when it
has no `config`: `--max-seq-len` is a hard limit the model must enforce, left out for a model
without one, which the commands that audit it (verify, train) probe up to `--intervention-len`).
With none given, the tiny-368 teaching model is used. `--checkpoint DIR --model FILE.py:FACTORY`
names the factory that rebuilds a module trained with --model: a folder's own factory.json is
never followed (it only pins which factory, and which bytes of its file, the weights fit).

A --model file's code runs inside the command; `user_output_to_stderr` keeps what it prints off
stdout (which holds only the command's own output, e.g. `verify --json`), and the paths a
command writes to are made absolute before it runs (`absolute`), so an os.chdir in it moves
nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shlex
import sys
from collections.abc import Iterator

from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from ..model.presets import preset_names
from ..sources import DEFAULT_PRESET, Source
from . import values


def add_model_source(parser, *, foreign: bool = True, checkpoint: bool = True,
                     hf: bool = False, intervention: bool = False) -> None:
    """The source flags; with `foreign`, --vocab-size and --max-seq-len for a --model, and with
    `intervention` (the commands that audit it) --intervention-len."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--preset", metavar="NAME",
                       help=f"a named configuration (default {DEFAULT_PRESET}): "
                            f"{', '.join(preset_names())}")
    group.add_argument("--config", metavar="FILE.json", help="a DecoderConfig saved as JSON")
    if checkpoint:
        group.add_argument("--checkpoint", metavar="DIR",
                           help="a decoder-audit checkpoint folder, or a training run folder "
                                "holding checkpoint/ (a model trained from FILE.py:FACTORY is "
                                "rebuilt by its factory)")
    if hf:
        group.add_argument("--hf", metavar="DIR",
                           help="a folder written by Hugging Face save_pretrained (any causal or "
                                "masked LM); V and the length policy come from its config")
    if foreign:
        # Beside --checkpoint too: the factory of a module checkpoint is named, never read off
        # the folder; source_from_args refuses it beside the other sources.
        (parser if checkpoint else group).add_argument(
            "--model", metavar="FILE.py:FACTORY",
            help="your own model: FACTORY() in FILE.py returns an nn.Module" + (
                "; with --checkpoint, the factory a module run was trained from, which "
                "rebuilds it (a folder's own code is never run)" if checkpoint else ""))
        parser.add_argument("--vocab-size", type=values.count(), metavar="V",
                            help="vocabulary size of a --model without a DecoderConfig")
        no_limit = ("; leave it out for a model without one (RoPE, ALiBi, recurrent) and give "
                    "--intervention-len instead") if intervention else (
                    "; leave it out for a model without one (RoPE, ALiBi, recurrent)")
        parser.add_argument("--max-seq-len", type=values.count(), metavar="T",
                            help="a hard length limit the --model enforces (T + 1 tokens must "
                                 f"be rejected){no_limit}")
    if intervention:
        parser.add_argument("--intervention-len", type=values.count(), metavar="T",
                            help="positions every behavioural check covers (default 64, or "
                                 "max_seq_len when smaller); a model without a hard length "
                                 "limit is probed up to T")


# The source flags, in the order a rerun command names them (argparse makes all but --model
# exclusive; --model goes with --checkpoint only).
SOURCE_FLAGS = ("checkpoint", "model", "hf", "config", "preset")


def source_from_args(args) -> Source:
    """The one model source the flags name (tiny-368 when none is given). A --model's file is
    made absolute here, before its code runs: a factory that changes directory would otherwise
    leave the command (and a run's saved factory) pointing at another file."""
    model = getattr(args, "model", None)
    if model:
        path, sep, factory = str(model).rpartition(":")
        model = f"{absolute(path)}{sep}{factory}" if sep and path else model
        other = next((kind for kind in ("hf", "config", "preset") if getattr(args, kind, None)),
                     None)
        if other is not None:
            raise ConfigError(f"--model and --{other} name two models: give one (--model goes "
                              "with --checkpoint only, naming the factory of a --model run)")
    if getattr(args, "checkpoint", None):
        return Source("checkpoint", args.checkpoint, factory=model or None)
    if model:
        return Source("model", model)
    if getattr(args, "config", None):
        return Source("config", json_file("--config", args.config))
    if getattr(args, "hf", None):
        return Source("hf", hf_folder("--hf", args.hf))
    if getattr(args, "preset", None):
        return Source("preset", args.preset)
    return Source("preset", DEFAULT_PRESET)


# A name on the Hugging Face Hub: "gpt2", "meta-llama/Llama-3.2-1B" (one owner, one name).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def hf_folder(flag: str, path: str) -> str:
    """`path` when it names a folder written by save_pretrained that this install can read;
    else ConfigError saying what it is instead, in this order, each before anything is read:
    nothing there (a Hub id, which is never downloaded: how to get its folder), a file, a
    folder without config.json, or transformers missing (how to install it)."""
    if not os.path.exists(path):
        if _HUB_ID.fullmatch(path):
            raise ConfigError(
                f"{flag} {path!r}: no such folder here. It reads as a Hugging Face Hub id, and "
                "Hub ids are not downloaded (decoder-audit reads local folders only): on a "
                f"machine with access, `hf download {path} --local-dir DIR` "
                "(older huggingface_hub: `huggingface-cli download`) or "
                f"`AutoModelForCausalLM.from_pretrained({path!r}).save_pretrained(DIR)`, then "
                f"{flag} DIR")
        raise ConfigError(f"{flag} {path!r} does not exist: it names a folder written by "
                          "save_pretrained")
    if not os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a file, not a folder: it names the folder "
                          "save_pretrained wrote (config.json and the weights)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"{flag} {path!r} has no config.json; not a Hugging Face model folder")
    try:
        importlib.import_module("transformers")  # only whether it imports
    except ImportError as exc:
        from ..references.hf_config import INSTALL_HINT

        what = "is not installed" if exc.name == "transformers" else \
            f"does not import ({type(exc).__name__}: {exc})"
        raise ConfigError(f"{flag} {path!r}: a Hugging Face folder is read with transformers, "
                          f"which {what}; install it with: {INSTALL_HINT}") from None
    return path


def absolute(path: str | None) -> str | None:
    """`path` made absolute against the directory the command started in (None stays None)."""
    return None if path is None else os.path.abspath(path)


@contextlib.contextmanager
def user_output_to_stderr() -> Iterator[None]:
    """What user code prints while the block runs (a --model factory, its forward during the
    audit) goes to stderr, where the progress and the notes are: stdout holds only the
    command's own output, so `verify --json` prints JSON and nothing else."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def config_from_args(args) -> DecoderConfig | None:
    """The DecoderConfig the flags name, or None for a foreign --model."""
    return source_from_args(args).config()


def model_from_args(args, *, seed: int = 0) -> nn.Module:
    """Build (seeded random weights), load or import the model the flags name."""
    return source_from_args(args).build(seed=seed)


def source_flags(args) -> list[str]:
    """The flags that name this model again, for the "rerun with" line of a report."""
    flags = [part for flag in SOURCE_FLAGS if getattr(args, flag, None)
             for part in flag_and_value(flag, getattr(args, flag))]
    if not flags:
        return ["--preset", DEFAULT_PRESET]
    for extra in ("vocab_size", "max_seq_len", "input_vocab_size"):
        if getattr(args, extra, None) is not None:
            flags += flag_and_value(extra, getattr(args, extra))
    return flags


def flag_and_value(name: str, value) -> list[str]:
    """`--name value` as a command's words; `--name=value` where the value starts with a dash,
    which argparse would read as a flag of its own (`--weights-map=-map.py:good`)."""
    flag, text = f"--{name.replace('_', '-')}", str(value)
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def rerun_command(subcommand: str, args, *extra: str) -> str:
    return shlex.join(["decoder-audit", subcommand, *source_flags(args), *extra])


def tokenizer_said(kind: str, name: str) -> str:
    """A tokenizer as the user named it: the file it was read from, with its kind where the
    file's name does not say it ("tokenizer.json" once, not its Tokenizer.name
    "tokenizer.json:tokenizer.json"), or a built-in kind's name."""
    given = name[len(kind) + 1:] if name.startswith(f"{kind}:") else ""
    if not given:
        return kind
    return given if os.path.basename(given) == kind else f"{given} ({kind})"


def json_file(flag: str, path: str) -> str:
    """`path` when it names a file that is not empty (a DecoderConfig saved as JSON, read by
    the library, which names a missing one); else ConfigError saying what it is instead:
    /dev/null is a character device, not a config that "does not exist"."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path  # missing or unreadable: the loader's message names it
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISSOCK, "a socket"))
    what = next((name for test, name in kinds if test(mode)), None)
    if what is None and stat.S_ISREG(mode) and os.stat(path).st_size == 0:
        raise ConfigError(f"{flag} {path!r} is empty (0 bytes): it names a DecoderConfig saved "
                          "as JSON")
    if what is not None:
        raise ConfigError(f"{flag} {path!r} is {what}, not a file: it names a DecoderConfig "
                          "saved as JSON")
    return path
