"""`generate`: continue prompts with a decoder, through its KV cache where it has one.

    gen = da.generate(model, [1, 5, 7], max_new_tokens=32)           # greedy, one row
    gen = da.generate(model, [[1, 5, 7], [1, 2]], max_new_tokens=8,  # ragged: left-padded
                      temperature=0.8, top_k=50, top_p=0.9, generator=torch.Generator())
    gen.ids[i], gen.new_ids[i], gen.stop[i]   # per row: prompt + new, new ids, why it stopped

The model is driven by its call convention ("decoder", "hugging face" or "plain": see
convention.py); `use_cache=False` recomputes the whole sequence every step under any
convention (the reference the cache must equal; greedy output is identical either way).

Prompts of different lengths are left-padded into one batch with an attention mask; positions
come from the mask (cumulative sum of real tokens minus one, as Hugging Face `generate` computes
them; plus the origin the model numbers a row from, measured by `position_origin`: RoBERTa's
family starts at padding_idx + 1), so each row generates what it would alone. A model that
takes no mask runs ragged prompts row by row. A finished row (end-of-sequence id, the context
limit, or max_new_tokens) is fed as padding until every row has finished, so it never moves past
its own limit.

The context limit: a model accepting T <= max_seq_len can be fed at most max_seq_len ids of a
row, and its last row predicts one more, so a finished row holds at most max_seq_len + 1 ids. A
prompt longer than max_seq_len is an error, never cropped. max_seq_len comes from the model's
DecoderConfig, or from `max_seq_len=` for another model (None: no limit is known or enforced).

Sampling (temperature > 0): logits / temperature, then top-k (keep the k largest scores; ties
with the k-th are kept), then top-p (keep, in order of decreasing probability, each token whose
more probable predecessors hold less than p of the mass; the most probable token is always
kept), then one draw from the renormalised softmax with `generator`. temperature 0 is greedy
(argmax; the first index among equal maxima). The scores are (logits - row maximum) /
temperature, the same softmax; at a temperature so small that this overflows (1e-45 in float32)
the tokens below the maximum get -inf, probability 0, which is their limit: the draw is then
among the maxima, greedy's token when the maximum is unique. Nothing overflows to +inf or NaN.

Logits that hold no distribution are refused, never drawn from: NaN or +inf at any token, or
-inf at every token, of a row still generating raise `NonFiniteLogitsError` naming the row and
the step (argmax would return the NaN's index, multinomial a bare RuntimeError). -inf at some
tokens is a model ruling them out, and stays allowed. A prompt tensor must lie on the model's
device (not on meta, which holds no values): it is refused, naming both devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import DecoderConfig
from ..errors import (
    ConfigError,
    ContextLengthError,
    DecoderInputError,
    InputShapeError,
    NonFiniteLogitsError,
    TokenIdError,
)
from .convention import (
    CacheNotReturned,
    Stepper,
    convention,
    device_of,
    established,
    left_padded,
    numbered,
)


@dataclass(frozen=True)
class Generated:
    """The result of `generate`, one entry per prompt row."""

    ids: list[list[int]]
    """The prompt (unpadded) followed by the generated ids."""
    new_ids: list[list[int]]
    """The generated ids only."""
    stop: list[str]
    """Why each row ended: "eos", "context" (max_seq_len + 1 ids) or "max_new_tokens"."""


# ---- generate --------------------------------------------------------------------------------

@torch.no_grad()
def generate(model: nn.Module, prompt: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor, *,
             max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None, use_cache: bool = True,
             max_seq_len: int | None = None,
             on_token: Callable[[int], None] | None = None) -> Generated:
    """Continue `prompt`: a list of ids (one row), a list of lists (rows of any lengths, padded
    for you) or a (B, T0) integer tensor. See the module docstring for conventions, stopping
    and sampling. `max_seq_len` is for a model without a DecoderConfig; `on_token(n)` is called
    after each generated token of the batch (n new tokens so far), e.g. for a progress bar.
    Raises ConfigError for a bad option and a DecoderInputError for a bad prompt (or a prompt
    tensor on another device than the model's), naming the value and its limit;
    NonFiniteLogitsError when the model's logits hold no distribution."""
    cfg = getattr(model, "config", None)
    cfg = cfg if isinstance(cfg, DecoderConfig) else None
    if cfg is not None:
        if max_seq_len is not None and max_seq_len != cfg.max_seq_len:
            raise ConfigError(f"max_seq_len={max_seq_len} disagrees with the model's config "
                              f"max_seq_len={cfg.max_seq_len}")
        max_seq_len = cfg.max_seq_len
    vocab = cfg.vocab_size if cfg is not None else None
    _check_device(prompt, device_of(model))
    rows = _prompt_rows(prompt, vocab)
    _check_options(max_new_tokens, temperature, top_k, top_p, eos_id, generator, use_cache,
                   max_seq_len, vocab)
    if max_seq_len is not None:
        for i, row in enumerate(rows):
            if len(row) > max_seq_len:
                raise ContextLengthError(
                    f"prompt row {i} has {len(row)} tokens but the model accepts at most "
                    f"max_seq_len={max_seq_len}; it is rejected, never cropped")
    conv = convention(model)
    longest_row = max(rows, key=len)
    if conv.name != "decoder" and len(longest_row) >= 2 and (conv.cached or conv.masked):
        # the names in a forward's signature are a guess: checked by calling it (two tokens)
        conv, _ = established(model, conv, torch.tensor([longest_row[:2]],
                                                        device=device_of(model)))
    if len({len(row) for row in rows}) > 1 or (eos_id is not None and len(rows) > 1):
        # pads will come: where the model's rows start
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        longest = torch.tensor([max(rows, key=len)], device=device_of(model))  # (1, T0)
        conv, _ = numbered(model, conv, longest, pad)
    if len({len(row) for row in rows}) > 1 and not conv.masked:
        # no mask, no padding: each row alone (the rows draw from `generator` in turn)
        parts = []
        for i, row in enumerate(rows):
            try:
                parts.append(generate(
                    model, [row], max_new_tokens=max_new_tokens, temperature=temperature,
                    top_k=top_k, top_p=top_p, eos_id=eos_id, generator=generator,
                    use_cache=use_cache, max_seq_len=max_seq_len, on_token=on_token))
            except NonFiniteLogitsError as exc:  # named by its row in the caller's prompt
                raise NonFiniteLogitsError(i, exc.step, exc.what) from None
        return Generated([p.ids[0] for p in parts], [p.new_ids[0] for p in parts],
                         [p.stop[0] for p in parts])
    sampler = Sampler(temperature, top_k, top_p, generator)
    return _Loop(model, conv, rows, max_new_tokens, eos_id, max_seq_len, use_cache, sampler,
                 on_token).run()


class Sampler:
    """Next ids (B,) from next-token logits (B, V): greedy, or temperature, top-k, top-p."""

    def __init__(self, temperature: float, top_k: int | None, top_p: float | None,
                 generator: torch.Generator | None) -> None:
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature == 0.0:
            return logits.argmax(-1)
        probs = self.probabilities(logits)
        device = self.generator.device if self.generator is not None else probs.device
        drawn = torch.multinomial(probs.to(device), 1, generator=self.generator)  # (B, 1)
        return drawn[:, 0].to(logits.device)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (B, V) a draw comes from (temperature > 0): softmax of
        logits / temperature over the tokens top-k and top-p keep (zero elsewhere)."""
        logits = logits.float()
        # The same softmax from scores <= 0, so a tiny temperature overflows only to -inf (a
        # token far below the maximum: probability 0, its limit), never to +inf or NaN. The
        # maxima are set to 0 rather than divided: 0 / 5e-324 is 0 / 0 once the temperature is
        # rounded to float32.
        shifted = logits - logits.amax(-1, keepdim=True)  # (B, V)
        scores = torch.where(shifted == 0, 0.0, shifted / self.temperature)
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[:, -1:]  # (B, 1)
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            ordered, order = scores.sort(-1, descending=True)  # (B, V)
            probs = ordered.softmax(-1)
            before = probs.cumsum(-1) - probs  # mass of the more probable tokens
            drop = torch.empty_like(before, dtype=torch.bool).scatter_(
                -1, order, before >= self.top_p)  # back to vocabulary order
            scores = scores.masked_fill(drop, float("-inf"))
        return scores.softmax(-1)


class _Loop:
    """One batched generation: left-pad, prefill, then one token per step for every row."""

    def __init__(self, model, conv, rows, max_new_tokens, eos_id, max_seq_len, use_cache,
                 sampler, on_token) -> None:
        self.model, self.conv, self.rows = model, conv, rows
        self.eos_id, self.sampler, self.on_token = eos_id, sampler, on_token
        # New tokens row i may produce, and why it stops there if no eos comes first: a row of
        # n ids reaches the context limit after max_seq_len + 1 - n new ones (when both limits
        # fall on the same token, the context is named).
        self.limits, self.reasons = [], []
        for row in rows:
            room = None if max_seq_len is None else max_seq_len + 1 - len(row)
            context = room is not None and room <= max_new_tokens
            self.limits.append(room if context else max_new_tokens)
            self.reasons.append("context" if context else "max_new_tokens")
        self.steps = max(self.limits)
        # slots: the padded prompt, then every generated token but the last (never fed)
        self.capacity = max(len(row) for row in rows) + self.steps - 1
        self.use_cache = use_cache

    def run(self) -> Generated:
        batch, device = len(self.rows), device_of(self.model)
        cached = self.use_cache and self.conv.cached
        stepper = Stepper(self.model, self.conv, batch, self.capacity) if cached else None
        new = torch.empty(batch, self.steps, dtype=torch.long, device=device)
        done_at: list[int | None] = [None] * batch  # new tokens when the row finished
        stop = list(self.reasons)
        if cached:
            ids, mask = left_padded(self.rows, device)
            try:
                logits = stepper(ids, mask, last_only=True)[:, -1]  # (B, V): the prefill
            except CacheNotReturned:  # a cache kept elsewhere: recompute every step instead
                cached = False
        if not cached:
            logits = self._recompute(new, 0, done_at, device)
        feed_mask = None
        for step in range(self.steps):
            _check_distribution(logits, done_at, step)
            nxt = self.sampler(logits)  # (B,)
            new[:, step] = nxt
            if self.on_token is not None:
                self.on_token(step + 1)
            finished = self._finished(step, nxt, done_at, stop)
            if all(at is not None for at in done_at):
                break
            if not cached:
                logits = self._recompute(new, step + 1, done_at, device)
                continue
            if finished and self.conv.masked:  # feed finished rows as pads from now on
                feed_mask = torch.tensor([[at is None] for at in done_at], device=device)
            logits = stepper(nxt[:, None], feed_mask, last_only=True)[:, -1]
        new_rows = new.tolist()
        news = [new_rows[i][:done_at[i]] for i in range(batch)]
        return Generated([row + n for row, n in zip(self.rows, news)], news, stop)

    def _recompute(self, new: torch.Tensor, made: int, done_at: list, device) -> torch.Tensor:
        """Next-token logits (B, V) by one full forward of every unfinished row (its prompt and
        the `made` tokens so far, left-padded); finished rows get zeros (never read)."""
        alive = [i for i, at in enumerate(done_at) if at is None]
        made_rows = new[alive, :made].tolist()
        ids, mask = left_padded([self.rows[i] + made_rows[j] for j, i in enumerate(alive)],
                                device)
        stepper = Stepper(self.model, self.conv, len(alive), ids.shape[1], use_cache=False)
        rows = stepper(ids, mask, last_only=True)[:, -1]  # (alive, V)
        logits = rows.new_zeros(len(done_at), rows.shape[-1])
        logits[alive] = rows
        return logits

    def _finished(self, step: int, nxt: torch.Tensor, done_at: list, stop: list) -> bool:
        """Mark rows that end with token `step` (eos, or their limit); whether any did."""
        hits = nxt.tolist() if self.eos_id is not None else None
        finished = False
        for i in range(len(done_at)):
            if done_at[i] is not None:
                continue
            if hits is not None and hits[i] == self.eos_id:
                done_at[i], stop[i], finished = step + 1, "eos", True
            elif step + 1 == self.limits[i]:
                done_at[i], finished = step + 1, True
        return finished


def _check_distribution(logits: torch.Tensor, done_at: list, step: int) -> None:
    """NonFiniteLogitsError for the first row still generating whose next-token logits (V,)
    hold NaN or +inf, or -inf everywhere (finished rows' logits are never read)."""
    alive = [i for i, at in enumerate(done_at) if at is None]
    rows = logits[alive]  # (alive, V)
    broken = rows.isnan().any(-1) | (rows == float("inf")).any(-1) | \
        (rows == float("-inf")).all(-1)  # (alive,)
    if not broken.any():
        return
    j = int(broken.nonzero()[0])
    row = rows[j]  # (V,)
    nan, inf = int(row.isnan().sum()), int((row == float("inf")).sum())
    if nan:
        what = f"hold NaN at {nan} of {row.numel()} tokens"
    elif inf:
        what = f"hold +inf at {inf} of {row.numel()} tokens"
    else:
        what = f"are -inf at all {row.numel()} tokens"
    raise NonFiniteLogitsError(alive[j], step, what)


def _check_device(prompt: Any, device: torch.device) -> None:
    """A prompt tensor (or a row given as one) must lie where the model's weights are, and
    neither may be on meta (shapes without values: a model there computes nothing, ids there
    are no ids)."""
    rows = prompt if isinstance(prompt, (list, tuple)) else [prompt]
    tensors = [row for row in rows if isinstance(row, torch.Tensor)]
    where = next((t.device for t in tensors if t.device != device), None) or \
        (tensors[0].device if tensors else None)
    if device.type == "meta":
        given = f"the prompt tensor is on {where}" if where is not None else "the prompt is a list"
        raise DecoderInputError(f"the model's weights are on the meta device, which holds no "
                                f"values, so it computes nothing ({given}); load or build the "
                                "model on a real device such as cpu")
    if where is not None and (where.type == "meta" or where != device):
        raise DecoderInputError(f"the prompt tensor is on device {where} but the model's "
                                f"weights are on {device}; move the ids to {device}"
                                + (" (meta tensors hold no ids)" if where.type == "meta" else ""))


def _prompt_rows(prompt: Any, vocab: int | None) -> list[list[int]]:
    """The prompt as rows of python ints; InputShapeError / TokenIdError naming the problem."""
    if isinstance(prompt, torch.Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise InputShapeError(f"a prompt tensor must have an integer dtype, got "
                                  f"dtype={prompt.dtype}")
        if prompt.dim() not in (1, 2):
            raise InputShapeError(f"a prompt tensor must be (T0,) or (B, T0), got shape "
                                  f"{tuple(prompt.shape)}")
        rows = [prompt.tolist()] if prompt.dim() == 1 else prompt.tolist()
    elif isinstance(prompt, (list, tuple)):
        nested = [isinstance(item, (list, tuple, torch.Tensor)) for item in prompt]
        if any(nested) and not all(nested):
            raise InputShapeError("the prompt mixes ids and rows; give a list of ids or a list "
                                  "of lists of ids")
        rows = [list(r.tolist() if isinstance(r, torch.Tensor) else r) for r in prompt] \
            if prompt and all(nested) else [list(prompt)]
    else:
        raise InputShapeError(f"the prompt must be a list of ids, a list of lists or a (B, T0) "
                              f"tensor, got {type(prompt).__name__}")
    if not rows:
        raise InputShapeError("the prompt has no rows; give at least one row of ids")
    for i, row in enumerate(rows):
        if not row:
            raise InputShapeError(f"prompt row {i} is empty; give at least one token "
                                  "(e.g. '<bos>')")
        for t, tok in enumerate(row):
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise InputShapeError(f"prompt row {i}, position {t}: {tok!r} is not an "
                                      "integer id")
            if tok < 0 or (vocab is not None and tok >= vocab):
                limit = f"vocab_size={vocab}" if vocab is not None else "infinity"
                raise TokenIdError(f"token id {tok} at prompt row {i}, position {t} is outside "
                                   f"[0, {limit})")
    return rows


def _check_options(max_new_tokens, temperature, top_k, top_p, eos_id, generator, use_cache,
                   max_seq_len, vocab) -> None:
    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not integer(max_new_tokens) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature={temperature!r} must be a finite number >= 0 "
                          "(0 is greedy)")
    if top_k is not None and (not integer(top_k) or top_k < 1):
        raise ConfigError(f"top_k={top_k!r} must be an integer >= 1 (or None)")
    if top_k is not None and vocab is not None and top_k > vocab:
        raise ConfigError(f"top_k={top_k} exceeds the vocabulary size V={vocab}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0.0 < top_p <= 1.0):
        raise ConfigError(f"top_p={top_p!r} must lie in (0, 1] (or None)")
    if temperature == 0 and (top_k is not None or top_p is not None):
        raise ConfigError(f"top_k={top_k!r} / top_p={top_p!r} need temperature > 0; "
                          "temperature=0 is greedy and would ignore them")
    if eos_id is not None and (not integer(eos_id) or eos_id < 0
                               or (vocab is not None and eos_id >= vocab)):
        limit = vocab if vocab is not None else "V"
        raise ConfigError(f"eos_id={eos_id!r} must be an id in [0, {limit})")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ConfigError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if not isinstance(use_cache, bool):
        raise ConfigError(f"use_cache={use_cache!r} must be True or False")
    if max_seq_len is not None and (not integer(max_seq_len) or max_seq_len < 1):
        raise ConfigError(f"max_seq_len={max_seq_len!r} must be a positive integer (or None)")


__all__ = ["Generated", "Sampler", "generate"]
