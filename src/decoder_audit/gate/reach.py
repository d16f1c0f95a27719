"""What a text-only next-token call of a model reaches, for `dead_parameters` (weights.py): the
routed experts its tokens are sent to, the modules it runs, and the inputs its forward takes
that such a call never gives.

A parameter that gets no gradient is dead when the call ran the module holding it (a norm scale
never applied, an output detached) or when nothing but the text could ever reach it (an unused
Linear in a forward that takes only ids). It is out of this call's reach, and not judged, when
its module never ran and the forward takes another input that could run it: GPT-2's
cross-attention behind `encoder_hidden_states`, a vision tower behind `pixel_values`, Mllama's
cross-attention layers behind `cross_attention_states`. That is decided from the model itself,
the modules its call ran and the parameters its forward names, never from its class: a plain
LlamaForCausalLM takes nothing but text, so every parameter it holds is judged.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

# The arguments of the calls a text-only next-token run makes (the ids first, whatever their
# name, then these): the text, its mask and positions, a cache, labels and the flags that only
# choose what comes back. Any other parameter a forward names is an input of another kind.
TEXT_CALL = frozenset({
    "input_ids", "attention_mask", "position_ids", "token_type_ids", "inputs_embeds", "labels",
    "shift_labels", "num_items_in_batch", "targets", "document_ids", "cache", "past_key_values",
    "use_cache", "cache_position", "logits_to_keep", "num_logits_to_keep", "output_attentions",
    "output_hidden_states", "output_router_logits", "return_dict", "head_mask"})

_EXPERT = re.compile(r"(^|\.)experts\.\d+$")


@dataclass
class Reached:
    """What the calls made within `reached()` ran: each routed expert module (named
    `...experts.{e}`) sent tokens, and each module that holds parameters of its own."""

    experts: dict[str, nn.Module]
    experts_seen: set[str] = field(default_factory=set)
    modules_run: set[str] = field(default_factory=set)

    @property
    def missed_experts(self) -> set[str]:
        """The experts no token was sent to: called on no rows (ours) or not at all (a loop
        that skips them)."""
        return set(self.experts) - self.experts_seen

    def ran(self, parameter: str) -> bool:
        """Whether the module holding the parameter `parameter` (a dotted name) was run."""
        owner = parameter.rpartition(".")[0]
        return owner in self.modules_run


@contextmanager
def reached(model: nn.Module) -> Iterator[Reached]:
    """Within the block, what the model's forwards run (see `Reached`)."""
    found = Reached({name: module for name, module in model.named_modules()
                    if _EXPERT.search(name)})

    def expert_seen(name: str, inputs: tuple) -> None:
        if not inputs or not isinstance(inputs[0], torch.Tensor) or inputs[0].numel():
            found.experts_seen.add(name)

    hooks = [module.register_forward_hook(
        lambda _, inputs, __, name=name: expert_seen(name, inputs))
        for name, module in found.experts.items()]
    hooks += [module.register_forward_pre_hook(
        lambda *_, name=name: found.modules_run.add(name))
        for name, module in model.named_modules() if module._parameters]
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()


def other_inputs(model: nn.Module) -> list[str]:
    """The parameters `model`'s forward names beyond the ids (its first) and TEXT_CALL: inputs
    of another kind (encoder states, pixels, audio features), which a text-only call never
    gives. A forward of *args and **kwargs alone names none."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in named[1:] if p.name not in TEXT_CALL]
