"""The mean next-token cross-entropy of bfloat16 logits, computed in float32 a few rows at a time.

Under autocast the readout's logits (B*T, V) come out in bfloat16. The plain route upcasts all
of them (`logits.float()`: at GPT-2 small's B*T = 1024, V = 50257, 200 MB), takes a float32
log-softmax (another 200 MB), and its backward zero-fills and scatters a float32 gradient, runs
the log-softmax backward over both, and casts the result back to bfloat16 for the readout's
matmul: six passes over 200 MB per step, which on a 2-core CPU cost more than a fifth of a bf16
GPT-2 small step (benchmarks/README.md, the profile). Here the same arithmetic runs on
ROWS_PER_CHUNK rows at a time, so the float32 values of a chunk stay in cache: forward, each
row's log-sum-exp in float32; backward, softmax(logits) - onehot(target) in float32, times the
mean's 1/N, rounded once to bfloat16 (as the plain route's final cast rounds it). Only the
bfloat16 logits and their gradient pass through memory, and nothing (B*T, V) is saved between
forward and backward but the logits themselves.

The loss is the same float32 value up to the order of float32 sums, and the gradient the same
bfloat16 tensor up to one rounding (tests/training/test_loss.py, against float64).
"""

from __future__ import annotations

import torch

# Rows per chunk: 8 rows of V = 50257 in float32 are 1.6 MB, inside a core's L2 cache (2 MB on
# the Sapphire Rapids CPU this was measured on); the per-chunk Python cost is ~10 us a row op.
ROWS_PER_CHUNK = 8


class _ChunkedCrossEntropy(torch.autograd.Function):
    """mean_r (logsumexp(x_r) - x_r[t_r]) over rows r of x (N, V), in float32 (float64 logits:
    in float64)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows, work = logits.shape[0], _working_dtype(logits)
        lse = torch.empty(rows, dtype=work, device=logits.device)  # (N,)
        for start in range(0, rows, ROWS_PER_CHUNK):
            lse[start:start + ROWS_PER_CHUNK] = torch.logsumexp(
                logits[start:start + ROWS_PER_CHUNK].to(work), -1)
        picked = logits.gather(1, targets[:, None]).squeeze(1).to(work)  # (N,)
        ctx.save_for_backward(logits, targets, lse)
        return (lse - picked).mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        rows, work = logits.shape[0], _working_dtype(logits)
        scale = grad.to(work) / rows  # d mean / d row = 1/N
        out = torch.empty_like(logits)  # (N, V), the logits' dtype
        for start in range(0, rows, ROWS_PER_CHUNK):
            # (n, V), float32 at least; a copy also when the logits are float32 or float64
            # already (.to would return a view of them): the softmax below runs in place, and
            # the logits themselves are read after backward (the leak stop's statistic)
            chunk = logits[start:start + ROWS_PER_CHUNK].to(work, copy=True)
            chunk.sub_(lse[start:start + ROWS_PER_CHUNK, None]).exp_()  # softmax
            picked = targets[start:start + ROWS_PER_CHUNK, None]
            chunk.scatter_add_(1, picked, torch.full(picked.shape, -1.0, dtype=work,
                                                     device=chunk.device))
            out[start:start + ROWS_PER_CHUNK] = chunk.mul_(scale)
        return out, None


def _working_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32, or the logits' own dtype where it is wider (float64)."""
    return torch.promote_types(logits.dtype, torch.float32)


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (N, V) against targets (N,), a float32 scalar (float64 for
    float64 logits): the value of F.cross_entropy(logits.float(), targets), its gradient in the
    logits' own dtype."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}: "
                         "need (N, V) and (N,)")
    if targets.numel() and not 0 <= int(targets.min()) <= int(targets.max()) < logits.shape[1]:
        raise ValueError(f"targets span [{int(targets.min())}, {int(targets.max())}], outside "
                         f"the vocabulary [0, {logits.shape[1]}): every token is a target here "
                         "(no ignore index)")
    return _ChunkedCrossEntropy.apply(logits, targets)
