"""The results files: benchmark.json (every figure), benchmark.md (the tables) and profiles.md.

benchmark.md is a header, the ceiling, then one section per result family in the order of the
entry point's table (each section renders `results[key]` and returns [] when there is nothing to
show), then the total wall time.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from .profiles import profiles_markdown
from .store import runs_lines, skipped_lines, write_text

Section = Callable[[Any], list[str]]


def _ms(s: dict[str, float]) -> str:
    return f"{s['median'] * 1e3:.0f} ({s['min'] * 1e3:.0f}-{s['max'] * 1e3:.0f})"


def header(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    return [
        "# decoder-audit vs Hugging Face: CPU benchmark", "",
        f"Command: `{results['command']}`  ",
        f"Machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, {m['threads_used']} threads "
        f"used (both sides), CPU capability {m['cpu_capability']}; torch {m['torch']}, "
        f"transformers {m['transformers']}, Python {m['python']}; code at {m['git']}.  ",
        f"Load average at start: {', '.join(f'{x:.2f}' for x in m['load_average_at_start'])} "
        "(a shared machine: absolute numbers are noisy, the interleaved ratios are what count).  ",
        f"Repeats: {results['repeats']} timed after {results['warmup']} warm-up per side, "
        "interleaved; times are median (min-max) in ms."
        + (f" Budget: no row started after {results['budget']:g} s."
           if results.get("budget") is not None else "")
        + ("" if results.get("finished", True) else
           " **Still running, or stopped: the rows finished so far.**"), "",
        *runs_lines(results.get("runs", {}), [row for value in results.values()
                                              if isinstance(value, list) for row in value
                                              if isinstance(row, dict) and "label" in row]),
    ]


def ceiling_section(c: dict[str, Any]) -> list[str]:
    lines = ["## Ceiling: dense fp32 matmul", "",
             "| shape | GFLOP/s median (min-max) |", "|---|---|"]
    for s in c["shapes"]:
        g = s["gflops"]
        lines.append(f"| {s['shape']} | {g['median']:.1f} ({g['min']:.1f}-{g['max']:.1f}) |")
    return lines + ["", f"Ceiling used for MFU: {c['ceiling_gflops']:.1f} GFLOP/s "
                    f"({c['ceiling_shape']}).", ""]


def _row_line(r: dict[str, Any]) -> str:
    o, h, p = r["ours"], r["hf"], r["hf_over_ours_paired"]
    return (f"| {r['label']} | {_ms(o['seconds'])} | {_ms(h['seconds'])} | "
            f"**{r['hf_over_ours']:.2f}** ({p['min']:.2f}-{p['max']:.2f}) | "
            f"{r['hf_over_ours_best']:.2f} | {o['tokens_per_s']:.0f} | {h['tokens_per_s']:.0f} | "
            f"{o['achieved_gflops']:.1f} | {h['achieved_gflops']:.1f} | {o['mfu']:.0%} | "
            f"{h['mfu']:.0%} | {r['equality']['max_abs_logit_diff']:.1e} |")


def rows_section(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Our Decoder vs Hugging Face (same weights, logits checked equal first)", "",
             "| row | ours ms | HF ms | HF/ours medians (paired min-max) | HF/ours best | "
             "ours tok/s | HF tok/s | ours GFLOP/s | HF GFLOP/s | ours MFU | HF MFU | "
             "max logit diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row_line(r) for r in rows]
    ratios = [r["hf_over_ours"] for r in rows]
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    best = [r["hf_over_ours_best"] for r in rows]
    geo_best = statistics.geometric_mean(best) if best else float("nan")
    attention = rows[0]["equality"]["hf_attention"] if rows else "?"
    return lines + [
        "", f"HF/ours geometric mean over rows: **{geo:.2f}** from medians, {geo_best:.2f} "
        "from best-of times (>1 means ours is faster; tok/s, GFLOP/s and MFU use medians). "
        f"HF runs `{attention}` attention, `use_cache=False`, eval mode; "
        "forward+backward FLOPs = 3 x forward.", ""]


def memory_section(memory: list[dict[str, Any]]) -> list[str]:
    if not memory:
        return []
    lines = ["## Peak memory, forward + backward (fresh process per side)", "",
             "| config | side | peak RSS MiB | RSS before steps MiB | step peak over it MiB | "
             "params MiB |", "|---|---|---|---|---|---|"]
    for mem in memory:
        for side in ("ours", "hf"):
            s = mem[side]
            lines.append(
                f"| {mem['config']} B={mem['batch']} T={mem['seq_len']} | {side} | "
                f"{s['peak_rss_mb']:.0f} | {s['rss_before_steps_mb']:.0f} | "
                f"{s['step_peak_over_rss_before_mb']:.0f} | {s['parameters_mb']:.0f} |")
    return lines + ["", "HF peak / our peak: " + ", ".join(
        f"{m['config']} {m['hf_over_ours_peak']:.2f}" for m in memory), ""]


def _gate_equivalents(g: dict[str, Any]) -> list[str]:
    """The table of the gate's cost in forward-equivalents, four ways and the gate's own."""
    return [
        "| measure | forward-equivalents |", "|---|---|",
        f"| tokens / tokens of the largest pass | {g['forward_equivalents_tokens']:.1f} |",
        f"| tokens / one max-length sequence (B=1, T={g['max_seq_len']}) | "
        f"{g['forward_equivalents_max_len']:.1f} |",
        f"| audit time / fp32 forward at the largest shape "
        f"({g['forward_seconds_largest_fp32'] * 1e3:.0f} ms) | "
        f"{g['forward_equivalents_time_fp32']:.1f} |",
        f"| audit time / fp64 forward at the largest shape "
        f"({g['forward_seconds_largest_fp64'] * 1e3:.0f} ms; the gate's working dtype) | "
        f"{g['forward_equivalents_time_fp64']:.1f} |",
        f"| the gate's own cost line (tokens / max_seq_len) | "
        f"{g['gate_report_cost']['forward_equivalents']} |", ""]


def gate_section(g: dict[str, Any]) -> list[str]:
    if not g:
        return []
    if "pending" in g:
        return ["## The gate's cost", "", f"Pending: {g['pending']}", ""]
    lines = [
        f"## The gate's cost on {g['preset']}", "",
        f"`da.audit` passed={g['passed']} in {g['seconds']:.1f} s; {g['decoder_passes']} "
        f"Decoder passes, {g['tokens']:,} tokens; largest pass B={g['largest_pass']['batch']} "
        f"T={g['largest_pass']['seq_len']}.", ""]
    lines += _gate_equivalents(g)
    lines += [f"The oracle (float64, per-head loops) processed {g['oracle_tokens']} tokens on top.",
              "", "| gate step | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.1f} |" for name, sec in g["seconds_by_step"].items()]
    return lines + ["", "Decoder passes by shape: " + ", ".join(
        f"{k} x{v}" for k, v in g["passes_by_shape"].items()), ""]


def account_section(a: dict[str, Any]) -> list[str]:
    if not a:
        return []
    return ["## Accounting", "", f"`{a['command']}`: {a['seconds']:.1f} s wall, peak RSS "
            f"{a['peak_rss_mb']:.0f} MiB (fresh process, imports included).", ""]


def markdown(results: dict[str, Any], sections: Sequence[tuple[str, Section]]) -> str:
    """benchmark.md: the header and ceiling, then `section(results[key])` for each (key, section)
    whose key the run produced, then the total wall time."""
    lines = header(results) + ceiling_section(results["ceiling"])
    for key, section in sections:
        if key in results:
            lines += section(results[key])
    lines += skipped_lines(results.get("skipped", []))
    lines.append(f"Total benchmark wall time: {results['wall_seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def write(out: Path, results: dict[str, Any], sections: Sequence[tuple[str, Section]]) -> str:
    """Write the three files under `out` (created if missing; each moved over its name whole,
    `store.write_text`); returns benchmark.md's text."""
    write_text(out / "benchmark.json", json.dumps(results, indent=2) + "\n")
    report = markdown(results, sections)
    write_text(out / "benchmark.md", report)
    write_text(out / "profiles.md", profiles_markdown(results))
    return report
