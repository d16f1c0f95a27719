"""How to call a model step by step: its call convention, read from its forward's signature,
and `Stepper`, which feeds it a padded batch (a prefill, then new tokens) under that convention.
`generate` and the gate's generation checks drive every model through these.

A model is driven by its call convention (`convention(model)`, read from its forward's
signature, then checked by calling it: `established`):
  "decoder"       our Decoder: `model(ids, attention_mask, cache=KVCache, last_only=True)`, a
                  static cache from `model.new_cache(B, capacity)`;
  "hugging face"  `model(input_ids, attention_mask=, position_ids=, past_key_values=,
                  use_cache=True)` returning `.logits` and `.past_key_values` (transformers
                  models, or a wrapper that names those parameters; transformers >= 5.2x
                  renamed the cache argument and output field `cache`, which is read the same).
                  attention_mask and position_ids are passed once the batch has pads; without
                  pads the model numbers positions from its cache, as its plain forward does;
  "input_pos"     litgpt's GPT: `set_kv_cache(batch_size=B)` builds the cache in its blocks, then
                  `model(ids, input_pos=positions)` steps it;
  "past_kv_cache" TransformerLens' HookedTransformer: `model(ids, past_kv_cache=cache,
                  attention_mask=mask of the new tokens)`, the cache from the class its forward's
                  annotation names (`init_cache(cfg, device, B)`);
  "return_intermediates"
                  x-transformers' TransformerWrapper, as its AutoregressiveWrapper drives it:
                  `logits, cache = model(every id so far, return_intermediates=True,
                  cache=cache)`, the logits of the ids the cache has not seen (all of them on
                  the prefill, without a cache);
  "plain"         ids (B, T) -> logits: every step recomputes the whole sequence.
`use_cache=False` recomputes the whole sequence every step under any convention (the reference
the cache must equal; greedy output is identical either way).

Positions of a padded batch come from the mask (cumulative sum of real tokens minus one, as
Hugging Face `generate` computes them), plus the origin the model numbers a row from, measured by
`position_origin` (RoBERTa's family starts at padding_idx + 1; `numbered`).

The origin: where a model that takes position_ids numbers the first token of a row, so where
the position_ids of a padded batch must start. Most models number a row's tokens 0, 1, 2, ..., and a left-padded row gets the mask's cumulative
sum minus one (what Hugging Face `generate` passes). The fairseq lineage of encoders used as
decoders (RoBERTa, XLM-RoBERTa, CamemBERT, Data2VecText, X-MOD, ...) numbers them from
padding_idx + 1 and, given no position_ids, derives them itself from `input_ids != padding_idx`;
position_ids counted from 0 shift every one of its rows by padding_idx + 1 positions, padded or
not. Passing no position_ids instead is no cure: its cached steps number themselves from the
cache length, which counts the pads of a left-padded row.

So the origin is measured, not guessed from a class: the first candidate whose position_ids
o, o+1, ... reproduce the model's own forward (given no position_ids) on a row of content ids.
0 comes first, so a model numbering from 0 (and a model that ignores position_ids) keeps 0; a
relative scheme (RoPE, ALiBi) cannot tell origins apart and keeps 0 as well.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..objective import logits_of


class CacheNotReturned(TypeError):
    """A model with a cache argument returned no cache object: its cache lives elsewhere (in
    the module, or in a dict the caller owns), so it cannot be driven step by step here;
    unless `field_declared`: its output has a cache field and left it empty."""

    def __init__(self, message: str, field_declared: bool = False) -> None:
        super().__init__(message)
        self.field_declared = field_declared


# A pad slot holds this id; its value never matters (the mask hides it), it only has to be a
# valid id.
PAD_ID = 0


@dataclass(frozen=True)
class Convention:
    """How to call a model for padded batches and cached steps (see the module docstring)."""

    name: str  # "decoder" | "hugging face" | "input_pos" | "past_kv_cache" |
    # "return_intermediates" | "plain"
    cached: bool  # it keeps a KV cache across calls
    masked: bool  # it takes an attention_mask
    position_ids: bool = False  # it takes position_ids (Hugging Face)
    last_only: str | None = None  # the keyword that limits logits to the last position
    cache_arg: str = "cache"  # Hugging Face: "past_key_values", or "cache" in transformers 5.2x
    position_origin: int = 0  # position_ids of a padded row start here (`position_origin` below)
    ids_keyword: bool = True  # Hugging Face: the ids go in as input_ids=; False: positionally
    """How the ids go in is established by calling (`established`), not read from a name."""
    mask_required: bool = False
    """Its forward requires an attention_mask (no default): every call passes one, all ones
    where the caller gives none (a batch without pads is all real tokens)."""


def convention(model: nn.Module) -> Convention:
    """The call convention of `model`, from the parameter names of its forward."""
    return replace(_convention(model), mask_required=_requires(model, "attention_mask"))


def _requires(model: nn.Module, name: str) -> bool:
    """Whether `model`'s forward takes `name` and has no default for it."""
    try:
        param = inspect.signature(model.forward).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty and param.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _convention(model: nn.Module) -> Convention:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    masked = "attention_mask" in params
    if "cache" in params and callable(getattr(model, "new_cache", None)):
        return Convention("decoder", True, masked,
                          last_only="last_only" if "last_only" in params else None)
    if "input_pos" in params and callable(getattr(model, "set_kv_cache", None)):
        return Convention("input_pos", True, masked)  # litgpt: the cache lives in its blocks
    if "past_kv_cache" in params and _init_cache_class(model) is not None:
        return Convention("past_kv_cache", True, masked)  # TransformerLens' HookedTransformer
    if "return_intermediates" in params and "cache" in params:  # x-transformers
        return Convention("return_intermediates", True, masked, ids_keyword=False)
    cache_arg = next((name for name in ("past_key_values", "cache") if name in params), None)
    keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if cache_arg is not None and ("use_cache" in params or keywords):  # use_cache may be a **kwarg
        # the logits of the last positions only: logits_to_keep, num_logits_to_keep before 4.49
        keep = next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in params),
                    None)
        return Convention("hugging face", True, masked, "position_ids" in params, keep, cache_arg,
                          ids_keyword="input_ids" in params)
    return Convention("plain", False, masked, "position_ids" in params)


def _init_cache_class(model: nn.Module) -> Any:
    """The cache class the forward's `past_kv_cache` annotation names, where it has an
    `init_cache(cfg, device, batch_size)` constructor (TransformerLens' key/value cache), else
    None."""
    import typing

    try:
        hint = typing.get_type_hints(model.forward).get("past_kv_cache")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve names no class
        return None
    for cls in (hint, *typing.get_args(hint)):
        if isinstance(cls, type) and callable(getattr(cls, "init_cache", None)):
            return cls
    return None


def is_signature_error(exc: BaseException) -> bool:
    """A TypeError that Python raised because the call did not fit the forward's signature (an
    unexpected or missing argument), not one the model raised from its own arithmetic."""
    return isinstance(exc, TypeError) and _SIGNATURE_ERROR.search(str(exc)) is not None


_SIGNATURE_ERROR = re.compile(r"unexpected keyword argument|missing \d+ required (positional|"
                              r"keyword-only) argument|takes \d+ positional argument|"
                              r"got multiple values for argument")


def established(model: nn.Module, conv: Convention, ids: torch.Tensor
                ) -> tuple[Convention, str]:
    """The convention `conv` (read from the forward's parameter names) checked by calling the
    model, once, on content ids (1, T >= 2), without gradients: how the ids go in, whether the
    cache it was guessed to keep goes in and comes out (a prefill, then one cached token), and
    whether it takes an attention_mask. Returns the convention as it works and, when the cache
    cannot be driven, why (its kv_cache check is then skipped with that reason, not failed).

    Only the calling convention is judged here: a call that fails for another reason than a
    signature mismatch (the model's own error) leaves the convention as guessed, so the check
    that drives it fails with that error as evidence."""
    why = ""
    if conv.name == "hugging face":
        conv, why = _cached_steps(model, conv, ids)
    if conv.name == "return_intermediates":
        conv, why = _intermediates_steps(model, conv, ids)
    if conv.masked:
        try:
            with torch.no_grad():
                Stepper(model, conv, 1, ids.shape[1], use_cache=False)(
                    ids, torch.ones_like(ids, dtype=torch.bool))
        except Exception as exc:  # noqa: BLE001 - only a signature mismatch changes the facts
            if is_signature_error(exc):
                conv = replace(conv, masked=False, position_ids=False)
    return conv, why


def _cached_steps(model: nn.Module, conv: Convention, ids: torch.Tensor
                  ) -> tuple[Convention, str]:
    """Two cached calls under the Hugging Face convention, the ids as input_ids= and, if that
    does not fit the signature, positionally; (the convention that drove them, "") or (the
    convention without a cache, why)."""
    errors = []
    for keyword in (True, False):
        trial = replace(conv, ids_keyword=keyword)
        try:
            with torch.no_grad():
                stepper = Stepper(model, trial, 1, ids.shape[1])
                stepper(ids[:, :1])
                stepper(ids[:, 1:2])
            return trial, ""
        except CacheNotReturned as exc:
            if exc.field_declared:
                # its output has a cache field and left it empty under use_cache=True: every
                # caller's decoding loop breaks (Nemotron in 4.46), so kv_cache runs and fails
                # with this error. An output without one keeps its cache elsewhere.
                return trial, ""
            return replace(trial, cached=False), (
                f"{exc}: its cache is kept elsewhere (in the module or a caller-owned object), "
                "so it cannot be stepped")
        except Exception as exc:  # noqa: BLE001 - the model's own error: kv_cache shows it
            if not is_signature_error(exc):
                return trial, ""
            errors.append(f"{type(exc).__name__}: {exc}")
    ids_passed = replace(conv, cached=False, ids_keyword=False)
    return ids_passed, ("its forward does not take the cache arguments its parameter names "
                        f"suggested (use_cache=, {conv.cache_arg}=): {errors[-1]}; so it cannot "
                        "be stepped with a cache")


def _intermediates_steps(model: nn.Module, conv: Convention, ids: torch.Tensor
                         ) -> tuple[Convention, str]:
    """Two cached calls under x-transformers' convention: (the convention, "") when they fit it,
    or (the convention without a cache, why) for a forward that names return_intermediates= and
    cache= but hands back no (logits, cache) pair, or does not take them."""
    try:
        with torch.no_grad():
            stepper = Stepper(model, conv, 1, ids.shape[1])
            stepper(ids[:, :1])
            stepper(ids[:, 1:2])
    except CacheNotReturned as exc:
        return replace(conv, cached=False), f"{exc}, so it cannot be stepped with one"
    except Exception as exc:  # noqa: BLE001 - the model's own error: kv_cache shows it
        if is_signature_error(exc):
            return replace(conv, cached=False), (
                f"its forward does not take return_intermediates= and cache= as their names "
                f"suggest ({type(exc).__name__}: {exc}), so it cannot be stepped with a cache")
    return conv, ""


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions (B, T) of a padded batch: real tokens counted from 0 in each row (the mask's
    cumulative sum minus one); a pad before a row's first real token gets 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class Stepper:
    """Feeds B rows to a model under its call convention.

    With a cache (use_cache, and a model that keeps one): a prefill, then new tokens (one or a
    chunk) per call, the cache kept between calls; `capacity` bounds the slots. Without: each
    call is one full forward of the ids it is given, positions from their mask; nothing is
    kept between calls."""

    def __init__(self, model: nn.Module, conv: Convention, batch: int, capacity: int,
                 use_cache: bool = True, cache: Any = None) -> None:
        self.model, self.conv, self.batch, self.capacity = model, conv, batch, capacity
        self.cached = use_cache and conv.cached
        self.length = 0  # slots fed so far
        # `cache`: one the caller built (an empty Hugging Face cache, a pre-sized KVCache);
        # else ours makes its static cache here and a Hugging Face model its own on the prefill
        # (or, where its own cannot be stepped, the one `generate` builds: `generate_cache`)
        self.cache: Any = cache if cache is not None else (
            model.new_cache(batch, capacity) if self.cached and conv.name == "decoder" else None)
        if cache is None and self.cached and conv.name == "hugging face":
            self.cache = generate_cache(model, batch, capacity)
        if cache is None and self.cached and conv.name in ("input_pos", "past_kv_cache"):
            self.cache = _module_cache(model, conv, batch, capacity)
        # A cache built before the first call (the caller's, or generate's) is told where each
        # step's slots lie, as generate tells it: a static or hybrid one cannot count them
        # itself (a windowed first layer holds only its window).
        self.cache_positions = (self.cache is not None and conv.name == "hugging face"
                                and _takes(model, "cache_position"))
        self.mask: torch.Tensor | None = None  # Hugging Face: (B, capacity) flags, once padded
        self.seen: torch.Tensor | None = None  # x-transformers: every id fed so far (B, S)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor | None = None,
                 last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V) of the new ids (B, T), or (B, 1, V) with last_only; `mask` (B, T)
        marks their real tokens (None: all real)."""
        if not self.cached:
            positions = (positions_from_mask(mask) + self.conv.position_origin
                         if mask is not None and self.conv.position_ids else None)
            extra = {"use_cache": False} if self.conv.name == "hugging face" else {}
            logits = logits_of(self._call(ids, mask, last_only, positions, **extra))
            return logits[:, -1:] if last_only else logits
        start, end = self.length, self.length + ids.shape[1]
        self.length = end
        if self.conv.name == "decoder":  # our cache keeps the mask and positions itself
            return logits_of(self._call(ids, mask, last_only, cache=self.cache))
        if self.conv.name == "input_pos":  # litgpt: the absolute positions of the new tokens
            return logits_of(self._call(ids, None, last_only,
                                        input_pos=torch.arange(start, end, device=ids.device)))
        if self.conv.name == "past_kv_cache":  # TransformerLens: the new tokens' mask
            real = torch.ones_like(ids) if mask is None else mask.long()
            return logits_of(self._call(ids, real, last_only, past_kv_cache=self.cache))
        if self.conv.name == "return_intermediates":  # x-transformers: every id so far
            self.seen = ids if self.seen is None else torch.cat((self.seen, ids), 1)  # (B, end)
            # the ids the cache has not seen: one by default, a chunk's size said (cache_age, as
            # its speculative decoding says it)
            age = {"cache_age": ids.shape[1]} if self.cache is not None and ids.shape[1] > 1 \
                else {}
            out = self._call(self.seen, None, False, return_intermediates=True,
                             cache=self.cache, **age)
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise CacheNotReturned(f"{type(self.model).__name__}(return_intermediates=True, "
                                       f"cache=) returned a {type(out).__name__}, no cache")
            logits, self.cache = out
            return logits[:, -1:] if last_only else logits
        # Hugging Face. Without pads the model numbers positions itself from its cache, as its
        # plain forward does (some families offset them: RoBERTa starts at padding_idx + 1).
        # Once a pad came: the mask of every slot so far and the positions of the new ones.
        if mask is not None and self.mask is None:
            self.mask = torch.ones(self.batch, self.capacity, dtype=torch.long,
                                   device=ids.device)  # (B, S): earlier slots were real
        if mask is not None:
            self.mask[:, start:end] = mask
        full = None if self.mask is None else self.mask[:, :end]  # (B, end)
        positions = (positions_from_mask(full)[:, start:] + self.conv.position_origin
                     if full is not None and self.conv.position_ids else None)
        extra = ({"cache_position": torch.arange(start, end, device=ids.device)}
                 if self.cache_positions else {})
        out = self._call(ids, full, last_only, positions, use_cache=True,
                         **{self.conv.cache_arg: self.cache}, **extra)
        self.cache = _returned_cache(out, self.conv.cache_arg)
        return logits_of(out)

    def _call(self, ids: torch.Tensor, mask: torch.Tensor | None, last_only: bool,
              positions: torch.Tensor | None = None, **extra) -> Any:
        kwargs = dict(extra)
        if mask is not None:
            kwargs["attention_mask"] = mask
        if positions is not None:
            kwargs["position_ids"] = positions
        if last_only and self.conv.last_only is not None:
            kwargs[self.conv.last_only] = True if self.conv.name == "decoder" else 1
        return call(self.model, self.conv, ids, **kwargs)


def call(model: nn.Module, conv: Convention, ids: torch.Tensor, **kwargs: Any) -> Any:
    """`model` called on ids (B, T) and `kwargs` the way its convention passes ids: as input_ids=
    where the Hugging Face convention was established with it, else positionally (every model
    the gate audits takes its ids first); an all-ones attention_mask where its forward requires
    one and the caller gave none."""
    if conv.mask_required and kwargs.get("attention_mask") is None:
        kwargs["attention_mask"] = torch.ones_like(ids)
    if conv.name == "hugging face" and conv.ids_keyword:
        return model(input_ids=ids, **kwargs)
    return model(ids, **kwargs)


def _takes(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def generate_cache(model: nn.Module, batch: int, capacity: int) -> Any:
    """The cache `generate` builds for a Hugging Face model whose config names a
    cache_implementation (Gemma 2 and 3 before transformers 4.53: "hybrid"), for `batch` rows
    and `capacity` slots; None for every other model, whose own cache grows as `generate` uses
    it. Such a model's own cache holds only its first call's tokens (a HybridCache of the
    prefill's length), so it cannot be stepped; and it cannot count its own slots (a windowed
    first layer's rolling buffer), so each step is given its cache_position, as `generate`
    gives it."""
    kind = getattr(getattr(model, "config", None), "cache_implementation", None)
    build = getattr(model, "_get_cache", None)
    if not isinstance(kind, str) or not callable(build):
        return None
    kwargs = {"cache_implementation": kind, "batch_size": batch, "max_cache_len": capacity,
              "model_kwargs": {}}
    if "device" in inspect.signature(build).parameters:
        kwargs["device"] = device_of(model)
    cache = build(**kwargs)
    vars(model).pop("_cache", None)  # generate keeps it on the model; each Stepper its own
    return cache


def _module_cache(model: nn.Module, conv: Convention, batch: int, capacity: int) -> Any:
    """The cache of a model that keeps it its own way: litgpt's, set in its blocks by
    `set_kv_cache` (the model holds it; nothing is returned), or TransformerLens' from its cache
    class's `init_cache`."""
    device = device_of(model)
    if conv.name == "input_pos":
        model.set_kv_cache(batch_size=batch, device=device)  # its own length: the masks it sizes
        return None
    return _init_cache_class(model).init_cache(model.cfg, device, batch)


def left_padded(rows: list[list[int]], device: torch.device | str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows of ids -> (ids (B, T) left-padded with PAD_ID, mask (B, T) bool or None when every
    row has the same length)."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):  # real tokens end every row
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = True
    return ids.to(device), (None if bool(mask.all()) else mask.to(device))


def _returned_cache(out: Any, name: str) -> Any:
    """The cache a Hugging Face-convention forward returned (the field named like its argument;
    the other name as a fallback)."""
    for field in (name, "cache" if name == "past_key_values" else "past_key_values"):
        value = out.get(field) if hasattr(out, "get") else getattr(out, field, None)
        if value is not None:
            return value
    fields = dataclasses.fields(out) if dataclasses.is_dataclass(out) else ()
    raise CacheNotReturned(f"{type(out).__name__} has no .{name}: the model returned no cache "
                           "although use_cache=True was passed",
                           field_declared=any(f.name in (name, "cache", "past_key_values")
                                              for f in fields))


def numbered(model: nn.Module, conv: Convention, ids: torch.Tensor,
             pad_token_id: int | None) -> tuple[Convention, int | None]:
    """(`conv` with the origin the model numbers a row from, that origin), measured on the
    content row `ids` (1, T) by position_origin; the origin is None (and `conv` keeps 0) when
    the convention passes no position_ids with a mask, or when no candidate matches."""
    if not (conv.position_ids and conv.masked):
        return conv, None
    origin = position_origin(model, ids, origin_candidates(pad_token_id),
                             keyword=conv.name == "hugging face" and conv.ids_keyword)
    return replace(conv, position_origin=origin or 0), origin


def device_of(model: nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


# ---- where a padded row's positions start -------------------------------------------------------

def position_origin(model: nn.Module, ids: torch.Tensor, candidates: Iterable[int], *,
                    keyword: bool = True) -> int | None:
    """The first origin in `candidates` whose position_ids reproduce the model's own forward
    exactly on `ids` (1, T) of content ids (no padding id among them), or None when none does.
    `keyword`: the ids go in as input_ids= (the Hugging Face convention), else positionally."""
    seq_len = ids.shape[1]

    def run(**extra) -> torch.Tensor:
        return logits_of(model(input_ids=ids, **extra) if keyword else model(ids, **extra))

    with torch.no_grad():
        own = run()  # (1, T, V): the model's own numbering
        for origin in dict.fromkeys(candidates):  # unique, in order
            positions = torch.arange(origin, origin + seq_len, device=ids.device)[None]  # (1, T)
            given = run(position_ids=positions)  # (1, T, V)
            # exact: the same lookups and the same arithmetic give the same bits; a wrong origin
            # moves a learned table's logits at O(1), never at the level of rounding
            if given.shape == own.shape and torch.equal(given, own):
                return origin
    return None


def origin_candidates(pad_token_id: int | None) -> tuple[int, ...]:
    """0, and padding_idx + 1 when the model declares a padding id (fairseq's make_positions)."""
    if isinstance(pad_token_id, int) and not isinstance(pad_token_id, bool) and pad_token_id >= 0:
        return (0, pad_token_id + 1)
    return (0,)
