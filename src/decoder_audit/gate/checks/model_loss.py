"""`model_loss`: the model's own loss (its forward's `labels=`) against its definition, through
every way targets reach it:

  labels              the input ids as labels, some set to -100: the loss is the mean cross
                      entropy of logit t against label t + 1 (the labels shifted once, inside the
                      model), over the labels that are not -100;
  shift_labels        labels the caller shifted already (sequence and context parallelism shard a
                      row, so only the caller knows the label after a shard's last token:
                      transformers#36607), where the model's loss takes them: the loss is the
                      cross entropy of logit t against shift_labels[t], with no shift of its own;
  num_items_in_batch  the whole batch's label count, where the forward takes it: each
                      micro-batch's loss is its summed cross entropy divided by that count, so
                      the micro-batches of a gradient accumulation add up to the whole batch's
                      loss (transformers#34191, #35438);
  ignore index        -100 in labels and in shift_labels is never scored.

The definitions are applied to the logits of a second call, the plain forward without labels
(the forward every other check and the oracle judge), never to the logits returned beside the
loss: a loss computed from other logits than the plain call's (a labels= path of its own) fails.

The call goes through the model's call convention (`Subject.call`), like every other check's; a
forward that takes `labels=` but cannot be called so, or returns no loss, is found once before the
checks (`probe_loss`, a fact) and the check is skipped with that reason. A Hugging Face class
promises the shift inside; a module of its own may instead take its labels as the targets
themselves (logit t against label t: "aligned", the convention of a trainer that shifts before it
calls), which is found and reported, and then holds for every variant. Either way, a loss that is
neither (labels shifted twice, ignored labels read) fails, naming what it is instead.

A failure affects the trainers that call the model's own loss (`transformers.Trainer`, TRL): the
path "model loss". decoder-audit's own `train` computes the loss itself and never takes it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...generation.convention import is_signature_error
from .. import tolerances
from ..result import CheckResult
from ..subject import Subject

IGNORE_INDEX = -100


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss a forward returned: `.loss` (Hugging Face), or the second item of a
    (logits, loss) tuple (nanoGPT's convention); None when there is none."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and len(output) >= 2:
        loss = output[1]
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def _parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def _takes_kwargs(model: nn.Module) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _parameters(model).values())


def takes(model: nn.Module, name: str, *, through_kwargs: bool = False) -> bool:
    """The forward names `name`, or (`through_kwargs`) takes **kwargs and the model's own loss
    function names it (a Hugging Face class hands its **kwargs to `self.loss_function`)."""
    if name in _parameters(model):
        return True
    if not through_kwargs or not _takes_kwargs(model):
        return False
    try:
        loss_function = getattr(model, "loss_function", None)
        return callable(loss_function) and name in inspect.signature(loss_function).parameters
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return False


def probe_loss(s: Subject) -> str:
    """Why the model's own loss cannot be taken ("" when it can): one call of (1, T) ids with
    labels= under its call convention. A call that does not fit the forward's signature, or an
    output holding no loss, is a fact of the model, not a defect of its loss."""
    seq_len = s.short_len(4)
    ids = s.random_ids(1, seq_len, s.generator(46)).to(s.device)
    s.count(ids)
    try:
        with torch.no_grad():
            out = s.call(ids, labels=ids, **_without_aux(s))
    except Exception as exc:  # noqa: BLE001 - only a signature mismatch is a fact here
        if is_signature_error(exc):
            return f"its forward takes labels= but does not take (ids, labels=) as called: {exc}"
        return ""  # the model's own error: the check runs and shows it
    if loss_of(out) is None:
        return (f"given labels=, {type(s.work).__name__} returned {type(out).__name__} with no "
                "loss (neither .loss nor a (logits, loss) tuple)")
    return ""


def _without_aux(s: Subject) -> dict[str, Any]:
    """The call's arguments that leave a routed model's auxiliary loss out of its loss
    (output_router_logits=False, where the forward takes it): model_loss judges the cross
    entropy alone, router_aux_loss the term a config with output_router_logits=True adds."""
    return {"output_router_logits": False} if s.facts.router_aux_coef is not None else {}


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
                   ) -> float:
    """Cross entropy of logits (B, T, V) against targets (B, T), IGNORE_INDEX skipped."""
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                 ignore_index=IGNORE_INDEX, reduction=reduction))


def _definitions(logits: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor) -> dict:
    """The loss under each reading of labels (B, T) for logits (B, T, V), float64."""
    return {"shifted_once": _cross_entropy(logits[:, :-1], labels[:, 1:]),
            "aligned": _cross_entropy(logits, labels),
            "shifted_twice": _cross_entropy(logits[:, :-2], labels[:, 2:]),
            "ignoring_nothing": _cross_entropy(logits[:, :-1], ids[:, 1:])}


_SAID = {"shifted_once": "labels shifted once (logit t scores label t + 1)",
         "aligned": "unshifted labels, the targets themselves (logit t scores label t)",
         "shifted_twice": "labels shifted twice (logit t scores label t + 2)",
         "ignoring_nothing": "every label, the ignored (-100) ones too"}


def _close(a: float, b: float, tol: float) -> bool:
    """Within `tol` of b, relative to b or to one nat, whichever is larger: a loss near zero
    (a model that has learned its probe) is judged on nats, not on a ratio of two tiny numbers."""
    return abs(a - b) <= tol * max(abs(b), 1.0)


def check_model_loss(s: Subject) -> CheckResult:
    seq_len = s.short_len(8)
    if seq_len < 3:
        return CheckResult("model_loss", True, f"T={seq_len}: no room for a shifted label", {})
    gen = s.generator(45)
    ids = s.random_ids(2, seq_len, gen).to(s.device)  # (2, T)
    labels = ids.clone()
    labels[0, 1:seq_len // 2] = IGNORE_INDEX  # row 0 reads fewer labels than row 1
    labels[1, -1] = IGNORE_INDEX
    tol = max(s.shape_tolerance(), tolerances.eps(s.dtype) * 64)
    with torch.no_grad():
        s.count(ids)
        out = s.call(ids, labels=labels, **_without_aux(s))
    loss = loss_of(out)
    if loss is None:
        return CheckResult("model_loss", False, f"given labels=, {type(s.work).__name__} returned "
                           "no loss", {})
    # the logits the loss is held to come from a second call, the plain forward (the one the
    # oracle holds to the weights), not from the output that carries the loss: a labels= path
    # that computes other logits than the plain call cannot agree with itself here
    logits = s.run(ids).double()  # (2, T, V)
    found = _definitions(logits, labels, ids)
    readings = ("shifted_once",) if s.facts.hugging_face else ("shifted_once", "aligned")
    convention = next((r for r in readings if _close(float(loss), found[r], tol)), None)
    evidence: dict[str, Any] = {"loss": float(loss), **found, "allowed": tol,
                                "labels_read": int((labels[:, 1:] != IGNORE_INDEX).sum()),
                                "convention": convention, "variants": ["labels"]}
    if convention is None:
        other = next((_SAID[r] for r in _SAID if r not in readings and
                      _close(float(loss), found[r], tol)), None)
        return CheckResult("model_loss", False, f"the model's loss {float(loss):.6g} is not cross "
                           f"entropy against {_SAID['shifted_once']} ({found['shifted_once']:.6g})"
                           + (f"; it scores {other}" if other else
                              "; it is none of the shifted-twice, unshifted or every-label "
                              "losses either"),
                           evidence, tol)
    problems = [problem for problem in (
        _shift_labels(s, ids, labels, logits, convention, tol, evidence),
        _accumulated(s, ids, labels, float(loss), convention, tol, evidence)) if problem]
    if problems:
        return CheckResult("model_loss", False, problems[0], evidence, tol)
    return CheckResult("model_loss", True, f"the model's loss = cross entropy of its logits against "
                       f"{_SAID[convention]}, -100 ignored ({float(loss):.4g}); through "
                       f"{', '.join(evidence['variants'])}", evidence, tol)


def _shift_labels(s: Subject, ids, labels, logits, convention: str, tol: float,
                  evidence: dict) -> str:
    """With shift_labels (B, T) given beside labels, the loss must score logit t against
    shift_labels[t] and ignore the labels' own shift. The shift_labels differ from the shifted
    labels at every scored position (and score the last position, which a shift leaves
    without a label), so a loss that ignores them cannot pass. "" when it holds, or the forward
    does not take them."""
    if convention != "shifted_once" or not takes(s.work, "shift_labels", through_kwargs=True):
        evidence["shift_labels"] = "not taken by the model's loss"
        return ""
    shifted = s.other_ids(torch.cat([ids[:, 1:], ids[:, :1]], 1).cpu(),
                          s.generator(47)).to(ids.device)  # (2, T)
    shifted[0, :2] = IGNORE_INDEX
    with torch.no_grad():
        s.count(ids)
        got = loss_of(s.call(ids, labels=labels, shift_labels=shifted, **_without_aux(s)))
    expected = _cross_entropy(logits, shifted)
    evidence["variants"].append("shift_labels")
    evidence["shift_labels"] = {"loss": None if got is None else float(got),
                                "expected": expected}
    if got is not None and _close(float(got), expected, tol):
        return ""
    said = "no loss" if got is None else f"{float(got):.6g}"
    why = (": the labels were shifted instead, so shift_labels were accepted and ignored"
           if got is not None and _close(float(got), evidence["shifted_once"], tol) else "")
    return (f"given shift_labels= (already shifted), the model's loss is {said}, not cross "
            f"entropy against them ({expected:.6g}){why}")


def _accumulated(s: Subject, ids, labels, whole: float, convention: str, tol: float,
                 evidence: dict) -> str:
    """Row 0 and row 1 as two micro-batches given num_items_in_batch = the whole batch's label
    count: their losses must add up to the whole batch's (each divides its sum by that count,
    not by its own). "" when they do, or the forward does not take num_items_in_batch."""
    if not (takes(s.work, "num_items_in_batch") or _takes_kwargs(s.work)):
        evidence["num_items_in_batch"] = "not taken by the forward"
        return ""
    scored = labels[:, 1:] if convention == "shifted_once" else labels
    count = int((scored != IGNORE_INDEX).sum())
    parts = []
    with torch.no_grad():
        for row in range(2):
            s.count(ids[row:row + 1])
            out = s.call(ids[row:row + 1], labels=labels[row:row + 1],
                         num_items_in_batch=torch.tensor(count, device=ids.device),
                         **_without_aux(s))
            parts.append(float(loss_of(out)))
    evidence["variants"].append("num_items_in_batch")
    evidence["micro_batch_sum"] = sum(parts)
    evidence["num_items_in_batch"] = count
    if _close(sum(parts), whole, tol):
        return ""
    return (f"two micro-batches given num_items_in_batch={count} add up to {sum(parts):.6g}, "
            f"not the whole batch's {whole:.6g}: each is normalised by its own token count, so "
            "gradient accumulation over unequal micro-batches weights their tokens unequally")
