"""Sampling from a trained decoder: greedy or temperature, never cropping the prompt.

The loop feeds the whole sequence each step (no KV cache: these models are small) and stops at
the first of: the end-of-sequence id, the context limit, or `max_new_tokens`. The context limit:
a model accepting T <= max_seq_len can be fed at most max_seq_len ids, and its last row predicts
one more, so a finished sequence holds at most max_seq_len + 1 ids. A prompt longer than
max_seq_len is an error, never silently cropped to its last max_seq_len ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import ConfigError, ContextLengthError, InputShapeError
from .objective import logits_of
from .tokenizer import Tokenizer  # noqa: F401  (its home was here)


@dataclass(frozen=True)
class Generation:
    ids: list[int]
    """The prompt followed by the generated ids."""
    new_ids: list[int]
    """The generated ids only."""
    stop: str
    """Why generation ended: "eos", "context" (max_seq_len + 1 ids) or "max_new_tokens"."""


@torch.no_grad()
def generate(model: nn.Module, prompt: list[int], *, max_seq_len: int,
             eos_id: int | None = None, temperature: float = 0.0,
             max_new_tokens: int | None = None,
             generator: torch.Generator | None = None) -> Generation:
    """Continue `prompt` (a list of ids). temperature 0 is greedy (argmax); T > 0 samples from
    softmax(logits / T) with `generator`."""
    prompt = [int(i) for i in prompt]
    if not prompt:
        raise InputShapeError("the prompt is empty; give at least one token (e.g. '<bos>')")
    if len(prompt) > max_seq_len:
        raise ContextLengthError(
            f"the prompt has {len(prompt)} tokens but the model accepts at most "
            f"max_seq_len={max_seq_len}; it is rejected, never cropped")
    if not temperature >= 0.0:
        raise ConfigError(f"temperature={temperature} must be >= 0 (0 is greedy)")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 1")
    device = next(model.parameters()).device
    ids = list(prompt)
    while True:
        out = model(torch.tensor([ids], device=device))  # (1, T, V)
        logits = logits_of(out)[0, -1].float()  # (V,): the next-token row
        if temperature == 0.0:
            nxt = int(logits.argmax())
        else:
            probs = torch.softmax(logits / temperature, dim=-1).cpu()
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        ids.append(nxt)
        new = ids[len(prompt):]
        if eos_id is not None and nxt == eos_id:
            return Generation(ids, new, "eos")
        if len(ids) > max_seq_len:  # ids can no longer be fed to the model
            return Generation(ids, new, "context")
        if max_new_tokens is not None and len(new) >= max_new_tokens:
            return Generation(ids, new, "max_new_tokens")
