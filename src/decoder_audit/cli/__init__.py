"""The `decoder-audit` command. Each subcommand lives in its own module with a `register`
function that adds its parser and sets `func`; `main` only dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CheckpointError, ConfigError, DecoderInputError, RunFolderError

# What a user can cause and fix: each ends the command with one line naming the problem and its
# value, and exit status 2. Anything else is a bug of ours and keeps its traceback.
USER_ERRORS = (ConfigError, DecoderInputError, CheckpointError, RunFolderError, OSError,
               MemoryError)

# Subcommand modules, in the order `--help` lists them.
COMMANDS = ["verify", "ledger", "account", "train", "sample", "convert", "prepare", "presets"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decoder-audit",
        description="Build decoder-only language models from one config and prove them correct "
                    "before training.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"decoder-audit {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"decoder-audit {args.command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise  # a usage error (argparse) keeps its status
        # Our commands return their status; a sys.exit(0) from user code (a --model factory or
        # forward) would otherwise end the run as a success with nothing checked.
        print(f"decoder-audit {args.command}: error: user code called sys.exit({exc.code!r}) "
              "before the command finished; nothing was checked", file=sys.stderr)
        return 1


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (an OSError with its path, as Python words it)."""
    text = str(exc) if not isinstance(exc, OSError) or not exc.strerror else (
        f"{exc.strerror}: {str(exc.filename)!r}" if exc.filename else exc.strerror)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or \
        type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
