"""Sampling one prompt: the single-row form of `decoder_audit.generate`, kept for its callers.

`generate(model, prompt, max_seq_len=...)` continues one list of ids until the end-of-sequence
id, the context limit (max_seq_len + 1 ids: the longest input fed is max_seq_len) or
`max_new_tokens`, and returns one `Generation`. It runs `decoder_audit.generate.generate` (KV
cache where the model has one, full recomputation otherwise); batches, ragged prompts, top-k and
top-p are there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import ConfigError
from .generate import generate as generate_batch
from .tokenizer import Tokenizer  # noqa: F401  (its home was here)


@dataclass(frozen=True)
class Generation:
    ids: list[int]
    """The prompt followed by the generated ids."""
    new_ids: list[int]
    """The generated ids only."""
    stop: str
    """Why generation ended: "eos", "context" (max_seq_len + 1 ids) or "max_new_tokens"."""


def generate(model: nn.Module, prompt: list[int], *, max_seq_len: int,
             eos_id: int | None = None, temperature: float = 0.0,
             max_new_tokens: int | None = None, generator: torch.Generator | None = None,
             top_k: int | None = None, top_p: float | None = None,
             use_cache: bool = True) -> Generation:
    """Continue `prompt` (a list of ids). temperature 0 is greedy (argmax); T > 0 samples from
    softmax(logits / T) with `generator`. max_new_tokens None runs to eos or the context."""
    prompt = [int(i) for i in prompt]
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 1")
    # Without a token budget a row can grow to max_seq_len + 1 ids; a prompt longer than
    # max_seq_len is refused by generate_batch (never cropped).
    budget = max_new_tokens if max_new_tokens is not None else max(1, max_seq_len + 1 - len(prompt))
    out = generate_batch(model, prompt, max_new_tokens=budget, temperature=temperature,
                         top_k=top_k, top_p=top_p, eos_id=eos_id, generator=generator,
                         use_cache=use_cache, max_seq_len=max_seq_len)
    return Generation(out.ids[0], out.new_ids[0], out.stop[0])
