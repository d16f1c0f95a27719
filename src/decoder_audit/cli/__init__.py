"""The `decoder-audit` command. Each subcommand lives in its own module with a `register`
function that adds its parser and sets `func`; `main` only dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CheckpointError, ConfigError, DecoderInputError

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
    except (ConfigError, DecoderInputError, CheckpointError, FileNotFoundError) as exc:
        print(f"decoder-audit {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
