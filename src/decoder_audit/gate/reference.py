"""`oracle`: the fast forward equals the slow float64 oracle fed the same weights (values, the
eager traced path, and gradients). A black box the Hugging Face converter can read is compared
with the oracle fed its converted weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..objective import logits_of
from ..oracle import oracle_logits
from . import tolerances
from .result import CheckResult, skipped
from .subject import Subject, batch_not_equal, scaled_excess


def check_oracle(s: Subject) -> CheckResult:
    """Fast forward (the working copy) against `oracle_logits` fed the same weights, on a short
    sequence (the oracle loops over heads and rows in Python). Values, the eager trace path, and
    the gradients of a fixed random projection of the logits with respect to every weight."""
    if s.cfg is None:
        return _check_hf_against_oracle(s)
    big = sum(p.numel() for p in s.model.parameters()) > 10_000_000
    seq_len = s.short_len(6 if big else 12)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(11)
    ids = s.random_ids(batch, seq_len, gen)
    # The logits are projected on fixed random weights (B, T, V) so one backward gives every
    # weight's gradient.
    projection = torch.randn(batch, seq_len, s.vocab_size, generator=gen, dtype=torch.float64)
    tol = tolerances.oracle(s.dtype)
    run = _run_fast_and_oracle(s, ids, projection, with_grads=not s.in_place)
    worst, allowed = scaled_excess(run.fast - run.reference, run.reference, tol)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(s.dtype),
                      "max_abs_logit_error": worst, "allowed": allowed}
    problems = []
    if not worst <= allowed:
        rows = (run.fast - run.reference).abs().amax((0, 2))
        evidence["error_by_position"] = rows.tolist()
        problems.append(f"fast logits differ from the slow oracle by up to {worst:.3g} (allowed "
                        f"{allowed:.1e}); first differing position "
                        f"{int((rows > allowed).nonzero()[0])}")
    if s.has_trace:
        eager, _ = s.work.run_with_trace(ids.to(s.device))
        s.count(ids)
        e_worst, e_allowed = scaled_excess(eager.double().cpu() - run.fast, run.fast, tol)
        evidence["eager_vs_fast_max_abs"] = e_worst
        if not e_worst <= e_allowed:
            problems.append(f"the eager (traced) path differs from the fast path by {e_worst:.3g}")
    if run.leaves is not None and not problems:
        problems += _compare_grads(s, run, evidence)
    if problems:
        return CheckResult("oracle", False, problems[0], evidence, tol)
    grads_note = f"; gradients of {len(run.leaves)} weights agree" if run.leaves else ""
    return CheckResult("oracle", True, f"fast logits = oracle on ({batch}, {seq_len}) ids (max "
                       f"error {worst:.1e}){grads_note}", evidence, tol)


@dataclass
class _OracleRun:
    fast: torch.Tensor  # (B, T, V) float64 CPU, detached
    reference: torch.Tensor  # (B, T, V) float64 CPU, detached
    leaves: dict[int, torch.Tensor] | None  # id(Parameter) -> oracle leaf with .grad
    grads: dict[str, torch.Tensor | None]  # the fast model's gradient per parameter name


def _run_fast_and_oracle(s: Subject, ids: torch.Tensor, projection: torch.Tensor, *,
                         with_grads: bool) -> _OracleRun:
    model = s.work
    named = list(model.named_parameters(remove_duplicate=False))
    # One oracle leaf per Parameter object, so a tied weight is one leaf under both names. The
    # oracle runs on the CPU in float64 whatever device the model is on; detach() shares
    # storage with the (float64, CPU) working copy: nothing is copied, neither side writes.
    leaves: dict[int, torch.Tensor] = {}
    for _, param in named:
        if id(param) not in leaves:
            leaves[id(param)] = (param.detach().to("cpu", torch.float64)
                                 .requires_grad_(with_grads))
    state = {name: leaves[id(param)] for name, param in named}
    state.update({name: buf.cpu() for name, buf in model.named_buffers()})
    trainable = [param for _, param in named] if with_grads else []
    for param in trainable:
        param.requires_grad_(True)
        param.grad = None
    try:
        with torch.enable_grad():
            fast = logits_of(model(ids.to(s.device)))
            s.count(ids)
            if with_grads:
                (fast.double() * projection.to(fast.device)).sum().backward()
        reference = oracle_logits(state, s.cfg, ids)
        if with_grads:
            (reference * projection).sum().backward()
    finally:
        grads = {name: (None if p.grad is None else p.grad.detach().double().cpu())
                 for name, p in model.named_parameters()}
        for param in trainable:
            param.grad = None
            param.requires_grad_(False)
    return _OracleRun(fast.detach().double().cpu(), reference.detach(),
                      leaves if with_grads else None, grads)


def _compare_grads(s: Subject, run: _OracleRun, evidence: dict) -> list[str]:
    """Every weight's gradient against the oracle leaf's, scaled by the largest oracle grad."""
    by_object = {id(p): name for name, p in s.work.named_parameters()}
    scale = max((float(leaf.grad.abs().max()) for leaf in run.leaves.values()
                 if leaf.grad is not None), default=0.0)
    g_allowed = tolerances.oracle_grad(s.dtype) * max(scale, 1e-30)
    grad_worst, grad_name = 0.0, None
    for pid, leaf in run.leaves.items():
        name = by_object.get(pid)
        want = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        have = run.grads.get(name)
        have = torch.zeros_like(want) if have is None else have
        err = float((have - want).abs().max()) if want.numel() else 0.0
        if err > grad_worst:
            grad_worst, grad_name = err, name
    evidence.update(max_abs_grad_error=grad_worst, worst_grad_parameter=grad_name,
                    grad_allowed=g_allowed)
    if grad_worst <= g_allowed:
        return []
    return [f"gradient of {grad_name} differs from the oracle's by {grad_worst:.3g} "
            f"(allowed {g_allowed:.1e})"]


def _check_hf_against_oracle(s: Subject) -> CheckResult:
    """A Hugging Face model (a black box to the rest of the gate) against the slow oracle fed its
    weights, when our converter can read it (`references.try_from_hf` decides, by model class):
    the HF forward must compute the architecture its config declares. Other black boxes, and HF
    models the converter refuses, are skipped with the converter's reason."""
    from ..references import try_from_hf

    converted, source = try_from_hf(s.model)
    if converted is None:
        return skipped("oracle", "black-box: the oracle needs a DecoderConfig and our weight names, "
                                 f"or a model the Hugging Face converter can read ({source})")
    name = type(s.model).__name__
    cfg = converted.config
    seq_len = s.short_len(6 if converted.num_parameters() > 10_000_000 else 12)
    ids = s.random_ids(batch_not_equal(seq_len, (2, 3)), seq_len, s.generator(11))
    with torch.no_grad():
        fast = logits_of(s.work(ids.to(s.device))).double().cpu()
        s.count(ids)
        reference = oracle_logits(converted.state_dict(), cfg, ids)
    tol = tolerances.hf_oracle(s.dtype, cfg)
    worst, allowed = scaled_excess(fast - reference, reference, tol)
    evidence = {"batch": ids.shape[0], "seq_len": seq_len, "dtype": str(s.dtype),
                "reference": source,
                "max_abs_logit_error": worst, "allowed": allowed}
    if not worst <= allowed:
        rows = (fast - reference).abs().amax((0, 2))
        evidence["error_by_position"] = rows.tolist()
        return CheckResult("oracle", False, f"{name} logits differ from the slow oracle fed its "
                           f"weights by up to {worst:.3g} (allowed {allowed:.1e})", evidence, tol)
    return CheckResult("oracle", True, f"{name} logits = oracle fed its converted weights on "
                       f"({ids.shape[0]}, {seq_len}) ids (max error {worst:.1e})", evidence, tol)
