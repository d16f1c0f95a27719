"""`decoder-audit verify-batch FILE`: audit a collator's batch (`da.audit_batch`) before training.

    decoder-audit verify-batch batch.pt --tokenizer tokenizer.json
    decoder-audit verify-batch batch.safetensors --json
    decoder-audit verify-batch collate.py:first_batch --report out/batch

FILE is a batch saved by `torch.save` (read with `weights_only=True`: tensors, lists, dicts and
numbers, and nothing else is unpickled) or a safetensors file, whose entries input_ids, labels
and optionally attention_mask and position_ids are (B, T); or FILE.py:FN, a function in FILE.py
that returns such a mapping when called with no arguments (its code runs, as a `--model
FILE.py:FACTORY` does: name only files you trust). Exit 0 when every check passes, 1 when one
fails, 2 for a usage error or a FILE that holds no batch at all (one line).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import zipfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..gate import BatchReport, audit_batch
from . import values
from .common import absolute, user_output_to_stderr


def register(subparsers) -> None:
    checks = "; ".join(f"{name}: {title}" for name, title in BatchReport.CHECK_TITLES.items())
    parser = subparsers.add_parser(
        "verify-batch", help="audit a collator's batch: labels, shift, pads, EOS/BOS, packing",
        description="Check one batch a collator built, before a model trains on it: "
                    f"{checks}. FILE is a batch saved by torch.save (read with "
                    "weights_only=True: nothing but tensors, lists, dicts and numbers is "
                    "unpickled) or a safetensors file, or FILE.py:FN, a function returning one "
                    "(its code runs, as a model factory's does). Exit 0 when every check "
                    "passes, 1 when one fails, 2 for a usage error.")
    parser.add_argument("file", metavar="FILE",
                        help="batch.pt (torch.save), batch.safetensors, or collate.py:FN")
    parser.add_argument("--tokenizer", metavar="T",
                        help="bytes, tiny-vocab, a tokenizer.json, a GPT-2 vocab.json (with "
                             "merges.txt beside it), or a folder holding one: its eos id and "
                             "size, and the decoded input/target pair of the first row")
    parser.add_argument("--labels-shifted", action="store_true",
                        help="the collator shifted the labels already (a loop that scores logit "
                             "t against label t); default: labels are the inputs, as Hugging "
                             "Face models take them")
    parser.add_argument("--ignore-index", type=values.token_value, default=-100, metavar="N",
                        help="the label value a loss ignores (default -100, cross_entropy's)")
    parser.add_argument("--pad-id", type=values.token_value, metavar="ID",
                        help="the pad id (for a batch without attention_mask)")
    parser.add_argument("--bos-id", type=values.token_value, metavar="ID",
                        help="the begin token's id (for the bos check)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report", metavar="DIR",
                        help="write report.md and report.json into DIR (a new folder, or one "
                             "holding an earlier batch report and nothing else)")
    parser.set_defaults(func=run)


def run(args) -> int:
    # made absolute before a collator's code runs: an os.chdir in it moves nothing
    report_dir = absolute(args.report)
    tokenizer_spec = (absolute(args.tokenizer) if args.tokenizer and os.path.exists(args.tokenizer)
                      else args.tokenizer)
    with user_output_to_stderr():  # what a collator prints stays off stdout (--json)
        batch = load_batch(args.file)
    tokenizer = None
    if tokenizer_spec is not None:
        from ..text.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_spec(tokenizer_spec)
    report = audit_batch(batch, tokenizer, labels_shifted=args.labels_shifted,
                         ignore_index=args.ignore_index, pad_id=args.pad_id,
                         bos_id=args.bos_id)
    command = rerun_command(args)
    written = report.write(report_dir, command) if report_dir else None
    if args.json:
        print(json.dumps(report.to_dict(command), indent=2, default=str))
    else:
        print("\n".join(report.lines(command)))
        if written:
            print(f"report written: {written}")
    return 0 if report.passed else 1


def load_batch(spec: str) -> Any:
    """The batch FILE names: FILE.py:FN called, or a torch.save / safetensors file read."""
    path_text, sep, name = spec.rpartition(":")
    if sep and path_text.endswith(".py"):
        from ..sources import run_user_code, load_callable

        function, where = load_callable(spec, "verify-batch", "FN")
        return run_user_code(f"{where} failed", function)
    path = Path(spec)
    if path.suffix == ".py":
        raise ConfigError(f"verify-batch {spec!r} is a Python file: name the function that "
                          "returns the batch, FILE.py:FN")
    if not path.is_file():
        raise ConfigError(f"verify-batch {spec!r} is not a file (a batch saved by torch.save or "
                          "safetensors, or FILE.py:FN)")
    return _read_safetensors(path) if _is_safetensors(path) else _read_torch(path)


def _is_safetensors(path: Path) -> bool:
    """A safetensors file opens with its header's length (8 bytes) and the header's '{'; a
    torch.save file is a zip archive (or, from before torch 1.6, a pickle)."""
    with path.open("rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and not zipfile.is_zipfile(path)


def _read_safetensors(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"{str(path)!r} is not a readable safetensors file: {exc}") from None


def _read_torch(path: Path) -> Any:
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():  # what torch's unpickler notes (a pickle protocol it
            # did not write) is no news: the file is read, or refused below in one line
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch(\.|$)")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        if found:
            raise ConfigError(f"{str(path)!r} holds a {found.group(1)} object, and nothing but "
                              "tensors, lists, dicts and numbers is unpickled here "
                              "(weights_only=True): save a plain dict, "
                              "torch.save(dict(batch), FILE)") from None
        raise ConfigError(f"{str(path)!r} is neither a torch.save file nor safetensors "
                          f"({_last_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - weights_only runs no code: any failure is the file's
        raise ConfigError(f"{str(path)!r} is neither a torch.save file nor safetensors "
                          f"({type(exc).__name__}: {_last_line(exc)})") from None


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of a message (torch's weights_only errors end with the cause)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def rerun_command(args) -> str:
    flags = ["decoder-audit", "verify-batch", args.file]
    if args.tokenizer:
        flags += ["--tokenizer", args.tokenizer]
    if args.labels_shifted:
        flags.append("--labels-shifted")
    if args.ignore_index != -100:
        flags += ["--ignore-index", str(args.ignore_index)]
    for flag in ("pad_id", "bos_id"):
        if getattr(args, flag) is not None:
            flags += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return shlex.join(flags)
