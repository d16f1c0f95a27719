"""`checkpointing`: activation checkpointing as the run configured it.

In train mode, with the dropout masks fixed by one seed, the logits and the gradient of every
parameter the run trains equal those of the plain forward; and with the input embeddings frozen
as well, every other trainable weight still gets a gradient (reentrant checkpointing of inputs
that need no gradient loses them: transformers#26221).

The checkpointed path is the one the model carries: a trainer switches checkpointing on before
the gate runs, with its own keyword arguments (`gradient_checkpointing_kwargs`: use_reentrant,
preserve_rng_state; every_n_layers), and each module keeps its switch and the function it
checkpoints through. The check runs that path as found, never one re-enabled with defaults
(preserve_rng_state=False on a model with dropout recomputes under other dropout masks: its
gradients are not the forward's), and puts every switch, function and input-embedding hook back
afterwards. A model that is not on yet (a training path that declares checkpointing) is switched
on its default way. The parameters the run freezes stay frozen: only the trainable ones take
part, and only theirs are compared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ...objective import logits_of
from ..facts import input_embedding
from ..measure import value_scale
from ..result import CheckResult
from ..subject import Subject
from .training import DROPOUT_SEED, in_train_mode

# A module's own attributes that say whether and how it checkpoints (Hugging Face's names, ours).
SWITCHES = ("gradient_checkpointing", "_gradient_checkpointing_func")
# The dicts of an input embedding's forward hooks (enable_input_require_grads adds one).
HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


@contextmanager
def configured_kept(model: nn.Module) -> Iterator[Callable[[], None]]:
    """Within the block, the checkpointing the model was found with can be put back by calling
    what it yields; on leaving it is put back: every module's switch and checkpoint function (an
    attribute of its own, or none), the input embedding's forward hooks."""
    saved = [(module, {k: module.__dict__[k] for k in SWITCHES if k in module.__dict__})
             for module in model.modules()]
    embedding = input_embedding(model)
    hooks = {name: dict(getattr(embedding, name, {})) for name in HOOK_DICTS}

    def restore() -> None:
        for module, own in saved:
            for key in SWITCHES:
                if key in own:
                    module.__dict__[key] = own[key]
                else:
                    module.__dict__.pop(key, None)
        if embedding is not None:
            for name, kept in hooks.items():
                found = getattr(embedding, name, None)
                for key in [k for k in (found or {}) if k not in kept]:
                    del found[key]

    try:
        yield restore
    finally:
        restore()


def check_checkpointing(s: Subject) -> CheckResult:
    model = s.work
    # transformers 5's names first: its gradient_checkpointing_* are deprecated aliases that warn
    enable = getattr(model, "activation_checkpointing_enable", None) or \
        getattr(model, "gradient_checkpointing_enable", None)
    disable = getattr(model, "activation_checkpointing_disable", None) or \
        getattr(model, "gradient_checkpointing_disable", None)
    if not (callable(enable) and callable(disable)):
        return CheckResult("checkpointing", False, f"training asks for activation checkpointing but "
                           f"{type(model).__name__} has no gradient_checkpointing_enable() / "
                           "_disable()", {})
    was_on = s.facts.checkpointing_enabled
    seq_len = s.short_len(8)
    gen = s.generator(41)
    ids = s.random_ids(2, seq_len, gen).to(s.device)
    projection = torch.randn(2, seq_len, s.vocab_size, generator=gen).to(s.device)
    trainable = {id(p) for p in s.trainable_parameters()}
    frozen = {id(p) for p in s.parameters()} - trainable  # the run's frozen weights
    embedding = s.input_embedding
    no_embedding = frozen | ({id(p) for p in embedding.parameters()} if embedding else set())
    with configured_kept(model) as as_found:
        configured = as_found if was_on else enable
        plain = _projected_backward(s, ids, projection, disable, frozen)
        checked = _projected_backward(s, ids, projection, configured, frozen)
        starved = _projected_backward(s, ids, projection, configured, no_embedding)
    return _checkpointing_verdict(s, plain, checked, starved,
                                  {"frozen_by_the_run": len(frozen), "configured": was_on,
                                   "frozen_input_embedding": len(no_embedding - frozen)})


def _projected_backward(s: Subject, ids: torch.Tensor, projection: torch.Tensor,
                        switch: Callable[[], None], frozen: set[int]
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """(logits, {weight name: gradient}) of sum(logits * projection) in train mode with the
    dropout masks fixed, after `switch()`; the weights in `frozen` get no gradient."""
    switch()
    params = [p for p in s.parameters() if id(p) not in frozen]
    with in_train_mode(s), s.gradients_for(params), torch.random.fork_rng(
            devices=[s.device] if s.device.type == "cuda" else []):
        torch.manual_seed(DROPOUT_SEED)
        s.count(ids)
        logits = logits_of(s.forward(ids))
        (logits.double() * projection.double()).sum().backward()
        grads = {name: (None if p.grad is None else p.grad.detach().clone())
                 for name, p in s.work.named_parameters() if id(p) not in frozen}
    return logits.detach(), grads


def _checkpointing_verdict(s: Subject, plain, checked, no_embedding, evidence: dict
                           ) -> CheckResult:
    (logits0, grads0), (logits1, grads1), (_, grads2) = plain, checked, no_embedding
    tol = s.shape_tolerance()
    logit_diff = float((logits1 - logits0).abs().max())
    logit_allowed = tol * value_scale(logits0)
    scale = max((float(g.abs().max()) for g in grads0.values() if g is not None), default=0.0)
    grad_diff, worst = 0.0, None
    for name, g0 in grads0.items():
        g1 = grads1.get(name)
        if (g0 is None) != (g1 is None):
            grad_diff, worst = float("inf"), name
            break
        if g0 is not None and float((g1 - g0).abs().max()) > grad_diff:
            grad_diff, worst = float((g1 - g0).abs().max()), name
    starved = [name for name, g in grads2.items()
               if name in grads0 and grads0[name] is not None and bool(grads0[name].any())
               and (g is None or not bool(g.any()))]
    evidence |= {"logits_max_abs_diff": logit_diff, "logits_allowed": logit_allowed,
                 "grad_max_abs_diff": grad_diff, "worst_grad": worst, "grad_scale": scale,
                 "grad_allowed": tol * scale, "no_gradient_when_frozen": starved}
    how = "as the run configured it" if evidence["configured"] else "switched on"
    if not logit_diff <= logit_allowed:
        return CheckResult("checkpointing", False, f"with checkpointing on ({how}), the logits "
                           f"differ from the plain forward's by up to {logit_diff:.3g} (allowed "
                           f"{logit_allowed:.1e}): the checkpointed path computes another "
                           "function (a mask or a branch it skips)", evidence, tol)
    if not grad_diff <= tol * scale:
        return CheckResult("checkpointing", False, f"with checkpointing on ({how}), the gradient "
                           f"of {worst} differs by up to {grad_diff:.3g} (allowed "
                           f"{tol * scale:.1e}, of a largest gradient {scale:.3g}): the "
                           "recomputation is not the forward (dropout masks drawn anew where "
                           "the RNG state is not preserved, a branch on recomputation)",
                           evidence, tol)
    if starved:
        return CheckResult("checkpointing", False, f"with checkpointing on ({how}) and the input "
                           f"embeddings frozen, {len(starved)} trainable weights get no gradient "
                           f"({', '.join(starved[:4])}): the recomputation is cut off from the "
                           "loss (reentrant checkpointing of inputs that need no gradient)",
                           evidence, tol)
    frozen = evidence["frozen_by_the_run"]
    return CheckResult("checkpointing", True, f"checkpointed ({how}), the logits and the "
                       f"gradients of {len(grads0)} trainable weights equal the plain ones (max "
                       f"{grad_diff:.1e})" + (f", {frozen} frozen as the run freezes them"
                                             if frozen else "")
                       + "; with the input embeddings frozen every other weight still gets its "
                       "gradient", evidence, tol)
