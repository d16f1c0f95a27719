"""What a text-only next-token call of a model reaches, for `dead_parameters` (weights.py): the
routed experts its tokens are sent to, the modules it runs, the modules whose output the loss
reads, and the inputs its forward takes that such a call never gives.

A parameter that gets no gradient is dead, and fails, when the loss reads the output of the
module holding it (a norm scale registered and never applied: its module is on the loss's path,
it is not). It is out of this call's reach, named and not judged:

- in a module of the user's own, when the module never ran and the forward names another input
  that could run it (a vision tower behind `pixel_values`); an unused Linear in a forward that
  takes only ids stays dead;
- in a released Hugging Face class, when no output of its module reaches the next-token loss:
  the class holds it for another input or objective (GPT-2's cross-attention behind
  `encoder_hidden_states`, BigBird's pooler, DeepSeek-V3.2's indexer, which chooses keys by
  top-k and is trained by a loss of its own). A plain LlamaForCausalLM has no such part: every
  module's output reaches its loss, so every parameter is judged.

That is decided from the model itself, the modules its call ran, the outputs the loss read and
the parameters its forward names, never from a list of classes.
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
    "input_ids", "attention_mask", "mask", "position_ids", "token_type_ids", "inputs_embeds",
    "labels", "shift_labels", "num_items_in_batch", "targets", "document_ids", "cache",
    "past_key_values", "use_cache", "cache_position", "logits_to_keep", "num_logits_to_keep",
    "output_attentions", "output_hidden_states", "output_router_logits", "return_dict",
    "head_mask"})

_EXPERT = re.compile(r"(^|\.)experts\.\d+$")


@dataclass
class Reached:
    """What the calls made within `reached()` ran: each routed expert module (named
    `...experts.{e}`) sent tokens, and each module that holds parameters of its own."""

    experts: dict[str, nn.Module]
    experts_seen: set[str] = field(default_factory=set)
    modules_run: set[str] = field(default_factory=set)
    # the modules an output of which received a nonzero gradient in a backward pass of the
    # block (a gradient of zeros, through a gate initialised at 0 or a path masked out, reads
    # nothing of it)
    read_by_loss: set[str] = field(default_factory=set)
    # nn.Embedding modules with a padding_idx -> whether any id but it was looked up
    padded_lookups: dict[str, bool] = field(default_factory=dict)

    @property
    def missed_experts(self) -> set[str]:
        """The experts no token was sent to: called on no rows (ours) or not at all (a loop
        that skips them)."""
        return set(self.experts) - self.experts_seen

    def ran(self, parameter: str) -> bool:
        """Whether the module holding the parameter `parameter` (a dotted name) was run."""
        return parameter.rpartition(".")[0] in self.modules_run

    def read(self, parameter: str) -> bool:
        """Whether the loss read an output of the module holding `parameter`."""
        return parameter.rpartition(".")[0] in self.read_by_loss

    def padding_only(self, parameter: str) -> bool:
        """Whether `parameter` is the table of an nn.Embedding looked up at its padding_idx
        alone (RoCBert's shape and pronunciation tables, fed zeros when their ids are not
        given): that row's gradient is 0 by nn.Embedding's definition, so the table gets none."""
        return self.padded_lookups.get(parameter.rpartition(".")[0]) is False


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
    def read(name: str, grad: torch.Tensor) -> None:
        if name not in found.read_by_loss and bool(grad.ne(0).any()):
            found.read_by_loss.add(name)

    def ran(name: str, module: nn.Module, inputs: tuple, output) -> None:
        found.modules_run.add(name)
        pad = getattr(module, "padding_idx", None)
        if isinstance(module, nn.Embedding) and pad is not None and inputs and \
                isinstance(inputs[0], torch.Tensor):
            found.padded_lookups[name] = found.padded_lookups.get(name, False) or \
                bool((inputs[0] != pad).any())
        for tensor in _tensors(output):  # a gradient through it: the loss reads this module
            if tensor.requires_grad:
                tensor.register_hook(lambda grad, name=name: read(name, grad))

    hooks += [module.register_forward_hook(
        lambda module, inputs, output, name=name: ran(name, module, inputs, output))
        for name, module in model.named_modules() if module._parameters]
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()


def _tensors(output) -> list[torch.Tensor]:
    """The tensors a module returned: itself, or those in a tuple, list or dict (a Hugging Face
    output is a dict), one level down."""
    if isinstance(output, torch.Tensor):
        return [output]
    values = output.values() if isinstance(output, dict) else \
        output if isinstance(output, (tuple, list)) else ()
    return [value for value in values if isinstance(value, torch.Tensor)]


def other_inputs(model: nn.Module) -> list[str]:
    """The parameters `model`'s forward names beyond the ids (its first) and TEXT_CALL that take
    a value a text-only call never gives (no default, or None: encoder states, pixels, audio
    features); a flag with a default of its own (`last_only=False`) chooses what comes back,
    and is none. A forward of *args and **kwargs alone names none."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in named[1:] if p.name not in TEXT_CALL
            and (p.default is p.empty or p.default is None)]
