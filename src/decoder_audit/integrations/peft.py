"""PEFT adapters under the gate: a LoRA-wrapped model audited through its base model's spec.

    report = audit_adapters(peft_model)           # AdapterReport
    report.passed, report.failures, report.live, report.merged

A fresh LoRA adapter adds nothing (one of its factors is 0: B of a Linear's, A of an
Embedding's), so a defect of the adapters is invisible on it, and its other factor gets no
gradient until the zero one moves. Every check below therefore runs with the zero factors drawn
(so that each update s B A has the RMS of the weight it adapts), and the user's values are put
back bit for bit after:

  live      the full gate on the PEFT model as it trains (its forward through the adapters):
            the behavioural checks, the training path, and `dead_parameters` on the parameters
            that train, the adapters, not the frozen base;
  merged    the adapters merged into the base weights (`merge_adapter`), the base model audited
            as itself, without the adapters' wrappers (each LoRA layer read as its base layer,
            each modules_to_save copy as the module the forward uses): its config is its spec,
            so `params`, `tying` and `oracle` hold the merged weights to the architecture. An
            adapter that makes a tied head its own copy (modules_to_save=["lm_head"]) fails
            `tying` here;
  adapter_merge  the merged model's logits equal the adapted model's, and after
            `unmerge_adapter` the adapted model's logits are what they were: a merge that
            forgets the scaling, or an adapter on an embedding the head is tied to (its merge
            moves the head too), fails.

The base weights are put back bit for bit after the merge (an unmerge subtracts, which rounds).

The adapters are audited in the state they are found in, and left in it:
  active    as above;
  merged    (merge_adapter) nothing is drawn (a draw would change the update the merge holds):
            the live model and its merged base are audited as they compute now (a merged
            layer's adapter factors are not in its forward, so a run would train none of them:
            dead_parameters names them), and adapter_merge unmerges, merges again, and puts
            every weight and each layer's merged adapters back as found;
  disabled  (inside disable_adapter()) the forward is the base model's: audited as it is,
            adapter_merge skipped (there is no update to merge).

`adapter_checks` is what a trainer's gate adds to its own live audit for a PEFT model (the merged
base and adapter_merge), so a PEFT model gets the same checks in every trainer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.other import AuxiliaryTrainingWrapper, ModulesToSaveWrapper
from torch import nn

from ..errors import ConfigError
from ..gate import AuditReport, CheckResult, ModelFacts, TrainingPath, audit, model_facts
from ..objective import logits_of

MERGE_TOLERANCE_ULPS = 256
"""The merged and the adapted forward differ by rounding alone: (W + s B A) x and W x + s B (A x)
round differently in each of the model's matmuls; 256 ulps of the logits' scale covers that in
float32 and bfloat16 for models of a few layers (measured: under 10 ulps on the tests' tiny
Llama). A forgotten scaling moves the logits by the whole update, orders of magnitude more."""
PROBE_SHAPE = (2, 12)
"""(B, T) of the ids the merge is compared on."""


@dataclass
class AdapterReport:
    """The verdict on a PEFT model: the gate on it as it trains, on its merged base, and the
    merge's own check."""

    live: AuditReport
    merged: AuditReport
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        """Every failed check: the live model's, the merged base's, the merge's."""
        return self.live.failures + self.merged.failures + [c for c in self.checks
                                                            if not c.passed]

    @property
    def labels(self) -> list[str]:
        """Each failure's name as the trainers' gate labels it: the live audit's as they are,
        the merged base's "merged:<check>", then adapter_merge."""
        return ([c.name for c in self.live.failures]
                + [f"merged:{c.name}" for c in self.merged.failures]
                + [c.name for c in self.checks if not c.passed])

    @property
    def passed(self) -> bool:
        return not self.failures

    def failed(self, name: str) -> bool:
        return any(c.name == name for c in self.failures)


def is_adapted(model: nn.Module) -> bool:
    """A PEFT model (imported only where peft is)."""
    return isinstance(model, PeftModel)


def adapted_facts(model: PeftModel, *, training: TrainingPath | None = None,
                  **options: Any) -> ModelFacts:
    """The gate's facts of a PEFT model: `model_facts` reads what the base model declares (V,
    the length policy, the packed forms its forward takes, use_cache, checkpointing switched
    on), since the PEFT model's forward hands every keyword to it. A training path whose packed
    form the base cannot take is a ConfigError, as for any model."""
    return model_facts(model, training=training, **options)


def adapter_state(model: PeftModel) -> str:
    """How the adapters stand: "merged" (merge_adapter: some layer computes with its update
    merged into the base weight), "disabled" (inside disable_adapter(): the forward is the base
    model's), or "active" (the forward adds each update, as a training step takes it)."""
    layers = [m for m in model.modules()
              if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]
    if any(getattr(m, "merged", False) for m in layers):
        return "merged"
    if getattr(model, "_adapters_disabled", False) or any(m.disable_adapters for m in layers):
        return "disabled"
    return "active"


@contextmanager
def live(model: PeftModel, seed: int) -> Iterator[None]:
    """The PEFT model as the live audit takes it: active adapters with their zero factors drawn
    (`drawn_adapters`); a merged or disabled state as it is (a draw would change the update a
    merge holds, or be read by nothing)."""
    with drawn_adapters(model, seed) if adapter_state(model) == "active" else nullcontext():
        yield


def audit_adapters(model: PeftModel, *, training: TrainingPath | None = None, seed: int = 0,
                   **audit_options: Any) -> AdapterReport:
    """The gate on a PEFT model (module docstring); `audit_options` go to both audits. The
    adapters are audited in the state they are in, and left in it, bit for bit."""
    if not isinstance(model, PeftModel):
        raise TypeError(f"audit_adapters() needs a peft.PeftModel, got {type(model).__name__}")
    facts = adapted_facts(model, training=training, **audit_options)
    with live(model, seed):
        live_report = audit(model, facts=facts, seed=seed)
    merged_report, checks, notes = adapter_checks(model, training=training, seed=seed,
                                                  **audit_options)
    return AdapterReport(live_report, merged_report, checks, notes)


def adapter_checks(model: PeftModel, *, training: TrainingPath | None = None, seed: int = 0,
                   **audit_options: Any) -> tuple[AuditReport, list[CheckResult], list[str]]:
    """What the adapters add to the live audit, in the state they are in: (the merged base's
    audit, [adapter_merge], notes). Active: merged for the audit, then unmerged; merged: the
    base audited as it computes now, unmerged and merged again for the check; disabled: the
    base audited as the forward runs it, adapter_merge skipped. Left as found, bit for bit."""
    state = adapter_state(model)
    ids = torch.randint(0, adapted_facts(model, **audit_options).vocab_size, PROBE_SHAPE,
                        generator=torch.Generator().manual_seed(seed + 1))
    view = without_adapters(model.get_base_model())
    if state == "disabled":
        report = audit(view, training=training, seed=seed, **audit_options)
        why = ("the adapters are disabled (disable_adapter()): the forward is the base model's, "
               "so there is no update to merge; audit outside disable_adapter() to check it")
        check = CheckResult("adapter_merge", True, f"skipped: {why}", {"reason": why},
                            skipped=True)
        return report, [check], [_STATE_NOTES["disabled"]]
    if state == "merged":
        report = audit(view, training=training, seed=seed, **audit_options)
        merged_logits = _logits(model, ids)
        adapted, again = unmerged_and_merged_again(model, ids)
        check = check_merge(adapted, merged_logits, again, undone="merge")
        return report, [check], [_STATE_NOTES["merged"]]
    with drawn_adapters(model, seed):
        adapted = _logits(model, ids)
        with merged(model):
            report = audit(view, training=training, seed=seed, **audit_options)
            merged_logits = _logits(view, ids)
        after = _logits(model, ids)
    return report, [check_merge(adapted, merged_logits, after)], [_STATE_NOTES["active"]]


_STATE_NOTES = {
    "active": "the adapters' zero factors were drawn for the audit (a fresh adapter adds "
              "nothing: no update to check, and no gradient for its other factor) and put back "
              "after",
    "merged": "the adapters were found merged (merge_adapter): audited as merged, the live "
              "model's forward computing with the merged base weights, so its adapter factors "
              "are not in it (a run would train none of them: dead_parameters names them); "
              "unmerged and merged again for adapter_merge, every weight put back bit for bit",
    "disabled": "the adapters were found disabled (disable_adapter()): the forward is the base "
                "model's, audited as it is; nothing of the adapters was checked"}


def check_merge(adapted: torch.Tensor, merged_logits: torch.Tensor, again: torch.Tensor, *,
                undone: str = "unmerge") -> CheckResult:
    """adapter_merge: the merged base's logits equal the adapted model's, and the round trip
    gives back what it started from (after `unmerge_adapter` the adapted model's logits; for a
    model found merged, after merging again the merged ones), within MERGE_TOLERANCE_ULPS of the
    logits' scale."""
    scale = max(float(adapted.abs().max()), 1.0)
    allowed = MERGE_TOLERANCE_ULPS * torch.finfo(adapted.dtype).eps * scale
    merge_diff = float((merged_logits - adapted).abs().max())
    start = adapted if undone == "unmerge" else merged_logits
    again_diff = float((again - start).abs().max())
    evidence = {"merge_max_abs_diff": merge_diff, f"{undone}_max_abs_diff": again_diff,
                "allowed": allowed, "logit_scale": scale}
    if merge_diff > allowed:
        return CheckResult("adapter_merge", False, f"the merged model's logits differ from the "
                           f"adapted model's by up to {merge_diff:.3g} (allowed {allowed:.2g}): "
                           "the merge does not compute what the adapters do (a scaling left "
                           "out, or a weight another module shares)", evidence, allowed)
    if again_diff > allowed:
        what = ("after unmerge the logits differ from before the merge" if undone == "unmerge"
                else "merged again, the logits differ from the merged model's as found")
        return CheckResult("adapter_merge", False, f"{what} by up to {again_diff:.3g} (allowed "
                           f"{allowed:.2g}): the {undone} does not undo what it followed",
                           evidence, allowed)
    return CheckResult("adapter_merge", True, f"merged logits = adapted logits (max diff "
                       f"{merge_diff:.2g}), and {undone}d again (max diff {again_diff:.2g}), "
                       f"allowed {allowed:.2g}", evidence, allowed)


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.no_grad():
        return logits_of(model(input_ids=ids.to(device))).float().cpu()


# ---- the base model, without the adapters' wrappers ---------------------------------------------

def without_adapters(module: nn.Module) -> nn.Module:
    """A view of `module` in which each adapter wrapper is the module its forward computes with
    when merged: a LoRA (any tuner) layer its base layer, a modules_to_save wrapper the copy it
    trains. Shallow copies that share every Parameter, buffer and config: no weight is copied and
    the user's model is not changed."""
    if isinstance(module, BaseTunerLayer):
        return without_adapters(module.get_base_layer())
    if isinstance(module, ModulesToSaveWrapper):
        active = None if module.disable_adapters else next(iter(module.active_adapters), None)
        return without_adapters(module.original_module if active is None
                                else module.modules_to_save[active])
    if isinstance(module, AuxiliaryTrainingWrapper):
        raise ConfigError(f"{type(module).__name__} (an auxiliary PEFT wrapper) has no base "
                          "module to read: audit_adapters reads LoRA layers and modules_to_save")
    if not any(True for _ in module.children()):
        return module
    view = copy.copy(module)
    view.__dict__["_modules"] = {name: None if child is None else without_adapters(child)
                                 for name, child in module._modules.items()}
    # hooks the view's forward registers (transformers' output capturing) are the view's own,
    # and the gate removes them from it, never from the user's module
    for name, table in module.__dict__.items():
        if "hooks" in name and isinstance(table, dict):
            view.__dict__[name] = type(table)(table)
    return view


# ---- the user's values, put back ----------------------------------------------------------------

@contextmanager
def drawn_adapters(model: PeftModel, seed: int) -> Iterator[None]:
    """Each LoRA layer's zero factor (a fresh Linear adapter's B, a fresh Embedding adapter's
    A) drawn so its update s B A has the RMS of the base weight it adapts; a trained adapter
    (neither factor zero) is left as it is. Every drawn factor put back bit for bit on
    leaving."""
    gen = torch.Generator().manual_seed(seed)
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for layer in _lora_layers(model):
                for name in layer.active_adapters:
                    factors = _factors(layer, name)
                    if factors is None:
                        continue
                    b, a = factors
                    zero = b if not b.any() else a if not a.any() else None
                    if zero is None:
                        continue
                    saved.append((zero, zero.detach().clone()))
                    drawn = torch.randn(zero.shape, generator=gen)
                    parts = (drawn, a.detach().float().cpu()) if zero is b else (
                        b.detach().float().cpu(), drawn)
                    update = layer.scaling[name] * (parts[0] @ parts[1])  # (out, in) or (D, V)
                    # an update that is 0 whatever the factor (a scaling of 0) is left at 0
                    ratio = _rms(layer.get_base_layer().weight) / (_rms(update) or 1.0)
                    zero.copy_((drawn * ratio).to(zero.dtype))
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)


@contextmanager
def merged(model: PeftModel) -> Iterator[None]:
    """The adapters merged into the base weights (`merge_adapter`), then unmerged, and every
    base weight the merge touched put back bit for bit."""
    saved = _base_weights(model)
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()
        _put_back(saved)


def unmerged_and_merged_again(model: PeftModel, ids: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """On a model found merged: (its logits on `ids` unmerged, as the adapters compute them;
    its logits merged again), then each layer's merged adapters as they were and every base
    weight put back bit for bit (an unmerge subtracts and a merge adds, which rounds)."""
    saved = _base_weights(model)
    layers = [(layer, list(layer.merged_adapters)) for layer in _lora_layers(model)]
    try:
        model.unmerge_adapter()
        adapted = _logits(model, ids)
        for layer, names in layers:
            if names:
                layer.merge(adapter_names=names)
        return adapted, _logits(model, ids)
    finally:
        for layer, names in layers:
            if layer.merged_adapters != names:  # a failure on the way: merged as found again
                while layer.merged:
                    layer.unmerge()
                layer.merge(adapter_names=names)
        _put_back(saved)


def _base_weights(model: PeftModel) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight, a copy) of every base weight a merge may write into."""
    return [(p, p.detach().clone()) for layer in _lora_layers(model)
            for p in layer.get_base_layer().parameters(recurse=False)]


def _put_back(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for tensor, value in saved:
            tensor.copy_(value)


def _lora_layers(model: nn.Module) -> Iterator[BaseTunerLayer]:
    return (m for m in model.modules() if isinstance(m, BaseTunerLayer) and hasattr(m, "lora_B"))


def _factors(layer: BaseTunerLayer, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(B, A) of adapter `name` in a LoRA layer: a Linear's lora_B / lora_A weights (out, r),
    (r, in), or an Embedding's lora_embedding_B / _A (D, r), (r, V); None when it has neither."""
    if name in getattr(layer, "lora_B", {}):
        return layer.lora_B[name].weight, layer.lora_A[name].weight
    if name in getattr(layer, "lora_embedding_B", {}):
        return layer.lora_embedding_B[name], layer.lora_embedding_A[name]
    return None


def _rms(tensor: torch.Tensor) -> float:
    return math.sqrt(float(tensor.float().pow(2).mean()))


__all__ = ["AdapterReport", "adapted_facts", "adapter_checks", "adapter_state", "audit_adapters",
           "check_merge", "drawn_adapters", "is_adapted", "live", "merged",
           "unmerged_and_merged_again", "without_adapters"]
