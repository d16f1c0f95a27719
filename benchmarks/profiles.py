"""torch.profiler tables of both sides of a row (top ops by self CPU time), and profiles.md."""

from __future__ import annotations

from typing import Any, Callable


def profile_table(fn: Callable[[], None], steps: int, rows: int = 15
                  ) -> tuple[str, list[dict[str, Any]]]:
    """torch.profiler over `steps` steps (several, so one preempted step weighs less): the table
    of top ops by self CPU time, and the same as data (times are totals over the steps)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages) or 1.0
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    data = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "self_share": e.self_cpu_time_total / total} for e in top]
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40)
    return table, data


def profile_sides(steps_by_side: dict[str, Callable[[], None]], steps: int
                  ) -> dict[str, dict[str, Any]]:
    """A row's "profile" entry: {side: {"table": text, "top_ops": data}} for each side."""
    out = {}
    for side, fn in steps_by_side.items():
        table, data = profile_table(fn, steps=steps)
        out[side] = {"table": table, "top_ops": data}
    return out


def profiles_markdown(results: dict[str, Any]) -> str:
    """profiles.md: every profile the rows carry, one section per row and side."""
    m = results["machine"]
    lines = ["# Profiles: top ops by self CPU time (three steps after the timed repeats)", "",
             f"torch {m['torch']}, {m['threads_used']} threads.", ""]
    for r in results.get("rows", []):
        for side, profile in r.get("profile", {}).items():
            lines += [f"## {r['label']}: {side}", "", "```", profile["table"].rstrip(), "```", ""]
    return "\n".join(lines)
