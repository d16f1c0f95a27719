"""`oracle`: the fast forward equals the slow float64 oracle fed the same weights (values, the
eager traced path, and gradients). A module of another layout with a declared spec (a Hugging
Face model of a class whose config is read as its spec declares it) is compared with the
spec's oracle fed its own weights where they lie (spec.py).

Memory: the oracle reads the model's own weights layer by layer (`StreamedOracle`: one layer in
float64 on the CPU at a time, the readout in vocabulary blocks), and the fast model's gradients
are taken for about `GRAD_SHARE` of its parameters per backward pass, in the order the oracle
produces its gradients, so no pass holds more than that share of gradients beside the weights.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import torch
from torch import nn

from ...objective import logits_of
from ...references.oracle import StreamedOracle
from .. import tolerances
from ..measure import batch_not_equal, largest, scaled_excess
from ..result import CheckResult
from ..sharding import whole
from .stress import declares_softcap
from .spec import check_spec_oracle
from ..subject import Subject, own_weight

GRAD_SHARE = 0.25
"""At most this share of the parameters (or one oracle stage, if larger) gets gradients in one
backward pass: 4 or 5 backward passes from one fast forward at (B, T) = (2, 6) instead of a
second model's worth of gradients (GPT-2 XL: 1.6 GB of gradients at a time instead of 6.2 GB)."""


def check_oracle(s: Subject) -> CheckResult:
    """Fast forward (the model itself) against the slow oracle fed the same weights, on a short
    sequence (the oracle loops over heads and rows in Python). Values, the eager trace path, and
    the gradients of a fixed random projection of the logits with respect to every weight."""
    if s.facts.reference == "spec":  # a module of another layout, against its declared spec
        return check_spec_oracle(s)
    big = sum(p.numel() for p in s.parameters()) > 10_000_000
    seq_len = s.short_len(6 if big else 12)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(11)
    ids = s.random_ids(batch, seq_len, gen)
    # The logits are projected on fixed random weights (B, T, V) so one backward gives every
    # weight's gradient; rounded to the model's dtype, so both sides start from the same numbers.
    projection = torch.randn(batch, seq_len, s.vocab_size, generator=gen,
                             dtype=torch.float64).to(s.dtype).double()
    floor = s.rounding_floor()
    tol = tolerances.oracle(s.dtype, floor)
    named = dict(s.work.named_parameters(remove_duplicate=False))
    oracle = StreamedOracle(functools.partial(own_weight, named), s.cfg, ids, progress=s.progress)
    fast = s.run(ids).double().cpu()
    worst, allowed = scaled_excess(fast - oracle.logits, oracle.logits, tol)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(s.dtype),
                      "max_abs_logit_error": worst, "allowed": allowed, "rounding_floor": floor}
    problems = []
    if not worst <= allowed:
        rows = (fast - oracle.logits).abs().amax((0, 2))
        evidence["error_by_position"] = rows.tolist()
        problems.append(f"fast logits differ from the slow oracle by up to {worst:.3g} (allowed "
                        f"{allowed:.1e}); first differing position "
                        f"{int((rows > allowed).nonzero()[0])}")
    if s.has_trace and not problems:
        problems += _compare_paths(s, ids, fast, tol, evidence)
    if s.has_trace and not problems and declares_softcap(s.cfg):
        problems += _compare_capped(s, ids, fast, tol, evidence)
    compared = 0
    if not problems:
        compared, grad_problems = _compare_grads(s, named, oracle, ids, projection, evidence)
        problems += grad_problems
    if problems:
        return CheckResult("oracle", False, problems[0], evidence, tol)
    grads_note = f"; gradients of {compared} weights agree" if compared else ""
    if "max_abs_logit_error" in evidence.get("capped", {}):
        grads_note = f"; and past the declared soft-caps{grads_note}"
    return CheckResult("oracle", True, f"fast logits = oracle on ({batch}, {seq_len}) ids (max "
                       f"error {worst:.1e}){grads_note}", evidence, tol)


SHARPENED_SCORE = 2.0
"""The eager (traced) and fast paths are compared twice: as the model is, and with every layer's
largest attention score brought to about 2 (queries and keys scaled by forward hooks). Freshly
initialised weights give scores of order 1e-3, where softmax is nearly uniform: a wrong score
scale on one path (1/Dh for 1/sqrt(Dh)) then moves logits by a few eps of float32; at scores of
order 1 the same defect moves them by percents (tiny-368: 44 eps -> 2e-3 of the logit scale).
2 keeps bfloat16's rounding of the scores (eps 7.8e-3 of 2) inside the tolerance."""


def _compare_paths(s: Subject, ids: torch.Tensor, fast: torch.Tensor, tol: float,
                   evidence: dict) -> list[str]:
    """The traced (eager) path against the fast path, natural and sharpened (see above)."""
    eager, trace = s.trace(ids)
    score_max = [float(trace[name].abs().max()) for name in trace if name.endswith(".attn.scores")]
    e_worst, e_allowed = scaled_excess(eager.double().cpu() - fast, fast, tol)
    del eager, trace
    evidence["eager_vs_fast_max_abs"] = e_worst
    if not e_worst <= e_allowed:
        return [f"the eager (traced) path differs from the fast path by {e_worst:.3g}"]
    with s.scaled_scores(score_max, SHARPENED_SCORE) as sharpened:
        if not sharpened:
            return []
        s.progress(f"sharpened: attention scores brought to ~{SHARPENED_SCORE:g}")
        sharp_fast = s.run(ids).double().cpu()
        sharp_eager = s.trace(ids)[0].double().cpu()
    worst, allowed = scaled_excess(sharp_eager - sharp_fast, sharp_fast, tol)
    evidence["sharpened_eager_vs_fast_max_abs"] = worst
    if not worst <= allowed:
        return [f"the eager (traced) path differs from the fast path by {worst:.3g} (allowed "
                f"{allowed:.1e}) with attention scores brought to ~{SHARPENED_SCORE:g}"]
    return []


CAPPED_REACH = 3.0
"""The capped comparison brings each layer's largest attention score and the largest logit to
this many times the declared cap (stress.py says why past the cap and not below it)."""


def _compare_capped(s: Subject, ids: torch.Tensor, fast: torch.Tensor, tol: float,
                    evidence: dict) -> list[str]:
    """Our Decoder with a declared soft-cap, fast against the oracle once more with its scores and
    logits driven past the caps: each layer's queries and keys (their projections, or their q/k
    norm gains) scaled so its largest score is CAPPED_REACH caps, and the final norm's gain (or an
    untied readout) so the largest logit is; the weights are changed in place and put back bit for
    bit. Fresh weights keep scores near 1e-3, where c tanh(x / c) = x to 1e-8."""
    cfg = s.cfg
    if s.dtype in tolerances.LOW_PRECISION:  # scores of a cap rounded to 16 bits: see spec.py
        evidence["capped"] = {"skipped": f"{s.dtype} rounds scores at the cap by more than the "
                                         "tolerance"}
        return []
    named = dict(s.work.named_parameters())
    factors = {}
    if cfg.attn_softcap is not None:
        _, trace = s.trace(ids)
        for i in range(cfg.n_layers):
            top = float(trace[f"layers.{i}.attn.scores"].abs().max())
            part = ("q_norm", "k_norm") if cfg.qk_norm else ("q_proj", "k_proj")
            for name in part:
                factors.update({key: (CAPPED_REACH * cfg.attn_softcap / max(top, 1e-30)) ** 0.5
                                for key in (f"layers.{i}.attn.{name}.weight",
                                            f"layers.{i}.attn.{name}.bias") if key in named})
        del trace
    if cfg.logit_softcap is not None:
        reach = CAPPED_REACH * cfg.logit_softcap / max(float(fast.abs().max()), 1e-30)
        readout = "ln_final" if "ln_final.weight" in named else "lm_head"
        factors.update({key: reach for key in (f"{readout}.weight", f"{readout}.bias")
                        if key in named and not (readout == "lm_head" and cfg.tie_embeddings)})
    saved = {key: named[key].detach().clone() for key in factors}
    s.forget_clean()
    try:
        with torch.no_grad():
            for key, factor in factors.items():  # a gain (offset + w) scaled as a whole
                offset = cfg.norm_offset if key.endswith("norm.weight") or \
                    key == "ln_final.weight" else 0.0
                named[key].add_(offset).mul_(factor).sub_(offset)
        capped = s.run(ids).double().cpu()
        oracle = StreamedOracle(functools.partial(own_weight, dict(
            s.work.named_parameters(remove_duplicate=False))), cfg, ids, progress=s.progress)
        worst, allowed = scaled_excess(capped - oracle.logits, oracle.logits, tol)
    finally:
        with torch.no_grad():
            for key, value in saved.items():
                named[key].copy_(value)
        s.forget_clean()
    evidence["capped"] = {"max_abs_logit_error": worst, "allowed": allowed,
                          "scaled": sorted(factors), "reach": CAPPED_REACH}
    if worst <= allowed:
        return []
    return [f"with scores and logits driven to {CAPPED_REACH:g} times the declared soft-caps "
            f"(attn_softcap={cfg.attn_softcap}, logit_softcap={cfg.logit_softcap}) the fast "
            f"logits differ from the slow oracle by up to {worst:.3g} (allowed {allowed:.1e}): a "
            "declared soft-cap the fast path does not apply shows here first"]


@dataclass
class _Chunk:
    """Consecutive oracle stages whose weights get their fast gradients in one backward pass."""
    stages: list[str] = field(default_factory=list)
    params: list[nn.Parameter] = field(default_factory=list)
    numel: int = 0


def _chunks(s: Subject, named: dict[str, nn.Parameter],
            stages: Reads) -> list[_Chunk]:
    """Group the stages, in the oracle's backward order, so each pass's new parameters (those
    whose first stage is in it) stay within GRAD_SHARE of the model. A weight read by a later
    stage too (a tied embedding) gets its gradient in the pass of its first stage."""
    budget = GRAD_SHARE * sum(p.numel() for p in s.parameters())
    chunks, seen = [_Chunk()], set()
    for stage, names in stages:
        new = []
        for name in names:
            param = named.get(name)
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                new.append(param)
        numel = sum(p.numel() for p in new)
        if chunks[-1].stages and new and chunks[-1].numel + numel > budget:
            chunks.append(_Chunk())
        chunks[-1].stages.append(stage)
        chunks[-1].params += new
        chunks[-1].numel += numel
    return chunks


Reads = list[tuple[str, dict[str, torch.Tensor | None]]]


class _GradientLedger:
    """The fast gradients against the oracle's pieces, weight by weight, while each fast
    gradient is alive (the pass of the weight's first stage in backward order).

    A piece's rows are compared at once, except rows a later stage reads too (a tied embedding:
    the readout's pieces come first, the lookup's last, for the rows the ids look up): those
    keep a residual, fast gradient minus the pieces so far, in at least float32, until the last
    stage. Rows no stage reads (embedding rows no id looks up) must have a zero fast gradient."""

    def __init__(self, named: dict[str, nn.Parameter], stages: Reads) -> None:
        self.names: dict[int, str] = {}
        for name, param in named.items():
            self.names.setdefault(id(param), name)
        self.params: dict[int, nn.Parameter] = {}
        self.first: dict[int, int] = {}  # the first stage (in backward order) reading a weight
        self.last: dict[int, int] = {}
        later: dict[int, list[torch.Tensor | None]] = {}  # rows read after the first stage
        for index, (_, reads) in enumerate(stages):
            for name, rows in reads.items():
                param = named.get(name)
                if param is None:
                    continue
                pid = id(param)
                self.params[pid] = param
                if pid in self.first:
                    later.setdefault(pid, []).append(rows)
                else:
                    self.first[pid] = index
                self.last[pid] = index
        self.pending = {pid: _union(rows, self.params[pid].shape[0])
                        for pid, rows in later.items()}
        self.residual: dict[int, torch.Tensor] = {}
        self.covered: dict[int, torch.Tensor] = {}
        self.errors: dict[str, float] = {}
        self.scale = 0.0  # largest |oracle gradient piece|

    def piece(self, stage: int, param: nn.Parameter, rows: torch.Tensor | None,
              grad: torch.Tensor) -> None:
        pid = id(param)
        self.scale = max(self.scale, largest(grad))
        rows = torch.arange(param.shape[0]) if rows is None else rows
        pending = self.pending.get(pid)
        if stage == self.first[pid]:
            fast = _dense(param.grad, param)
            self.covered.setdefault(pid, torch.zeros(param.shape[0], dtype=torch.bool))[rows] = True
            if pending is not None and pid not in self.residual:
                wide = torch.promote_types(param.dtype, torch.float32)
                self.residual[pid] = fast[pending.to(fast.device)].to("cpu", wide)
            now = torch.ones_like(rows, dtype=torch.bool) if pending is None else \
                ~torch.isin(rows, pending)
            if now.all():  # the usual case: a whole weight, or a block of consecutive rows
                # In place: the piece is the ledger's to consume, and a fresh weight-sized
                # float64 tensor costs more in page faults than the subtraction itself.
                self._error(pid, largest(grad.sub_(_rows(fast, rows).to("cpu"))))
                return
            if now.any():
                have = fast[rows[now].to(fast.device)].to("cpu", torch.float64)
                self._error(pid, largest(have - grad[now]))
            rows, grad = rows[~now], grad[~now]
        residual = self.residual[pid]  # rows read by a later stage: add up
        at = torch.searchsorted(pending, rows)
        residual[at] -= grad.to(residual.dtype)

    def end_stage(self, stage: int, param: nn.Parameter) -> None:
        """A stage that reads `param` is over."""
        pid = id(param)
        if stage == self.first[pid]:
            unread = ~self.covered.pop(pid)
            if pid in self.pending:
                unread[self.pending[pid]] = False
            if unread.any():  # rows no stage reads: their fast gradient must be exactly 0
                fast = _dense(param.grad, param)
                self._error(pid, largest(fast[unread.to(fast.device)]))
        if stage == self.last[pid] and pid in self.residual:
            self._error(pid, largest(self.residual.pop(pid)))

    def _error(self, pid: int, err: float) -> None:
        name = self.names[pid]
        self.errors[name] = max(self.errors.get(name, 0.0), err)


def _union(rows: list[torch.Tensor | None], count: int) -> torch.Tensor:
    """Sorted unique rows of a weight read by later stages (None: every row)."""
    if any(r is None for r in rows):
        return torch.arange(count)
    return torch.unique(torch.cat(rows))


def _rows(tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """tensor[rows]: a view when the rows are consecutive (readout blocks, whole weights)."""
    start, count = int(rows[0]), len(rows)
    if int(rows[-1]) == start + count - 1 and (count < 3 or bool((rows.diff() == 1).all())):
        return tensor[start:start + count]
    return tensor[rows.to(tensor.device)]


def _dense(grad: torch.Tensor | None, param: nn.Parameter) -> torch.Tensor:
    """The whole gradient of `param` (zeros when it got none)."""
    if grad is None:
        return torch.zeros(param.shape, dtype=param.dtype, device=param.device)
    return whole(grad)


def _compare_grads(s: Subject, named: dict[str, nn.Parameter], oracle: StreamedOracle,
                   ids: torch.Tensor, projection: torch.Tensor,
                   evidence: dict) -> tuple[int, list[str]]:
    """Every weight's fast gradient against the oracle's, chunk by chunk (see GRAD_SHARE), the
    error scaled by the largest oracle gradient. Returns (weights compared, problems)."""
    stages = oracle.backward_stages()
    chunks = _chunks(s, named, stages)
    ledger = _GradientLedger(named, stages)
    index_of = {stage: index for index, (stage, _) in enumerate(stages)}
    by_stage = itertools.groupby(oracle.backward(projection), key=lambda piece: piece[0])
    device_ids, device_projection = ids.to(s.device), projection.to(s.device)
    def objective() -> torch.Tensor | None:
        fast = logits_of(s.forward(device_ids))
        s.count(ids)
        # No weight reaches the logits when fast does not require grad: every gradient is 0.
        return (fast.double() * device_projection).sum() if fast.requires_grad else None

    passes = s.gradients_by_share([chunk.params for chunk in chunks], objective)
    for number, (chunk, _) in enumerate(zip(chunks, passes), start=1):
        s.progress(f"gradients: pass {number}/{len(chunks)}")
        for stage in chunk.stages:
            yielded, pieces = next(by_stage)
            assert yielded == stage, (yielded, stage)
            index = index_of[stage]
            for _, name, rows, grad in pieces:
                ledger.piece(index, named[name], rows, grad)
            for param in {id(named[n]): named[n] for n in stages[index][1]
                          if n in named}.values():
                ledger.end_stage(index, param)
    allowed = tolerances.oracle_grad(s.dtype, s.rounding_floor()) * ledger.scale
    worst_name, worst = max(ledger.errors.items(), key=lambda item: item[1],
                            default=(None, 0.0))
    evidence.update(max_abs_grad_error=worst, worst_grad_parameter=worst_name,
                    grad_allowed=allowed, grad_passes=len(chunks))
    if worst <= allowed:
        return len(ledger.errors), []
    return len(ledger.errors), [f"gradient of {worst_name} differs from the oracle's by "
                                f"{worst:.3g} (allowed {allowed:.1e})"]
