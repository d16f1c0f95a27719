"""The terminal console every command and the trainer print through, and `literal`, the one way
user text reaches it.

rich reads `[...]` in a printed string as markup: a decoded token, a file name, a prompt or a
model name holding `topics[k]` would print as `topics`, and one holding `[/x]` would raise
MarkupError mid-command. Whatever the user wrote goes through `literal` (or is printed with
markup off, or as a `rich.text.Text`); only our own strings carry markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

# 100 columns is the width our tables are designed for; wider terminals get no benefit.
WIDTH = 100


def console(*, stderr: bool = False) -> Console:
    return Console(width=WIDTH, stderr=stderr)


def literal(value: object) -> str:
    """`str(value)` escaped so that the console prints it as it is, brackets and all."""
    return escape(str(value))
