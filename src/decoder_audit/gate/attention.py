"""`attention_rows`: every attention pattern is finite, sums to 1 over its keys, and puts exactly
0 on future keys, also with the query and key projections scaled up until a finite mask constant
would be beaten (DEFECTS.md #10).

Patterns come from our trace (`run_with_trace`) or from a Hugging Face model's
`output_attentions=True`.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from . import tolerances
from .result import CheckResult, skipped
from .subject import Subject, batch_not_equal, get_attr

# Attention pictures keep at most this many positions per side.
PICTURE_LEN = 16


def _patterns(s: Subject, module: nn.Module,
              ids: torch.Tensor) -> tuple[list[torch.Tensor] | None, list[float] | None]:
    """Attention patterns (B, H, T, T) per layer, from our trace or a Hugging Face model's
    `output_attentions` (None when the model exposes none), and the largest |score| per layer
    (trace only)."""
    if s.has_trace:
        _, trace = module.run_with_trace(ids.to(s.device))
        s.count(ids)
        layers = sorted({int(n.split(".")[1]) for n in trace if n.endswith(".attn.pattern")})
        scores = [float(trace[f"layers.{i}.attn.scores"].abs().max())
                  if f"layers.{i}.attn.scores" in trace else None for i in layers]
        return [trace[f"layers.{i}.attn.pattern"] for i in layers], scores
    try:
        with torch.no_grad():
            out = module(ids.to(s.device), output_attentions=True)
    except Exception:
        return None, None
    s.count(ids)
    attentions = getattr(out, "attentions", None)
    if not attentions or not all(isinstance(a, torch.Tensor) and a.dim() == 4 for a in attentions):
        return None, None
    return list(attentions), None


def _judge_patterns(patterns: list[torch.Tensor], seq_len: int) -> tuple[list[dict], list[str]]:
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    records, problems = [], []
    for layer, pattern in enumerate(patterns):
        pattern = pattern.detach().cpu()
        tol = tolerances.row_sum(pattern.dtype, seq_len)
        for head in range(pattern.shape[1]):
            p = pattern[:, head].double()  # (B, T, T)
            finite = bool(torch.isfinite(p).all())
            row_err = (p.sum(-1) - 1).abs().nan_to_num(float("inf"))  # (B, T)
            on_future = p.masked_select(future.expand_as(p))
            future_max = float(on_future.abs().nan_to_num(float("inf")).max()) if on_future.numel() else 0.0
            rec = {"layer": layer, "head": head, "finite": finite,
                   "max_row_sum_error": float(row_err.max()),
                   "max_future_probability": future_max, "row_sum_tolerance": tol}
            records.append(rec)
            if not finite:
                rows = sorted({int(t) for t in (~torch.isfinite(p)).any(-1).nonzero()[:, 1]})
                problems.append(f"layer {layer} head {head}: non-finite probabilities in rows "
                                f"{rows[:8]} (a row with every key masked?)")
            elif future_max > tolerances.FUTURE_PROBABILITY:
                bad = (p * future).amax(0).nonzero()[0].tolist()
                problems.append(f"layer {layer} head {head}: probability {future_max:.3g} on a "
                                f"future key (row {bad[0]}, key {bad[1]}); masked keys must get "
                                "exactly 0")
            elif float(row_err.max()) > tol:
                problems.append(f"layer {layer} head {head}: a row sums to 1 +- "
                                f"{float(row_err.max()):.3g} (allowed {tol:.1e})")
    return records, problems


def _stressed_copy(s: Subject, score_max: list[float | None] | None) -> nn.Module | None:
    """A copy of the working model whose query and key projections (weights and biases) are
    each scaled by a = sqrt(STRESS_SCORE / max |score|), so every layer's largest attention score
    grows by a^2 to about STRESS_SCORE. A finite mask constant is then beaten; -inf is not
    (DEFECTS.md #10)."""
    if s.cfg is None or s.in_place or not score_max or any(m is None for m in score_max):
        return None
    stressed = copy.deepcopy(s.work)
    with torch.no_grad():
        for i, largest in enumerate(score_max):
            q, k = get_attr(stressed, f"layers.{i}.attn.q_proj"), get_attr(stressed, f"layers.{i}.attn.k_proj")
            if not isinstance(q, nn.Module) or not isinstance(k, nn.Module):
                return None
            factor = math.sqrt(tolerances.STRESS_SCORE / max(largest, 1e-12))
            for proj in (q, k):
                for param in proj.parameters(recurse=False):
                    param.mul_(factor)
    return stressed


def check_attention_rows(s: Subject) -> CheckResult:
    seq_len = s.short_len(PICTURE_LEN)
    batch = batch_not_equal(seq_len, (2, 3))
    ids = s.random_ids(batch, seq_len, s.generator(9))
    patterns, score_max = _patterns(s, s.work, ids)
    if patterns is None:
        return skipped("attention_rows", "black-box model exposes no attention patterns "
                       "(neither our trace nor output_attentions)")
    records, problems = _judge_patterns(patterns, seq_len)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(patterns[0].dtype),
                      "heads": records}
    arrays = {"patterns": [p[0].detach().cpu().double().numpy() for p in patterns], "ids": ids[0].tolist()}
    stressed = _stressed_copy(s, score_max) if not problems else None
    if stressed is not None:
        stressed_patterns, _ = _patterns(s, stressed, ids)
        stress_records, stress_problems = _judge_patterns(stressed_patterns, seq_len)
        evidence["stressed"] = {
            "how": f"q_proj and k_proj scaled so attention scores reach ~{tolerances.STRESS_SCORE:.0e}",
            "max_future_probability": max(r["max_future_probability"] for r in stress_records),
            "all_finite": all(r["finite"] for r in stress_records),
        }
        problems += [f"under scaled-up Q/K: {p}" for p in stress_problems]
        del stressed
    n_heads = len(records)
    if problems:
        result = CheckResult("attention_rows", False, problems[0], evidence,
                             tolerances.FUTURE_PROBABILITY)
    else:
        stress = " (also under Q/K scaled to scores ~1e6)" if "stressed" in evidence else ""
        worst = max(r["max_row_sum_error"] for r in records)
        result = CheckResult("attention_rows", True, f"{n_heads} layer-heads: finite, rows sum to 1 "
                             f"(worst error {worst:.1e}), exactly 0 on future keys{stress}",
                             evidence, tolerances.FUTURE_PROBABILITY)
    result.arrays = arrays
    return result


