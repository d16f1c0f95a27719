"""`router_aux_loss`: the routed training path, driven as a training step takes it (train mode,
`output_router_logits=True` and `labels=`, then one backward), and held to expectations drawn
from the routers' own weights, never from another output of the same forward:

  router logits  each routed layer's router weight (E, D), placed by the layout, applied in
                 float64 to the input its router module received (a forward pre-hook), plus its
                 bias (E,) where the spec declares one (gpt-oss): the router_logits the model
                 returns must equal them. A returned tensor that is
                 already a distribution (rows in [0, 1] summing to 1: a softmax applied before it
                 was returned, which the load-balancing loss then applies again) is named so.
  aux loss       Switch Transformer's load-balancing loss over the top k, as transformers' MoE
                 families define it, of the recomputed logits: over every routed layer's N tokens
                 together, P_e the mean softmax probability of expert e and F_e the share of
                 tokens whose k most probable experts include e, aux = E * sum_e F_e P_e. The
                 families define it so whatever their routers score and choose by (a sigmoid, a
                 selection bias, the top k before the softmax): the loss always takes the
                 softmax of the raw logits.
  loss           the cross entropy of the logits against the labels shifted once (model_loss
                 proves that term on its own) plus router_aux_loss_coef times the recomputed aux:
                 an aux loss left out or added with another coefficient fails.
  gradients      the backward of that loss reaches every router weight with the aux term's own
                 gradient: d loss/dW = d CE/dW + coef * d aux/dW, the last taken through the
                 recomputed aux on the same graph. An aux loss added detached (its value right,
                 its gradient lost) fails here, where no value can show it.

Shape letters: B batch, T sequence, D model width, E experts, k experts per token, N tokens of
one layer (B*T), L routed layers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ...objective import logits_of
from .. import tolerances
from ..measure import largest
from .model_loss import loss_of
from ..result import CheckResult
from .routing import placed_routers
from ..subject import Subject
from .training import in_train_mode

NAME = "router_aux_loss"


@contextmanager
def _router_inputs(routers: dict[int, nn.Module]) -> Iterator[list[tuple[int, torch.Tensor]]]:
    """Within the block, (layer, the input its router received) for every router call, in call
    order (the order the model returns its router logits in), the input kept on its graph."""
    seen: list[tuple[int, torch.Tensor]] = []
    hooks = [module.register_forward_pre_hook(
        lambda _module, args, layer=layer: seen.append((layer, args[0])) if args else None)
        for layer, module in routers.items()]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _router_weights(s: Subject, layers) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
    """Each routed layer's router weight (E, D) and the bias on its logits (E,) where the spec
    declares one (else None), views of the module's own Parameters."""
    spots = s.facts.placement.spots
    named = dict(s.work.named_parameters(remove_duplicate=False))
    out = {}
    for layer in layers:
        spot = spots[f"layers.{layer}.ffn.router.weight"]
        bias = spots.get(f"layers.{layer}.ffn.router.bias") if s.facts.spec.router_bias else None
        out[layer] = (spot.view(named[spot.source]),
                      None if bias is None else bias.view(named[bias.source]))
    return out


def load_balancing(logits: torch.Tensor, experts: int, k: int, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, dict]:
    """aux = E * sum_e F_e P_e over router logits (L N, E), differentiable in P_e, and the
    tokens whose k-th and (k+1)-th logits are so close that rounding may choose either
    ("near_ties"), with how far each would move aux if it did (`bounds`: the lowest and highest
    aux every such choice allows)."""
    probs = logits.softmax(-1)  # (L N, E)
    ranked = logits.detach().sort(-1, descending=True)
    chosen = ranked.indices[:, :k]  # (L N, k)
    share = F.one_hot(chosen, experts).sum(1).to(probs.dtype).mean(0)  # (E,): F_e
    mean_prob = probs.mean(0)  # (E,): P_e
    aux = experts * (share * mean_prob).sum()
    info = {"near_ties": 0, "bounds": (float(aux.detach()), float(aux.detach()))}
    if k < experts:
        gap = ranked.values[:, k - 1] - ranked.values[:, k]  # (L N,)
        scale = float(logits.detach().abs().max())
        ties = (gap <= tolerances.router_logits(dtype) * max(scale, 1e-30)).nonzero().flatten()
        lost, won = ranked.indices[ties, k - 1], ranked.indices[ties, k]
        # a tie choosing the other expert moves one token's share from `lost` to `won`
        moves = (experts / logits.shape[0] * (mean_prob[won] - mean_prob[lost])).detach()
        info = {"near_ties": int(ties.numel()),
                "bounds": (float(aux.detach()) + float(moves.clamp(max=0).sum()),
                           float(aux.detach()) + float(moves.clamp(min=0).sum()))}
    return aux, info


def _distribution(rows: torch.Tensor, dtype: torch.dtype) -> bool:
    """Every row in [0, 1] and summing to 1: probabilities, not logits."""
    tol = tolerances.normalised_sum(dtype)
    return bool(((rows >= 0) & (rows <= 1)).all()) and \
        float((rows.sum(-1) - 1).abs().max()) <= tol


def _returned_problem(returned, seen, weights, experts: int, dtype: torch.dtype,
                      evidence: dict) -> tuple[str, torch.Tensor | None]:
    """The returned router logits against each router's weight on its input: ("", the
    recomputed logits (L N, E) on their graph) or (what is wrong, None)."""
    if len(returned) != len(seen):
        return (f"returned {len(returned)} router logit tensors for {len(seen)} router calls "
                f"(layers {[layer for layer, _ in seen]})", None)
    recomputed, worst = [], []
    tol = tolerances.router_logits(dtype)
    for (layer, x), got in zip(seen, returned):
        weight, bias = weights[layer]
        want = x.reshape(-1, x.shape[-1]).double() @ weight.double().T  # (N, E)
        want = want if bias is None else want + bias.double()
        got = got.detach().double().reshape(-1, experts) if got.numel() % experts == 0 else got
        if tuple(got.shape) != tuple(want.shape):
            return (f"layers.{layer}: the returned router logits have shape "
                    f"{tuple(got.shape)}, not its router's (N, E) = {tuple(want.shape)}", None)
        error, allowed = largest(got - want.detach()), tol * max(largest(want), 1e-30)
        worst.append({"layer": layer, "max_abs_diff": error, "allowed": allowed})
        if _distribution(got, dtype) and not _distribution(want.detach(), dtype):
            evidence["router_logits"] = worst
            return (f"layers.{layer}: the returned router logits are already a distribution "
                    f"(every row in [0, 1], summing to 1): a softmax was applied before they "
                    f"were returned, so the load-balancing loss takes a softmax of "
                    f"probabilities; its router's weight on its input gives logits up to "
                    f"{largest(want):.3g}", None)
        if not error <= allowed:
            evidence["router_logits"] = worst
            return (f"layers.{layer}: the returned router logits differ by up to {error:.3g} "
                    f"(allowed {allowed:.1e}) from its router's weight applied to the input the "
                    f"router received: the model returns another tensor than its router "
                    "computed", None)
        recomputed.append(want)
    evidence["router_logits"] = worst
    return "", torch.cat(recomputed)


def check_router_aux_loss(s: Subject) -> CheckResult:
    """One training step's forward and backward with the load-balancing loss on (see the module
    docstring): the router logits, the aux loss, the loss and the routers' gradients."""
    spec, coef = s.facts.spec, s.facts.router_aux_coef
    routers = placed_routers(s)
    if not routers:
        return CheckResult(NAME, False, "the declared routed spec's router weights "
                           "(layers.{i}.ffn.router.weight) were not placed, so the router logits "
                           "cannot be recomputed", {"placed": False})
    weights = _router_weights(s, routers)
    params = _parameters_of(s, routers)
    ids = s.random_ids(2, s.short_len(8), s.generator(48)).to(s.device)  # (2, T)
    with in_train_mode(s), s.gradients_for(params.values()), _router_inputs(routers) as seen:
        s.count(ids)
        out = s.call(ids, labels=ids, output_router_logits=True)
        return _judged(s, out, seen, weights, params, ids, spec, coef)


def _parameters_of(s: Subject, routers: dict[int, nn.Module]) -> dict[int, nn.Parameter]:
    """Each routed layer's Parameter its router weight is a view of."""
    spots = s.facts.placement.spots
    named = dict(s.work.named_parameters(remove_duplicate=False))
    return {layer: named[spots[f"layers.{layer}.ffn.router.weight"].source] for layer in routers}


def _judged(s: Subject, out: Any, seen, weights, params, ids, spec, coef: float) -> CheckResult:
    aux, returned, loss = (getattr(out, "aux_loss", None), getattr(out, "router_logits", None),
                           loss_of(out))
    if not isinstance(aux, torch.Tensor) or not returned or loss is None:
        return CheckResult(NAME, False, "given output_router_logits=True and labels=, "
                           f"{type(s.work).__name__} returned no aux_loss, router_logits and loss "
                           "together", {"aux_loss": isinstance(aux, torch.Tensor),
                                        "router_logits": bool(returned), "loss": loss is not None})
    value = float(aux.detach())
    evidence: dict[str, Any] = {"coef": coef, "tokens": int(ids.numel()), "train_mode": True}
    problem, logits = _returned_problem(tuple(returned), seen, weights, spec.n_experts, s.dtype,
                                        evidence)
    if problem:
        return CheckResult(NAME, False, problem, evidence, tolerances.router_logits(s.dtype))
    expected, ties = load_balancing(logits, spec.n_experts, spec.experts_per_token, s.dtype)
    lm = _next_token_loss(logits_of(out), ids)  # float64, on the graph
    tol = max(s.shape_tolerance(), tolerances.eps(s.dtype) * 64)
    low, high = ties["bounds"]
    whole, want, ce = float(loss.detach()), float(expected.detach()), float(lm.detach())
    added = whole - ce
    evidence.update(aux_loss=value, expected=want, near_ties=ties["near_ties"], loss=whole,
                    cross_entropy=ce, added=added, allowed=tol)
    if not low - tol * max(abs(low), 1.0) <= value <= high + tol * max(abs(high), 1.0):
        return CheckResult(NAME, False, f"the model's aux_loss {value:.6g} is not the "
                           f"load-balancing loss E x sum_e F_e P_e = {want:.6g} of the "
                           f"logits its routers' weights give (E={spec.n_experts}, "
                           f"k={spec.experts_per_token}, {logits.shape[0]} routed tokens)",
                           evidence, tol)
    if abs(added - coef * want) > tol * max(abs(whole), 1.0):
        said = (": the aux loss is not added" if abs(added) <= tol * max(abs(whole), 1.0)
                else f" = {added / want:.4g} x aux")
        return CheckResult(NAME, False, f"with output_router_logits=True the loss is the cross "
                           f"entropy plus {added:.6g}{said}, not router_aux_loss_coef x aux = "
                           f"{coef:g} x {want:.6g} = {coef * want:.6g}", evidence, tol)
    problem = _gradient_problem(loss, lm, expected, coef, params, s.dtype, evidence)
    if problem:
        return CheckResult(NAME, False, problem, evidence, tol)
    return CheckResult(NAME, True, f"a training step with output_router_logits=True: the "
                       f"returned router logits = its routers' weights on their inputs, aux_loss "
                       f"= E x sum_e F_e P_e of them ({want:.4g}), the loss adds "
                       f"{coef:g} x it, and its gradient reaches every router", evidence, tol)


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of logits (B, T, V) at t against ids[t + 1], in float64."""
    logits = logits.double()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _gradient_problem(loss, lm, expected, coef: float, params, dtype: torch.dtype,
                      evidence: dict) -> str:
    """d loss/dW against d CE/dW + coef * d aux/dW for every router weight W, relative to the
    largest of the three; "" when they agree and the aux term reaches each router."""
    layers, weights = list(params), list(params.values())

    def grads(value: torch.Tensor, retain: bool) -> list[torch.Tensor]:
        got = torch.autograd.grad(value, weights, retain_graph=retain, allow_unused=True)
        return [torch.zeros_like(p, dtype=torch.float64) if g is None else g.double()
                for g, p in zip(got, weights)]

    g_loss, g_lm, g_aux = grads(loss, True), grads(lm, True), grads(expected, False)
    tol = tolerances.oracle_grad(dtype)
    records = []
    for layer, whole, ce, term in zip(layers, g_loss, g_lm, g_aux):
        scale = max(largest(whole), largest(ce), coef * largest(term))
        records.append({"layer": layer, "max_abs_diff": largest(whole - ce - coef * term),
                        "aux_gradient": coef * largest(term), "allowed": tol * scale})
    evidence["gradients"] = records
    silent = [r for r in records if not r["aux_gradient"] > r["allowed"]]
    if len(silent) == len(records):
        evidence["gradients_judged"] = False  # the aux term's gradient is below rounding
        return ""
    wrong = [r for r in records if not r["max_abs_diff"] <= r["allowed"]]
    if not wrong:
        return ""
    first = wrong[0]
    lost = first["max_abs_diff"] >= 0.5 * first["aux_gradient"]
    return (f"the loss's gradient at layers.{first['layer']}'s router differs from the cross "
            f"entropy's plus coef x the aux loss's by {first['max_abs_diff']:.3g} (allowed "
            f"{first['allowed']:.1e}; the aux term alone gives {first['aux_gradient']:.3g})"
            + (": the aux loss is added detached, so no gradient of it reaches the routers"
               if lost else ""))
