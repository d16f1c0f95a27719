"""The `decoder-audit` command. Each subcommand lives in its own module with a `register`
function that adds its parser and sets `func`; `main` only dispatches.

A refusal (USER_ERRORS) ends the command with one line on stderr naming the value and the limit,
and exit status 2; `--debug` re-raises it instead, with its traceback. `--version` prints the
installed package's version.

User code (a --model file: its factory, its forward) runs inside the command and must not decide
its outcome: a sys.exit or os._exit in it ends the command with one line and status 1 (os._exit
is turned into an exception while the command runs, `sources.hard_exits_raise`). What it prints
is kept off stdout (`common.user_output_to_stderr`).

Nor can it decide the exit status after the verdict. Run as the process's command (the console
script, `python -m`, a torchrun worker) once user code has run, `main` ends the process itself
(`_end_process`): the signal handlers user code installed are set to ignore, the exit handlers
(atexit, weakref finalizers) run with os._exit still raising, each one that fails or exits
noted in one line, and then the process ends with the verdict's status, past any thread user
code left running and past the interpreter's finalisation (where a __del__ could run more of
it). A Python caller of `main([...])` keeps its process and ends it as usual."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import difflib
import importlib
import signal
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
from .terms import in_flags, offered_flags

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

    def parse_args(self, args=None, namespace=None):
        """argparse's, except for arguments no parser took: argparse refuses them in the
        top-level parser's name, pointing at its --help; those typed after the command belong
        to it, and its parser refuses them here, each option with what was meant."""
        words = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(words, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            before = words[:words.index(command)] if command in words else words
            # typed before the command: decoder-audit's own arguments
            chosen = self if set(extras) & set(before) else _subcommands(self).choices[command]
            chosen.error(f"unrecognized arguments: {' '.join(extras)}"
                         + "".join(f"; {hint}" for hint in _meant(self, chosen, extras)))
        return parsed


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _meant(top: argparse.ArgumentParser, chosen: argparse.ArgumentParser,
           extras: list[str]) -> list[str]:
    """What each unknown option in `extras`, refused by `chosen`, may have meant (argparse
    3.11 suggests nothing for an option): an option of decoder-audit itself, which goes before
    the command; one that other commands take; else `chosen`'s nearest option names
    (difflib)."""
    commands = _subcommands(top).choices
    command = chosen.prog.removeprefix(f"{top.prog} ")
    hints = []
    for arg in dict.fromkeys(a.split("=", 1)[0] for a in extras if a.startswith("--")):
        takers = [name for name, sub in commands.items() if arg in sub._option_string_actions]
        if chosen is not top and arg in top._option_string_actions:
            hints.append(f"{arg} is an option of decoder-audit itself: give it before the "
                         f"command (decoder-audit {arg} {command} ...)")
        elif chosen is not top and takers:
            hints.append(f"{arg} is an option of {', '.join(takers)}, not of {command}")
        else:
            words = {name[2:]: name for name in chosen._option_string_actions
                     if name.startswith("--")}
            near = difflib.get_close_matches(arg[2:], list(words), n=2, cutoff=0.7)
            if near:
                hints.append(f"{arg}: did you mean {' or '.join(words[w] for w in near)}?")
    return hints


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
    parser = build_parser()
    args = parser.parse_args(argv)
    offered = offered_flags(parser, args.command)
    if argv is not None:  # a Python caller: its process, its exit
        return _dispatch(args, offered)
    threads, handlers = set(threading.enumerate()), _signal_handlers()
    with hard_exits_raise() as real_exit:  # until the very end: a user thread's os._exit too
        status = _dispatch(args, offered)
        if user_code_ran():
            _end_process(args, status, threads, handlers, real_exit)
    return status


def _dispatch(args, offered: frozenset[str]) -> int:
    """Run the command; a refusal is one line in the command line's words (`terms.in_flags`)."""
    ran = len(user_code_ran())
    try:
        with hard_exits_raise(), one_line_warnings(args.command):
            return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"decoder-audit {args.command}: error: {in_flags(one_line(exc), args, offered)}",
              file=sys.stderr)
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


def _end_process(args, status: int, before: set[threading.Thread],
                 handlers: dict[int, object], real_exit) -> None:
    """End the process now with `status`, the verdict's, once user code has run: nothing it
    left behind (a signal handler, an exit handler, a thread, a __del__, a stream whose flush
    raises) decides the status; whatever the steps before it raise, the process ends so."""
    try:
        for number, handler in handlers.items():  # a handler user code installed: ignored now
            with contextlib.suppress(OSError, ValueError, TypeError):
                if signal.getsignal(number) is not handler:
                    signal.signal(number, signal.SIG_IGN)
        left = [t for t in threading.enumerate()
                if t not in before and t.is_alive() and not t.daemon]
        if left:  # Python would wait for them at exit: one left running would hang the command
            names = ", ".join(t.name for t in left[:3]) + (
                f" and {len(left) - 3} more" if len(left) > 3 else "")
            _note(args, f"user code left {len(left)} thread(s) running ({names}); exiting with "
                        f"status {status} without waiting for them")
        for failure in _run_exit_handlers():
            _note(args, f"an exit handler {failure}; ignored: the status is the verdict's, "
                        f"{status}")
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        real_exit(status)  # sys.exit would run the interpreter's finalisation: more user code


def _signal_handlers() -> dict[int, object]:
    """Every signal's Python-level handler now, before user code can install its own."""
    handlers = {}
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handlers[number] = signal.getsignal(number)
    return handlers


def _run_exit_handlers() -> list[str]:
    """Run the atexit handlers now, as the interpreter would at exit (once each; their prints
    on stderr), and return what those that failed did, one phrase each: an os._exit(0) in one
    raises here (hard_exits_raise) and is one of them."""
    from .common import user_output_to_stderr

    failures, hook = [], sys.unraisablehook

    def collect(unraisable) -> None:
        exc = unraisable.exc_value
        where = getattr(unraisable.object, "__qualname__", None) or "unnamed"
        if isinstance(exc, SystemExit):
            what = f"called {getattr(exc, 'call', 'sys.exit')}({exc.code!r})"
        else:
            what = f"raised {unraisable.exc_type.__name__}: {one_line(exc)}"
        failures.append(f"({where}) {what}")

    sys.unraisablehook = collect
    try:
        with user_output_to_stderr():
            atexit._run_exitfuncs()
    finally:
        sys.unraisablehook = hook
    return failures


@contextlib.contextmanager
def one_line_warnings(command: str):
    """Within the block, a warning of ours (its category defined in decoder_audit, e.g. the
    stranded copy a resume reads) is one line on stderr, `decoder-audit COMMAND: warning: ...`,
    instead of Python's two (file, line and the source line that warned). Other libraries'
    warnings, and which warnings show at all (the filters), are left as they are."""
    import warnings

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category.__module__.partition(".")[0] != __name__.partition(".")[0]:
            shown(message, category, filename, lineno, file, line)
            return
        text = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
        print(f"decoder-audit {command}: warning: {text}", file=file or sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _note(args, text: str) -> None:
    print(f"decoder-audit {args.command}: note: {text}", file=sys.stderr)


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
