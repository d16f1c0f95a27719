"""The caches a caller builds for a Hugging Face model before its first step, the way `generate`
builds them, in whatever form the installed transformers release has:

    DynamicCache   grows with each step (`DynamicCache(config=...)` where it takes the config,
                   so its sliding layers keep only their window; `DynamicCache()` before);
    StaticCache    pre-sized to a length past the prompt (`cache_implementation="static"`),
                   the slots beyond what is filled never read;
    SlidingWindowCache, HybridCache
                   before transformers 5 (Mistral's window, Gemma 2's alternating layers), where
                   the release has them and the config declares a window.

Each is built from the class's own signature (config, max_cache_len, max_batch_size or
batch_size, device, dtype: each passed where it is a parameter), so no release's spelling is
assumed; a class whose constructor still refuses is left out, with the reason.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from .hf_windows import declared_windows


def _parameters(cls: type) -> set[str]:
    """The named parameters of the class's constructor, and of its parents' where it forwards
    **kwargs to them (StaticCache in 4.54-4.55 hands everything to Cache.__init__; HybridCache
    there names only config and forwards the rest)."""
    named: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            return named
        named |= {name for name, p in params.items() if name != "self" and p.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return named  # it forwards nothing further up
    return named


def _build(cls: type, config: Any, batch: int, length: int, device: torch.device,
           dtype: torch.dtype) -> Any:
    params = _parameters(cls)
    offered = {"config": config, "max_cache_len": length, "max_batch_size": batch,
               "batch_size": batch, "device": device, "dtype": dtype}
    return cls(**{name: value for name, value in offered.items() if name in params})


def _window_caches(config: Any) -> list[str]:
    """The windowed cache classes `generate` could hand this model: SlidingWindowCache windows
    every layer, so only a config windowing every layer (Mistral) takes it; HybridCache windows
    the layers its release's rule picks (before 4.53 the non-sliding_window_pattern-th, 2 by
    default; from 4.53 layer_types'), so only a config whose layers it reads (layer_types, or
    cache_implementation="hybrid": Gemma 2 and 3 before 4.53) or that windows every layer. A
    config without a declared window takes neither (Qwen2 in 4.50-4.52 keeps sliding_window=4096
    beside use_sliding_window=False)."""
    windows = declared_windows(config)
    if windows is None or not any(window is not None for window in windows):
        return []
    every = all(window is not None for window in windows)
    text = getattr(config, "get_text_config", lambda: config)()
    hybrid = every or bool(getattr(text, "layer_types", None)) or \
        getattr(text, "cache_implementation", None) == "hybrid"
    return (["SlidingWindowCache"] if every else []) + (["HybridCache"] if hybrid else [])


def caller_caches(model: Any, batch: int, length: int
                  ) -> tuple[list[tuple[str, Callable[[], Any]]], list[str]]:
    """([(name, build)], notes): a builder of each cache a caller may hand `model` for `batch`
    rows and at least `length` positions (StaticCache pre-sized to twice that), and why any
    known class was left out. Empty without transformers or for a model without a config."""
    tf = sys.modules.get("transformers")
    config = getattr(model, "config", None)
    if tf is None or config is None:
        return [], []
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None else torch.float32
    names = ["DynamicCache", "StaticCache"] + _window_caches(config)
    built, notes = [], []
    for name in names:
        cls = getattr(tf, name, None)
        if cls is None:
            continue  # this release has no such class
        size = 2 * length if name != "DynamicCache" else length
        try:
            _build(cls, config, batch, size, device, dtype)  # it must build here to be tried
        except Exception as exc:  # noqa: BLE001 - a constructor this model's config cannot fill
            notes.append(f"{name}: not built for this model ({type(exc).__name__}: {exc})"[:200])
            continue
        label = name if name == "DynamicCache" else f"{name} of {size} positions"
        built.append((label, lambda cls=cls, size=size: _build(cls, config, batch, size, device,
                                                               dtype)))
    return built, notes


def slots_kept(cache: Any) -> int:
    """The slots a cache still counts after its reset(): 0 where reset empties it, else the old
    prompt's length, which a second prompt would be written after: transformers 4.54-5.2x's
    DynamicCache zeroes its layers' tensors and keeps them, and its windowed layers then say 0
    while a second prompt is appended after them. Read from `get_seq_length()`, each layer's
    cumulative_length, and the slots a growing (not pre-sized) layer still holds; 0 for a
    cache that cannot say, and for any cache not of transformers."""
    if not type(cache).__module__.startswith("transformers"):
        return 0  # ours (a KVCache holds its pre-sized slots by design) and any other library's
    counts = []
    counted = getattr(cache, "get_seq_length", None)
    try:
        counts.append(counted() if callable(counted) else 0)
    except Exception:  # noqa: BLE001 - a cache that cannot count after a reset: taken as empty
        pass
    for layer in getattr(cache, "layers", ()):
        counts.append(getattr(layer, "cumulative_length", 0))
        keys = getattr(layer, "keys", None)  # (B, Hkv, S, Dh) where a dynamic layer holds any
        if not hasattr(layer, "max_cache_len") and isinstance(keys, torch.Tensor) \
                and keys.dim() >= 2:  # a growing layer: what it holds, it appends to
            counts.append(keys.shape[-2])
    return max([int(c.max()) if isinstance(c, torch.Tensor) else int(c) for c in counts
                if isinstance(c, (int, torch.Tensor))] or [0])
