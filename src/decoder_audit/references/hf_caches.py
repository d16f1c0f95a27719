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


def _build(cls: type, config: Any, batch: int, length: int, device: torch.device,
           dtype: torch.dtype) -> Any:
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        params = {}
    offered = {"config": config, "max_cache_len": length, "max_batch_size": batch,
               "batch_size": batch, "device": device, "dtype": dtype}
    return cls(**{name: value for name, value in offered.items() if name in params})


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
    windowed = getattr(getattr(config, "get_text_config", lambda: config)(), "sliding_window",
                       None) is not None
    names = ["DynamicCache", "StaticCache"] + (["SlidingWindowCache", "HybridCache"]
                                               if windowed else [])
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
