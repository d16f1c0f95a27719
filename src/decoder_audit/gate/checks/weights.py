"""White-box weight checks: the parameter ledger, tying by identity, and the tied weight's
gradient as the sum of its two paths. They need a `DecoderConfig` and the Decoder's weight names
(`token_embeddings`, `lm_head`, ...); the registry skips them on a black box.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from ...accounting.ledger import measured_ledger, parameter_ledger, reconcile
from ...objective import logits_of
from .. import tolerances
from ..measure import batch_not_equal, largest
from .reach import other_inputs, reached
from ..result import CheckResult
from ..sharding import is_sharded, whole
from .spec import check_spec_params
from ..subject import Subject
from ..wrappers import adapter_update


def check_params(s: Subject) -> CheckResult:
    if s.cfg is None:  # a module of another layout, against its declared spec
        return check_spec_params(s)
    analytic, measured = parameter_ledger(s.cfg), measured_ledger(s.model)
    problems = reconcile(analytic, measured)
    evidence = {
        "analytic": analytic.as_dict(), "measured": measured.as_dict(),
        "analytic_total": analytic.total, "measured_total": measured.total,
        "rows": [list(row) for row in analytic.grouped()],
        "measured_rows": [list(row) for row in measured.grouped()],
        "differences": problems, "notes": measured.notes,
    }
    if problems:
        return CheckResult("params", False, problems[0] if len(problems) == 1 else
                           f"{problems[0]}; {problems[-1]}", evidence)
    return CheckResult("params", True, f"measured {measured.total:,} unique parameters = analytic "
                       f"{analytic.total:,}", evidence)


def check_tying(s: Subject) -> CheckResult:
    """The readout's weight against the input embedding's, on any module whose two are found
    (facts.readout, facts.tie): one Parameter object is tied; two Parameters with equal values
    or over one storage are a false tie (they drift apart, or the optimizer keeps two states);
    two different ones are untied, a fact. Where the model declares a tie (a DecoderConfig's
    tie_embeddings, a Hugging Face config's tie_word_embeddings) the structure must match it."""
    facts = s.facts
    evidence = {"readout": facts.readout, "structure": facts.tie,
                "declared_tied": facts.declared_tie,
                "parameters_listed": len(list(s.model.named_parameters(remove_duplicate=False))),
                "parameters_unique": len(list(s.model.parameters()))}
    head = f"{facts.readout}.weight"
    if facts.tie == "shared storage":
        return CheckResult("tying", False, f"{head} and the input embedding are two Parameter "
                           "objects over one storage: the optimizer keeps two states", evidence)
    if facts.tie == "equal copies":
        return CheckResult("tying", False, f"{head} holds a copy of the input embedding's values "
                           "in a separate Parameter: false tying, they drift apart as soon as "
                           "training starts", evidence)
    if facts.tie == "adapted":
        return CheckResult("tying", False, f"{head} is the input embedding's Parameter, but "
                           f"{_adapted_side(s)} in the forward: the readout and the embedding "
                           "differ as soon as the adapter trains, so the tie is lost (merged, "
                           "its update would move both)", evidence)
    tied = facts.tie == "one Parameter"
    if facts.declared_tie is not None and facts.declared_tie != tied:
        said = "tied" if facts.declared_tie else "untied"
        return CheckResult("tying", False, f"declared {said}, but {head} "
                           + ("is a separate Parameter: the tie was lost" if facts.declared_tie
                              else "is the input embedding's Parameter"), evidence)
    if tied:
        return CheckResult("tying", True, f"{head} is the input embedding's weight (one Parameter "
                           "object)", evidence)
    return CheckResult("tying", True, f"untied: {head} is its own Parameter"
                       + ("" if facts.declared_tie is not None else " (the model declares no tie)"),
                       evidence)


def _adapted_side(s: Subject) -> str:
    """Which of the tied pair adds a PEFT adapter's update to the shared weight, and which
    adapters (facts.tie == "adapted")."""
    sides = [(f"{s.facts.readout} (the readout)", s.model.get_submodule(s.facts.readout)),
             ("the input embedding", s.input_embedding)]
    return " and ".join(f"{name} adds the update of adapter {', '.join(adapter_update(module))}"
                        for name, module in sides if adapter_update(module))


def check_tying_grad(s: Subject) -> CheckResult:
    """The shared weight's gradient equals the gradient through the lookup plus the gradient
    through the readout, each computed separately (in float64) from the recorded activations:
        lookup[v]  = sum of dL/d(embedding output) over the positions whose id is v
        readout    = (dL/dlogits)^T @ h, h the input of the readout (B*T, D).
    A module that is not ours may do more in its embedding or readout (Gemma scales the lookup
    by sqrt(D) inside its embedding module): there each path's gradient is the vector-Jacobian
    product through that module alone, on the input it recorded. It runs on the model itself
    with only the shared weight requiring grad; flags and .grad are restored afterwards."""
    model = s.work
    emb_module = s.input_embedding
    head_module = model.get_submodule(s.facts.readout) if s.facts.readout else None
    emb = getattr(emb_module, "weight", None)
    if emb_module is None or head_module is None or emb is None:
        return CheckResult("tying_grad", False, "no input embedding and readout modules to "
                           "observe", {})
    with s.gradients_for([emb]):
        ids, seen = _backward_recording_both_paths(s, model, emb_module, head_module)
        if not seen.get("lookup_grads") or not seen.get("readout_grads"):
            return CheckResult("tying_grad", False, "the lookup or readout path was never run "
                               f"through the input embedding / {s.facts.readout}", {})
        sums = (_compare_path_sums(emb, ids, seen, s.vocab_size) if s.whitebox
                else _vjp_path_sums(emb, emb_module, head_module, seen))
    batch, seq_len = ids.shape
    tol = tolerances.tying_grad(emb.dtype)
    worst, missing_readout = sums["error"], sums["shared_minus_lookup"]
    allowed = tol * sums["expected_max"]
    evidence = {"batch": batch, "seq_len": seq_len, "dtype": str(emb.dtype),
                "max_abs_error": worst, "allowed": allowed,
                "lookup_grad_max": sums["lookup_max"], "readout_grad_max": sums["readout_max"],
                "shared_minus_lookup_max": missing_readout}
    if worst <= allowed:
        return CheckResult("tying_grad", True, "shared weight gradient = lookup path + readout "
                           f"path (max error {worst:.1e}, allowed {allowed:.1e})", evidence, tol)
    if not (math.isfinite(worst) and math.isfinite(allowed)):
        return CheckResult("tying_grad", False, "the shared weight's gradient or its two paths "
                           "hold NaN or inf (the forward or backward overflowed in "
                           f"{str(emb.dtype).removeprefix('torch.')}): nothing was compared",
                           evidence, tol)
    if missing_readout <= allowed:
        why = ("the embedding's gradient holds only the lookup path: the readout's gradient goes "
               "elsewhere")
    else:
        why = "the embedding's gradient is not the sum of the two paths"
    return CheckResult("tying_grad", False, f"{why} (max error {worst:.3g}, allowed {allowed:.1e})",
                       evidence, tol)


# Vocabulary rows of the shared weight compared at a time (float64 blocks, not V x D at once).
ROW_BLOCK = 2048


def _compare_path_sums(emb: torch.Tensor, ids: torch.Tensor, seen: dict[str, torch.Tensor],
                       vocab_size: int) -> dict[str, float]:
    """The shared weight's gradient (emb.grad) against lookup + readout, block by block of rows:
    largest |error|, largest |grad - lookup| (what a missing readout path would leave), and the
    largest |expected|, |lookup|, |readout|. The lookup path is nonzero only at the rows the ids
    look up, so it is added there alone; each block is one float64 buffer, updated in place."""
    dim = emb.shape[1]
    flat_ids = ids.reshape(-1)
    d_lookup = seen["lookup_grads"][0].reshape(-1, dim).double()  # (B*T, D)
    d_logits = seen["readout_grads"][0].reshape(-1, vocab_size).double()  # (B*T, V)
    h = seen["readout_in"].reshape(-1, dim).double()  # (B*T, D)
    grad = None if emb.grad is None else whole(emb.grad)  # (V, D)
    rows, where = torch.unique(flat_ids, return_inverse=True)
    lookup = torch.zeros(len(rows), dim, dtype=torch.float64,
                         device=d_lookup.device).index_add_(0, where, d_lookup)  # (U, D)
    out = {"error": 0.0, "shared_minus_lookup": 0.0, "lookup_max": largest(lookup),
           "expected_max": 0.0, "readout_max": 0.0}
    for start in range(0, emb.shape[0], ROW_BLOCK):
        stop = min(start + ROW_BLOCK, emb.shape[0])
        inside = (rows >= start) & (rows < stop)
        here, looked = rows[inside] - start, lookup[inside]  # the looked-up rows of this block
        readout = d_logits[:, start:stop].T @ h  # (rows, D)
        out["readout_max"] = max(out["readout_max"], largest(readout))
        out["expected_max"] = max(out["expected_max"], largest(readout),
                                  largest(readout[here] + looked))
        diff = (torch.zeros_like(readout) if grad is None
                else grad[start:stop].to(torch.float64, copy=True))
        diff -= readout  # grad - readout
        diff[here] -= looked  # grad - readout - lookup
        out["error"] = max(out["error"], largest(diff))
        diff += readout  # grad - lookup
        out["shared_minus_lookup"] = max(out["shared_minus_lookup"], largest(diff))
    return out




class _Capture(torch.autograd.Function):
    """The identity, recording the gradient its output receives."""

    @staticmethod
    def forward(ctx, x, grads):
        ctx.grads = grads
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.grads.append(grad.detach())
        return grad, None


def _vjp_path_sums(emb: torch.Tensor, emb_module, head_module,
                   seen: dict[str, torch.Tensor]) -> dict[str, float]:
    """The shared weight's gradient against lookup + readout, each path's gradient the
    vector-Jacobian product through its module alone (re-run on the input it recorded, with the
    gradient its output received): whatever the module computes around its weight."""
    def through(module, calls) -> torch.Tensor:
        total = torch.zeros(emb.shape, dtype=torch.float64, device=emb.device)
        for call in calls:
            for grad in call["grads"]:
                with torch.enable_grad():
                    out, leaf = _with_whole_weights(module, emb, call["in"])
                    piece = torch.autograd.grad(out, leaf, grad_outputs=grad,
                                                allow_unused=True)[0]
                if piece is not None:
                    total += piece.double()
        return total

    lookup = through(emb_module, seen["lookup_calls"])
    readout = through(head_module, seen["readout_calls"])
    total = torch.zeros_like(lookup) if emb.grad is None else whole(emb.grad).double()
    return {"error": largest(total - lookup - readout), "shared_minus_lookup":
            largest(total - lookup), "lookup_max": largest(lookup), "readout_max":
            largest(readout), "expected_max": largest(lookup + readout)}


def _with_whole_weights(module: nn.Module, emb: torch.Tensor, inputs: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(module(inputs), the leaf its output is differentiated by for `emb`): `emb` itself, or
    on a model FSDP2 sharded (its weights DTensors between calls, the recorded input a whole
    tensor), the module called on its whole weights gathered, with a whole copy of `emb` as
    the leaf."""
    if not is_sharded(emb):
        return module(inputs), emb
    params = dict(module.named_parameters(remove_duplicate=False))
    weights = {name: whole(param.detach()) for name, param in params.items()}
    leaf = next(weights[name] for name, param in params.items() if param is emb)
    leaf.requires_grad_(True)
    return torch.func.functional_call(module, weights, (inputs,)), leaf


def _backward_recording_both_paths(s: Subject, model, emb_module, head_module
                                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One loss.backward() on random ids and targets, with the lookup's output (B, T, D) and
    the readout's input (B, T, D) and output (B, T, V) kept, each with its gradient."""
    seen: dict[str, torch.Tensor] = {}

    # Each output goes on through a capture whose backward records the gradient it receives:
    # the gradient of the output as the module returned it, even when the model then changes
    # it in place (CTRL scales its embedding by sqrt(D) in place). Every call is kept (a module
    # may be called twice); the last one also under the keys a Decoder's formula reads.
    def keep(kind: str):
        def hook(_module, inputs, output):
            grads: list[torch.Tensor] = []
            call = {"in": inputs[0].detach(), "grads": grads}
            seen.setdefault(f"{kind}_calls", []).append(call)
            seen[f"{kind}_in"], seen[f"{kind}_grads"] = call["in"], grads
            return _Capture.apply(output, grads)
        return hook

    keep_lookup, keep_readout = keep("lookup"), keep("readout")
    hooks = [emb_module.register_forward_hook(keep_lookup),
             head_module.register_forward_hook(keep_readout)]
    seq_len = s.short_len(8)
    batch = batch_not_equal(seq_len, (2, 3))
    gen = s.generator(10)
    ids = s.random_ids(batch, seq_len, gen).to(s.device)
    targets = s.random_ids(batch, seq_len, gen).to(s.device)
    try:
        logits = logits_of(model(ids))
        loss = F.cross_entropy(logits.reshape(-1, s.vocab_size).float(), targets.reshape(-1))
        loss.backward()
        del logits, loss
    finally:
        for hook in hooks:
            hook.remove()
    s.count(ids)
    return ids, seen


# Parameters whose gradient from the next-token loss is exactly 0 by the mathematics, not by a
# bug: a bias on the key projection adds q . b_k to every score of a query row, the same amount
# for every key, and softmax does not change when a row is shifted, so no loss can move it.
INERT = {r"(^|\.)(k_proj|key|k|wk)\.bias$": "a key-projection bias adds the same q . b_k to every "
                                            "score of a query row, which softmax ignores"}
# At most this share of the parameters gets gradients in one backward pass (as the oracle's).
DEAD_SHARE = 0.25


def check_dead_parameters(s: Subject) -> CheckResult:
    """Every trainable parameter (those that required grad when the audit began) receives a
    nonzero gradient from the next-token loss of a random batch: an unused Linear, a norm scale
    created but never applied, a LoRA factor that nothing reaches are named. A parameter inert
    by the mathematics (INERT) is reported as such, not failed. The gradients are taken a share
    of the parameters at a time (DEAD_SHARE) from one forward, so no more than that share of
    gradients exists beside the weights."""
    trainable = s.trainable_parameters()
    names = {}
    for name, param in s.work.named_parameters():
        names.setdefault(id(param), name)
    seq_len = s.short_len(16)
    gen = s.generator(46)
    ids = s.random_ids(3, seq_len, gen).to(s.device)
    targets = s.random_ids(3, seq_len, gen).to(s.device)
    largest_grad: dict[str, float] = {}

    def loss() -> torch.Tensor | None:
        s.count(ids)
        logits = logits_of(s.forward(ids))
        value = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return value if value.requires_grad else None  # no weight reaches it: every grad is 0

    with reached(s.work) as ran:  # which experts and modules the probe's call runs
        for share in s.gradients_by_share(_shares(trainable, DEAD_SHARE), loss):
            for param in share:
                largest_grad[names[id(param)]] = (0.0 if param.grad is None
                                                  else largest(whole(param.grad)))
    behind_zeros = _behind_zeros(s, trainable, names, largest_grad, loss)
    evidence = {"trainable": len(trainable), "batch": 3, "seq_len": seq_len,
                **_sorted_out(s, ran, largest_grad, behind_zeros),
                "behind_zero_init": behind_zeros}
    dead = evidence["dead"]
    if dead:
        return CheckResult("dead_parameters", False, f"{len(dead)} of {len(trainable)} trainable "
                           f"parameters get no gradient from the loss: {', '.join(dead[:6])}"
                           + (" ..." if len(dead) > 6 else "") + " (unused, never applied, or "
                           "cut off from the loss)", evidence)
    return CheckResult("dead_parameters", True, _passed(evidence, largest_grad), evidence)


def _sorted_out(s: Subject, ran, largest_grad: dict[str, float],
                behind_zeros: dict[str, list[str]]) -> dict:
    """The parameters with no gradient, sorted: inert (INERT, or a table looked up at its
    padding index alone), out of this call's reach (reach.py), behind a routed expert no token
    chose, or dead."""
    # No gradient is exactly none: a parameter the loss reads gets some, however small (a
    # fresh model's query weights: 1e-6 of the largest). A parameter inert by the mathematics
    # (INERT) gets exactly 0 or the rounding of terms that cancel (1e-12 of the largest here):
    # reported as inert either way, never failed.
    rounding = tolerances.eps(s.dtype) * max(largest_grad.values(), default=0.0)
    dead, inert, unrouted, unreached = [], {}, sorted(ran.missed_experts), []
    elsewhere = other_inputs(s.work)  # inputs that could run what this call did not (reach.py)
    released = s.facts.hugging_face  # a released class: its parts off the loss are by design
    for name, size in largest_grad.items():
        why = next((w for pattern, w in INERT.items() if re.search(pattern, name)), None)
        if why is None and size == 0.0 and ran.padding_only(name):
            why = "an nn.Embedding looked up at its padding_idx alone, whose row never learns"
        if why is not None and size <= rounding:
            inert[name] = why
        elif size == 0.0 and name not in behind_zeros and (
                (released and not ran.read(name)) or (elsewhere and not ran.ran(name))):
            unreached.append(name)
        elif size == 0.0 and name not in behind_zeros and not _under(name, unrouted):
            dead.append(name)
    return {"dead": dead, "inert": inert, "unrouted_experts": unrouted,
            "other_inputs": elsewhere, "not_reached": unreached, "released_class": released}


def _passed(evidence: dict, largest_grad: dict[str, float]) -> str:
    """The passing sentence: how many were judged, and what was not, and why."""
    inert, unreached, unrouted = (evidence[k] for k in ("inert", "not_reached",
                                                        "unrouted_experts"))
    behind_zeros, elsewhere = evidence["behind_zero_init"], evidence["other_inputs"]
    said = f"; inert by the mathematics: {', '.join(sorted(inert)[:3])}" if inert else ""
    if unreached:  # parts for another input or objective: not this call's to judge (reach.py)
        how = (f"a text-only call never runs (reached through {', '.join(elsewhere[:3])})"
               if not evidence["released_class"] else "whose output the next-token loss "
               "never reads (parts for another input or objective: cross-attention, a pooler, "
               "an indexer)")
        said += (f"; {len(unreached)} in modules {how}, so not judged here "
                 f"({', '.join(unreached[:2])}" + (" ..." if len(unreached) > 2 else "") + ")")
    if behind_zeros:
        first = next(iter(behind_zeros))
        said += (f"; {len(behind_zeros)} reached only once a zero-initialised partner leaves zero "
                 f"(e.g. {first} behind {behind_zeros[first][0]})")
    if unrouted:  # no token was sent there: their gradient is 0 by the routing, not the wiring
        said += (f"; {len(unrouted)} routed experts not chosen for any of the probe's "
                 f"{3 * evidence['seq_len']} tokens, so not judged here "
                 f"({', '.join(unrouted[:3])}" + (" ..." if len(unrouted) > 3 else "") + ")")
    judged = sum(not _under(n, unrouted) for n in largest_grad) - len(unreached)
    return f"all {judged - len(inert)} trainable parameters get a gradient from the loss{said}"


def _under(name: str, modules: list[str]) -> bool:
    """Whether the parameter `name` belongs to one of `modules`."""
    return any(name.startswith(module + ".") for module in modules)


def _behind_zeros(s: Subject, trainable: list[nn.Parameter], names: dict[int, str],
                  largest_grad: dict[str, float], loss) -> dict[str, list[str]]:
    """{name: the zero-initialised parameters behind it}: the parameters with no gradient that
    get one once every trainable tensor that is exactly zero (LoRA's B factor, a projection
    initialised to zero so a new branch starts as the identity, a scale or gate started at 0)
    is given small random values, restored to zero after. Such a parameter is reached from the
    first step on, not dead."""
    if s.sharded:  # a shard's rows cannot be drawn here; the zero factors stay as they are
        return {}
    zeros = [p for p in trainable if p.is_floating_point() and not bool(whole(p).any())]
    starved = [p for p in trainable if largest_grad.get(names[id(p)]) == 0.0
               and all(p is not z for z in zeros)]
    found: dict[str, list[str]] = {}
    # The zero matrices first (LoRA's B, a zero-started projection), then, for what is still
    # starved, the other zero tensors: a scale or gate started at 0 (Gemma 3n's
    # correct_output_scale) multiplies what lies behind it too, where a zero bias, which adds,
    # reaches nothing more and is not named.
    for group in ([z for z in zeros if z.dim() >= 2], [z for z in zeros if z.dim() < 2]):
        still = [p for p in starved if names[id(p)] not in found]
        if group and still:
            partners = [names[id(z)] for z in group]
            found.update({name: partners for name in _reached_with(s, group, still, names,
                                                                   loss)})
    return found


def _reached_with(s: Subject, zeros: list[nn.Parameter], starved: list[nn.Parameter],
                  names: dict[int, str], loss) -> list[str]:
    """The names of the `starved` parameters that get a gradient once `zeros` hold small random
    values (put back to zero after)."""
    gen = s.generator(47)
    with torch.no_grad():
        for param in zeros:
            param.copy_(1e-2 * torch.randn(param.shape, generator=gen).to(param))
    try:
        reached = []
        for share in s.gradients_by_share([starved], loss):
            reached = [names[id(p)] for p in share
                       if p.grad is not None and largest(whole(p.grad)) > 0.0]
    finally:
        with torch.no_grad():
            for param in zeros:
                param.zero_()
    return reached


def _shares(params: list[nn.Parameter], share: float) -> list[list[nn.Parameter]]:
    """Consecutive groups of at most `share` of the parameters' elements (a bigger one alone)."""
    budget = share * sum(p.numel() for p in params)
    groups, size = [[]], 0
    for param in params:
        if groups[-1] and size + param.numel() > budget:
            groups.append([])
            size = 0
        groups[-1].append(param)
        size += param.numel()
    return groups
