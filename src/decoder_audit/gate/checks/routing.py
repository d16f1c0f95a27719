"""The routing checks of a model with routed experts: a white-box Decoder whose config routes
some layers (its trace records each token's expert weights, `layers.{i}.ffn.gates` (B, T, E)),
and for routing_independence also a module whose declared spec routes and whose routers the
layout placed (a Hugging Face MoE: transformers 5's router modules return each token's chosen
experts and weights, recorded by a forward hook; an older router, a Linear, its logits).

- `routing_independence`: a token's experts and their weights read neither the other rows of
  the batch nor the later tokens of its own row. Routing is a per-token function of the token's
  own stream, so a correct router passes exactly (the rows compared sit at the same batch index
  of batches of the same shape); a router that drops tokens over an expert's capacity, counted
  over the batch in order, reads both, which for a causal LM is a leak: the failure names the
  declared capacity. It sees the leak in the routing itself, however small the dropped
  expert's contribution to the logits (which batch_independence and causal judge).
- `expert_gradients`: every routed expert gets a gradient from the next-token loss of a probe
  that routes a token to each of them: the router's logits are moved (by a forward hook) so
  that token n's largest, by far, is expert n mod E, and a selection-only bias is held at 0 for
  the probe, then restored bit for bit. An expert cut off from the loss (a detached output, a weight
  never applied) is named, even one the router never chooses on its own, which
  dead_parameters' random probe cannot reach (it names such experts as not judged).

Shape letters: B batch, T sequence, E experts, k experts per token, N = B*T tokens.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...objective import logits_of
from .. import tolerances
from ..result import CheckResult
from ..subject import Subject


PUSH_DOWN = 30.0
"""How far the probe of expert_gradients lowers the router logits of a token's other experts:
their sigmoid scores fall below 1e-13 and their softmax share below e^-30, so the target is
chosen, and weighs about 1, whatever the scoring, the groups and the other logits."""


def _declared(s: Subject):
    """The routed architecture: our config, or the declared spec."""
    return s.cfg if s.cfg is not None else s.facts.spec


def _routed_layers(s: Subject) -> list[int]:
    spec = _declared(s)
    return [i for i in range(spec.n_layers) if spec.routes(i)]


def _gates(s: Subject, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each routed layer's expert weights per token, (B, T, E): from the traced run (ours), or
    recorded at each placed router module (`placed_routers`)."""
    if s.cfg is not None:
        _, trace = s.trace(ids)
        return {i: trace[f"layers.{i}.ffn.gates"].float().cpu() for i in _routed_layers(s)}
    experts, seen = s.facts.spec.n_experts, {}

    def record(layer: int):
        def hook(module, inputs, output):
            if isinstance(output, tuple) and len(output) == 3:  # (logits, weights, indices)
                _, weights, chosen = output  # (N, k) each
                dense = torch.zeros(chosen.shape[0], experts, dtype=torch.float32,
                                    device=chosen.device)
                seen[layer] = dense.scatter(1, chosen, weights.float())  # (N, E)
            elif isinstance(output, tuple) and len(output) == 2:  # (weights (N, E), indices)
                seen[layer] = output[0].detach().float().reshape(-1, experts)  # gpt-oss in 4.5x
            else:  # a router that returns its logits (N, E): the block chooses from them
                seen[layer] = output.detach().float().reshape(-1, experts)
        return hook

    hooks = [module.register_forward_hook(record(layer))
             for layer, module in placed_routers(s).items()]
    try:
        s.run(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return {layer: gates.reshape(*ids.shape, experts).cpu() for layer, gates in seen.items()}


def placed_routers(s: Subject) -> dict[int, torch.nn.Module]:
    """Each routed layer's router module, found where the layout placed ffn.router.weight (a
    declared spec's module); empty when it was not placed."""
    placement = s.facts.placement
    spots = getattr(placement, "spots", None) or {}
    found = {}
    for layer in _routed_layers(s):
        spot = spots.get(f"layers.{layer}.ffn.router.weight")
        if spot is not None and spot.source.endswith(".weight"):
            found[layer] = s.work.get_submodule(spot.source.removesuffix(".weight"))
    return found


def check_routing_independence(s: Subject) -> CheckResult:
    """The last row's expert weights with the other rows replaced, and every row's weights
    before a cut with the tokens after it replaced, against the same tokens' weights in the
    base batch (same shape, same batch index: a correct router gives them bitwise)."""
    seq_len = s.short_len(12)
    gen = s.generator(83)
    ids = s.random_ids(3, seq_len, gen)
    base = _gates(s, ids)
    others = ids.clone()
    # the last row kept: a router that counts tokens over the batch in order (capacity) reads
    # the rows before a row, never those after it
    others[:-1] = s.other_ids(ids[:-1].contiguous(), gen)
    variants = [("the other rows of the batch", others, (slice(2, 3), slice(None)))]
    cut = max(1, seq_len // 2)
    if seq_len > 1:
        later = ids.clone()
        later[:, cut:] = s.other_ids(ids[:, cut:].contiguous(), gen)  # those before it kept
        variants.append((f"the tokens after position {cut - 1}", later,
                         (slice(None), slice(0, cut))))
    tol = tolerances.shape_change(s.dtype)
    moved = []
    for what, variant, kept in variants:
        for layer, gates in _gates(s, variant).items():
            change = float((gates[kept] - base[layer][kept]).abs().max())
            if change > tol * max(1.0, _declared(s).routed_scaling):
                moved.append((what, layer, change))
    evidence = {"batch": 3, "seq_len": seq_len, "cut": cut, "allowed": tol,
                "moved": [{"changed": w, "layer": i, "by": c} for w, i, c in moved]}
    if moved:
        return CheckResult("routing_independence", False, _leak(s, moved), evidence, tol)
    return CheckResult("routing_independence", True, f"every token's experts and weights in "
                       f"{len(base)} routed layers are unchanged when the other rows or the later "
                       "tokens change", evidence, tol)


def _leak(s: Subject, moved: list[tuple[str, int, float]]) -> str:
    """The failure: what moved a token's routing, where, by how much, and the declared capacity
    that explains it, if one is declared."""
    what, layer, change = moved[0]
    said = (f"a token's expert weights in layers.{layer}.ffn changed by up to {change:.3g} when "
            f"{what} changed" + (f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""))
    cfg = _declared(s)
    if cfg.capacity_factor is None:
        return said + ": the router reads other tokens"
    tokens = 3 * s.short_len(12)
    return (said + f": capacity_factor={cfg.capacity_factor} lets each expert take at most "
            f"{cfg.expert_capacity(tokens)} of the forward's {tokens} tokens (ceil(capacity_factor "
            f"x B x T x k / E)), dropping the rest in batch order, so a token's experts read the "
            "other rows and the later tokens: a leak for a causal LM")


def _target_raised(logits: torch.Tensor, target: torch.Tensor, experts: int) -> torch.Tensor:
    """Router logits (N, E) with token n's target expert 1 above its largest and the others
    PUSH_DOWN lower still: constants, so the router's own gradient is untouched; a sigmoid
    score saturates, and with the others near 0 the target's group ranks first too
    (group-limited routing)."""
    want = F.one_hot(target.to(logits.device), experts).to(logits.dtype)  # (N, E)
    gap = logits.max(-1, keepdim=True).values - (logits * want).sum(-1, keepdim=True)
    return logits + (want * (gap + 1.0) - (1 - want) * PUSH_DOWN).detach()


@contextmanager
def _routed_to_each(s: Subject, tokens: int):
    """Within the block, token n of a forward of `tokens` tokens ranks expert n mod E first in
    every routed layer: the router's logits raised by a constant (no gradient of its own) so
    the target's exceeds the largest by 1; selection-only biases held at 0."""
    experts = s.cfg.n_experts
    target = torch.arange(tokens) % experts  # (N,)
    hooks, biases = [], []

    def raise_target(module, inputs, logits):  # logits (N, E)
        return _target_raised(logits, target, experts)

    try:
        for i in _routed_layers(s):
            router = s.work.get_submodule(f"layers.{i}.ffn.router")
            hooks.append(router.register_forward_hook(raise_target))
            if getattr(router, "selection_bias", None) is not None:
                biases.append((router.selection_bias, router.selection_bias.detach().clone()))
        with torch.no_grad():
            for bias, _ in biases:
                bias.zero_()
        s.forget_clean()
        yield
    finally:
        for hook in hooks:
            hook.remove()
        with torch.no_grad():
            for bias, saved in biases:
                bias.copy_(saved)
        s.forget_clean()


@contextmanager
def _placed_routed_to_each(s: Subject, tokens: int):
    """`_routed_to_each` for a declared spec's placed routers: a router module that returns
    (logits, weights, indices) (transformers 5) has its choice replaced, token n's k experts
    n, n + 1, ... mod E, weighed by their softmax probabilities (differentiable, so the experts
    and the router keep their gradients); one that returns (weights (N, E), indices) (gpt-oss
    in 4.55 to 4.57) the same, its logits recomputed from its own weight and bias on its input;
    one that returns its logits has them moved as ours."""
    spec = s.facts.spec
    experts, k = spec.n_experts, spec.experts_per_token
    chosen = (torch.arange(tokens)[:, None] + torch.arange(k)[None, :]) % experts  # (N, k)
    target = chosen[:, 0]  # (N,)

    def route(module, inputs, output):
        if isinstance(output, tuple) and len(output) == 3:
            logits, weights, _ = output  # (N, E), (N, k), (N, k)
            picked = chosen.to(logits.device)
            probs = logits.float().softmax(-1).gather(1, picked)  # (N, k)
            return logits, probs.to(weights.dtype), picked
        if isinstance(output, tuple) and len(output) == 2:
            weights = output[0]  # (N, E): zero but for each token's k experts
            x = inputs[0].reshape(-1, module.weight.shape[1])  # (N, D)
            logits = F.linear(x, module.weight, getattr(module, "bias", None))  # (N, E)
            picked = chosen.to(logits.device)
            probs = logits.float().softmax(-1).gather(1, picked)  # (N, k)
            dense = torch.zeros_like(weights).scatter(1, picked, probs.to(weights.dtype))
            return dense, picked
        return _target_raised(output, target, experts)

    hooks = [module.register_forward_hook(route) for module in placed_routers(s).values()]
    s.forget_clean()
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        s.forget_clean()


def _placed_experts(s: Subject) -> dict[str, list[tuple[nn.Parameter, Any]]]:
    """Each routed expert ("layers.{i}.ffn.experts.{e}") -> (module Parameter, its Spot) of its
    matrices where the layout placed them (an expert's rows of a fused tensor, or its own)."""
    spots = s.facts.placement.spots
    named = dict(s.work.named_parameters(remove_duplicate=False))
    found: dict[str, list[tuple[nn.Parameter, Any]]] = {}
    for layer in _routed_layers(s):
        for e in range(s.facts.spec.n_experts):
            name = f"layers.{layer}.ffn.experts.{e}"
            found[name] = [(named[spot.source], spot) for w in ("w1", "w2", "w3")
                           if (spot := spots.get(f"{name}.{w}.weight")) is not None]
    return found


def _placed_expert_gradients(s: Subject, batch: int, seq_len: int, ids: torch.Tensor,
                             loss) -> tuple[dict[str, float], set[str]]:
    """({expert: its largest gradient}, the experts given rows) for a declared spec's module:
    every expert is given rows by the forced choice (N >= E), and its gradient is read from
    its own rows of the module's Parameters."""
    experts = _placed_experts(s)
    params = list({id(p): p for pairs in experts.values() for p, _ in pairs}.values())
    reached: dict[str, float] = {}
    with _placed_routed_to_each(s, batch * seq_len):
        for share in s.gradients_by_share([params], loss):
            for name, pairs in experts.items():
                reached[name] = max((float(spot.view(p.grad).abs().max()) for p, spot in pairs
                                     if p.grad is not None), default=0.0)
            del share
    return reached, set(experts) if batch * seq_len >= s.facts.spec.n_experts else set()


def check_expert_gradients(s: Subject) -> CheckResult:
    """Every routed expert's weights get a nonzero gradient from the next-token loss of a probe
    routed to each expert (see the module docstring); an expert without one is named."""
    cfg = _declared(s)
    seq_len = s.short_len(16)
    batch = max(2, math.ceil(cfg.n_experts / seq_len))
    gen = s.generator(89)
    ids = s.random_ids(batch, seq_len, gen).to(s.device)
    targets = s.random_ids(batch, seq_len, gen).to(s.device)

    def loss() -> torch.Tensor | None:
        s.count(ids)
        logits = logits_of(s.forward(ids))
        value = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return value if value.requires_grad else None

    if s.cfg is None:  # a declared spec's module: its placed routers and experts
        reached, given_rows = _placed_expert_gradients(s, batch, seq_len, ids, loss)
        return _expert_verdict(reached, given_rows, set(reached), batch, seq_len)
    experts = {f"layers.{i}.ffn.experts.{e}": s.work.get_submodule(f"layers.{i}.ffn.experts.{e}")
               for i in _routed_layers(s) for e in range(cfg.n_experts)}
    params = [p for module in experts.values() for p in module.parameters()]
    reached: dict[str, float] = {}
    given_rows: set[str] = set()  # the experts the probe's forward sent rows to
    hooks = [module.register_forward_hook(
        lambda _, inputs, __, name=name: given_rows.add(name) if inputs[0].numel() else None)
        for name, module in experts.items()]
    try:
        with _routed_to_each(s, batch * seq_len):
            for share in s.gradients_by_share([params], loss):
                for name, module in experts.items():
                    reached[name] = max((float(p.grad.abs().max()) for p in module.parameters()
                                         if p.grad is not None), default=0.0)
                del share
    finally:
        for hook in hooks:
            hook.remove()
    return _expert_verdict(reached, given_rows, set(experts), batch, seq_len)


def _expert_verdict(reached: dict[str, float], given_rows: set[str], experts: set[str],
                    batch: int, seq_len: int) -> CheckResult:
    dead = [name for name, size in reached.items() if size == 0.0 and name in given_rows]
    missed = sorted(set(experts) - given_rows)  # not reached even so: not judged, named
    evidence = {"batch": batch, "seq_len": seq_len, "experts": len(experts), "dead": dead,
                "not_reached": missed}
    if dead:
        return CheckResult("expert_gradients", False, f"{len(dead)} of {len(experts)} routed "
                           f"experts get no gradient from the loss though tokens are routed to "
                           f"them: {', '.join(dead[:4])}" + (" ..." if len(dead) > 4 else "")
                           + " (cut off from the loss, or their output never added)", evidence)
    said = (f"; {len(missed)} not reached by the probe, so not judged ({', '.join(missed[:3])})"
            if missed else "")
    return CheckResult("expert_gradients", True, f"all {len(experts) - len(missed)} routed "
                       f"experts the probe reached get a gradient from the loss of a probe routed "
                       f"to each ({batch} x {seq_len} tokens){said}", evidence)
