"""`decoder-audit account`: parameters, memory and every forward matmul of a config, analytic and
measured on the meta device. No weight is allocated, so gpt2-xl is sized on a laptop."""

from __future__ import annotations

import json
import sys

import torch
from rich.table import Table

from ..accounting import account
from ..accounting.plot import plot_context_sweep
from ..accounting.results import BYTES_PER_ELEMENT, FLOP_CONVENTIONS
from ..console import console, literal
from ..gate import GatePeak, gate_peak
from ..sources import DEFAULT_PRESET
from .common import add_model_source, rerun_command, source_from_args
from . import values


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "account", help="parameters, memory and forward FLOPs, without building the model",
        description="Size a decoder from its config: parameters per component (tied/untied and "
                    "embedding conventions labelled), memory for weights and AdamW training, and "
                    "every forward matrix multiply with its FLOPs (2mnp). The analytic FLOPs are "
                    "cross-checked by torch's FlopCounterMode on the meta device.")
    add_model_source(parser, foreign=False, checkpoint=True, hf=True)
    parser.add_argument("--batch", type=values.count(), default=1, metavar="B", help="batch size (default 1)")
    parser.add_argument("--seq", type=values.count(), default=None, metavar="T",
                        help="sequence length (default: the config's max_seq_len)")
    parser.add_argument("--max-seq-len", type=values.count(), default=None, metavar="N",
                        help="account a variant of the config with this context length (learned "
                             "position embeddings grow with it); --seq defaults to it")
    parser.add_argument("--no-measure", action="store_true",
                        help="skip the FlopCounterMode cross-check (analytic numbers only)")
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=sorted(GATE_DTYPES),
                        metavar="DTYPE", help="dtype(s) of the gate's predicted peak memory, as "
                                              "`verify --dtype` would run it (default float32; "
                                              f"{', '.join(GATE_DTYPES)})")
    parser.add_argument("--world-size", type=values.count(), default=1, metavar="N",
                        help="the gate's peak per rank with the weights sharded by FSDP2 over N "
                             "ranks (default 1: one process holds them all)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="write a log-log plot of each group's FLOPs as the context doubles")
    parser.set_defaults(func=run)


GATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "float64": torch.float64}


# The units a size is shown in, largest first: powers of 1000 and of 1024. GB is the largest
# (a 671B model's 1,342 GB reads as the docs and datasheets give it); a small model's weights
# read in kB or MB, where GB showed 0.00.
DECIMAL = ((10**9, "GB"), (10**6, "MB"), (10**3, "kB"))
BINARY = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
MEMORY_TITLE = "memory (kB, MB, GB: powers of 1000; KiB, MiB, GiB: of 1024; P = parameters)"


def scaled(n_bytes: int, units=DECIMAL) -> str:
    """`n_bytes` in the largest of `units` it holds at least one of, to 2 decimals (8.51 GB,
    17.60 kB); in bytes below the smallest (512 B)."""
    for size, name in units:
        if n_bytes >= size:
            return f"{n_bytes / size:,.2f} {name}"
    return f"{n_bytes:,} B"


def _sizes(n_bytes: int) -> tuple[str, str, str]:
    """The bytes, decimal (kB, MB, GB) and binary (KiB, MiB, GiB) cells of a memory row."""
    return f"{n_bytes:,}", scaled(n_bytes), scaled(n_bytes, BINARY)


def _source_name(args) -> str:
    for flag in ("preset", "config", "checkpoint", "hf"):
        if getattr(args, flag, None):
            return f"{flag} {getattr(args, flag)}"
    return f"preset {DEFAULT_PRESET}"


def run(args) -> int:
    source = source_from_args(args)
    cfg = source.config()
    if cfg is None:  # a Hugging Face family the converter does not read, a --model's weights
        print(f"decoder-audit account: error: {_source_name(args)}: accounting needs a "
              f"DecoderConfig and {source.why_no_config()}", file=sys.stderr)
        return 2
    if args.max_seq_len is not None:
        cfg = cfg.replace(max_seq_len=args.max_seq_len)
    if args.world_size < 1:
        print(f"decoder-audit account: error: --world-size={args.world_size} must be >= 1",
              file=sys.stderr)
        return 2
    acct = account(cfg, batch_size=args.batch, seq_len=args.seq, measure=not args.no_measure)
    peaks = {name: gate_peak(cfg, GATE_DTYPES[name], world_size=args.world_size)
             for name in dict.fromkeys(args.dtype)}
    extra = [f"--batch={args.batch}", f"--seq={acct.seq_len}"]
    if args.max_seq_len is not None:
        extra.append(f"--max-seq-len={args.max_seq_len}")
    if args.dtype != ["float32"]:
        extra += ["--dtype", *peaks]
    if args.world_size != 1:
        extra.append(f"--world-size={args.world_size}")
    if args.plot:
        title = f"{_source_name(args)}: forward matmul FLOPs vs context (B={args.batch})"
        plot_context_sweep(cfg, args.plot, args.batch, seq_len=acct.seq_len, title=title)
    if args.json:
        out = acct.to_dict()
        out["command"] = rerun_command("account", args, *extra)
        out["plot"] = args.plot
        out["gate_peak"] = {name: peak.to_dict() for name, peak in peaks.items()}
        print(json.dumps(out, indent=2))
    else:
        _print(acct, args, extra, peaks)
    matched = acct.measured is None or acct.measured.matches_analytic
    return 0 if matched else 1


def _print(acct, args, extra, peaks: dict[str, GatePeak]) -> None:
    cfg, out = acct.config, console()
    B, T = acct.batch_size, acct.seq_len
    out.print(f"[bold]{literal(_source_name(args))}[/bold], accounted at B={B}, T={T}")
    out.print(f"  L={cfg.n_layers} D={cfg.d_model} H={cfg.n_heads} Hkv={cfg.kv_heads} "
              f"Dh={cfg.head_dim} F={cfg.d_ff} V={cfg.vocab_size} max_seq_len={cfg.max_seq_len} "
              f"mlp={cfg.mlp} pos={cfg.pos} norm={cfg.norm} tied={cfg.tie_embeddings}")
    for section in (_print_parameters, _print_memory, _print_matmuls, _print_groups,
                    _print_measured):
        section(acct, out)
    for peak in peaks.values():
        _print_gate_peak(peak, out)
    out.print("conventions:")
    for line in FLOP_CONVENTIONS:
        out.print(f"  - {line}")
    if args.plot:
        out.print(f"plot: {literal(args.plot)}")
    out.print(f"rerun: {literal(rerun_command('account', args, *extra))}")


def _print_parameters(acct, out) -> None:
    """The analytic ledger, and the counts under each labelled convention."""
    p = acct.parameters
    table = Table(title="parameters (from the analytic ledger)")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    table.add_column("formula", overflow="fold")
    for comp in p.components:
        table.add_row(comp.name, f"{comp.count:,}", f"{comp.count / p.total:.1%}", comp.formula)
    table.add_row("total (unique: a tied weight once)", f"{p.total:,}", "100.0%", "", style="bold")
    out.print(table)
    tie_word = "tied" if p.tied else "untied"
    out.print(f"  without embeddings (token + position tables removed; an untied lm_head stays): "
              f"{p.non_embedding:,}")
    out.print(f"  without position embeddings only (nanoGPT convention): "
              f"{p.non_position_embedding:,}")
    out.print(f"  this config is {tie_word}; the same shape tied: {p.total_if_tied:,}, "
              f"untied: {p.total_if_untied:,} (+V*D)")
    cfg = acct.config
    if cfg.routed:
        out.print(f"  active per token: {p.active:,} ({p.active / p.total:.1%}: the "
                  f"{cfg.experts_per_token} of {cfg.n_experts} routed experts a token is sent to, "
                  "the router, shared experts, attention, norms, embeddings); routed experts in "
                  f"all: {p.routed_experts:,}")


def _print_memory(acct, out) -> None:
    """Weights per dtype, the AdamW training footprint, the activation estimate."""
    m = acct.memory
    table = Table(title=MEMORY_TITLE)
    table.add_column("what")
    table.add_column("bytes", justify="right")
    table.add_column("decimal", justify="right")
    table.add_column("binary", justify="right")
    table.add_column("formula")
    for dtype, n_bytes in m.weights.items():
        table.add_row(f"weights in {dtype}", *_sizes(n_bytes), f"{BYTES_PER_ELEMENT[dtype]} x P")
    table.add_section()
    for row in m.training:
        table.add_row(row.name, *_sizes(row.bytes), row.formula)
    table.add_row("training total", *_sizes(m.training_total), "16 x P", style="bold")
    table.add_section()
    for row in m.activations:
        table.add_row(row.name, *_sizes(row.bytes), row.formula)
    table.add_row("activations (an estimate)", *_sizes(m.activations_total), "", style="bold")
    out.print(table)
    out.print("activation estimate assumes:")
    for line in m.activation_assumptions:
        out.print(f"  - {line}")


def _print_gate_peak(peak: GatePeak, out) -> None:
    """The predicted peak resident memory of `decoder-audit verify`, term by term."""
    rank = f", per rank of {peak.world_size} (FSDP2)" if peak.world_size > 1 else ""
    table = Table(title=f"gate peak (verify) in {peak.dtype}{rank}: set by {peak.check}")
    table.add_column("term")
    table.add_column("bytes", justify="right")
    table.add_column("decimal", justify="right")
    table.add_column("binary", justify="right")
    table.add_column("formula", overflow="fold")
    for row in peak.rows:
        table.add_row(row.name, *_sizes(row.bytes), row.formula)
    table.add_row(f"predicted peak ({peak.check})", *_sizes(peak.total), "", style="bold")
    out.print(table)
    others = ", ".join(f"{name} {scaled(n_bytes)}" for name, n_bytes in peak.checks)
    out.print(f"  each check's peak: {others}")
    out.print("  an upper bound on a verify process's peak RSS (benchmarks/gate_peak.py); "
              "verify refuses a model whose figure exceeds the memory available")


def _print_matmuls(acct, out) -> None:
    """Every forward matrix multiply with its operands, runs and FLOPs."""
    B, T = acct.batch_size, acct.seq_len
    table = Table(title=f"forward matrix multiplies (B={B}, T={T}); FLOPs = runs x 2mnp")
    table.add_column("matmul")
    table.add_column("operands (m x n)(n x p)")
    table.add_column("runs", justify="right")
    table.add_column("FLOPs", justify="right")
    table.add_column("share", justify="right")
    for mm in acct.matmuls:
        table.add_row(mm.name, f"{mm.shape_formula}\n= {mm.operands}",
                      f"{mm.count:,} ({mm.count_formula})", f"{mm.flops:,}",
                      f"{mm.flops / acct.forward_flops:.1%}")
    table.add_row("total forward", "", "", f"{acct.forward_flops:,}", "100.0%", style="bold")
    out.print(table)


def _print_groups(acct, out) -> None:
    """FLOPs by group, the dominant terms, forward + backward."""
    table = Table(title="forward FLOPs by group")
    table.add_column("group")
    table.add_column("FLOPs", justify="right")
    table.add_column("share", justify="right")
    table.add_column("grows")
    table.add_column("closed form")
    for group in acct.groups:
        table.add_row(group.name, f"{group.flops:,}", f"{group.share:.1%}", group.scaling,
                      group.formula)
    out.print(table)
    out.print(f"[bold]total forward FLOPs: {acct.forward_flops:,}[/bold]  "
              f"(dominant: {', '.join(acct.dominant)})")
    out.print(f"forward + backward, estimated as 3 x forward: {acct.forward_backward_flops:,}")


def _print_measured(acct, out) -> None:
    """The FlopCounterMode cross-check on the meta device."""
    if acct.measured is None:
        out.print(f"measured: skipped ({literal(acct.measure_skipped or '--no-measure')})")
    else:
        meas = acct.measured
        ops = ", ".join(f"{op} {n:,}" for op, n in sorted(meas.by_op.items()))
        verdict = ("[green]equal to the analytic total[/green]" if meas.matches_analytic
                   else "[red]DIFFERS from the analytic count[/red]")
        out.print(f"measured: {meas.total:,} {verdict}")
        out.print(f"  how: {meas.path}")
        out.print(f"  by op: {ops}")
        out.print(f"  the plain forward (F.scaled_dot_product_attention) on meta counts "
                  f"{meas.sdpa_meta_total:,} (torch lowers it to the math path's bmm there; "
                  "on real CPU tensors the fused kernel is not counted)")
        for line in meas.differences:
            out.print(f"  [red]{line}[/red]")
