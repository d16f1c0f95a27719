"""A declared architecture (`audit(model, spec=cfg)`, `verify --spec cfg.json`) checked on a
module we did not write: its weights placed on the spec's canonical names
(`references.layouts`), then

    params   the module's unique parameters against the spec's analytic ledger, row by row, and
             by name: a weight the spec expects that the module lacks, one of another shape, one
             the spec has no place for (an extra bias), a parameter nothing takes (an extra
             Linear) are each named;
    oracle   the spec's float64 oracle fed the module's own weights equals the module's logits
             and every weight's gradient, three times: with the weights as they are, with
             `stress` weights written into the module (through the canonical views, restored
             bit for bit afterwards), and with a quiet residual stream; a fourth time, where
             the spec declares a soft-cap, with scores and logits driven past it (stress.py:
             below the cap tanh capping changes nothing the tolerance sees). Freshly initialised
             weights keep every activation small (attention scores ~1e-3: a wrong score scale,
             RoPE base or layout moves the logits by a few ulps), so the stress weights bring
             them to order 1: embeddings N(0, 1), matrices N(0, 1/fan_in), norm gains
             1 + N(0, 0.2^2), biases and shifts N(0, 0.2^2). An order-1 stream hides a norm's
             eps (1e-5 against a variance of 1), so the quiet weights scale what writes into the
             stream (embeddings, output projections, post-sublayer norms) to keep its variance
             at the spec's eps: an eps of another size then moves every norm's output by a
             fifth. A difference is traced to its first stage: the residual stream entering
             each block and the final norm is compared with the oracle's (forward pre-hooks on
             the layout's block modules), so the report says "layer 1" or "the final norm or
             readout". The gradients are compared with the stress weights (as initialised where
             none can be written).

A weights_map is user code: it is run guarded (`references.layouts.run_weights_map`), and the
module's parameters are compared bit for bit before and after its first run on them: an
exception, an exit or an in-place edit fails params and oracle naming the map. What it returns
is input: a result that is not {name: tensor} (a list, None, a non-tensor value) is refused when
the facts are decided, `WeightsMapReturnError`, a ConfigError, before any check runs. Stress weights reach the module through a map whose tensors are views of
its own, and through one that copies them (found by probing the map with parameters that hold
their own indices); a map that computes its tensors gets the gradients compared as initialised,
and the report says no stress weights were written.

`tying` and `tying_grad` read the spec's tie_embeddings as the model's declaration (facts.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ...accounting.ledger import measured_ledger, parameter_ledger, reconcile
from ...config import DecoderConfig
from ...objective import logits_of
from ...references.layouts import Placement, placeable
from ...references.oracle import StreamedOracle, oracle_logits
from ...references.spec_weights import expected_weights
from ...references.weights_map import WeightsMapError
from .. import tolerances
from ..measure import batch_not_equal, largest, scaled_excess
from ..result import CheckResult
from .stress import (capped_spreads, capped_values, declares_softcap, quiet_values,
                     quiet_variance, stress_values)
from ..subject import Subject

WINDOW_ORACLE_MAX = 64
"""A declared sliding window of at most this many positions that the `window` check cannot read
is held by the oracle: it runs at T = W + 1, the first length at which the window leaves a token
out, where its usual T <= 8 never reaches it. The `window` check reads each layer's span at its
attention module; a module whose attention is no module of its own (nanoGPT's attention as a
method beside a ModuleDict) leaves it skipped, and a full-attention module then passed a spec
declaring a window of 16. Where the window check runs it holds the window at any size, and the
oracle keeps its short probe; a wider window it cannot read stays unchecked, and the window
check's skip says why (the oracle's loops grow as T^2)."""

GRADIENT_MAX_PARAMETERS = 50_000_000
"""The gradients are compared up to this many parameters: the oracle's side holds a float64
copy of every weight and its gradient (16 bytes a parameter: 0.8 GB here, 25 GB for GPT-2 XL),
where the values stream one stage at a time. Above it the logits are compared, as initialised
and with stress weights, and the report says the gradients were not."""


# ---- params ---------------------------------------------------------------------------------

def unplaced(s: Subject, name: str) -> CheckResult:
    """The verdict of params or oracle on a declared spec whose weights no layout placed: a
    failure (the architecture was declared and could not be checked), naming what was not found
    and the way to say where the weights are (weights_map=); or on a peer library's config
    whose options no spec expresses (no spec: the reason names them)."""
    spec = s.facts.spec
    return CheckResult(name, False, f"the declared spec could not be checked: "
                       f"{s.facts.reference_reason}",
                       {"spec": None if spec is None else spec.to_dict(), "placed": False,
                        "reason": s.facts.reference_reason})


def check_spec_params(s: Subject) -> CheckResult:
    """The module's parameters against the spec's ledger, by row and by name."""
    spec, placement = s.facts.spec, s.facts.placement
    if placement is None:
        return unplaced(s, "params")
    analytic = parameter_ledger(spec)
    measured = measured_ledger(s.model, names=_ledger_names(s.model, placement))
    problems = list(placement.problems)
    shapes = {name: tuple(tensor.shape) for name, tensor in placeable(s.model).items()}
    problems += [f"{name} ({shapes[name]}): a parameter of the module the spec has no place "
                 "for" for name in placement.leftover]
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
    and a fused q/k/v matrix as attention); a placed buffer (DeepSeek-V3's selection bias) by
    its name, counted as the Parameter it stands for (`measured_ledger`)."""
    named = placeable(model)
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
    seq_len = min(_oracle_len(s), spec.max_seq_len)  # the oracle runs within the spec
    ids = s.random_ids(batch_not_equal(seq_len, (2, 3)), seq_len, s.generator(13))
    tol = tolerances.hf_oracle(s.dtype, spec)
    evidence: dict = {"layout": placement.layout, "batch": ids.shape[0], "seq_len": seq_len,
                      "dtype": str(s.dtype), "tolerance": tol}
    if placement.map_error:
        return CheckResult("oracle", False, placement.map_error, evidence, tol)
    # a weights_map is user code run on the module's own tensors: they are kept to be restored
    saved = _snapshot(s) if placement.user_map is not None else None
    try:
        failure = _compare_all(s, ids, tol, evidence, saved)
    except WeightsMapError as exc:
        failure = str(exc)
    finally:
        if saved is not None:
            _restore(saved)
    if failure:
        return CheckResult("oracle", False, failure, evidence, tol)
    return CheckResult("oracle", True, f"logits = the spec's float64 oracle fed the module's "
                       f"weights, as initialised {_coverage(evidence)}; layout "
                       f"{placement.layout}", evidence, tol)


def _oracle_len(s: Subject) -> int:
    """The oracle's length: 8 (or the model's limit), or W + 1 past a declared window of W <=
    WINDOW_ORACLE_MAX positions whose layers the window check cannot read, so that the window
    changes what the oracle computes."""
    window, readable = s.facts.window_size, bool(s.facts.attention_layers)
    if window is not None and window <= WINDOW_ORACLE_MAX and not readable:
        return s.short_len(max(8, window + 1))
    return s.short_len(8)


def _compare_all(s: Subject, ids: torch.Tensor, tol: float, evidence: dict,
                 saved: list | None) -> str:
    """Every comparison, recorded into `evidence`: the logits as initialised, with stress
    weights and with a quiet stream, and the gradients (with stress weights where they could be
    written, else as initialised); the first failure's sentence, or "" when all agree."""
    spec, placement = s.facts.spec, s.facts.placement
    named = placeable(s.work)  # with a placed buffer: the oracle reads it, the stress writes it
    live = {n: t.detach() for n, t in named.items()}
    weights = _mapped(s, placement, live, saved)  # views of the module's own tensors
    missing = [name for name, shape in expected_weights(spec).items()
               if name not in weights or tuple(weights[name].shape) != shape]
    if missing:
        evidence["missing"] = missing
        return (f"{len(missing)} weights the spec's oracle reads are missing or of another "
                f"shape, first {missing[0]} (layout {placement.layout})")
    evidence["as_initialised"] = _compare_values(s, placement, weights, ids, tol)
    small = sum(p.numel() for p in s.parameters()) <= GRADIENT_MAX_PARAMETERS
    with _stressed(s, placement, weights, live, stress_values(spec), saved) as stressed:
        evidence["stressed"] = stressed
        if stressed:  # the module now holds the stress weights
            stress = _mapped(s, placement, live)
            evidence["stress"] = _compare_values(s, placement, stress, ids, tol)
            if small:
                evidence["gradients"] = _compare_grads(s, placement, named, ids)
    if not stressed and small:  # the gradients at least, as the module holds its weights
        evidence["gradients"] = _compare_grads(s, placement, named, ids)
    if s.dtype != torch.float16:  # its range: a quiet stream's squares would underflow
        with _stressed(s, placement, weights, live, quiet_values(spec), saved) as quieted:
            if quieted:
                evidence["quiet"] = _compare_values(s, placement, _mapped(s, placement, live),
                                                    ids, tol)
    if declares_softcap(spec) and s.dtype in tolerances.LOW_PRECISION:
        # a score of one cap (50) rounded to a 16-bit dtype moves by 0.2-0.4, an attention
        # weight by as much: the comparison would judge the dtype, not the cap
        evidence["capped"] = {"skipped": f"{s.dtype} rounds scores at the cap by more than "
                                         "the tolerance"}
    elif declares_softcap(spec):
        with _stressed(s, placement, weights, live, capped_values(spec), saved) as capped:
            if capped:
                evidence["capped"] = {**_compare_values(s, placement, _mapped(
                    s, placement, live), ids, tol), **_capped_reach(spec, weights)}
    return _first_failure(evidence, spec, placement)


def _capped_reach(spec: DecoderConfig, weights: Mapping[str, torch.Tensor]) -> dict:
    """Which declared caps the capped weights drive past (stress.py): the scores where the
    queries and keys have projections or norms to scale, the logits where a final gain or an
    untied readout carries the factor; and the factors."""
    names = set(weights)
    scores = spec.attn_softcap is not None and any(
        name.endswith(("attn.q_proj.weight", "attn.q_norm.weight")) for name in names)
    logits = spec.logit_softcap is not None and ("ln_final.weight" in names or (
        not spec.tie_embeddings and "lm_head.weight" in names))
    return {"scores_past_cap": scores, "logits_past_cap": logits,
            "factors": capped_spreads(spec)}


def _first_failure(evidence: dict, spec: DecoderConfig, placement: Placement) -> str:
    """The sentence of the first comparison that failed, or ""."""
    for key, label in (("as_initialised", "as initialised"), ("stress", "with stress weights"),
                       ("quiet", f"with a quiet residual stream (variance "
                                 f"{quiet_variance(spec):.0e}, where a norm's eps weighs as "
                                 "much as the stream)"),
                       ("capped", f"with scores and logits driven past the declared soft-caps "
                                  f"(attn_softcap={spec.attn_softcap}, logit_softcap="
                                  f"{spec.logit_softcap}: spread about one cap)")):
        found = evidence.get(key)
        if found and "skipped" not in found and \
                not found["max_abs_logit_error"] <= found["allowed"]:
            hint = {"quiet": f"; a norm eps other than the spec's norm_eps={spec.norm_eps:g} "
                             "shows here first",
                    "capped": "; a declared soft-cap the module does not apply shows here "
                              "first"}.get(key, "")
            return (f"logits {label} differ from the spec's oracle by up to "
                    f"{found['max_abs_logit_error']:.3g} (allowed {found['allowed']:.1e}); first "
                    f"differing stage: {found['first_stage']}{hint} (layout {placement.layout})")
    grads = evidence.get("gradients")
    if grads and not grads["max_abs_grad_error"] <= grads["allowed"]:
        return (f"gradient of {grads['worst_parameter']} differs from the spec's oracle by "
                f"{grads['max_abs_grad_error']:.3g} (allowed {grads['allowed']:.1e})")
    return ""


def _coverage(evidence: dict) -> str:
    """What the passing comparisons covered beyond the weights as initialised."""
    grads = evidence.get("gradients")
    quiet = " and a quiet stream" if "quiet" in evidence else ""
    if "max_abs_logit_error" in evidence.get("capped", {}):
        quiet += ", and past the declared soft-caps"
    if evidence["stressed"] and grads:
        return (f"and with stress weights{quiet} (gradients of {grads['compared']} weights "
                "agree)")
    if evidence["stressed"]:
        return (f"and with stress weights{quiet} (gradients not compared above "
                f"{GRADIENT_MAX_PARAMETERS:,} parameters)")
    said = (f"(gradients of {grads['compared']} weights agree as initialised; " if grads
            else "(")
    return (said + "no stress weights: the weights_map's tensors are neither views nor copies "
            "of the module's own, so the gate cannot write through it)")


def _mapped(s: Subject, placement: Placement, live: Mapping[str, torch.Tensor],
            saved: list | None = None) -> dict[str, torch.Tensor]:
    """The canonical weights the spec reads, from the module's live tensors. With `saved` (the
    parameters as they were before any weights_map ran), a map that changed any of them, bit
    for bit, is refused (WeightsMapError); they are restored by the caller."""
    weights = _canonical(placement, live, s.facts.spec)
    if saved is not None:
        changed = [name for name, (param, before) in zip(_names(s), saved)
                   if not _same_bits(param, before)]
        if changed:
            raise WeightsMapError(f"{placement.layout} changed {len(changed)} of the module's "
                                  f"parameters in place (first {changed[0]}); the gate restored "
                                  "them: a map reads the state dict and returns tensors made "
                                  "from it, never writing into it")
    return weights


def _names(s: Subject) -> list[str]:
    """A name of each of s.parameters(), in its order."""
    first = {}
    for name, param in s.work.named_parameters():
        first.setdefault(id(param), name)
    return [first[id(param)] for param in s.parameters()]


def _snapshot(s: Subject) -> list[tuple[nn.Parameter, torch.Tensor]]:
    return [(p, p.detach().clone()) for p in s.parameters()]


def _restore(saved: list[tuple[nn.Parameter, torch.Tensor]]) -> None:
    with torch.no_grad():
        for param, value in saved:
            param.copy_(value)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit equal (a NaN equals the same NaN, -0.0 differs from 0.0)."""
    a, b = a.detach(), b.detach()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if type(a) is not torch.Tensor:  # a sharded DTensor: compared by value
        return bool(torch.equal(a, b))
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(as_int), b.contiguous().view(as_int)
    return torch.equal(a, b)


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
    if fast.shape != oracle.logits.shape:  # never broadcast (B, 1, V) against (B, T, V)
        return {"max_abs_logit_error": float("inf"), "allowed": tol,
                "first_stage": f"the logits' shape {tuple(fast.shape)} (the oracle's "
                               f"{tuple(oracle.logits.shape)})"}
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
        fast = logits_of(s.forward(ids.to(s.device)))
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
              live: Mapping[str, torch.Tensor], value_of, saved: list | None = None
              ) -> Iterator[bool]:
    """Within the block, the module holds the values `value_of(name, shape, generator)` gives
    each canonical weight (the stress weights, or the quiet ones), each written into its place:
    by the layout's spots, through a weights_map's tensors when they are views of the module's
    own tensors `live`, and through a map that copies by where its probe says each value comes
    from (`_copied_from`). Yields False, writing nothing, for a map whose tensors are computed.
    Every parameter is restored bit for bit afterwards (from `saved` when given)."""
    write = _writer(s, placement, weights, live)
    if write is None:
        yield False
        return
    saved = saved if saved is not None else _snapshot(s)
    # a placed buffer (DeepSeek-V3's selection bias) is written too, and restored with the rest
    buffers = sorted(set(live) - set(_parameters_by_name(s)))
    saved = saved + [(live[name], live[name].clone()) for name in buffers]
    gen = s.generator(19)
    s.forget_clean()  # the weights change what the model computes
    try:
        with torch.no_grad():
            for name, tensor in weights.items():
                write(name, tensor, value_of(name, tuple(tensor.shape), gen))
        del write  # a copying map's probe (16 bytes a parameter) goes before the comparisons
        yield True
    finally:
        _restore(saved)
        s.forget_clean()


def _writer(s: Subject, placement: Placement, weights: Mapping[str, torch.Tensor],
            live: Mapping[str, torch.Tensor]):
    """write(name, tensor, value): a canonical weight's value into the module, once per place (a
    tied weight is written by its first name); None when nothing can be written."""
    written: set = set()

    def once(key) -> bool:
        fresh = key not in written
        written.add(key)
        return fresh

    if placement.spots:
        def by_spot(name, tensor, value):
            spot = placement.spots.get(name)
            # a tied weight is one tensor under two names (wte and lm_head): written once
            # (each expert of a fused tensor its own place: the same rows of another matrix)
            place = spot and (live[spot.source].untyped_storage().data_ptr(), spot.transposed,
                              spot.rows, spot.groups, spot.heads, spot.expert)
            if spot is not None and once(place):
                spot.write(live[spot.source], value)
        return by_spot
    storages = {t.untyped_storage().data_ptr() for t in live.values()}
    if all(t.untyped_storage().data_ptr() in storages for t in weights.values()):
        def by_view(name, tensor, value):
            if once((tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                     tuple(tensor.shape))):
                tensor.copy_(value)
        return by_view
    sources = _copied_from(s, placement, live) \
        if sum(p.numel() for p in s.parameters()) <= GRADIENT_MAX_PARAMETERS else None
    if not sources:
        return None
    taken = {id(p): torch.zeros(p.numel(), dtype=torch.bool) for p in s.parameters()}

    def by_probe(name, tensor, value):
        for param, where, at in sources.get(name, ()):
            fresh = ~taken[id(param)][where]  # an element two canonical weights copy: once
            param.detach().view(-1)[where[fresh]] = value.flatten()[at[fresh]].to(param.dtype)
            taken[id(param)][where[fresh]] = True
    return by_probe


def _copied_from(s: Subject, placement: Placement, live: Mapping[str, torch.Tensor]
                 ) -> dict[str, list[tuple[nn.Parameter, torch.Tensor, torch.Tensor]]]:
    """For a weights_map that copies (clone, contiguous, cat, a transpose made contiguous):
    canonical name -> [(parameter, its flat elements, the canonical tensor's flat elements
    they fill)], found by running the map on probes whose every element holds its own index
    (1-based across all parameters, in float64: exact to 2^53). An element of a canonical tensor
    that is not a parameter's index (computed, or a constant) is left alone; empty when none."""
    params = [p for p in s.parameters() if p.is_contiguous() and type(p.data) is torch.Tensor]
    starts, probes, total = {}, {}, 1
    for param in params:
        starts[id(param)] = total
        probes[id(param)] = torch.arange(total, total + param.numel(),
                                         dtype=torch.float64).view(param.shape)
        total += param.numel()
    state = {name: probes.get(id(named), torch.zeros(named.shape, dtype=torch.float64))
             for name, named in _parameters_by_name(s).items()}
    mapped = _canonical(placement, state, s.facts.spec)
    bounds = torch.tensor([starts[id(p)] for p in params] + [total], dtype=torch.float64)
    out = {}
    for name, tensor in mapped.items():
        flat = tensor.detach().to(torch.float64).flatten()
        exact = (flat == flat.round()) & (flat >= 1) & (flat < total)
        owner = torch.searchsorted(bounds, flat, right=True) - 1
        pieces = []
        for index in owner[exact].unique().tolist():
            param = params[index]
            at = torch.nonzero(exact & (owner == index)).flatten()
            pieces.append((param, (flat[at] - starts[id(param)]).long(), at))
        if pieces:
            out[name] = pieces
    return out


def _parameters_by_name(s: Subject) -> dict[str, nn.Parameter]:
    return dict(s.work.named_parameters(remove_duplicate=False))
