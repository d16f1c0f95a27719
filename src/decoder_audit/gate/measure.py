"""How the checks size their probes and compare numbers: batch sizes and sampled positions,
finiteness, and the scale rounding errors are measured against; and giving freed memory back.
Pure functions of tensors and sizes: nothing here knows the model."""

from __future__ import annotations

import ctypes
import functools

import torch


def batch_not_equal(seq_len: int, preferred: tuple[int, ...] = (3, 2, 5)) -> int:
    """A batch size different from T, so no axis can be identified by its size."""
    return next(b for b in preferred if b != seq_len)


def sample_positions(seq_len: int, count: int) -> list[int]:
    """All of 0..T-1 when T <= count, else `count` positions spread over them, always including
    0, 1 and T-1 (the ends are where off-by-one masks show)."""
    if seq_len <= count:
        return list(range(seq_len))
    picks = {0, 1, seq_len - 1}
    step = (seq_len - 1) / (count - 1)
    picks.update(round(i * step) for i in range(count))
    picks = sorted(picks)
    while len(picks) > count:  # drop interior duplicates of the spread, keep the ends
        picks.pop(len(picks) // 2)
    return picks


def all_finite(tensor: torch.Tensor, chunk: int = 1 << 22) -> bool:
    """torch.isfinite(tensor).all(), a chunk of 4M elements at a time: on logits (1, 1024, 50257)
    the one-shot test allocates 1.7x the logits in temporaries."""
    flat = tensor.detach().reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(chunk))


def value_scale(reference: torch.Tensor) -> float:
    """max |reference|: what rounding errors are relative to. Floating point rounds each result
    relative to its magnitude, and the largest logit bounds the magnitudes a logit row is built
    from (the same readout of the same normalised stream), so a tolerance is a multiple of the
    dtype's eps times this scale: a model with tiny logits is held to the same relative
    precision as one with large logits."""
    return float(reference.detach().abs().max()) if reference.numel() else 0.0


def index_noise(logits: torch.Tensor) -> float:
    """The noise floor of a batch of identical rows (B, T, V): the largest |row b - row 0|,
    relative to the logit scale. Elementwise kernels vectorise over the flat tensor and finish
    its tail (and each thread's chunk) with other code, so the same row can round differently at
    another batch index; on most kernels this is exactly 0."""
    scale = value_scale(logits[0])
    if logits.shape[0] < 2 or scale == 0.0:
        return 0.0
    return float((logits[1:] - logits[:1]).abs().max()) / scale


def largest(tensor: torch.Tensor) -> float:
    """max |tensor| in one pass (no |tensor| temporary); 0 for an empty one; NaN if any entry
    is NaN. `aminmax` reads float64 about 2.7x faster than the inf-norm on this machine (10M
    weights of GPT-2 XL: 7 ms against 19 ms)."""
    if not tensor.numel():
        return 0.0
    low, high = torch.aminmax(tensor.detach())
    return float(torch.maximum(-low, high))  # maximum propagates NaN


def scaled_excess(diff: torch.Tensor, reference: torch.Tensor, tol: float) -> tuple[float, float]:
    """(largest |diff|, the allowed bound tol * max |reference|)."""
    return float(diff.detach().abs().max()) if diff.numel() else 0.0, tol * value_scale(reference)


def return_freed_memory() -> None:
    """Give memory the gate freed back to the OS. glibc raises its mmap threshold as large
    blocks are freed (up to 32 MB), after which activation-sized blocks live in the heap and
    stay there when freed: measured on GPT-2 small, the resident set crept by 250 MB over the
    checks, every later check starting that much higher. malloc_trim(0) releases them. A no-op
    where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# mallopt's parameter for the mmap threshold (glibc's malloc.h: M_MMAP_THRESHOLD).
M_MMAP_THRESHOLD = -3


def allocate_large_blocks_apart(threshold: int = 128 * 2**10) -> None:
    """Serve every allocation of at least `threshold` bytes from its own mmap, returned to the
    OS as soon as it is freed, for the rest of the process. A sharded model gathers each
    block's weights before it runs and frees them after, dozens of times in one check: under
    glibc's sliding threshold those buffers land in the heap, whose fragments hold the peak up
    between two trims (GPT-2 small over 2 ranks: the `inputs` check's peak 1,611 MiB with the
    sliding threshold, 973 MiB pinned at 128 KiB). A no-op without glibc's mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, threshold)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
