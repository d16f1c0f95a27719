"""`decoder-audit verify`: run the acceptance gate and print its evidence.

With no flags it audits the tiny-368 teaching decoder: the shape ledger, the parameter ledger,
the causal-intervention results, the attention row sums, the decoded aligned example and the
exact command that reruns them. Exit status 0 only when every check passes, 1 when one fails,
2 for usage errors.
"""

from __future__ import annotations

import os
import sys

from ..gate import audit, print_report, to_json
from ..console import console
from .common import add_model_source, model_from_args, rerun_command


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="run the acceptance gate on a model (default tiny-368)",
        description="Run every check of the acceptance gate (inputs, overlength, shapes, raw "
                    "logits, determinism, batch independence, causal interventions, prefixes, "
                    "attention rows, parameter ledger, tying, tying gradient, slow oracle, loss "
                    "alignment) and print the evidence. Exit 0 only when every check passes.")
    add_model_source(parser, foreign=True)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the model's random weights and of the probe ids (default 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report", metavar="DIR",
                        help="write report.md, report.json and PNG pictures into DIR")
    parser.add_argument("--intervention-len", type=int, metavar="T",
                        help="length of the causal and prefix interventions "
                             "(default min(max_seq_len, 64))")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="show a progress bar (default: only on a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    parser.set_defaults(func=run)


def run(args) -> int:
    model = model_from_args(args, seed=args.seed)
    if args.intervention_len is not None and args.intervention_len < 1:
        print(f"decoder-audit verify: error: --intervention-len={args.intervention_len} "
              "must be >= 1", file=sys.stderr)
        return 2
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        print(f"decoder-audit verify: error: --report {args.report!r} is a file; it names a folder "
              "for report.md, report.json and the pictures", file=sys.stderr)
        return 2  # said before the gate runs, not after
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    report = audit(model, vocab_size=args.vocab_size, max_seq_len=args.max_seq_len,
                   progress=show_progress and not args.json, seed=args.seed,
                   intervention_len=args.intervention_len)
    extra = []
    if args.seed:
        extra += ["--seed", str(args.seed)]
    if args.intervention_len is not None:
        extra += ["--intervention-len", str(args.intervention_len)]
    command = rerun_command("verify", args, *extra)
    if args.report:
        written = report.write(args.report, command=command)
    if args.json:
        print(to_json(report, command))
    else:
        out = console()
        print_report(report, out, command=command)
        if args.report:
            out.print(f"report written: {', '.join(str(p) for p in written)}")
    return 0 if report.passed else 1
