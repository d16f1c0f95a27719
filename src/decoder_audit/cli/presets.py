"""`decoder-audit presets`: the named configurations and their parameter counts."""

from __future__ import annotations

import json

from rich.table import Table

from ..accounting.ledger import parameter_ledger
from ..console import console
from ..model.presets import PRESETS


def register(subparsers) -> None:
    parser = subparsers.add_parser("presets", help="list the named configurations",
                                   description="List the named configurations with their shapes "
                                               "and unique parameter counts.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.json:
        print(json.dumps({name: {"config": cfg.to_dict(), "parameters": parameter_ledger(cfg).total}
                          for name, cfg in PRESETS.items()}, indent=2))
        return 0
    table = Table(title="decoder-audit presets")
    for column in ("preset", "V", "D", "L", "H/Hkv", "F", "T", "blocks", "parameters"):
        table.add_column(column, justify="left" if column in ("preset", "blocks") else "right")
    for name, cfg in PRESETS.items():
        blocks = f"{cfg.norm} {cfg.mlp} {cfg.pos}" + (" tied" if cfg.tie_embeddings else "")
        table.add_row(name, str(cfg.vocab_size), str(cfg.d_model), str(cfg.n_layers),
                      f"{cfg.n_heads}/{cfg.kv_heads}", str(cfg.d_ff), str(cfg.max_seq_len), blocks,
                      f"{parameter_ledger(cfg).total:,}")
    console().print(table)
    return 0
