"""`kv_cache`: cached decoding equals the full forward at every position, through every cache a
generation run may use (DEFECTS.md H25):

  the model's own cache   prefill + one-token steps and chunks, for several prompt lengths (the
                          seeds' prefix equivalence applied to the cache: positions after the
                          prefill, a dropped cache entry, a bottom-right mask);
  caches the caller builds  the ones `generate` builds and hands in: ours pre-sized past the
                          prompt; a Hugging Face model's DynamicCache, StaticCache pre-sized to
                          twice the prompt, and (before transformers 5, for a windowed config)
                          SlidingWindowCache and HybridCache (`references.hf_caches`); each
                          in one-token steps and in chunks of several tokens after a prefill,
                          then, where it has `reset()`, reset and reused for a second prompt,
                          which must decode as if the cache were new. A model that raises
                          on the prefill into one does not take that cache (MiniMax keeps its
                          own): noted, not failed, since nothing decodes wrongly in silence;
  batch independence      row 0's cached logits are the same beside other rows as beside
                          different ones (a cache indexed by the wrong row mixes them).

It drives the model exactly as `decoder_audit.generate` does (its `Stepper`).
"""

from __future__ import annotations

from typing import Any

import torch

from ...generation.convention import Stepper
from ...references.hf_caches import caller_caches, slots_kept
from ..measure import batch_not_equal, scaled_excess
from ..result import CheckResult
from ..subject import Subject

# Tokens the cache probes cover (capped by max_seq_len): a decode step reads every weight, so
# the cost is in calls, not tokens; 16 positions give every schedule several steps.
KV_LEN = 16


def _schedules(seq_len: int) -> list[tuple[str, list[int]]]:
    """Chunk sizes that cover 0..T-1: (description, [prefill, step, step, ...])."""
    if seq_len < 2:
        return []
    half = seq_len // 2
    growing, done, size = [1], 1, 2
    while done < seq_len:
        growing.append(min(size, seq_len - done))
        done, size = done + growing[-1], size + 1
    candidates = [
        (f"prefill {half}, then one token at a time", [half] + [1] * (seq_len - half)),
        ("prefill 1, then chunks of 2, 3, ...", growing),
        (f"prefill {seq_len - 1}, then the last token", [seq_len - 1, 1]),
    ]
    unique, seen = [], set()
    for name, sizes in candidates:
        if tuple(sizes) not in seen:
            seen.add(tuple(sizes))
            unique.append((name, sizes))
    return unique


def _step_kind(sizes: list[int], call: int) -> str:
    if call == 0:
        return f"the prefill of {sizes[0]}"
    past = sum(sizes[:call])
    return (f"a one-token step after {past} cached" if sizes[call] == 1
            else f"a chunk of {sizes[call]} after {past} cached")


def _decode(s: Subject, ids: torch.Tensor, sizes: list[int], cache: Any = None,
            stepper: Stepper | None = None) -> torch.Tensor:
    """Logits (B, T, V) of ids (B, T) fed in chunks of `sizes` through one Stepper (a new one
    holding `cache`, or the one given)."""
    stepper = stepper or Stepper(s.work, s.convention, ids.shape[0], capacity=ids.shape[1],
                                 cache=cache)
    pieces, start = [], 0
    with torch.no_grad():
        for size in sizes:
            chunk = ids[:, start:start + size]
            s.count(chunk)
            try:
                pieces.append(stepper(chunk))
            except Exception as exc:
                if cache is not None and not pieces:  # the prefill: a cache it does not take
                    raise _Refused(f"{type(exc).__name__}: {exc}"[:200]) from exc
                raise
            start += size
    return torch.cat(pieces, 1)


class _Refused(Exception):
    """The model raised on the prefill into a caller's cache: it does not take that kind of
    cache (it says so loudly, as generate would hear it), which is not a decoding defect."""


def _compare(label: str, sizes: list[int], cached: torch.Tensor, full: torch.Tensor,
             tol: float) -> tuple[dict, str]:
    """(record, failure or "") of cached logits (B, T, V) against the full forward's."""
    worst, allowed = scaled_excess(cached - full, full, tol)
    moved = (cached - full).abs().amax((0, 2))  # (T,)
    bad = [int(t) for t in (~(moved <= allowed)).nonzero().flatten()]
    record = {"schedule": label, "sizes": sizes, "max_abs_diff": worst, "allowed": allowed,
              "positions_differing": bad}
    if not bad:
        return record, ""
    call = next(i for i, end in enumerate(torch.tensor(sizes).cumsum(0).tolist()) if bad[0] < end)
    return record, (f"{label}: position {bad[0]} ({_step_kind(sizes, call)}) differs from the "
                    f"full forward by up to {worst:.3g} (allowed {allowed:.1e}); {len(bad)} of "
                    f"{full.shape[1]} positions differ")


def _callers(s: Subject, batch: int, seq_len: int) -> tuple[list, list[str]]:
    """(name, build) of each cache a caller builds for this model, and notes."""
    if s.convention.name == "decoder":
        return [(f"a KVCache pre-sized to {2 * seq_len} slots",
                 lambda: s.work.new_cache(batch, 2 * seq_len))], []
    if s.facts.hugging_face:
        return caller_caches(s.work, batch, seq_len)
    return [], []


def check_kv_cache(s: Subject) -> CheckResult:
    seq_len = s.short_len(KV_LEN)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(21)
    ids = s.random_ids(batch, seq_len, gen).to(s.device)
    tol = s.shape_tolerance()
    schedules = _schedules(seq_len)
    if not schedules:
        return CheckResult("kv_cache", True, "max_seq_len is 1: no cached step exists",
                           {"seq_len": seq_len}, tol)
    full = s.run(ids)  # (B, T, V)
    found = [_compare(name, sizes, _decode(s, ids, sizes), full, tol) for name, sizes in schedules]
    first = schedules[0][1]
    callers, notes = _callers(s, batch, seq_len)
    second = s.other_ids(ids.cpu(), s.generator(22)).to(s.device)  # a second prompt
    for label, build in callers:
        cache = build()
        try:
            cached = _decode(s, ids, first, cache)
        except _Refused as refusal:
            notes.append(f"{label}: the model refuses it ({refusal}), not tried")
            continue
        found.append(_compare(f"{label}: {schedules[0][0]}", first, cached, full, tol))
        # chunks of several tokens into a pre-sized cache (chunked prefill, a chat continued
        # on its cache): a static sliding layer written one token at a time breaks only there
        for name, sizes in schedules[1:2]:
            found.append(_compare(f"{label}: {name}", sizes, _decode(s, ids, sizes, build()),
                                  full, tol))
        if callable(getattr(cache, "reset", None)):
            cache.reset()
            kept = slots_kept(cache)
            if kept:  # the cache class's own defect, not the model's: not reused
                notes.append(f"{label}: reset() keeps {kept} slots (zeroed, not dropped: "
                             "transformers 4.54-5.2x's DynamicCache), so it is not reused")
                continue
            found.append(_compare(f"{label}, reset and reused for a second prompt", first,
                                  _decode(s, second, first, cache), s.run(second), tol))
    found.append(_batch_independence(s, ids, first, tol))
    records = [record for record, _ in found]
    failures = [failure for _, failure in found if failure]
    evidence = {"seq_len": seq_len, "batch": batch, "dtype": str(s.dtype),
                "convention": s.convention.name, "schedules": records,
                "caller_caches": [label for label, _ in callers], "notes": notes}
    if failures:
        return CheckResult("kv_cache", False, "cached decoding differs from the full forward: "
                           + failures[0], evidence, tol)
    worst = max(r["max_abs_diff"] for r in records)
    own = records[:len(schedules)]
    return CheckResult("kv_cache", True, f"{len(own)} schedules (prefill lengths "
                       f"{sorted({r['sizes'][0] for r in own})}, one-token steps and chunks) "
                       f"through the model's own cache"
                       + (f", {len(callers)} {'cache' if len(callers) == 1 else 'caches'} a "
                          f"caller builds ({', '.join(evidence['caller_caches'])})"
                          if callers else "")
                       + f" equal the full T={seq_len} forward at every position, and row 0 "
                       f"decodes the same beside other rows (max {worst:.1e})", evidence, tol)


def _batch_independence(s: Subject, ids: torch.Tensor, sizes: list[int], tol: float
                        ) -> tuple[dict, str]:
    """Row 0 decoded through the cache beside rows that differ at every position, against row 0
    decoded beside copies of itself."""
    beside = ids.clone()
    beside[1:] = s.other_ids(ids[1:].cpu(), s.generator(23)).to(ids.device)
    copies = ids[:1].repeat(ids.shape[0], 1)
    alone = _decode(s, copies, sizes)[0]  # (T, V)
    mixed = _decode(s, beside, sizes)[0]
    record, failure = _compare("row 0 beside other rows, cached", sizes, mixed[None],
                               alone[None], tol)
    return record, failure and (failure + ": the cached path mixes rows of the batch")
