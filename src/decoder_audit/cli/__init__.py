"""The `decoder-audit` command. Each subcommand lives in its own module with a `register`
function that adds its parser and sets `func`; `main` only dispatches.

A refusal (USER_ERRORS) ends the command with one line on stderr naming the value and the limit,
and exit status 2; `--debug` re-raises it instead, with its traceback. `--version` prints the
installed package's version.

User code (a --model file: its factory, its forward) runs inside the command and must not decide
its outcome: a sys.exit or os._exit in it ends the command with one line and status 1 (os._exit
is turned into an exception while the command runs, `sources.hard_exits_raise`), and a thread it
leaves running (not a daemon) does not keep the process alive after the verdict: the command
exits with its own status. What it prints is kept off stdout (`common.user_output_to_stderr`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from importlib import metadata

from ..errors import (
    CheckpointError,
    ConfigError,
    DecoderInputError,
    NonFiniteLogitsError,
    RunFolderError,
)
from ..sources import hard_exits_raise, user_code_ran

# What a user can cause and fix: each ends the command with one line naming the problem and its
# value, and exit status 2. The storage refusals (an out folder holding a user's file, a
# checkpoint that does not fit) are CheckpointErrors; NonFiniteLogitsError is a model whose
# logits broke (sample). Anything else is a bug, ours or in a user's forward: one line too, exit
# status 1, and its traceback with --debug.
USER_ERRORS = (ConfigError, DecoderInputError, CheckpointError, RunFolderError,
               NonFiniteLogitsError, OSError, MemoryError)

# Subcommands, in the order `--help` lists them; each in the module of its name ("-" as "_").
COMMANDS = ["verify", "verify-batch", "ledger", "account", "train", "sample", "convert",
            "prepare", "presets"]


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (status 2); the usage is one --help away.
    The subcommands' parsers are of this class too (add_subparsers makes them so)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="decoder-audit",
        description="Build decoder-only language models from one config and prove them correct "
                    "before training.",
    )
    parser.add_argument("--version", action="version", version=f"decoder-audit {version()}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, raise it with its traceback instead of one line")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = set(threading.enumerate())
    status = _dispatch(args)
    if argv is None and user_code_ran():
        # Run as the process's command (the console script): Python would wait for every
        # non-daemon thread at exit, so one user code left running would hang it after the
        # verdict. A Python caller of main([...]) keeps its process and its threads.
        _exit_past_user_threads(args, threads, status)
    return status


def _dispatch(args) -> int:
    ran = len(user_code_ran())
    try:
        with hard_exits_raise():
            return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"decoder-audit {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"decoder-audit {args.command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        from_user = len(user_code_ran()) > ran or bool(getattr(args, "model", None))
        if args.debug or not (from_user or exc.code in (0, None)):
            raise  # a usage error (argparse) keeps its status
        # Our commands return their status; a sys.exit or os._exit from user code (a --model
        # factory or forward) would otherwise end the run with the code's status, 0 a success
        # with nothing checked.
        call = getattr(exc, "call", "sys.exit")
        print(f"decoder-audit {args.command}: error: user code called {call}({exc.code!r}) "
              "before the command finished; nothing was checked", file=sys.stderr)
        return 1
    except BaseException as exc:  # a bug: ours, or raised by a user's forward
        if args.debug:
            raise
        # Still one line: the traceback is one flag away, not in every user's terminal.
        print(f"decoder-audit {args.command}: error: unexpected {type(exc).__name__}: "
              f"{one_line(exc)} (rerun with --debug for the traceback)", file=sys.stderr)
        return 1


def _exit_past_user_threads(args, before: set[threading.Thread], status: int) -> None:
    """End the process now, with `status`, when threads started during the command (by user
    code: ours are daemons or joined) are still running; say which on stderr first."""
    left = [t for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon]
    if not left:
        return
    names = ", ".join(t.name for t in left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3
                                                   else "")
    print(f"decoder-audit {args.command}: note: user code left {len(left)} thread(s) running "
          f"({names}); exiting with status {status} without waiting for them", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # sys.exit would wait for them: Python joins non-daemon threads at exit


def version() -> str:
    """The installed distribution's version (the one pip reports)."""
    try:
        return metadata.version("decoder-audit")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (an OSError with its path, as Python words it)."""
    text = str(exc) if not isinstance(exc, OSError) or not exc.strerror else (
        f"{exc.strerror}: {str(exc.filename)!r}" if exc.filename else exc.strerror)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or \
        type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
