"""`decoder-audit ledger`: the parameter ledger, analytic against measured."""

from __future__ import annotations

import json

from rich.table import Table

from ..accounting.ledger import active_parameters, measured_ledger, parameter_ledger, reconcile
from ..accounting.measured import unbuildable
from ..console import console, literal
from .common import add_model_source, source_from_args, user_output_to_stderr


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ledger", help="parameter ledger, analytic vs measured",
        description="Count every component's parameters from the config (analytic) and from the "
                    "built module (measured, on the meta device: no weights are allocated), and "
                    "reconcile the two.")
    add_model_source(parser, foreign=True, hf=True)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args) -> int:
    source = source_from_args(args)
    skipped = None
    with user_output_to_stderr():  # a --model factory's prints: stdout holds the ledger only
        cfg = source.config()
        if args.model or cfg is None:  # a foreign module, or a family we do not convert
            model = source.build()
        elif (skipped := unbuildable(cfg)) is None:
            from ..model.decoder import Decoder

            # shapes only: gpt2-xl is counted without allocating it
            model = Decoder(cfg, device="meta")
    measured = measured_ledger(model) if skipped is None else None
    analytic = parameter_ledger(cfg) if cfg is not None else None
    problems = reconcile(analytic, measured) if analytic is not None and measured else []
    if args.json:
        print(json.dumps({
            "analytic": analytic.as_dict() if analytic else None,
            "analytic_total": analytic.total if analytic else None,
            "measured": measured.as_dict() if measured else None,
            "measured_total": measured.total if measured else None,
            "measured_skipped": skipped,
            "active_total": active_parameters(cfg) if cfg is not None else None,
            "reconciled": analytic is not None and measured is not None and not problems,
            "differences": problems,
        }, indent=2))
        return 0 if not problems else 1
    out = console()
    shown = analytic or measured
    table = Table(title=f"parameter ledger ({shown.source})")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("formula")
    for name, count, formula in shown.grouped():
        table.add_row(name, f"{count:,}", formula)
    table.add_row("total", f"{shown.total:,}", "", style="bold")
    out.print(table)
    if analytic is None:
        why = f" ({literal(source.why_no_config())})" if source.why_no_config() else ""
        out.print(f"no DecoderConfig{why}: measured ledger only (unique Parameters, a tied "
                  "weight once)")
        return 0
    if measured is None:
        out.print(f"measured ledger not built: {literal(skipped)}")
        return 0
    if problems:
        out.print("[red]analytic and measured ledgers differ:[/red]")
        for line in problems:
            out.print(f"  {line}")
        return 1
    out.print(f"measured unique parameters: {measured.total:,} = analytic {analytic.total:,} "
              "[green]reconciled[/green]")
    if cfg.routed:
        out.print(f"active per token: {active_parameters(cfg):,} (every weight but the routed "
                  f"experts a token is not sent to: {cfg.experts_per_token} of {cfg.n_experts})")
    return 0
