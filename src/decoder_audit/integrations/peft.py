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
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
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
    def passed(self) -> bool:
        return not self.failures

    def failed(self, name: str) -> bool:
        return any(c.name == name for c in self.failures)


def is_adapted(model: nn.Module) -> bool:
    """A PEFT model (imported only where peft is)."""
    return isinstance(model, PeftModel)


def adapted_facts(model: PeftModel, *, training: TrainingPath | None = None,
                  **options: Any) -> ModelFacts:
    """The gate's facts of a PEFT model. Its forward hands every keyword to the base model, so
    the paths the base's forward takes (the packed forms, use_cache, checkpointing switched on)
    are its own, and V is the base's where `options` give none (a PeftModel carries no config
    the gate reads). A training path whose packed form the base cannot take is a ConfigError,
    as for any model."""
    base = model_facts(model.get_base_model(), **options)
    own = model_facts(model, **({"vocab_size": base.vocab_size} | options))
    wanted = None if training is None else training.pack_form
    if wanted is not None and wanted not in base.packing_forms:
        raise ConfigError(f"training pack_form={wanted!r}: the base model "
                          f"{base.model}'s forward takes only {list(base.packing_forms)}")
    return replace(own, packing=base.packing, packing_forms=base.packing_forms,
                   takes_use_cache=base.takes_use_cache,
                   checkpointing_enabled=base.checkpointing_enabled, training=training)


def audit_adapters(model: PeftModel, *, training: TrainingPath | None = None, seed: int = 0,
                   **audit_options: Any) -> AdapterReport:
    """The gate on a PEFT model (module docstring); `audit_options` go to both audits."""
    if not isinstance(model, PeftModel):
        raise TypeError(f"audit_adapters() needs a peft.PeftModel, got {type(model).__name__}")
    base = model.get_base_model()
    facts = adapted_facts(model, training=training, **audit_options)
    with drawn_adapters(model, seed):
        live = audit(model, facts=facts, seed=seed)
        ids = torch.randint(0, facts.vocab_size, PROBE_SHAPE,
                            generator=torch.Generator().manual_seed(seed + 1))
        adapted = _logits(model, ids)
        with merged(model):
            view = without_adapters(base)
            merged_report = audit(view, training=training, seed=seed, **audit_options)
            merged_logits = _logits(view, ids)
        after = _logits(model, ids)
    check = check_merge(adapted, merged_logits, after)
    notes = ["the adapters' zero factors were drawn for the audit (a fresh adapter adds "
             "nothing: no update to check, and no gradient for its other factor) and put back "
             "after"]
    return AdapterReport(live, merged_report, [check], notes)


def check_merge(adapted: torch.Tensor, merged_logits: torch.Tensor, after: torch.Tensor
                ) -> CheckResult:
    """adapter_merge: the merged base's logits, and the adapted model's after unmerge, equal
    the adapted model's within MERGE_TOLERANCE_ULPS of its logits' scale."""
    scale = max(float(adapted.abs().max()), 1.0)
    allowed = MERGE_TOLERANCE_ULPS * torch.finfo(adapted.dtype).eps * scale
    merge_diff = float((merged_logits - adapted).abs().max())
    unmerge_diff = float((after - adapted).abs().max())
    evidence = {"merge_max_abs_diff": merge_diff, "unmerge_max_abs_diff": unmerge_diff,
                "allowed": allowed, "logit_scale": scale}
    if merge_diff > allowed:
        return CheckResult("adapter_merge", False, f"the merged model's logits differ from the "
                           f"adapted model's by up to {merge_diff:.3g} (allowed {allowed:.2g}): "
                           "the merge does not compute what the adapters do (a scaling left "
                           "out, or a weight another module shares)", evidence, allowed)
    if unmerge_diff > allowed:
        return CheckResult("adapter_merge", False, f"after unmerge the logits differ from before "
                           f"the merge by up to {unmerge_diff:.3g} (allowed {allowed:.2g}): the "
                           "unmerge does not undo the merge", evidence, allowed)
    return CheckResult("adapter_merge", True, f"merged logits = adapted logits (max diff "
                       f"{merge_diff:.2g}), and unmerged again (max diff {unmerge_diff:.2g}), "
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
    layers = list(_lora_layers(model))
    saved = [(p, p.detach().clone()) for layer in layers
             for p in layer.get_base_layer().parameters(recurse=False)]
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()
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


__all__ = ["AdapterReport", "audit_adapters", "check_merge", "adapted_facts", "drawn_adapters",
           "is_adapted", "merged", "without_adapters"]
