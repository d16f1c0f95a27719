"""The terminal console every command and the trainer print through."""

from __future__ import annotations

from rich.console import Console

# 100 columns is the width our tables are designed for; wider terminals get no benefit.
WIDTH = 100


def console(*, stderr: bool = False) -> Console:
    return Console(width=WIDTH, stderr=stderr)
