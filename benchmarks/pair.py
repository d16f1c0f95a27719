"""The pair of models every A/B figure compares, and what one timed step of either does.

Our seeded `Decoder` and `da.to_hf(decoder)`, checked to compute the same logits before anything
is timed; a step is a no-grad forward or forward + cross-entropy + backward; the two sides are
timed interleaved so drift and the other users of the machine hit both.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import decoder_audit as da
from decoder_audit.model.decoder import Decoder

from .common import SEED, BenchmarkError

# The pair must compute the same function before it is timed: max |ours - HF| over the logits,
# relative to the logit scale. fp32 conversions agree to ~1e-6 of scale; 1e-4 is a real bug.
EQUALITY_TOL = 1e-4


def hf_fast_attention(hf_model) -> str:
    """Switch the converted model (built with eager attention so weights can be read back) to HF's
    default fused attention, the fastest HF path on CPU. Returns the implementation in use."""
    try:
        hf_model.set_attn_implementation("sdpa")
    except (AttributeError, ValueError, ImportError):
        pass
    return str(getattr(hf_model.config, "_attn_implementation", "unknown"))


def build_pair(cfg: da.DecoderConfig, ids: torch.Tensor) -> tuple[Decoder, Any, dict[str, Any]]:
    """Our seeded Decoder and to_hf(decoder); refuses (BenchmarkError) unless their logits agree."""
    torch.manual_seed(SEED)
    ours = Decoder(cfg).eval()
    theirs = da.to_hf(ours).eval()
    attn = hf_fast_attention(theirs)
    with torch.no_grad():
        a = ours(ids)  # (B, T, V)
        b = theirs(input_ids=ids, use_cache=False).logits  # (B, T, V)
    diff = float((a - b).abs().max())
    scale = float(a.abs().max())
    if not diff <= EQUALITY_TOL * (1.0 + scale):
        raise BenchmarkError(f"{type(theirs).__name__} logits differ from ours by {diff:.3g} "
                             f"(logit scale {scale:.3g}, B={ids.shape[0]} T={ids.shape[1]}); "
                             "refusing to time unequal models")
    check = {"max_abs_logit_diff": diff, "logit_scale": scale, "hf_class": type(theirs).__name__,
             "hf_attention": attn}
    return ours, theirs, check


def step_fn(model, is_hf: bool, ids: torch.Tensor, targets: torch.Tensor | None
            ) -> Callable[[], None]:
    """One timed step: a no-grad forward, or forward + cross-entropy + backward (grads set to None
    first so every step allocates the same)."""
    def logits() -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits if is_hf else model(ids)

    if targets is None:
        def forward() -> None:
            with torch.no_grad():
                logits()
        return forward

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        out = logits()  # (B, T, V)
        F.cross_entropy(out.flatten(0, 1), targets.flatten()).backward()
    return forward_backward


def time_interleaved(ours: Callable[[], None], theirs: Callable[[], None], warmup: int,
                     repeats: int) -> tuple[list[float], list[float]]:
    """Warm both up, then alternate the order each repeat (A B, B A, ...) so neither side always
    runs first; gc is off inside a timed call so a collection never lands in one side's time."""
    for _ in range(warmup):
        ours()
        theirs()
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for r in range(repeats):
        order = (("ours", ours), ("hf", theirs))
        for side, fn in order if r % 2 == 0 else order[::-1]:
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                fn()
                times[side].append(time.perf_counter() - start)
            finally:
                gc.enable()
    return times["ours"], times["hf"]
