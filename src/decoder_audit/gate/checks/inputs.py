"""Checks of the input and output contract: ids and lengths, overlength, shapes, raw logits.

The seeds' acceptance gate: "the forward pass accepts at least two batch sizes and lengths
1 through 4", "an overlength input is rejected instead of silently clipping positions", and the
shape ledger "(B, T) ids -> (B, T, V) logits" with B != T, so no axis is identified by its size.
"""

from __future__ import annotations

import re

import torch

from ...errors import DecoderInputError
from ...objective import OutputError
from .. import tolerances
from ..measure import all_finite, batch_not_equal
from ..result import CheckResult
from ..subject import SHORT_CONTEXT, Subject


def _probe_lengths(s: Subject) -> list[int]:
    top = s.probe_max
    if top <= SHORT_CONTEXT:
        return list(range(1, top + 1))
    # The ends are where position tables run out: 1, 2, 3, two odd lengths past the short
    # range, and max_seq_len itself (one full-length forward; more would dominate the cost).
    return sorted({1, 2, 3, 7, SHORT_CONTEXT + 1, top})


def _batch_sizes(seq_len: int) -> tuple[int, ...]:
    """Two batch sizes, both != T. Very long runs use B = 1 only: they prove the length runs;
    the short lengths already ran two batch sizes."""
    if seq_len > 4 * SHORT_CONTEXT:
        return (1,)
    first = batch_not_equal(seq_len, (3, 2, 5))
    return (first, batch_not_equal(seq_len, tuple(b for b in (2, 5, 7) if b != first)))


def _plan(s: Subject) -> list[tuple[int, int]]:
    """(T, B) of every run: each length at both batch sizes in a short context; in a long one
    each sampled length once, at the two batch sizes in turn. Every call of a big model is a
    pass over all its weights (GPT-2 small: a run of 3 tokens costs a tenth of a 1024-token
    forward), and a second batch size at each length shows nothing the other lengths' do not."""
    if s.probe_max <= SHORT_CONTEXT:
        return [(t, b) for t in _probe_lengths(s) for b in _batch_sizes(t)]
    return [(t, _batch_sizes(t)[i % len(_batch_sizes(t))])
            for i, t in enumerate(_probe_lengths(s))]


def probe_length_limit(s: Subject) -> tuple[int | None, str]:
    """For a model declared without max_seq_len: (the longest T it runs, what it raised one
    token later) when the longest probe raises and a shorter one runs, found by bisection (a
    fixed 32-row position table raises IndexError at T = 33); (None, "") when the longest probe
    runs, or when even T = 1 raises (the model is broken: the checks show how)."""
    if s.max_seq_len is not None:
        return None, ""
    gen = s.generator(5)

    def raised(seq_len: int) -> BaseException | None:
        try:
            s.run(s.random_ids(1, seq_len, gen))
        except OutputError:
            return None  # it ran; what it returned is the checks' business
        except Exception as exc:  # noqa: BLE001 - any refusal marks the length as too long
            return exc
        return None

    longest = s.facts.intervention_len
    at_longest = raised(longest)
    if at_longest is None or raised(1) is not None:
        return None, ""
    runs, fails = 1, longest  # invariant: `runs` runs, `fails` raises
    while fails - runs > 1:
        middle = (runs + fails) // 2
        if raised(middle) is None:
            runs = middle
        else:
            fails = middle
    error = raised(fails)
    said = f"{type(error).__name__}: {str(error).strip()[:160]}"
    # A table that ends raises an IndexError (nn.Embedding: "index out of range in self") or
    # names where it ended (size 33 vs 32): a limit is only inferred from such an error.
    # Anything else (a model that fails on every T > 1) is a defect the checks report, not a
    # limit to stay within.
    names_it = isinstance(error, IndexError) or re.search(rf"\b({runs}|{fails})\b", str(error))
    if runs < 2 or not names_it:
        return None, ""
    return runs, said


def _inside_declared_context(s: Subject) -> str:
    """Why a length limit the facts found is a defect ("" when it is not): the model's own
    config declares a longer context (a Hugging Face config's max_position_embeddings), so it
    fails inside its declared length. The other checks still stay within the limit, so they
    judge what runs."""
    limit = s.facts.length_limit
    if limit is None or not s.facts.hugging_face:
        return ""
    from ...references.hf_models import config_length

    declared = config_length(getattr(s.work, "config", None))
    if declared is None or declared <= limit:
        return ""
    return (f"T={limit + 1} raised {s.facts.length_error}, inside the context of {declared} "
            "positions its config declares (max_position_embeddings)")


def check_inputs(s: Subject) -> CheckResult:
    gen = s.generator(1)
    runs, failures = [], []
    plan = _plan(s)
    for number, (seq_len, batch) in enumerate(plan, start=1):
        s.progress(f"run {number}/{len(plan)}: B={batch}, T={seq_len}")
        ids = s.random_ids(batch, seq_len, gen)
        want = (batch, seq_len, s.vocab_size)
        try:
            logits = s.run(ids, finite=False)  # non-finite logits are named below
        except Exception as exc:
            failures.append(f"B={batch}, T={seq_len} raised {type(exc).__name__}: {exc}")
            continue
        got = tuple(logits.shape)
        if got != want:
            failures.append(f"B={batch}, T={seq_len}: logits {got}, expected {want}")
        elif not all_finite(logits):
            bad = (~torch.isfinite(logits)).any(-1).nonzero().tolist()
            failures.append(f"B={batch}, T={seq_len}: non-finite logits at (batch, position) "
                            f"{bad[:6]}")
        runs.append({"batch": batch, "seq_len": seq_len, "shape": list(got)})

    rejections = _rejections(s, gen)
    failures += [f"{r['probe']}: {r['verdict']}" for r in rejections if not r["rejected"]]
    inside = _inside_declared_context(s)
    failures += [inside] if inside else []
    lengths = sorted({r["seq_len"] for r in runs})
    batches = sorted({r["batch"] for r in runs})
    evidence = {"lengths": lengths, "batch_sizes": batches, "runs": len(runs),
                "failures": failures, "rejections": rejections,
                "lengths_sampled": s.probe_max > SHORT_CONTEXT}
    if failures:
        return CheckResult("inputs", False, failures[0], evidence)
    span = (f"every length 1..{s.probe_max}" if s.probe_max <= SHORT_CONTEXT
            else f"lengths {lengths} (sampled from 1..{s.probe_max})")
    return CheckResult("inputs", True, f"{span} ran at batch sizes {batches}; "
                       f"{len(rejections)} malformed inputs rejected", evidence)


def _rejections(s: Subject, gen: torch.Generator) -> list[dict]:
    """Out-of-range, negative, float and wrongly ranked ids must raise. A black-box model may
    instead accept an extra leading/trailing axis if its output is the input's shape plus V
    (it treated the axis as batch, misreading nothing); our own models must raise."""
    seq_len = s.short_len(3)
    batch = batch_not_equal(seq_len)
    good = s.random_ids(batch, seq_len, gen)
    too_big, negative = good.clone(), good.clone()
    too_big[0, -1] = s.input_vocab_size  # the first id the input embedding must not accept
    negative[-1, 0] = -1
    which = "vocab_size" if s.input_vocab_size == s.vocab_size else "input_vocab_size"
    probes = [
        (f"id {s.input_vocab_size} = {which}", too_big, None),
        ("negative id -1", negative, None),
        ("float ids", good.double() + 0.25, None),
        (f"rank-1 ids {tuple(good[0].shape)}", good[0], [(seq_len, s.vocab_size), (1, seq_len, s.vocab_size)]),
        (f"rank-3 ids {tuple(good[..., None].shape)}", good[..., None],
         [(batch, seq_len, 1, s.vocab_size)]),
    ]
    out = []
    for name, ids, benign in probes:
        record = {"probe": name, "rejected": False, "verdict": ""}
        try:
            logits = s.run(ids)
        except OutputError as exc:
            record["verdict"] = f"not rejected: {exc}"
            out.append(record)
            continue
        except Exception as exc:
            typed = isinstance(exc, DecoderInputError)
            record.update(rejected=True, error=type(exc).__name__, message=str(exc)[:200],
                          verdict=f"rejected with {type(exc).__name__}" + ("" if typed or not s.whitebox
                                                                          else " (untyped)"))
        else:
            got = tuple(logits.shape)
            record["output_shape"] = list(got)
            if benign is not None and not s.whitebox and got in benign:
                record.update(rejected=True, verdict=f"accepted as an extra batch axis, output {got}")
            else:
                record["verdict"] = f"accepted silently, output {got}"
        out.append(record)
    return out


def check_overlength(s: Subject) -> CheckResult:
    seq_len = s.max_seq_len + 1
    ids = s.random_ids(1, seq_len, s.generator(2))
    try:
        logits = s.run(ids)
    except OutputError:
        raise  # not a rejection: the model ran and returned something else
    except Exception as exc:
        evidence = {"seq_len": seq_len, "error": type(exc).__name__, "message": str(exc)[:300]}
        return CheckResult("overlength", True, f"T={seq_len} rejected with {type(exc).__name__}: "
                           f"{str(exc)[:120]}", evidence)
    got = tuple(logits.shape)
    evidence = {"seq_len": seq_len, "output_shape": list(got)}
    if len(got) == 3 and got[1] < seq_len:
        detail = (f"T={seq_len} > max_seq_len={s.max_seq_len} was cropped silently to "
                  f"{got[1]} positions (output {got})")
    else:
        detail = (f"T={seq_len} > max_seq_len={s.max_seq_len} was accepted (output {got}): "
                  "positions past the limit were clipped, wrapped or extrapolated silently")
        if not s.whitebox:
            # A stock rotary (or ALiBi, relative, recurrent) model runs at any length by design:
            # its config length is a horizon, not a limit, and it was declared as one.
            evidence["hint"] = NO_HARD_LIMIT_HINT
            detail += f". {NO_HARD_LIMIT_HINT}"
    return CheckResult("overlength", False, detail, evidence)


NO_HARD_LIMIT_HINT = (
    "max_seq_len declares a hard limit the model must enforce; if this model has none by design "
    "(rotary, ALiBi, relative or recurrent positions), audit it with max_seq_len=None and "
    "intervention_len=N (decoder-audit verify: leave out --max-seq-len, add --intervention-len N) "
    "so every behavioural check covers positions 0..N-1")


def check_shapes(s: Subject) -> CheckResult:
    seq_len = s.short_len(5)
    batch = batch_not_equal(seq_len)
    ids = s.random_ids(batch, seq_len, s.generator(3))
    want = (batch, seq_len, s.vocab_size)
    logits = s.run(ids)
    got = tuple(logits.shape)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "logits_shape": list(got),
                      "expected": list(want)}
    problems = [] if got == want else [f"logits: shape {got}, expected (B, T, V) = {want}"]
    if s.has_trace:
        _, trace = s.trace(ids)
        sites = []
        for name, letters in trace.declared.items():
            expected = trace.expected_shape(name)
            recorded = tuple(trace[name].shape) if name in trace else None
            sites.append({"site": name, "declared": list(letters), "expected": list(expected),
                          "got": None if recorded is None else list(recorded),
                          "ok": recorded == expected})
        evidence["sites"] = sites
        evidence["sizes"] = dict(trace.sizes)
        problems += trace.shape_mismatches()
    evidence["mismatches"] = problems
    if problems:
        return CheckResult("shapes", False, problems[0], evidence)
    ledger = f"; {len(evidence['sites'])} trace sites as declared" if s.has_trace else ""
    return CheckResult("shapes", True, f"logits {got} = (B, T, V){ledger}", evidence)


def check_raw_logits(s: Subject) -> CheckResult:
    seq_len = s.short_len(8)
    batch = batch_not_equal(seq_len)
    logits = s.run(s.random_ids(batch, seq_len, s.generator(4)), finite=False).double()
    tol = tolerances.normalised_sum(s.dtype)
    finite = all_finite(logits)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "finite": finite,
                      "min": float(logits.nan_to_num().min()), "max": float(logits.nan_to_num().max())}
    if not finite:
        bad = (~torch.isfinite(logits)).any(-1).nonzero().tolist()
        evidence["non_finite_rows"] = bad[:16]
        return CheckResult("raw_logits", False, f"non-finite logits at (batch, position) {bad[:6]}",
                           evidence, tol)
    row_sums = logits.sum(-1)
    lse = logits.logsumexp(-1)
    evidence["max_abs_row_sum_minus_1"] = float((row_sums - 1).abs().max())
    evidence["max_abs_logsumexp"] = float(lse.abs().max())
    if logits.min() >= 0 and logits.max() <= 1 and (row_sums - 1).abs().max() <= tol:
        return CheckResult("raw_logits", False, "the forward returns probabilities (every row is "
                           "in [0, 1] and sums to 1): softmax inside the model; return raw logits "
                           "and let the loss normalise", evidence, tol)
    if logits.max() <= 1e-6 and lse.abs().max() <= tol:
        return CheckResult("raw_logits", False, "the forward returns log-probabilities (every row "
                           "has logsumexp 0): log_softmax inside the model; return raw logits",
                           evidence, tol)
    return CheckResult("raw_logits", True, f"finite, unnormalised (logsumexp of rows up to "
                       f"{evidence['max_abs_logsumexp']:.3g}, ln V = "
                       f"{torch.log(torch.tensor(float(s.vocab_size))):.3g})", evidence, tol)
