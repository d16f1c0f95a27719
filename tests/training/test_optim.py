"""The AdamW implementation training runs: torch's fused kernel where the device has one.

Independent expectations:
- the update: torch's plain single-tensor AdamW (foreach=False, fused=False), the reference
  implementation of the formula, from the same weights, groups and gradients. The fused kernel
  computes the same formula in another order of float32 roundings, so after a few steps the
  weights agree to a few ulps of their size (measured below), never bitwise by design.
- resume: a checkpoint carries the implementation in its param_groups; an optimizer state saved
  by the default implementation (every checkpoint written before fused AdamW) continues on the
  default implementation, bitwise equal to the run that never stopped.
"""

from __future__ import annotations

import copy

import torch

import decoder_audit as da
from decoder_audit.training import TrainConfig
from decoder_audit.training.optim import adamw_implementation, make_optimizer, param_groups

CFG = TrainConfig(lr=1e-2, weight_decay=0.1)


def _gradients(model: torch.nn.Module, step: int) -> None:
    """Gradients of a fixed loss on step `step`'s batch (the same on every copy of the model)."""
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, model.config.vocab_size, (8, model.config.max_seq_len), generator=gen)
    model.zero_grad(set_to_none=True)
    logits = model(ids)  # (B, T, V)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()


def _plain(model: torch.nn.Module) -> torch.optim.AdamW:
    """torch's single-tensor AdamW over the same groups and settings as make_optimizer's, at
    the lr its schedule starts from (warmup's first step: peak / warmup)."""
    return torch.optim.AdamW(param_groups(model, CFG.weight_decay), lr=CFG.peak_lr / CFG.warmup,
                             betas=CFG.betas, foreach=False, fused=False)


def test_training_runs_fused_adamw_on_a_cpu():
    model = da.Decoder(da.preset("tiny-368"))
    optimizer, _ = make_optimizer(model, CFG)
    assert all(group["fused"] for group in optimizer.param_groups)
    assert adamw_implementation([torch.zeros(2, dtype=torch.int64)]) != {"fused": True}
    assert adamw_implementation([]) == {}


def test_fused_adamw_equals_torchs_plain_adamw_within_float_rounding():
    torch.manual_seed(0)
    fused_model = da.Decoder(da.preset("tiny-368"))
    plain_model = copy.deepcopy(fused_model)
    fused, _ = make_optimizer(fused_model, CFG)
    plain = _plain(plain_model)
    start = {n: p.detach().clone() for n, p in plain_model.named_parameters()}
    for step in range(5):
        for model, optimizer in ((fused_model, fused), (plain_model, plain)):
            _gradients(model, step)
            optimizer.step()
    worst_moved = worst_gap = 0.0
    for (name, got), want in zip(fused_model.named_parameters(), plain_model.parameters()):
        moved = float((want.detach() - start[name]).abs().max())
        gap = float((got - want).detach().abs().max())
        # a few float32 ulps of the weights' size (eps = 2^-23): five steps of a handful of
        # roundings each, reordered (measured: 1.9e-9 at max |w| ~0.05, about one ulp)
        ulps = float(want.detach().abs().max()) * torch.finfo(torch.float32).eps
        assert gap <= 8 * ulps, (name, gap, ulps)
        worst_moved, worst_gap = max(worst_moved, moved), max(worst_gap, gap)
    assert worst_moved > 1e4 * worst_gap  # the steps moved the weights far more (2.5e-3)


def test_a_default_adamw_checkpoint_resumes_on_the_default_implementation_bitwise():
    torch.manual_seed(0)
    model = da.Decoder(da.preset("tiny-368"))
    plain = _plain(model)
    for step in range(2):
        _gradients(model, step)
        plain.step()
    saved_model, saved_state = copy.deepcopy(model.state_dict()), copy.deepcopy(plain.state_dict())
    for step in range(2, 4):  # the run that never stopped
        _gradients(model, step)
        plain.step()

    resumed = da.Decoder(da.preset("tiny-368"))
    resumed.load_state_dict(saved_model)
    optimizer, _ = make_optimizer(resumed, CFG)
    optimizer.load_state_dict(saved_state)
    assert not any(group["fused"] for group in optimizer.param_groups)
    for step in range(2, 4):
        _gradients(resumed, step)
        optimizer.step()
    for name, want in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], want), name
