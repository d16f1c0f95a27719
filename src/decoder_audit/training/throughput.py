"""Throughput of a run: tokens per second and model FLOPs utilisation (MFU).

    tokens/s = tokens trained (steps this call x batch_size x T) / seconds in the loop
    MFU      = tokens/s x training FLOPs per token / peak FLOP/s

Training FLOPs per token come from the accounting package's analytic forward count
(`accounting.flops_by_group`: every matmul at 2 FLOPs per multiply-add, embeddings as lookups,
attention's scores and weighted sum over the full T x T square, the causal half not
subtracted) times 3: the backward pass costs twice the forward (a gradient for the inputs and
one for the weights of every matmul). For a dense decoder that is 6N + 12 L T D per token, with
N the matmul weights (readout included): the "6N + attention" of Kaplan et al. and PaLM's MFU.
Only a model with a DecoderConfig is counted; a foreign module gets no MFU (its FLOPs are not
known from a config).

The peak is the one the caller states (`--peak-flops`, e.g. a GPU's datasheet figure) or, when
none is given, a measured matmul ceiling: the best of a few square matmuls on the run's device in
the run's precision. A measured ceiling is what this machine reaches on the easiest possible
workload, not a datasheet peak, so the MFU against it is higher than against a datasheet; the
report says which peak it used.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from ..accounting.analytic import flops_by_group
from ..config import DecoderConfig

# The measured ceiling's square matmul grows from SIDE_START, doubling while one product takes
# under SIDE_SECONDS and the side is under the device's largest, so a slow device (a CPU in
# bf16: ~0.3 GFLOP/s on 2 cores) is not kept busy for seconds and a fast one is measured on a
# product big enough to reach its rate.
SIDE_START = 256
SIDE_SECONDS = 0.05
LARGEST_SIDE = {"cpu": 2048, "cuda": 8192}
CEILING_REPEATS = 3


@dataclass(frozen=True)
class Throughput:
    tokens: int
    """Tokens trained in this call (a resumed run counts its own steps only)."""
    seconds: float
    """Wall time of the training loop (its evaluations and checkpoints included)."""
    flops_per_token: int | None
    """Training FLOPs per token (3 x the analytic forward); None without a DecoderConfig."""
    peak_flops: float | None
    peak_source: str | None
    """"given" (--peak-flops) or "measured matmul ceiling (...)"."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def mfu(self) -> float | None:
        if self.flops_per_token is None or not self.peak_flops:
            return None
        return self.tokens_per_s * self.flops_per_token / self.peak_flops

    def describe(self) -> str:
        line = f"{self.tokens:,} tokens in {self.seconds:.1f} s: {self.tokens_per_s:,.0f} tokens/s"
        if self.mfu is None:
            return line + "; MFU not computed (no DecoderConfig to count the model's FLOPs)"
        return (line + f"; model FLOPs {self.flops_per_token:,} per token (6N + attention, "
                f"accounting's forward x 3); MFU {self.mfu:.2%} of {self.peak_flops:.3g} FLOP/s "
                f"({self.peak_source})")


def training_flops_per_token(cfg: DecoderConfig, seq_len: int) -> int:
    """3 x the analytic forward FLOPs of one sequence of `seq_len` tokens, per token."""
    forward = sum(flops_by_group(cfg, 1, seq_len).values())  # (1, T)
    return 3 * forward // seq_len


@functools.lru_cache(maxsize=None)
def matmul_ceiling(device: str, precision: str) -> tuple[float, str]:
    """The best FLOP/s of CEILING_REPEATS square matmuls (n x n)(n x n) on `device` in the
    training precision (bf16 for bf16 runs), and a label saying what was measured. Measured
    once per process and (device, precision): a property of the machine, not of the run."""
    kind = torch.device(device).type
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    n, largest = SIDE_START, LARGEST_SIDE.get(kind, LARGEST_SIDE["cpu"])
    while True:
        a = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        b = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        _timed(a, b, kind)  # warm-up: allocations, threads, kernel choice
        first = _timed(a, b, kind)
        if first >= SIDE_SECONDS or n >= largest:
            break
        n *= 2
    best = min([first] + [_timed(a, b, kind) for _ in range(CEILING_REPEATS)])
    label = f"measured matmul ceiling: {n}x{n} {str(dtype).removeprefix('torch.')} on {device}"
    return 2 * n ** 3 / best, label


def _timed(a: torch.Tensor, b: torch.Tensor, kind: str) -> float:
    _sync(kind)
    start = time.perf_counter()
    a @ b
    _sync(kind)
    return time.perf_counter() - start


def _sync(kind: str) -> None:
    if kind == "cuda":
        torch.cuda.synchronize()


def throughput(cfg: DecoderConfig | None, seq_len: int, tokens: int, seconds: float, *,
               device: str, precision: str, peak_flops: float | None) -> Throughput:
    """The run's throughput; the peak measured only when MFU can be computed and none is given."""
    per_token = training_flops_per_token(cfg, seq_len) if cfg is not None else None
    if peak_flops is not None:
        peak, source = float(peak_flops), "given: --peak-flops"
    elif per_token is not None:
        peak, source = matmul_ceiling(device, precision)
    else:
        peak, source = None, None
    return Throughput(tokens, seconds, per_token, peak, source)
