"""The chunked cross-entropy training computes its loss with (training/loss.py).

Independent expectation: torch's F.cross_entropy over the same logits in float64, the loss and
its gradient with respect to the logits. The chunked loss is float32 arithmetic, so its value
agrees to float32 rounding of a sum of N terms; its gradient is float32 arithmetic rounded once
to the logits' dtype, so it agrees to one rounding of that dtype (bfloat16: 2^-8 of the value,
float32: a few 2^-24) at every element, within the bound the plain route (upcast, float32
cross-entropy, cast back) meets too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from decoder_audit.training.loss import ROWS_PER_CHUNK, chunked_cross_entropy

# N not a multiple of the chunk, so the last chunk is short; V odd, as GPT-2's 50257 is.
N, V = 3 * ROWS_PER_CHUNK + 5, 1001


def _logits(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(N, V, generator=gen)).to(dtype)  # (N, V): a peaked softmax too
    logits[0, 7] = 40.0  # one row near one-hot: the target's p - 1 is small there
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[0] = 7
    return logits, targets


@pytest.mark.parametrize("dtype, rounding", [(torch.bfloat16, 2.0 ** -8),
                                             (torch.float32, 8 * 2.0 ** -24),
                                             (torch.float64, 8 * 2.0 ** -53)])
def test_loss_and_gradient_equal_float64_cross_entropy_to_the_dtypes_rounding(dtype, rounding):
    logits, targets = _logits(dtype)
    ours = logits.clone().requires_grad_()
    loss = chunked_cross_entropy(ours, targets)
    (2.5 * loss).backward()  # an upstream gradient other than 1 reaches every element
    exact = logits.double().clone().requires_grad_()  # a copy also when logits are float64
    want = F.cross_entropy(exact, targets)
    (2.5 * want).backward()
    assert loss.dtype == torch.promote_types(dtype, torch.float32) and ours.grad.dtype == dtype
    exact_loss = 1e-15 if dtype == torch.float64 else 1e-6  # a sum of N terms, rounded
    assert abs(float(loss) - float(want)) <= exact_loss * float(want)
    got, ref = ours.grad.double(), exact.grad
    # per element: one rounding to the dtype, plus exp's argument x - lse rounded at the working
    # precision (|lse| < 64 here), relative to p; at each target, softmax - 1 keeps that error
    # of p (~1) absolutely, however small p - 1 is (the plain float32 route loses it too)
    unit = 2.0 ** -53 if dtype == torch.float64 else 2.0 ** -24  # float32 at least
    assert float(logits.double().logsumexp(-1).abs().max()) < 64
    allowed = (rounding + 64 * unit) * ref.abs()
    allowed[torch.arange(N), targets] += 64 * unit * 2.5 / N
    assert ((got - ref).abs() <= allowed).all(), float(((got - ref).abs() - allowed).max())
    if dtype != torch.float64:  # the bound is the one the plain float32 route meets
        plain = logits.clone().requires_grad_()
        (2.5 * F.cross_entropy(plain.float(), targets)).backward()
        assert ((plain.grad.double() - ref).abs() <= allowed).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_backward_leaves_the_logits_as_they_were(dtype):
    """Training reads the step's logits after backward (the leak stop's statistic): a backward
    that wrote its softmax into them would hand it the gradient instead."""
    logits, targets = _logits(dtype)
    ours = logits.clone().requires_grad_()
    out = ours * 1  # (N, V): a non-leaf, as the readout's logits are
    chunked_cross_entropy(out, targets).backward()
    assert torch.equal(out.detach(), logits) and torch.equal(ours.detach(), logits)


def test_targets_outside_the_vocabulary_are_refused_with_their_range():
    logits, targets = _logits(torch.float32)
    targets[3] = -100  # an ignore index F.cross_entropy would skip: refused, never dropped
    with pytest.raises(ValueError, match=r"\[-100, .*\[0, 1001\)"):
        chunked_cross_entropy(logits, targets)
    with pytest.raises(ValueError, match=r"\(29, 1001\).*\(3,\)"):
        chunked_cross_entropy(logits, targets[:3])
