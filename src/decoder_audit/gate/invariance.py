"""Behavioural invariants, black-box: determinism, batch independence, causality, prefixes.

These compare the model with itself under interventions, so they need no reference and work on
any model. They run on the float64 working copy where the model allows it (see tolerances.py),
so a leak of 1e-6 is far above the tolerance.
"""

from __future__ import annotations

import torch

from . import tolerances
from .result import CheckResult
from .subject import Subject, batch_not_equal, sample_positions, scaled_excess

# Cuts of the causal intervention: every position up to this many, sampled beyond.
MAX_CUTS = 16
# Prefix lengths compared with the full run: every length up to this many, sampled beyond.
MAX_PREFIXES = 6


def _other_ids(ids: torch.Tensor, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    """Ids that differ from `ids` at every position (a random non-zero shift mod V)."""
    if vocab_size < 2:
        return ids.clone()
    shift = torch.randint(1, vocab_size, ids.shape, generator=gen)
    return (ids + shift) % vocab_size


def check_determinism(s: Subject) -> CheckResult:
    seq_len = s.short_len(16)
    batch = batch_not_equal(seq_len, (2, 3))
    ids = s.random_ids(batch, seq_len, s.generator(5))
    first, second = s.run(ids), s.run(ids)
    diff = (first - second).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    evidence = {"batch": batch, "seq_len": seq_len, "max_abs_diff": worst,
                "positions_differing": int((diff.amax(-1) > 0).sum())}
    if torch.equal(first, second) or (worst == 0.0 and torch.isnan(first).equal(torch.isnan(second))):
        return CheckResult("determinism", True, f"two eval-mode runs of ({batch}, {seq_len}) ids "
                           "are bitwise identical", evidence, tolerances.DETERMINISM)
    return CheckResult("determinism", False, f"the same ids gave different logits twice in eval "
                       f"mode (max difference {worst:.3g} at {evidence['positions_differing']} "
                       "positions): dropout or noise left on", evidence, tolerances.DETERMINISM)


def check_batch_independence(s: Subject) -> CheckResult:
    """Row 0's logits must not depend on the other rows: altered, reordered, or absent."""
    seq_len = s.short_len(16)
    batch = batch_not_equal(seq_len)
    gen = s.generator(6)
    ids = s.random_ids(batch, seq_len, gen)
    base = s.run(ids)
    altered = ids.clone()
    altered[1:] = _other_ids(ids[1:], s.vocab_size, gen)
    reversed_ids = ids.flip(0)
    # (name, row 0 under the variant, tolerance): the B=1 run has another shape
    variants = [
        ("other rows changed", s.run(altered)[0], s.tol),
        ("batch order reversed", s.run(reversed_ids)[-1], s.tol),
        ("row run alone (B=1)", s.run(ids[:1])[0], tolerances.shape_change(s.dtype)),
    ]
    tol = s.tol
    results, failures = [], []
    for name, row, tol_used in variants:
        worst, allowed = scaled_excess(row - base[0], base[0], tol_used)
        moved = (row - base[0]).abs().amax(-1)
        positions = [int(t) for t in (moved > allowed).nonzero().flatten()]
        results.append({"variant": name, "max_abs_diff": worst, "allowed": allowed,
                        "positions_moved": positions})
        if not worst <= allowed:
            failures.append(f"{name}: row 0 moved by up to {worst:.3g} at positions "
                            f"{positions[:8]} (allowed {allowed:.1e})")
    evidence = {"batch": batch, "seq_len": seq_len, "dtype": str(s.dtype), "variants": results}
    if failures:
        return CheckResult("batch_independence", False, "rows leak across the batch: " + failures[0],
                           evidence, tol)
    return CheckResult("batch_independence", True, f"row 0 of a ({batch}, {seq_len}) batch is "
                       "unchanged when other rows change, reorder, or are dropped", evidence, tol)


def check_causal(s: Subject) -> CheckResult:
    """The seeds' intervention at every cut c (sampled for long contexts), batched: sequence 0
    is the base; sequence k changes every token from cut c_k on. Rows < c must not move; row c
    must move (the model reads its own position)."""
    seq_len = s.intervention_len()
    gen = s.generator(7)
    base_ids = s.random_ids(1, seq_len, gen)
    cuts = sample_positions(seq_len, MAX_CUTS)
    changed = _other_ids(base_ids, s.vocab_size, gen)
    batch = base_ids.repeat(len(cuts) + 1, 1)  # (1 + cuts, T)
    for k, cut in enumerate(cuts, start=1):
        batch[k, cut:] = changed[0, cut:]
    logits = s.run(batch)  # (1 + cuts, T, V)
    base = logits[0]
    tol = s.tol
    allowed = tol * max(1.0, float(base.abs().max()))
    self_min = tolerances.SELF_DEPENDENCE_FACTOR * allowed
    # change[k, t]: largest logit change at row t when tokens from cut k on changed
    change = (logits[1:] - base).abs().amax(-1)  # (cuts, T)
    records, leaks, blind = [], [], []
    for k, cut in enumerate(cuts):
        earlier = change[k, :cut]
        moved = [int(t) for t in (~(earlier <= allowed)).nonzero().flatten()]
        worst_row = int(earlier.argmax()) if cut else None
        record = {
            "cut": cut,
            "earlier_rows": cut,
            "max_change_earlier": float(earlier.max()) if cut else 0.0,
            "worst_row": worst_row,
            "moved_rows": moved,
            "change_at_cut": float(change[k, cut]),
        }
        records.append(record)
        if moved:
            leaks.append(record)
        if not change[k, cut] > self_min:
            blind.append(record)
    evidence = {
        "seq_len": seq_len, "dtype": str(s.dtype), "cuts": records, "allowed": allowed,
        "self_dependence_min": self_min, "all_cuts": len(cuts) == seq_len,
        # rows = logit positions, columns = first changed input position (the cut)
        "dependency": {"rows": list(range(seq_len)), "cols": cuts,
                       "max_change": change.T.tolist()},
    }
    if leaks:
        first = leaks[0]
        detail = (f"cut c={first['cut']}: earlier rows {first['moved_rows'][:8]} moved by up to "
                  f"{first['max_change_earlier']:.3g} (row {first['worst_row']}), allowed "
                  f"{allowed:.1e}; the model reads future tokens ({len(leaks)} of {len(cuts)} cuts leak)")
        return CheckResult("causal", False, detail, evidence, tol)
    if blind:
        first = blind[0]
        detail = (f"cut c={first['cut']}: row {first['cut']} changed by only "
                  f"{first['change_at_cut']:.3g} when its own token changed: the row does not read "
                  "its own position (output shifted; it predicts two tokens ahead)")
        return CheckResult("causal", False, detail, evidence, tol)
    span = "every cut" if len(cuts) == seq_len else f"{len(cuts)} sampled cuts"
    return CheckResult("causal", True, f"{span} of a T={seq_len} sequence: earlier rows unchanged "
                       f"(max {max((r['max_change_earlier'] for r in records), default=0):.1e}, "
                       f"allowed {allowed:.1e}); row c always moved", evidence, tol)


def check_prefix(s: Subject) -> CheckResult:
    """A prefix run alone equals the same rows of the full run: catches anything that depends on
    the total length T (normalising by T, position tables indexed from the end, ...)."""
    seq_len = s.intervention_len()
    batch = batch_not_equal(seq_len, (2, 3))
    ids = s.random_ids(batch, seq_len, s.generator(8))
    full = s.run(ids)
    tol = tolerances.shape_change(s.dtype)  # a prefix run has another shape than the full run
    lengths = [p + 1 for p in sample_positions(seq_len - 1, MAX_PREFIXES)] if seq_len > 1 else []
    records, failures = [], []
    for length in lengths:
        alone = s.run(ids[:, :length])
        worst, allowed = scaled_excess(alone - full[:, :length], full[:, :length], tol)
        rows = (alone - full[:, :length]).abs().amax((0, 2))
        moved = [int(t) for t in (~(rows <= allowed)).nonzero().flatten()]
        records.append({"prefix_len": length, "max_abs_diff": worst, "allowed": allowed,
                        "rows_differing": moved})
        if moved:
            failures.append(records[-1])
    evidence = {"seq_len": seq_len, "batch": batch, "dtype": str(s.dtype), "prefixes": records}
    if failures:
        first = failures[0]
        return CheckResult("prefix", False, f"prefix of length {first['prefix_len']} run alone "
                           f"differs from the full run at rows {first['rows_differing'][:8]} by up "
                           f"to {first['max_abs_diff']:.3g}: rows depend on what follows them (future tokens "
                           "or the total length)",
                           evidence, tol)
    if not lengths:
        return CheckResult("prefix", True, "max_seq_len is 1: no proper prefix exists", evidence, tol)
    return CheckResult("prefix", True, f"prefixes of length {lengths} alone equal rows of the full "
                       f"T={seq_len} run", evidence, tol)
