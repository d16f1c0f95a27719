"""The library's errors in the command line's words, translated in this one place.

The library speaks to Python callers: "audit() needs vocab_size=V", "top_k=0 must be an integer
>= 1", "e.g. cfg.replace(max_seq_len=2048)". On the command line the same fact is a flag the
user typed, or could type: "verify needs --vocab-size V", "--top-k=0 must be ...", "e.g.
--max-seq-len 2048". `in_flags` rewrites a refusal's message before the command prints it; the
library's own messages stay as they are for its Python callers.

Two rules, each applied only where the command offers the flag:
- a phrase of the table below (a Python call, a placeholder V or T), to the flag it means;
- `name=value` where `value` is what the user gave for `--name`: the user's own flag (a value the
  user did not give, such as the model's own `vocab_size=8` beside it, stays as it is).
"""

from __future__ import annotations

import argparse
import re

# (the Python phrase, the flag it needs the command to offer (None: any), what the command line
# says instead)
_PHRASES = (
    (re.compile(r"\baudit\(\) needs vocab_size=V\b"), "--vocab-size",
     "{command} needs --vocab-size V"),
    (re.compile(r"\bmax_seq_len=T\b"), "--max-seq-len", "--max-seq-len T"),
    (re.compile(r"\bcfg\.replace\(max_seq_len=(\d+)\)"), "--max-seq-len", r"--max-seq-len \1"),
    (re.compile(r"\(or None\)"), None, "(or left out)"),  # a flag left out is None
)
# name=value, not already a flag (--name=value), an attribute (cfg.name=value) or in a path
_ASSIGNMENT = re.compile(r"(?<![\w./-])([a-z][a-z0-9_]*)=('[^']*'|[^\s,;:)/]+)")


def offered_flags(parser: argparse.ArgumentParser, command: str) -> frozenset[str]:
    """The option strings `command`'s parser offers (--vocab-size, ...)."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return frozenset(subparsers.choices[command]._option_string_actions)


def in_flags(text: str, args: argparse.Namespace, offered: frozenset[str]) -> str:
    """`text` (a refusal's message) in the words of the command line that `args` parsed."""
    for pattern, flag, replacement in _PHRASES:
        if flag is None or flag in offered:
            text = pattern.sub(replacement.replace("{command}", args.command), text)

    def flag_if_given(match: re.Match) -> str:
        name, value = match.groups()
        flag = "--" + name.replace("_", "-")
        given = getattr(args, name, None)
        if flag not in offered or given is None or isinstance(given, bool):
            return match.group(0)
        return f"{flag}={value}" if _same(value, given) else match.group(0)

    return _ASSIGNMENT.sub(flag_if_given, text)


def _same(text: str, given: object) -> bool:
    """Whether `text` (a value as a message prints it: 0, 0.5, 'cpu') is the value `given`."""
    text = text.strip("'\"")
    if isinstance(given, (int, float)):
        try:
            return float(text) == float(given)
        except ValueError:
            return False
    return text == str(given)
