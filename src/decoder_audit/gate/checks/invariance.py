"""Behavioural invariants, black-box: determinism, batch independence, causality, prefixes.

These compare the model with itself under interventions, so they need no reference and work on
any model, in the model's own dtype. A comparison of two runs of the same shape reads each row
at the same batch index in both (an intervention batch against a batch of copies of the base
row), so for a correct model the rows compared come out of identical arithmetic and agree
bitwise in any dtype; the allowance is a multiple of a noise floor measured in the same run
(identical rows at different batch indices), which is 0 on most kernels, making the
comparison exact. Runs of different shapes (a prefix alone, a row alone) get the dtype's
shape-change tolerance. See tolerances.py.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from ...references.hf_models import eager_experts
from .. import tolerances
from . import trainshape
from ..measure import batch_not_equal, index_noise, sample_positions, scaled_excess, value_scale
from ..result import CheckResult
from ..subject import Subject

# Cuts of the causal intervention: every position up to this many, sampled beyond.
MAX_CUTS = 16
# Prefix lengths compared with the full run: every length up to this many, sampled beyond.
MAX_PREFIXES = 6


def clean_batch(s: Subject) -> torch.Tensor:
    """The ids the four checks below start from, (B, T) with T the intervention length and
    B != T: row 0 random, every other row different from row 0 at every position (so "other
    rows changed" changes every position of them). Their clean logits, and those of row 0 at
    every index, are run once and shared (Subject.clean_logits): each check adds only its own
    interventions."""
    seq_len = s.intervention_len()
    gen = s.generator(6)
    first = s.random_ids(1, seq_len, gen)  # (1, T)
    others = s.other_ids(first.repeat(batch_not_equal(seq_len) - 1, 1), gen)  # (B - 1, T)
    return torch.cat([first, others])  # (B, T)


def check_determinism(s: Subject) -> CheckResult:
    """The same ids twice in eval mode, the second call meeting whatever state the first left
    in the model (`as_found=False`: every other check's calls meet the state as found). When
    the two differ and the first call changed the model's own state, a third call from the
    state as found tells which it is: equal to the first, the state moved the answers (a
    position counter that never resets: the model's property, named with what moved); not
    equal, the model draws noise."""
    ids = clean_batch(s)
    batch, seq_len = ids.shape
    first = s.clean_logits(ids)
    moved = s.state.changes(additions=False) if s.state is not None else []
    try:
        second = s.logits(ids, as_found=False)
    except Exception as exc:
        if not moved:
            raise  # the model's own failure: the runner records it
        return CheckResult("determinism", False, f"the model's own state changes its answers: a "
                           f"call changed {', '.join(moved[:3])}, and the same ids then raised "
                           f"{type(exc).__name__}: {str(exc)[:160]} (from the state as found "
                           "they ran): state that never resets between calls",
                           {"batch": batch, "seq_len": seq_len, "state_moved": moved,
                            "stateful": True}, tolerances.DETERMINISM)
    diff = (first - second).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    evidence = {"batch": batch, "seq_len": seq_len, "max_abs_diff": worst,
                "positions_differing": int((diff.amax(-1) > 0).sum()), "state_moved": moved,
                "process_settings": s.settings_changed()}
    if evidence["process_settings"]:
        return _settings_changed(evidence)
    if _identical(first, second):
        return CheckResult("determinism", True, f"two eval-mode runs of ({batch}, {seq_len}) ids "
                           "are bitwise identical"
                           + (f" (the first changed the model's own state, {moved[0]}, which "
                              "does not change its answers)" if moved else ""),
                           evidence, tolerances.DETERMINISM)
    evidence["stateful"] = bool(moved) and _identical(first, s.logits(ids))
    if evidence["stateful"]:
        return CheckResult("determinism", False, f"the model's own state changes its answers: a "
                           f"call changed {', '.join(moved[:3])}, and the same ids then gave "
                           f"logits different by up to {worst:.3g} at "
                           f"{evidence['positions_differing']} positions (from the state as "
                           "found they are identical again): state that never resets between "
                           "calls", evidence, tolerances.DETERMINISM)
    return CheckResult("determinism", False, f"the same ids gave different logits twice in eval "
                       f"mode (max difference {worst:.3g} at {evidence['positions_differing']} "
                       "positions): dropout or noise left on", evidence, tolerances.DETERMINISM)


def _settings_changed(evidence: dict) -> CheckResult:
    """A forward that changes process-wide settings (gate/state.py's SETTINGS) fails
    determinism, whether or not its own next answer moved: a note would let `train` go on in a
    process whose default dtype, kernels, threads or anomaly mode the model switched mid-run, so
    every later computation (its own next call, the training loop, any other model) differs from
    the first. The gate put each setting back after every call; the failure names them."""
    changed = evidence["process_settings"]
    return CheckResult("determinism", False, f"the model's forward changes process-wide "
                       f"settings: {'; '.join(changed[:3])}"
                       + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")
                       + ": every later computation in the process runs under them (its own "
                       "next call, the training loop, other models); the gate put them back "
                       "after each call", evidence, tolerances.DETERMINISM)


def _identical(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Bitwise equal, NaN where NaN."""
    if torch.equal(first, second):
        return True
    diff = (first - second).abs()
    return (float(diff.max()) if diff.numel() else 0.0) == 0.0 and \
        torch.isnan(first).equal(torch.isnan(second))


def _row_variants(s: Subject, ids: torch.Tensor) -> tuple[list[tuple[str, torch.Tensor, float]],
                                                             torch.Tensor, float]:
    """([(variant, row 0 under it, relative tolerance)], row 0 of the clean batch, noise)."""
    batch = len(ids)
    base = s.clean_logits(ids)  # (B, T, V)
    copies = s.clean_logits(ids[:1].repeat(batch, 1))  # (B, T, V): row 0 at every index
    noise = index_noise(copies)
    shape_tol = s.shape_tolerance()
    return [
        ("other rows changed", copies[0], tolerances.same_shape(noise)),
        ("batch order reversed", s.logits(ids.flip(0))[-1], shape_tol),
        ("row run alone (B=1)", s.logits(ids[:1])[0], shape_tol),
    ], base[0], noise


def check_batch_independence(s: Subject) -> CheckResult:
    """Row 0's logits must not depend on the other rows: the clean batch against row 0 at every
    index (same index, same shape, the other rows all changed: an exact comparison up to the
    measured noise floor), reordered so that row 0 sits at the last index, or absent (B = 1):
    those two round differently, so the shape-change tolerance. A rounding-sized movement
    (`rounding_sized`: routed experts grouping the tokens an expert receives) is confirmed on
    the float64 twin before it is called a leak."""
    ids = clean_batch(s)
    batch, seq_len = ids.shape
    variants, base, noise = _row_variants(s, ids)
    scale = value_scale(base)
    exact, shape_tol = variants[0][2], variants[1][2]
    results, failures = [], []
    for name, row, tol_used in variants:
        worst, allowed = float((row - base).abs().max()), tol_used * scale
        moved = (row - base).abs().amax(-1)
        positions = [int(t) for t in (~(moved <= allowed)).nonzero().flatten()]
        results.append({"variant": name, "max_abs_diff": worst, "allowed": allowed,
                        "positions_moved": positions})
        if not worst <= allowed:
            failures.append(f"{name}: row 0 moved by up to {worst:.3g} at positions "
                            f"{positions[:8]} (allowed {allowed:.1e})")
    evidence = {"batch": batch, "seq_len": seq_len, "dtype": str(s.dtype), "variants": results,
                "index_noise": noise, "logit_scale": scale, "float64": None}
    if failures and rounding_sized(max(r["max_abs_diff"] for r in results), s, scale):
        evidence["float64"] = confirmed = _rows_in_float64(s, ids)
        if confirmed is not None and confirmed["passed"]:
            worst = max(r["max_abs_diff"] for r in results)
            return CheckResult("batch_independence", True, f"row 0 of a ({batch}, {seq_len}) "
                               f"batch moved by at most {worst:.1e}, within {tolerances.ROUNDING_JITTER_ULPS:g} ulps of the logit "
                               f"scale, and by {confirmed['max_abs_diff']:.1e} (allowed "
                               f"{confirmed['allowed']:.1e}) in a float64 copy: rounding, not a "
                               "dependence", evidence, exact)
    if failures:
        return CheckResult("batch_independence", False,
                           "rows leak across the batch: " + failures[0], evidence, exact)
    how = "bitwise" if exact == 0.0 else f"within {exact:.1e} of the logit scale"
    return CheckResult("batch_independence", True, f"row 0 of a ({batch}, {seq_len}) batch is "
                       f"unchanged ({how}) when other rows change, and within {shape_tol:.0e} "
                       "when the batch is reversed or the row runs alone", evidence, exact)


def _rows_in_float64(s: Subject, ids: torch.Tensor) -> dict | None:
    """The three variants rerun on the float64 twin: {"passed": row 0 within FLOAT64_CONFIRM of
    the logit scale under each, ...}, or None where the twin cannot be made or run."""
    def worst_row(twin: Subject) -> tuple[float, float]:
        variants, base, _ = _row_variants(twin, ids)
        return max(float((row - base).abs().max()) for _, row, _ in variants), value_scale(base)

    measured = _in_float64(s, worst_row)
    if measured is None:
        return None
    worst, scale64 = measured
    allowed = tolerances.FLOAT64_CONFIRM * scale64
    return {"passed": worst <= allowed, "max_abs_diff": worst, "allowed": allowed}


def cut_changes(s: Subject, cuts: list[int], call: Callable[[torch.Tensor], torch.Tensor]
                | None = None) -> tuple[torch.Tensor, float, float, torch.Tensor]:
    """(change (cuts, T), index noise, logit scale, row 0 of the copies (T, V)): the copies
    batch is clean_batch's row 0 at every index, which batch independence through `call`
    compares with too (training._path_probe), so it runs once. change[k, t] is the largest
    logit change at row t when the tokens from cut k on change. The cuts go B - 1 at a time
    into a (B, T) batch: row 0 the clean row (a model that mixes rows reads only clean content,
    and fails batch_independence, not this check), row k >= 1 changed from its cut on. Each row is
    compared with the clean row 0 at the same index of a batch of copies, so a correct
    model's rows < c come out of identical arithmetic. `call` runs the model another way (in
    train mode, under autocast: training.py); the clean runs are then its own, not shared."""
    clean = clean_batch(s)  # (B, T)
    base_ids = clean[:1]  # (1, T)
    copies_ids = base_ids.repeat(len(clean), 1)  # (B, T): as batch_independence
    copies = s.clean_logits(copies_ids) if call is None else call(copies_ids)
    run = s.logits if call is None else call
    group, seq_len = copies.shape[0] - 1, base_ids.shape[1]
    changed = s.other_ids(base_ids, s.generator(7))  # (1, T): differs at every position
    rows = []
    for start in range(0, len(cuts), group):
        some = cuts[start:start + group]
        s.progress(f"cuts {start + 1}-{start + len(some)} of {len(cuts)}, T={seq_len}")
        batch = base_ids.repeat(group + 1, 1)  # (B, T); rows past the last cut: the base
        for k, cut in enumerate(some, start=1):
            batch[k, cut:] = changed[0, cut:]
        moved = run(batch)
        moved -= copies  # in place: logits are the check's largest allocation
        rows.append(moved[1:1 + len(some)].abs_().amax(-1))  # (cuts in this batch, T)
        del moved
    noise = index_noise(copies)
    if call is None:  # eval mode's floor, which train_mode reuses (copies_noise)
        s.copies_noise = noise
    return torch.cat(rows), noise, value_scale(copies[0]), copies[0]


def copies_noise(s: Subject) -> float:
    """The index noise of clean_batch's row 0 at every index, in eval mode: what `causal`
    measured on those copies (cut_changes), or measured now where it did not run."""
    if s.copies_noise is None:
        clean = clean_batch(s)
        s.copies_noise = index_noise(s.logits(clean[:1].repeat(len(clean), 1)))
    return s.copies_noise


def leaks_at(change: torch.Tensor, cuts: list[int], allowed: float) -> list[dict]:
    """The cuts whose earlier rows moved by more than `allowed`: {cut, moved_rows, max_change}."""
    found = []
    for k, cut in enumerate(cuts):
        earlier = change[k, :cut]
        moved = [int(t) for t in (~(earlier <= allowed)).nonzero().flatten()]
        if moved:
            found.append({"cut": cut, "moved_rows": moved, "max_change": float(earlier.max())})
    return found


def check_causal(s: Subject) -> CheckResult:
    """The seeds' intervention at every cut c (sampled for long contexts), batched: rows < c
    must not move; row c must move (the model reads its own position)."""
    seq_len = s.intervention_len()
    cuts = sample_positions(seq_len, MAX_CUTS)
    change, noise, scale, _ = cut_changes(s, cuts)  # change: (cuts, T)
    tol = tolerances.same_shape(noise)
    allowed = tol * scale
    self_min = tolerances.SELF_DEPENDENCE_FACTOR * allowed
    records, leaks, blind = [], [], []
    for k, cut in enumerate(cuts):
        earlier = change[k, :cut]
        moved = [int(t) for t in (~(earlier <= allowed)).nonzero().flatten()]
        records.append({
            "cut": cut,
            "earlier_rows": cut,
            "max_change_earlier": float(earlier.max()) if cut else 0.0,
            "worst_row": int(earlier.argmax()) if cut else None,
            "moved_rows": moved,
            "change_at_cut": float(change[k, cut]),
        })
        if moved:
            leaks.append(records[-1])
        if not change[k, cut] > self_min:  # strictly: with an exact comparison, > 0
            blind.append(records[-1])
    shape = trainshape.probe(s)
    if leaks:
        worst = max(record["max_change_earlier"] for record in leaks)
        confirmed = confirm_in_float64(s, cuts, worst, scale)
        if confirmed is not None and confirmed["passed"]:
            for record in leaks:
                record["moved_rows"] = []  # rounding, confirmed: see evidence["float64"]
            leaks = []
    else:
        confirmed = None
    evidence = {
        "seq_len": seq_len, "dtype": str(s.dtype), "cuts": records, "allowed": allowed,
        "float64": confirmed, "training_shape": shape,
        "index_noise": noise, "self_dependence_min": self_min, "all_cuts": len(cuts) == seq_len,
        # rows = logit positions, columns = first changed input position (the cut)
        "dependency": {"rows": list(range(seq_len)), "cols": cuts,
                       "max_change": change.T.tolist()},
    }
    return _causal_verdict(records, leaks, blind, evidence, tol)


def rounding_sized(worst: float, s: Subject, scale: float) -> bool:
    """Whether a movement of `worst` may be rounding: at most ROUNDING_JITTER_ULPS of the logit
    scale in a dtype below float64 (a larger one, or any in float64, is a dependence)."""
    return s.dtype != torch.float64 and \
        worst <= tolerances.ROUNDING_JITTER_ULPS * tolerances.eps(s.dtype) * scale


def float64_twin(s: Subject) -> Subject | None:
    """A Subject on a float64 copy of the model, its experts on their eager loop, or None where
    none can be made (too large, a module that cannot be copied or refuses float64)."""
    size = sum(p.numel() for p in s.parameters()) * 8
    if size > tolerances.FLOAT64_CONFIRM_MAX_BYTES:
        return None
    s.progress("confirming a rounding-sized movement in float64")
    try:
        wide = copy.deepcopy(s.work).double()
        eager_experts(wide)
    except Exception:  # noqa: BLE001 - a module that cannot be copied is not confirmed
        return None
    return Subject(wide, s.facts, seed=s.seed)


def _in_float64(s: Subject, measure: Callable[[Subject], tuple[float, float]]
                ) -> tuple[float, float] | None:
    """(movement, logit scale) that `measure` finds on the float64 twin, or None where the twin
    cannot be made or run; its tokens and calls are counted on `s`."""
    twin = float64_twin(s)
    if twin is None:
        return None
    try:
        return measure(twin)
    except Exception:  # noqa: BLE001 - a model that does not run in float64 is not confirmed
        return None
    finally:
        s.tokens, s.calls = s.tokens + twin.tokens, s.calls + twin.calls


def confirm_in_float64(s: Subject, cuts: list[int], worst: float, scale: float,
                       mode: Callable[[Subject], Any] | None = None) -> dict | None:
    """Earlier rows that moved by a rounding-sized amount `worst` (`rounding_sized`), rerun on
    the float64 twin: {"passed": whether they stay within FLOAT64_CONFIRM there, ...}, or None
    when there is nothing to confirm (a larger movement, a float64 model) or the twin cannot be
    made or run: the movement then stays a failure. `mode(twin)`: a context in which, and the
    call through which, the twin runs (train mode's; default: eval mode, twin.logits)."""
    if not rounding_sized(worst, s, scale):
        return None

    def earlier_rows(twin: Subject) -> tuple[float, float]:
        with (contextlib.nullcontext(None) if mode is None else mode(twin)) as call:
            change, _, scale64, _ = cut_changes(twin, cuts, call)
        return max((float(change[k, :cut].max()) for k, cut in enumerate(cuts) if cut),
                   default=0.0), scale64

    measured = _in_float64(s, earlier_rows)
    if measured is None:
        return None
    earlier, scale64 = measured
    allowed = tolerances.FLOAT64_CONFIRM * scale64
    return {"passed": earlier <= allowed, "max_change_earlier": earlier, "allowed": allowed,
            "float32_max_change_earlier": worst}


def _causal_verdict(records: list[dict], leaks: list[dict], blind: list[dict], evidence: dict,
                    tol: float) -> CheckResult:
    allowed, seq_len = evidence["allowed"], evidence["seq_len"]
    if leaks:
        first = leaks[0]
        detail = (f"cut c={first['cut']}: earlier rows {first['moved_rows'][:8]} moved by up to "
                  f"{first['max_change_earlier']:.3g} (row {first['worst_row']}), allowed "
                  f"{allowed:.1e}; the model reads future tokens ({len(leaks)} of {len(records)} cuts leak)")
        return CheckResult("causal", False, detail, evidence, tol)
    shape = evidence.get("training_shape")
    if shape is not None and not shape["passed"]:
        return CheckResult("causal", False, f"{trainshape.said(shape)}; the audit's own "
                           f"shapes (T={seq_len}) did not show it", evidence, tol)
    if blind:
        first = blind[0]
        detail = (f"cut c={first['cut']}: row {first['cut']} changed by only "
                  f"{first['change_at_cut']:.3g} when its own token changed: the row does not read "
                  "its own position (output shifted; it predicts two tokens ahead)")
        return CheckResult("causal", False, detail, evidence, tol)
    span = "every cut" if len(records) == seq_len else f"{len(records)} sampled cuts"
    wide = evidence.get("float64")
    if wide is not None and wide["passed"]:
        return CheckResult("causal", True, f"{span} of a T={seq_len} sequence: earlier rows moved "
                           f"by at most {wide['float32_max_change_earlier']:.1e}, within "
                           f"{tolerances.ROUNDING_JITTER_ULPS:g} ulps of the logit scale, and by "
                           f"{wide['max_change_earlier']:.1e} (allowed {wide['allowed']:.1e}) in "
                           "a float64 copy: rounding, not a dependence; row c always moved",
                           evidence, tol)
    return CheckResult("causal", True, f"{span} of a T={seq_len} sequence: earlier rows unchanged "
                       f"(max {max((r['max_change_earlier'] for r in records), default=0):.1e}, "
                       f"allowed {allowed:.1e}); row c always moved", evidence, tol)


def check_prefix(s: Subject) -> CheckResult:
    """A prefix run alone equals the same rows of the full run: catches anything that depends on
    the total length T (normalising by T, position tables indexed from the end, ...). Its own
    batch, of 2 rows: the prefixes and the full run must have the same B (a model may read B),
    and 2 rows of every prefix cost less than 3 would, even with the full run shared."""
    seq_len = s.intervention_len()
    batch = batch_not_equal(seq_len, (2, 3))
    ids = s.random_ids(batch, seq_len, s.generator(8))
    full = s.logits(ids)
    tol = s.shape_tolerance()  # a prefix run has another shape than the full run
    lengths = [p + 1 for p in sample_positions(seq_len - 1, MAX_PREFIXES)] if seq_len > 1 else []
    records, failures = [], []
    for length in lengths:
        s.progress(f"prefix of length {length} (of {seq_len})")
        alone = s.logits(ids[:, :length])
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
