"""`decoder-audit verify`: run the acceptance gate and print its evidence.

With no flags it audits the tiny-368 teaching decoder: the shape ledger, the parameter ledger,
the causal-intervention results, the attention row sums, the decoded aligned example and the
exact command that reruns them. Exit status 0 only when every check passes, 1 when one fails,
2 for usage errors.
"""

from __future__ import annotations

import os
import sys

import torch

from ..config import DecoderConfig
from ..console import console, literal
from ..errors import ConfigError
from ..gate import (
    AuditReport,
    allocate_large_blocks_apart,
    audit,
    check_gate_fits,
    print_report,
    to_json,
)
from ..sources import load_weights_map
from . import helptext
from . import values
from .common import (
    absolute,
    add_model_source,
    flag_and_value,
    json_file,
    rerun_command,
    source_from_args,
    user_output_to_stderr,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="run the acceptance gate on a model (default tiny-368)",
        description="Run every check of the acceptance gate (listed below) and print the "
                    "evidence. Exit 0 only when every check passes, 1 when one fails, 2 for a "
                    "usage error.",
        epilog=helptext.checks_listing(), formatter_class=helptext.ListingFormatter)
    add_model_source(parser, foreign=True, hf=True, intervention=True)
    parser.add_argument("--input-vocab-size", type=values.count(), metavar="V_IN",
                        help="ids the model reads when that differs from V (an extra start "
                             "token past the output vocabulary): V_IN - 1 must run, V_IN must be "
                             "rejected")
    parser.add_argument("--spec", metavar="CONFIG.json",
                        help="the architecture a --model (or --hf) module declares, a "
                             "DecoderConfig saved as JSON: its parameter ledger, tie and float64 "
                             "oracle are checked against it, its weights found by their names "
                             f"in one of the layouts {helptext.layout_names()} (else give "
                             "--weights-map)")
    parser.add_argument("--weights-map", metavar="FILE.py:FN",
                        help="with --spec, for a layout not found by its names: FN(state_dict) "
                             "returns {canonical name: tensor} (views of the module's tensors)")
    parser.add_argument("--seed", type=values.seed, default=0,
                        help="seed of the model's random weights and of the probe ids (default 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report", metavar="DIR",
                        help="write report.md, report.json and PNG pictures into DIR")
    parser.add_argument("--dtype", choices=sorted(DTYPES),
                        help="cast the model to this dtype before the gate (default: its own, "
                             "float32 for a preset); tolerances follow the dtype. float64 doubles "
                             "the memory of float32: meant for small models")
    parser.add_argument("--device", default="cpu",
                        help="run the checks on this device: cpu (default), cuda or cuda:N")
    parser.add_argument("--shard", action="store_true",
                        help="audit the model sharded with FSDP2, as `train --shard` trains it "
                             "(run under torchrun: each rank holds 1/N of the weights; a preset "
                             "or config is built sharded, never whole); rank 0 reports")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="show a progress bar (default: only on a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    parser.set_defaults(func=run)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    """cpu, cuda, cuda:N (or another device torch knows and this machine has). A device this
    machine lacks is a ConfigError: one line, exit 2, before anything is built."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: CUDA is not available on this machine "
                              f"(torch {torch.__version__}, torch.cuda.is_available() is "
                              "False); run without --device, on the CPU")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                              f"CUDA device(s), so there is no cuda:{index}")
        return torch.device("cuda", index)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {name}: MPS is not available on this machine")
    return device


def run(args) -> int:
    if args.intervention_len is not None and args.intervention_len < 1:
        print(f"decoder-audit verify: error: --intervention-len={args.intervention_len} "
              "must be >= 1", file=sys.stderr)
        return 2
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        print(f"decoder-audit verify: error: --report {args.report!r} is a file; it names a folder "
              "for report.md, report.json and the pictures", file=sys.stderr)
        return 2  # said before the gate runs, not after
    report_dir = absolute(args.report)  # before user code runs: an os.chdir in it moves nothing
    if report_dir:  # a report.md of the user's own there is refused now, not after the gate
        AuditReport.refuse_to_overwrite(report_dir)
    if args.shard:
        return _run_sharded(args, report_dir)
    device = resolve_device(args.device)
    source = source_from_args(args)
    spec = DecoderConfig.load(json_file("--spec", args.spec)) if args.spec else None
    if args.weights_map and spec is None:
        raise ConfigError("--weights-map places a module's weights on a spec's names: give "
                          "--spec CONFIG.json too")
    # A module checkpoint's V and lengths are in its factory.json; the flags win.
    declared = source.declared()
    vocab_size, max_seq_len, intervention_len = (
        getattr(args, name) if getattr(args, name) is not None else declared.get(name)
        for name in ("vocab_size", "max_seq_len", "intervention_len"))
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    if source.built_fresh:  # our Decoder in the dtype asked: sized before it is built
        check_gate_fits(source.config(), DTYPES.get(args.dtype) or torch.float32, device=device)
    with user_output_to_stderr():  # a --model's prints, in its factory or its forward
        weights_map = load_weights_map(args.weights_map) if args.weights_map else None
        model = source.build(seed=args.seed, dtype=DTYPES.get(args.dtype))
        # In place: the command owns the model it built or loaded (a Decoder keeps its tie).
        model.to(device=device, dtype=DTYPES.get(args.dtype))
        # The facts (V, the length policy, the pad id) are the gate's to read from the model: a
        # DecoderConfig or a Hugging Face config; the flags say what a bare module cannot.
        report = audit(model, vocab_size=vocab_size, max_seq_len=max_seq_len,
                       input_vocab_size=args.input_vocab_size,
                       progress=show_progress and not args.json, seed=args.seed,
                       intervention_len=intervention_len, spec=spec, weights_map=weights_map)
    return _print_verdict(args, report, report_dir)


def _run_sharded(args, report_dir: str | None) -> int:
    """`verify --shard` (under torchrun): the model sharded with FSDP2 over every rank, the
    gate run on every rank alike (gate/sharding.py), rank 0 printing and writing the report.
    A preset or config is built sharded (`build_sharded`: 1/N of the weights per rank); a
    checkpoint or a --model's Decoder is loaded whole on each rank, then sharded. A failure on
    any rank ends the run with one line (`end_failed_rank`), never a wait on the others."""
    from ..training import distributed

    if args.spec or args.weights_map or args.hf:
        raise ConfigError("--shard audits a decoder-audit Decoder in its own layout (a preset, "
                          "--config, --checkpoint, or a --model that returns a Decoder); "
                          "--spec, --weights-map and --hf describe modules of other layouts")
    device = distributed.resolve_device(args.device, distributed.local_rank())
    ranks = distributed.init_distributed(device, shard=True)
    allocate_large_blocks_apart()  # the blocks gathered and freed at every call: see there
    try:
        report = _audit_sharded(args, ranks, device)
        launcher = (f"torchrun --nproc_per_node {ranks.world_size} --no-python "
                    if ranks.distributed else "")
        code = _print_verdict(args, report, report_dir, launcher) if ranks.is_main else \
            (0 if report.passed else 1)
    except BaseException as exc:
        if ranks.distributed and not args.debug and not isinstance(exc, KeyboardInterrupt):
            end_failed_rank("verify", ranks, exc)
        distributed.close(ranks)
        raise
    distributed.close(ranks)
    return code


def _audit_sharded(args, ranks, device):
    from ..training import distributed

    dtype = DTYPES.get(args.dtype)
    source = source_from_args(args)
    if source.built_fresh:  # the ranks on one host's CPU share its memory
        check_gate_fits(source.config(), dtype or torch.float32, device=device,
                        world_size=ranks.world_size,
                        local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
                        if torch.device(device).type == "cpu" else 1)
    with user_output_to_stderr():
        if source.built_fresh:
            model = distributed.build_sharded(source.config(), ranks, device, seed=args.seed,
                                              dtype=dtype, reshard_root=True)
        else:
            model = source.build(seed=args.seed, dtype=dtype)
            _refuse_unshardable(model)
            model.to(device=device, dtype=dtype)
            distributed.shard_model(model, ranks, device, reshard_root=True)
        show_progress = ranks.is_main and (sys.stderr.isatty() if args.progress is None
                                           else args.progress)
        return audit(model, progress=show_progress and not args.json, seed=args.seed,
                     vocab_size=args.vocab_size, max_seq_len=args.max_seq_len,
                     input_vocab_size=args.input_vocab_size,
                     intervention_len=args.intervention_len)


def end_failed_rank(command: str, ranks, exc: BaseException) -> None:
    """A rank of a run under torchrun failed: the run's one line, said by the rank whose it is
    (`distributed.says_failure`: rank 0 for a failure every rank shares, else the rank that
    alone failed, naming itself), then this process ends at once (`distributed.abandon`) with
    the status the failure has in one process (2 for a user's mistake, 1 otherwise)."""
    from ..gate import RanksDisagree
    from ..training import distributed
    from . import USER_ERRORS, one_line

    user = isinstance(exc, USER_ERRORS)
    if distributed.says_failure(ranks, exc):
        # a rank other than 0 names itself (RanksDisagree's message does already)
        who = "" if ranks.is_main or isinstance(exc, RanksDisagree) else f"rank {ranks.rank}: "
        what = one_line(exc) if user or isinstance(exc, RanksDisagree) else \
            f"{type(exc).__name__}: {one_line(exc)}"
        print(f"decoder-audit {command}: error: {who}{what}", file=sys.stderr)
        distributed.hold_store_for_peers(ranks)
    distributed.abandon(2 if user else 1)


def _refuse_unshardable(model: torch.nn.Module) -> None:
    """--shard shards a Decoder's blocks (`distributed.shard_model`): any other module is
    refused in verify's words, naming its class, before the gate is spent on it."""
    from ..model.decoder import Decoder

    if not isinstance(model, Decoder):
        cls = type(model)
        raise ConfigError(f"verify --shard needs a decoder-audit Decoder (FSDP2 shards its "
                          f"blocks), and the model is a {cls.__module__}.{cls.__qualname__}: "
                          "run verify without --shard, where any module is audited whole")


def _print_verdict(args, report, report_dir: str | None, launcher: str = "") -> int:
    """The report on stdout (and in --report DIR), with the command that reruns it (`launcher`
    before it: torchrun for a sharded run); the exit status of its verdict."""
    command = launcher + rerun_command("verify", args, *_rerun_flags(args))
    if report_dir:
        written = report.write(report_dir, command=command)
    if args.json:
        print(to_json(report, command))
    else:
        out = console()
        print_report(report, out, command=command)
        if report_dir:
            out.print(f"report written: {literal(', '.join(str(p) for p in written))}")
    return 0 if report.passed else 1


def _rerun_flags(args) -> list[str]:
    """The flags besides the model's that reproduce this run."""
    extra = []
    if args.spec:
        extra += flag_and_value("spec", args.spec)
    if args.weights_map:
        extra += flag_and_value("weights_map", args.weights_map)
    if args.seed:
        extra += ["--seed", str(args.seed)]
    if args.intervention_len is not None:
        extra += ["--intervention-len", str(args.intervention_len)]
    if args.dtype:
        extra += ["--dtype", args.dtype]
    if args.device != "cpu":
        extra += ["--device", args.device]
    if args.shard:
        extra.append("--shard")
    return extra
