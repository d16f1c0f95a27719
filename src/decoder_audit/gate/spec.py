"""A declared architecture (`audit(model, spec=cfg)`, `verify --spec cfg.json`) checked on a
module we did not write: its weights placed on the spec's canonical names
(`references.layouts`), then

    params   the module's unique parameters against the spec's analytic ledger, row by row, and
             by name: a weight the spec expects that the module lacks, one of another shape, one
             the spec has no place for (an extra bias), a parameter nothing takes (an extra
             Linear) are each named;
    oracle   the spec's float64 oracle fed the module's own weights equals the module's logits
             and every weight's gradient, twice: with the weights as they are, and with
             `stress` weights written into the module (through the canonical views, restored
             bit for bit afterwards). Freshly initialised weights keep every activation small
             (attention scores ~1e-3: a wrong score scale, RoPE base or layout moves the logits
             by a few ulps), so the stress weights bring them to order 1: embeddings N(0, 1),
             matrices N(0, 1/fan_in), norm gains 1 + N(0, 0.2^2), biases and shifts N(0, 0.2^2).
             A difference is traced to its first stage: the residual stream entering each block
             and the final norm is compared with the oracle's (forward pre-hooks on the layout's
             block modules), so the report says "layer 1" or "the final norm or readout".

`tying` and `tying_grad` read the spec's tie_embeddings as the model's declaration (facts.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..accounting.ledger import measured_ledger, parameter_ledger, reconcile
from ..config import DecoderConfig
from ..objective import logits_of
from ..references.layouts import Placement, expected_weights
from ..references.oracle import StreamedOracle, oracle_logits
from . import tolerances
from .measure import batch_not_equal, largest, scaled_excess
from .result import CheckResult
from .subject import Subject

STRESS_GAIN_STD = 0.2
"""Spread of the stress weights' norm gains around 1 and of their biases and shifts around 0."""

GRADIENT_MAX_PARAMETERS = 50_000_000
"""The gradients are compared up to this many parameters: the oracle's side holds a float64
copy of every weight and its gradient (16 bytes a parameter: 0.8 GB here, 25 GB for GPT-2 XL),
where the values stream one stage at a time. Above it the logits are compared, as initialised
and with stress weights, and the report says the gradients were not."""


# ---- params ---------------------------------------------------------------------------------

def unplaced(s: Subject, name: str) -> CheckResult:
    """The verdict of params or oracle on a declared spec whose weights no layout placed: a
    failure (the architecture was declared and could not be checked), naming what was not found
    and the way to say where the weights are (weights_map=)."""
    return CheckResult(name, False, f"the declared spec could not be checked: "
                       f"{s.facts.reference_reason}", {"spec": s.facts.spec.to_dict(),
                                                       "placed": False,
                                                       "reason": s.facts.reference_reason})


def check_spec_params(s: Subject) -> CheckResult:
    """The module's parameters against the spec's ledger, by row and by name."""
    spec, placement = s.facts.spec, s.facts.placement
    if placement is None:
        return unplaced(s, "params")
    analytic = parameter_ledger(spec)
    measured = measured_ledger(s.model, names=_ledger_names(s.model, placement))
    problems = list(placement.problems)
    problems += [f"{name} ({tuple(s.model.get_parameter(name).shape)}): a parameter of the module "
                 "the spec has no place for" for name in placement.leftover]
    problems += reconcile(analytic, measured)
    evidence = {"layout": placement.layout, "spec": spec.to_dict(),
                "analytic": analytic.as_dict(), "measured": measured.as_dict(),
                "analytic_total": analytic.total, "measured_total": measured.total,
                "rows": [list(row) for row in analytic.grouped()],
                "measured_rows": [list(row) for row in measured.grouped()],
                "differences": problems, "leftover": list(placement.leftover)}
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return CheckResult("params", False, f"{problems[0]}{more}; layout {placement.layout}",
                           evidence)
    return CheckResult("params", True, f"measured {measured.total:,} unique parameters = the "
                       f"spec's analytic {analytic.total:,} (layout {placement.layout}, every "
                       "weight placed)", evidence)


def _ledger_names(model: nn.Module, placement: Placement) -> dict[str, str]:
    """module parameter name -> the canonical name it holds, for every name of each placed
    Parameter (by identity, so a tied weight counts as the embedding under any of its names,
    and a fused q/k/v matrix as attention)."""
    named = dict(model.named_parameters(remove_duplicate=False))
    by_param: dict[int, str] = {}
    for canonical in sorted(placement.sources, key=lambda n: not n.startswith("token_emb")):
        for source in placement.sources[canonical]:
            by_param.setdefault(id(named[source]), canonical)
    return {name: by_param[id(p)] for name, p in named.items() if id(p) in by_param}


# ---- oracle ---------------------------------------------------------------------------------

def check_spec_oracle(s: Subject) -> CheckResult:
    """The module against the spec's float64 oracle fed its weights (see the module docstring)."""
    spec, placement = s.facts.spec, s.facts.placement
    if placement is None:
        return unplaced(s, "oracle")
    seq_len = min(s.short_len(8), spec.max_seq_len)  # the oracle runs within the spec
    ids = s.random_ids(batch_not_equal(seq_len, (2, 3)), seq_len, s.generator(13))
    tol = tolerances.hf_oracle(s.dtype, spec)
    named = dict(s.work.named_parameters(remove_duplicate=False))
    live = {n: t.detach() for n, t in named.items()}
    weights = _canonical(placement, live, spec)  # views of the module's own tensors
    missing = [name for name, shape in expected_weights(spec).items()
               if name not in weights or tuple(weights[name].shape) != shape]
    evidence: dict = {"layout": placement.layout, "batch": ids.shape[0], "seq_len": seq_len,
                      "dtype": str(s.dtype), "tolerance": tol}
    if missing:
        evidence["missing"] = missing
        return CheckResult("oracle", False, f"{len(missing)} weights the spec's oracle reads are "
                           f"missing or of another shape, first {missing[0]} (layout "
                           f"{placement.layout})", evidence, tol)
    natural = _compare_values(s, placement, weights, ids, tol)
    evidence["as_initialised"] = natural
    with _stressed(s, placement, weights, live) as stressed:
        evidence["stressed"] = stressed
        if stressed:  # the module now holds the stress weights
            weights = _canonical(placement, live, spec)
            evidence["stress"] = _compare_values(s, placement, weights, ids, tol)
            if sum(p.numel() for p in s.parameters()) <= GRADIENT_MAX_PARAMETERS:
                evidence["gradients"] = _compare_grads(s, placement, named, ids)
    for label, found in (("as initialised", natural), ("with stress weights",
                                                       evidence.get("stress"))):
        if found and not found["max_abs_logit_error"] <= found["allowed"]:
            return CheckResult("oracle", False, f"logits {label} differ from the spec's oracle by "
                               f"up to {found['max_abs_logit_error']:.3g} (allowed "
                               f"{found['allowed']:.1e}); first differing stage: "
                               f"{found['first_stage']} (layout {placement.layout})", evidence,
                               tol)
    grads = evidence.get("gradients")
    if grads and not grads["max_abs_grad_error"] <= grads["allowed"]:
        return CheckResult("oracle", False, f"gradient of {grads['worst_parameter']} differs from "
                           f"the spec's oracle by {grads['max_abs_grad_error']:.3g} (allowed "
                           f"{grads['allowed']:.1e})", evidence, tol)
    if grads:
        how = f"and with stress weights (gradients of {grads['compared']} weights agree)"
    elif evidence["stressed"]:
        how = (f"and with stress weights (gradients not compared above "
               f"{GRADIENT_MAX_PARAMETERS:,} parameters)")
    else:
        how = ("(stress weights not written: the weights_map returns tensors that are not views "
               "of the module's own)")
    return CheckResult("oracle", True, f"logits = the spec's float64 oracle fed the module's "
                       f"weights, as initialised {how}; layout {placement.layout}", evidence, tol)


def _canonical(placement: Placement, named: Mapping[str, torch.Tensor],
               spec: DecoderConfig) -> dict[str, torch.Tensor]:
    """The canonical weights the spec's architecture reads (an extra bias the module has but the
    spec does not is left out: the params check names it, and the oracle computes the spec)."""
    want = expected_weights(spec)
    mapped = placement.canonical(named)
    return {name: tensor for name, tensor in mapped.items() if name in want}


def _compare_values(s: Subject, placement: Placement, weights: Mapping[str, torch.Tensor],
                    ids: torch.Tensor, tol: float) -> dict:
    """The module's logits against the oracle's fed `weights` (the canonical views), and the
    first stage whose input differs."""
    spec = s.facts.spec
    oracle = StreamedOracle(weights, spec, ids, progress=s.progress)
    with _stage_inputs(s.work, placement, spec) as seen:
        fast = s.run(ids).double().cpu()
    worst, allowed = scaled_excess(fast - oracle.logits, oracle.logits, tol)
    found = {"max_abs_logit_error": worst, "allowed": allowed, "first_stage": None}
    if not worst <= allowed:
        found["first_stage"] = _first_stage(seen, oracle.inputs, spec, tol)
    return found


def _first_stage(seen: dict[int, torch.Tensor], inputs: list[torch.Tensor], spec: DecoderConfig,
                 tol: float) -> str:
    """The first stage whose output (the next stage's input) differs from the oracle's."""
    names = ["the embedding"] + [f"layer {i}" for i in range(spec.n_layers)]
    for index, expected in enumerate(inputs):  # entering layer 0..L-1, then the final norm
        got = seen.get(index)
        if got is None and index == spec.n_layers and index - 1 in seen:
            return "the final norm or readout (the final norm module was never called)"
        if got is None:
            stage = names[index + 1] if index < spec.n_layers else "the final norm"
            return f"unknown (the module of {stage} was not called with the residual stream)"
        got = got.double().cpu()
        if got.shape != expected.shape:
            return f"{names[index]} (its output has shape {tuple(got.shape)})"
        worst, allowed = scaled_excess(got - expected, expected, tol)
        if not worst <= allowed:
            return f"{names[index]} (its output differs by {worst:.3g})"
    return "the final norm or readout"


@contextmanager
def _stage_inputs(model: nn.Module, placement: Placement, spec: DecoderConfig
                  ) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, what enters each layout block module and the final norm (index L)."""
    seen: dict[int, torch.Tensor] = {}
    modules = _stage_modules(model, placement, spec)
    hooks = []
    for index, module in modules.items():
        def record(_module, args, index=index):
            if args and isinstance(args[0], torch.Tensor):
                seen.setdefault(index, args[0].detach())
        hooks.append(module.register_forward_pre_hook(record))
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _stage_modules(model: nn.Module, placement: Placement, spec: DecoderConfig
                   ) -> dict[int, nn.Module]:
    """The module of block i (from where its first norm's weight lies, or its query
    projection's: every layout nests it two deep, as attn.q_proj) and the final norm."""
    out: dict[int, nn.Module] = {}
    for index in range(spec.n_layers + 1):
        spots = placement.spots
        if index < spec.n_layers:
            norm = spots.get(f"layers.{index}.ln1.weight")
            query = spots.get(f"layers.{index}.attn.q_proj.weight")
            spot, up = (norm, 2) if norm is not None else (query, 3)
        else:
            spot, up = spots.get("ln_final.weight"), 1
        if spot is None:
            continue
        path = spot.source.rsplit(".", up)[0]  # the block (or the final norm) module
        try:
            out[index] = model.get_submodule(path)
        except AttributeError:
            continue
    return out


def _compare_grads(s: Subject, placement: Placement, named: Mapping[str, nn.Parameter],
                   ids: torch.Tensor) -> dict:
    """Every placed parameter's gradient of a fixed random projection of the logits, the module's
    against the oracle's (the oracle fed float64 copies of the same parameters, through the same
    placement, so a tied weight's two uses add up in one leaf)."""
    spec = s.facts.spec
    gen = s.generator(17)
    projection = torch.randn(*ids.shape, s.vocab_size, generator=gen, dtype=torch.float64)
    leaves = {id(p): p.detach().to("cpu", torch.float64).requires_grad_() for p in named.values()}
    with torch.enable_grad():
        reference = oracle_logits(_canonical(placement, {n: leaves[id(p)] for n, p in
                                                         named.items()}, spec), spec, ids)
        (reference * projection).sum().backward()
    placed = {id(p): name for name, p in named.items() if leaves[id(p)].grad is not None}
    params = [p for p in s.parameters() if id(p) in placed]
    with s.gradients_for(params):
        fast = logits_of(s.work(ids.to(s.device)))
        s.count(ids)
        (fast.double() * projection.to(fast.device)).sum().backward()
        errors = {placed[id(p)]: largest((_dense(p) .double().cpu() - leaves[id(p)].grad))
                  for p in params}
    scale = max(largest(leaves[id(p)].grad) for p in params)  # the spec reads every weight
    allowed = tolerances.oracle_grad(s.dtype) * scale
    worst_name, worst = max(errors.items(), key=lambda item: item[1], default=(None, 0.0))
    return {"compared": len(errors), "max_abs_grad_error": worst, "allowed": allowed,
            "worst_parameter": worst_name}


def _dense(param: nn.Parameter) -> torch.Tensor:
    return torch.zeros_like(param) if param.grad is None else param.grad


@contextmanager
def _stressed(s: Subject, placement: Placement, weights: Mapping[str, torch.Tensor],
              live: Mapping[str, torch.Tensor]) -> Iterator[bool]:
    """Within the block, the module holds the stress weights (see the module docstring), each
    written into its place: by the layout's spots, or through a weights_map's tensors when they
    are views of the module's own tensors `live`. Yields False, writing nothing, for a
    weights_map that copies. Every parameter is restored bit for bit afterwards."""
    storages = {t.untyped_storage().data_ptr() for t in live.values()}
    if not placement.spots and not all(t.untyped_storage().data_ptr() in storages
                                       for t in weights.values()):
        yield False
        return
    saved = [(p, p.detach().clone()) for p in s.parameters()]
    gen = s.generator(19)
    s.forget_clean()  # the weights change what the model computes
    try:
        with torch.no_grad():
            written: set = set()
            for name, tensor in weights.items():
                value = _stress_value(name, tuple(tensor.shape), gen)
                spot = placement.spots.get(name)
                key = spot if spot is not None else (tensor.untyped_storage().data_ptr(),
                                                     tensor.storage_offset(), tuple(tensor.shape))
                if key in written:  # a tied weight: written once
                    continue
                written.add(key)
                if spot is not None:
                    spot.write(live[spot.source], value)
                else:
                    tensor.copy_(value)
        yield True
    finally:
        with torch.no_grad():
            for param, value in saved:
                param.copy_(value)
        s.forget_clean()


def _stress_value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A stress value for the canonical weight `name` (see the module docstring)."""
    noise = torch.randn(shape, generator=gen, dtype=torch.float64)
    part = name.rsplit(".", 2)
    if name.startswith(("token_embeddings", "position_embeddings")):
        return noise
    if part[-2].startswith("ln") or part[-2].endswith("_norm"):  # a norm's gain or shift
        return (1.0 + STRESS_GAIN_STD * noise) if part[-1] == "weight" else STRESS_GAIN_STD * noise
    if part[-1] == "bias":
        return STRESS_GAIN_STD * noise
    return noise / shape[1] ** 0.5  # a matrix (out, in): unit-variance outputs
