"""The parts of `--help` that are facts of the code, written from the code that decides them:
the checks from the gate's registry, the paths each refuses, the layouts a --spec is found in.
A check added to the registry or a layout added to `references.layout_table` appears here
without an edit, so `--help` never names fewer than there are (docs/generate.py writes the
docs' tables from the same sources)."""

from __future__ import annotations

import argparse

from ..gate import CHECKS
from ..references.layout_table import LAYOUTS

class ListingFormatter(argparse.HelpFormatter):
    """Wraps the description as argparse does and keeps the epilog's lines as written (a table
    of checks, one a line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        description, _, listing = text.partition("\n\n")
        filled = super()._fill_text(description, width, indent)
        return filled + ("\n\n" + listing if listing else "")


def checks_listing() -> str:
    """Every check of the gate, in diagnosis order, with what it holds and the paths a failure
    affects; for `verify --help`'s epilog."""
    width = max(len(name) for name in CHECKS)
    lines = [f"  {name:<{width}}  {check.title} [{', '.join(check.paths)}]"
             for name, check in CHECKS.items()]
    return (f"the gate's {len(CHECKS)} checks, in diagnosis order (a check that cannot run on "
            "the model is skipped with its reason; in brackets, the paths a failure affects):\n"
            "\n" + "\n".join(lines))


def off_training_path() -> str:
    """The checks whose failure does not refuse training, each with the paths it affects
    (training takes none of them), as `train --help` names them."""
    return ", ".join(f"{name} ({', '.join(check.paths)})" for name, check in CHECKS.items()
                     if "training" not in check.paths)


def layout_names() -> str:
    """The layouts a spec's weights are found in by their names."""
    return ", ".join([layout.name for layout in LAYOUTS] + ["TransformerLens' HookedTransformer"])
