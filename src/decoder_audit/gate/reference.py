"""`oracle`: the fast forward equals the slow float64 oracle fed the same weights (values, the
eager traced path, and gradients). A black box the Hugging Face converter can read is compared
with the oracle fed its converted weights.
"""

from __future__ import annotations

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
    cfg = s.cfg
    big = sum(p.numel() for p in s.model.parameters()) > 10_000_000
    seq_len = s.short_len(6 if big else 12)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(11)
    ids = s.random_ids(batch, seq_len, gen)
    model = s.work
    tol, grad_tol = tolerances.oracle(s.dtype), tolerances.oracle_grad(s.dtype)
    with_grads = not s.in_place
    named = list(model.named_parameters(remove_duplicate=False))
    # One oracle leaf per Parameter object, so a tied weight is one leaf under both names. The
    # oracle runs on the CPU in float64 whatever device the model is on.
    leaves: dict[int, torch.Tensor] = {}
    for _, param in named:
        if id(param) not in leaves:
            # detach() shares storage with the (float64, CPU) working copy: nothing is copied,
            # and neither side writes to it.
            leaves[id(param)] = (param.detach().to("cpu", torch.float64)
                                 .requires_grad_(with_grads))
    state = {name: leaves[id(param)] for name, param in named}
    state.update({name: buf.cpu() for name, buf in model.named_buffers()})
    weights = torch.randn(batch, seq_len, s.vocab_size, generator=gen, dtype=torch.float64)

    if with_grads:
        for _, param in named:
            param.requires_grad_(True)
            param.grad = None
    try:
        with torch.enable_grad():
            fast = logits_of(model(ids.to(s.device)))
            s.count(ids)
            if with_grads:
                (fast.double() * weights.to(fast.device)).sum().backward()
        reference = oracle_logits(state, cfg, ids)
        if with_grads:
            (reference * weights).sum().backward()
    finally:
        grads = {name: (None if p.grad is None else p.grad.detach().double().cpu())
                 for name, p in model.named_parameters()}
        if with_grads:
            for _, param in named:
                param.grad = None
                param.requires_grad_(False)
    fast = fast.detach().double().cpu()
    worst, allowed = scaled_excess(fast - reference.detach(), reference, tol)
    evidence: dict = {"batch": batch, "seq_len": seq_len, "dtype": str(s.dtype),
                      "max_abs_logit_error": worst, "allowed": allowed}
    problems = []
    if not worst <= allowed:
        rows = (fast - reference.detach()).abs().amax((0, 2))
        evidence["error_by_position"] = rows.tolist()
        problems.append(f"fast logits differ from the slow oracle by up to {worst:.3g} (allowed "
                        f"{allowed:.1e}); first differing position "
                        f"{int((rows > allowed).nonzero()[0])}")
    if s.has_trace:
        eager, _ = model.run_with_trace(ids.to(s.device))
        s.count(ids)
        e_worst, e_allowed = scaled_excess(eager.double().cpu() - fast, fast, tol)
        evidence["eager_vs_fast_max_abs"] = e_worst
        if not e_worst <= e_allowed:
            problems.append(f"the eager (traced) path differs from the fast path by {e_worst:.3g}")
    if with_grads and not problems:
        by_object = {id(p): name for name, p in model.named_parameters()}
        scale = max((float(leaf.grad.abs().max()) for leaf in leaves.values()
                     if leaf.grad is not None), default=0.0)
        g_allowed = grad_tol * max(scale, 1e-30)
        grad_worst, grad_name = 0.0, None
        for pid, leaf in leaves.items():
            name = by_object.get(pid)
            want = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            have = grads.get(name)
            have = torch.zeros_like(want) if have is None else have
            err = float((have - want).abs().max()) if want.numel() else 0.0
            if err > grad_worst:
                grad_worst, grad_name = err, name
        evidence.update(max_abs_grad_error=grad_worst, worst_grad_parameter=grad_name,
                        grad_allowed=g_allowed)
        if not grad_worst <= g_allowed:
            problems.append(f"gradient of {grad_name} differs from the oracle's by {grad_worst:.3g} "
                            f"(allowed {g_allowed:.1e})")
    if problems:
        return CheckResult("oracle", False, problems[0], evidence, tol)
    grads_note = f"; gradients of {len(leaves)} weights agree" if with_grads else ""
    return CheckResult("oracle", True, f"fast logits = oracle on ({batch}, {seq_len}) ids (max error "
                       f"{worst:.1e}){grads_note}", evidence, tol)


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
