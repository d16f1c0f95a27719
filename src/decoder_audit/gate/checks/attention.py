"""`attention_rows`: every attention pattern is finite, sums to 1 over its keys, and puts exactly
0 on future keys, also with the query and key projections scaled up until a finite mask constant
would be beaten (DEFECTS.md #10).

Patterns come from our trace (`run_with_trace`) or from a model's `output_attentions=True`
(Hugging Face). What a model hands back there is judged for what it is (DEFECTS.md #28):

- The path. A Hugging Face model that runs a fused kernel by default (`sdpa`, which returns no
  weights) is switched to its eager attention for this check and switched back afterwards; the
  report names the path whose patterns were judged, and the verdict `causal` gave the plain
  forward, so a leak in the `output_attentions` path alone is reported as that.
- Attention sinks. A model that declares sinks in its weights (a parameter named `sinks`, a
  learned logit per head that takes part in every softmax row and is then dropped) has rows
  that sum to less than 1 by design: they may, but never to more than 1, and future keys still
  get exactly 0. Our trace says each row's sink share (`layers.{i}.attn.sink`, attn_sinks):
  the visible keys plus that share must sum to 1, so a row short of it is still found.
- More keys than queries. A pattern (B, H, T, T + k) carries k extra keys (memory or sink keys);
  the future is judged with the extra keys first or last, whichever maps keys to positions; a
  key axis that does not follow T is judged by its rows only, and the report says why.
- Not a pattern. A tensor whose query axis does not follow the input length (a linear-attention
  layer's (B, H, d, d) state) is recognised by probing a second length and skipped with the
  reason, never judged as probabilities.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .. import tolerances
from ..measure import batch_not_equal
from ..result import CheckResult
from ..subject import Subject

# Attention pictures keep at most this many positions per side.
PICTURE_LEN = 16
# A parameter or buffer with a dotted part named like this is (or computes) a learned sink:
# `self_attn.sinks` (a logit per head), `sink_proj.weight` (a logit per token and head).
_SINK_NAME = re.compile(r"(^|_)sinks?($|_)")


@dataclass
class _Layer:
    """One entry of a model's attention outputs, classified before anything is judged."""

    index: int
    pattern: torch.Tensor | None  # (B, H, T, S) when it is a pattern, else None
    extra_keys: int | None = None  # S - T when the key axis follows T, None when it does not
    why_not: str = ""  # why it is not judged as a pattern (when pattern is None)


def declared_sinks(model: nn.Module) -> list[str]:
    """Names of the parameters and buffers that declare attention sinks (e.g. GPT-OSS's
    `self_attn.sinks`, Inkling's `self_attn.sink_proj.weight`)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, _ in named
            if any(_SINK_NAME.search(part.lower()) for part in name.split("."))]


@contextmanager
def _eager_attention(model: nn.Module):
    """Within the block a Hugging Face model computes attention on its eager path, the one whose
    weights `output_attentions` can return; its own implementation is restored afterwards (the
    same weights: nothing is copied). Yields (path, default): the path checked and the model's
    own (None when the model has no such switch)."""
    config = getattr(model, "config", None)
    own = getattr(config, "_attn_implementation", None)
    setter = getattr(model, "set_attn_implementation", None)
    if own in (None, "eager") or not callable(setter):
        yield (own or "the model's own"), own
        return
    try:
        setter("eager")
    except Exception:  # noqa: BLE001 - a model without an eager path: use its own
        yield own, own
        return
    try:
        yield "eager", own
    finally:
        setter(own)


def _attention_outputs(s: Subject, ids: torch.Tensor) -> list | None:
    """The model's `output_attentions=True` tuple for ids, or None when it gives none."""
    try:
        with torch.no_grad():
            out = s.forward(ids.to(s.device), output_attentions=True)
    except Exception:  # noqa: BLE001 - a model that takes no such argument exposes nothing
        return None
    s.count(ids)
    attentions = getattr(out, "attentions", None)
    if isinstance(attentions, torch.Tensor):
        attentions = [attentions]
    if not isinstance(attentions, (tuple, list)) or not attentions:
        return None
    return list(attentions)


def _second_length(s: Subject, seq_len: int) -> int | None:
    """Another length to probe with, to tell a pattern (whose axes follow T) from a state."""
    if seq_len + 1 <= s.probe_max:
        return seq_len + 1
    return seq_len - 1 if seq_len > 1 else None


def _classify(first: list, second: list | None, batch: int, seq_len: int,
              other_len: int | None) -> list[_Layer]:
    """Which entries are attention patterns (see the module docstring)."""
    layers = []
    for i, a in enumerate(first):
        b = second[i] if second is not None and i < len(second) else None
        if not isinstance(a, torch.Tensor):
            layers.append(_Layer(i, None, why_not=f"layer {i} returned {type(a).__name__}, "
                                                  "no pattern"))
            continue
        shape = tuple(a.shape)
        if a.dim() != 4 or shape[0] != batch or shape[2] != seq_len:
            layers.append(_Layer(i, None, why_not=f"layer {i}: {shape} is not a pattern "
                                                  f"(B={batch}, H, T={seq_len}, keys)"))
            continue
        if isinstance(b, torch.Tensor) and other_len is not None and (
                b.dim() != 4 or b.shape[2] != other_len):
            layers.append(_Layer(i, None, why_not=(
                f"layer {i}: {shape} at T={seq_len} but {tuple(b.shape)} at T={other_len}: its "
                "query axis does not follow the input length, so it is a state, not a pattern")))
            continue
        extra = shape[3] - seq_len
        if isinstance(b, torch.Tensor) and other_len is not None and b.shape[3] - other_len != extra:
            extra = None  # the key axis does not grow with T: keys are not one per position
        elif extra < 0:
            extra = None
        layers.append(_Layer(i, a.detach(), extra))
    return layers


def _patterns(s: Subject, ids: torch.Tensor) -> tuple[list[torch.Tensor], list[float | None],
                                                     list[torch.Tensor | None]]:
    """Attention patterns (B, H, T, T) per layer from our trace, the largest |score| per layer
    (for the stressed run), and each layer's sink share per row (B, H, T) where the config has
    attention sinks (None elsewhere)."""
    _, trace = s.trace(ids)
    layers = sorted({int(n.split(".")[1]) for n in trace if n.endswith(".attn.pattern")})
    scores = [float(trace[f"layers.{i}.attn.scores"].abs().max())
              if f"layers.{i}.attn.scores" in trace else None for i in layers]
    sinks = [trace.get(f"layers.{i}.attn.sink") for i in layers]
    return [trace[f"layers.{i}.attn.pattern"] for i in layers], scores, sinks


def _future_mask(seq_len: int, keys: int, extra_first: bool) -> torch.Tensor:
    """(T, S) bool: key j is in query i's future. With k = S - T extra keys first, key j is
    position j - k; with them last, key j < T is position j and the extra keys are visible."""
    extra = keys - seq_len
    rows = torch.arange(seq_len)[:, None]
    cols = torch.arange(keys)[None, :]
    if extra_first:
        return cols - extra > rows
    return (cols > rows) & (cols < seq_len)


def _judge_patterns(patterns: list[torch.Tensor], seq_len: int, *, sinks: bool = False,
                    extra_keys: list[int | None] | None = None, layer_ids: list[int] | None = None,
                    sink_shares: list[torch.Tensor | None] | None = None
                    ) -> tuple[list[dict], list[str]]:
    """Records per (layer, head) and the problems found. `sinks`: rows may sum to less than 1
    (sinks a model declares but whose share it does not say). `extra_keys[i]`: S - T for
    pattern i (None: the key axis does not map to positions, so the future is not judged).
    `sink_shares[i]` (B, H, T): the share of each row a declared sink took (our trace), added to
    the row's sum, which must then be 1."""
    records, problems = [], []
    for n, pattern in enumerate(patterns):
        layer = layer_ids[n] if layer_ids is not None else n
        pattern = pattern.detach().cpu()
        keys = pattern.shape[-1]
        extra = (keys - seq_len) if extra_keys is None else extra_keys[n]
        p_all = pattern.double()  # (B, H, T, S)
        share = None if sink_shares is None or sink_shares[n] is None else \
            sink_shares[n].detach().cpu().double()  # (B, H, T)
        tol = tolerances.row_sum(pattern.dtype, keys + (share is not None))
        future, layout = _layout(p_all, seq_len, extra)
        for head in range(pattern.shape[1]):
            p = p_all[:, head]  # (B, T, S)
            if share is not None:  # the sink as one more key, which no position owns
                p = torch.cat((p, share[:, head, :, None]), dim=-1)  # (B, T, S + 1)
            finite = bool(torch.isfinite(p).all())
            sums = p.sum(-1).nan_to_num(float("inf"))  # (B, T)
            row_err = (sums - 1).abs()
            if future is not None:
                on_future = p[..., :keys].masked_select(future.expand(p.shape[0], -1, -1))
                future_max = (float(on_future.abs().nan_to_num(float("inf")).max())
                              if on_future.numel() else 0.0)
            else:
                future_max = 0.0
            rec = {"layer": layer, "head": head, "finite": finite,
                   "max_row_sum_error": float(row_err.max()), "min_row_sum": float(sums.min()),
                   "max_row_sum": float(sums.max()), "max_future_probability": future_max,
                   "row_sum_tolerance": tol, "keys": keys, "key_layout": layout}
            if share is not None:
                rec["max_sink_share"] = float(p[..., -1].nan_to_num(float("inf")).max())
            records.append(rec)
            problem = _head_problem(p, rec, future, sinks, tol)
            if problem:
                problems.append(f"layer {layer} head {head}: {problem}")
    return records, problems


def _layout(p: torch.Tensor, seq_len: int, extra: int | None) -> tuple[torch.Tensor | None, str]:
    """The future mask for patterns (B, H, T, S) and a description of how keys map to
    positions. Extra keys are taken to come first or last, whichever puts no probability on a
    future key; if neither does, first (the key-value cache convention: the last T keys are the
    T positions), so the leak is reported."""
    keys = p.shape[-1]
    if extra is None:
        return None, (f"{keys} keys for T={seq_len} that do not grow with T: the key axis is not "
                      "one key per position, so only finiteness and row sums are judged")
    if extra == 0:
        return _future_mask(seq_len, keys, True), "one key per position"
    masks = [(_future_mask(seq_len, keys, first), first) for first in (True, False)]
    for mask, first in masks:
        if not bool((p.nan_to_num(1.0) * mask).abs().amax() > 0):
            where = "first" if first else "last"
            return mask, f"{extra} extra keys ({where}), then one key per position"
    return masks[0][0], f"{extra} extra keys (taken first: no layout keeps the future at 0)"


def _head_problem(p: torch.Tensor, rec: dict, future: torch.Tensor | None, sinks: bool,
                  tol: float) -> str | None:
    if not rec["finite"]:
        rows = sorted({int(t) for t in (~torch.isfinite(p)).any(-1).nonzero()[:, 1]})
        return f"non-finite probabilities in rows {rows[:8]} (a row with every key masked?)"
    if rec["max_future_probability"] > tolerances.FUTURE_PROBABILITY:
        bad = (p[..., :future.shape[-1]] * future).amax(0).nonzero()[0].tolist()
        return (f"probability {rec['max_future_probability']:.3g} on a future key (row {bad[0]}, "
                f"key {bad[1]}); masked keys must get exactly 0")
    if bool((p < 0).any()):
        return f"negative probability {float(p.min()):.3g}"
    if sinks:
        if rec["max_row_sum"] > 1 + tol:
            return (f"a row sums to {rec['max_row_sum']:.6g} > 1 (allowed 1 + {tol:.1e}; sinks "
                    "only take mass away)")
        return None
    if rec["max_row_sum_error"] > tol:
        return f"a row sums to 1 +- {rec['max_row_sum_error']:.3g} (allowed {tol:.1e})"
    return None


def _judge_stressed(patterns: list[torch.Tensor], seq_len: int, dtype: torch.dtype,
                    evidence: dict, sink_shares: list[torch.Tensor | None]) -> list[str]:
    records, problems = _judge_patterns(patterns, seq_len, sink_shares=sink_shares)
    evidence["stressed"] = {
        "how": f"q_proj and k_proj outputs scaled so attention scores reach "
               f"~{tolerances.stress_score(dtype):.0e}",
        "max_future_probability": max(r["max_future_probability"] for r in records),
        "all_finite": all(r["finite"] for r in records),
    }
    return [f"under scaled-up Q/K: {p}" for p in problems]


def check_attention_rows(s: Subject) -> CheckResult:
    ids, batch, seq_len = _probe_ids(s)
    if s.has_trace:
        return _check_traced(s, ids, seq_len, batch)
    return _check_exposed(s, ids, seq_len, batch)


def _check_traced(s: Subject, ids: torch.Tensor, seq_len: int, batch: int) -> CheckResult:
    """Our trace: the eager path `run_with_trace` records, then the stressed run. A layer with
    attention sinks records each row's sink share (layers.{i}.attn.sink): its visible keys and
    that share together sum to 1."""
    patterns, score_max, shares = _patterns(s, ids)
    records, problems = _judge_patterns(patterns, seq_len, sink_shares=shares)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(patterns[0].dtype),
                      "path": "trace", "heads": records}
    sunk = [i for i, share in enumerate(shares) if share is not None]
    if sunk:
        evidence["sinks"] = (f"layers {sunk} have attention sinks: each row's visible keys sum "
                             "to 1 less the sink's share (layers.{i}.attn.sink), judged with it")
    arrays = {"patterns": [p[0].detach().cpu().double().numpy() for p in patterns], "ids": ids[0].tolist()}
    del patterns
    if not problems:
        # DEFECTS.md #10: with every layer's largest score brought to ~1e6, a finite mask
        # constant is beaten; -inf is not.
        with s.scaled_scores(score_max, tolerances.stress_score(s.dtype)) as stressed:
            if stressed:
                stressed_patterns, _, stressed_shares = _patterns(s, ids)
        if stressed:
            problems += _judge_stressed(stressed_patterns, seq_len, s.dtype, evidence,
                                        stressed_shares)
    n_heads = len(records)
    if problems:
        result = CheckResult("attention_rows", False, problems[0], evidence,
                             tolerances.FUTURE_PROBABILITY)
    else:
        stress = (f" (also under Q/K scaled to scores ~{tolerances.stress_score(s.dtype):.0e})"
                  if "stressed" in evidence else "")
        worst = max(r["max_row_sum_error"] for r in records)
        with_sinks = " with the sinks' share" if sunk else ""
        result = CheckResult("attention_rows", True, f"{n_heads} layer-heads: finite, rows sum to 1"
                             f"{with_sinks} (worst error {worst:.1e}), exactly 0 on future keys"
                             f"{stress}", evidence, tolerances.FUTURE_PROBABILITY)
    result.arrays = arrays
    return result


def _probe_ids(s: Subject) -> tuple[torch.Tensor, int, int]:
    """The ids the check reads patterns of, (B, T), and B, T."""
    seq_len = s.short_len(PICTURE_LEN)
    batch = batch_not_equal(seq_len, (2, 3))
    return s.random_ids(batch, seq_len, s.generator(9)), batch, seq_len


def _exposed(s: Subject, ids: torch.Tensor, seq_len: int, batch: int
             ) -> tuple[list[_Layer] | None, str, str | None, int | None]:
    """`output_attentions=True` (Hugging Face), on the eager path, at two lengths: (the layers
    classified, or None when it returned nothing; the path; the model's own; the second T)."""
    other_len = _second_length(s, seq_len)
    with _eager_attention(s.work) as (path, own):
        first = _attention_outputs(s, ids)
        second = None
        if first is not None and other_len is not None:
            second = _attention_outputs(s, s.random_ids(batch, other_len, s.generator(10)))
    if first is None:
        return None, path, own, other_len
    return _classify(first, second, batch, seq_len, other_len), path, own, other_len


def probe_attention(s: Subject) -> tuple[str | None, str]:
    """Where this model's attention patterns can be read (a fact, found before the checks):
    ("trace", "") for ours, ("output_attentions", "") when that returns a pattern at the
    check's lengths, else (None, why not)."""
    if s.has_trace:
        return "trace", ""
    ids, batch, seq_len = _probe_ids(s)
    layers, path, _, _ = _exposed(s, ids, seq_len, batch)
    if layers is None:
        where = path if path.startswith("the ") else f"its {path}"  # "the model's own", "eager"
        return None, ("the model exposes no attention patterns (neither our trace nor "
                      f"output_attentions=True on {where} path)")
    if all(layer.pattern is None for layer in layers):
        return None, ("output_attentions=True returned no attention pattern: "
                      + "; ".join(layer.why_not for layer in layers[:3]))
    return "output_attentions", ""


def _check_exposed(s: Subject, ids: torch.Tensor, seq_len: int, batch: int) -> CheckResult:
    """The patterns `output_attentions=True` returns (the facts say it returns some)."""
    layers, path, own, other_len = _exposed(s, ids, seq_len, batch)
    judged = [layer for layer in layers if layer.pattern is not None]
    not_patterns = [layer.why_not for layer in layers if layer.pattern is None]
    sinks = declared_sinks(s.work)
    records, problems = _judge_patterns([layer.pattern for layer in judged], seq_len,
                                        sinks=bool(sinks),
                                        extra_keys=[layer.extra_keys for layer in judged],
                                        layer_ids=[layer.index for layer in judged])
    where = _path_text(path, own)
    plain = _plain_verdict(s, path, own, failed=bool(problems))
    evidence: dict = {"batch": batch, "seq_len": seq_len, "second_seq_len": other_len,
                      "dtype": str(judged[0].pattern.dtype), "path": path, "default_path": own,
                      "path_checked": where, "plain_forward": plain, "sinks": sinks,
                      "not_patterns": not_patterns, "heads": records}
    arrays = {"patterns": [layer.pattern[0].cpu().double().numpy() for layer in judged],
              "ids": ids[0].tolist()}
    if problems:
        detail = f"{problems[0]}, in {where}"
        if plain:
            detail += f"; {plain}"
        result = CheckResult("attention_rows", False, detail, evidence,
                             tolerances.FUTURE_PROBABILITY)
    else:
        result = CheckResult("attention_rows", True, _passed_text(records, sinks, not_patterns,
                                                                   where, plain),
                             evidence, tolerances.FUTURE_PROBABILITY)
    result.arrays = arrays
    return result


def _path_text(path: str, own: str | None) -> str:
    if own is not None and own != path:
        return (f"the path output_attentions=True takes ({path} attention, switched from the "
                f"model's default {own} for this check and back)")
    return f"the path output_attentions=True takes ({path} attention)"


def _plain_verdict(s: Subject, path: str, own: str | None, *, failed: bool) -> str:
    """What `causal` said of the plain forward, which may run another path than the one judged
    here: so a leak in the output_attentions path alone is reported as that (`failed`: this
    check found one; a passing check speaks of no leak)."""
    causal = s.results.get("causal")
    if causal is None or causal.skipped:
        return ""
    plain = f"the plain forward ({own or 'its own'} attention)"
    if causal.passed:
        alone = " so the leak is in this path only" if failed and path != own else ""
        return f"{plain} already passed `causal`,{alone}".rstrip(",")
    return f"{plain} fails `causal` too"


def _passed_text(records: list[dict], sinks: list[str], not_patterns: list[str], where: str,
                 plain: str) -> str:
    heads = len(records)
    if sinks:
        low = min(r["min_row_sum"] for r in records)
        rows = (f"rows sum to at most 1 (attention sinks declared by {sinks[0]}"
                f"{f' and {len(sinks) - 1} more' if len(sinks) > 1 else ''} take the rest; "
                f"lowest row sum {low:.3g})")
    else:
        rows = f"rows sum to 1 (worst error {max(r['max_row_sum_error'] for r in records):.1e})"
    layouts = sorted({r["key_layout"] for r in records if r["key_layout"] != "one key per position"})
    text = f"{heads} layer-heads from {where}: finite, {rows}, exactly 0 on future keys"
    if layouts:
        text += f"; keys: {'; '.join(layouts)}"
    if not_patterns:
        text += f"; not judged: {'; '.join(not_patterns[:2])}"
    if plain:
        text += f"; {plain}"
    return text
