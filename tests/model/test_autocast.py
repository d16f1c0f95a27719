"""Under torch.autocast the projections of one input (q, k, v; a gated MLP's w1, w3) run as one
product (`layers.autocast_projections`). Independent expectation: the same model with a no-op
forward hook on each of those projections, which makes every Linear run its own call (the path
without the fusion, and autocast's own casts); and an op count of the casts themselves."""

from collections import Counter

import configs
import pytest
import torch
import torch.nn.functional as F
from helpers import random_decoder
from torch.utils._python_dispatch import TorchDispatchMode

FUSED = configs.entries("tiny-368", "ln-swiglu-rope-allbias-gqa", "qk-norm-gqa",
                        "rms-relu-rope-mlpbias-tied")


def _projections(model):
    for block in model.layers:
        yield from (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj)
        if block.ffn.w3 is not None:
            yield from (block.ffn.w1, block.ffn.w3)


def _step(model, ids):
    """bf16-autocast logits and the float32 gradients of a float32 loss over them."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids)  # (B, T, V)
    F.cross_entropy(logits.float().flatten(0, 1), ids.flatten()).backward()
    return logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("cfg", configs.params(FUSED))
def test_the_joint_product_computes_what_the_separate_projections_compute(cfg):
    model = random_decoder(cfg, std=0.3)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    joint_logits, joint_grads = _step(model, ids)
    hooks = [p.register_forward_hook(lambda _m, _i, out: out) for p in _projections(model)]
    separate_logits, separate_grads = _step(model, ids)
    for hook in hooks:
        hook.remove()
    scale = float(separate_logits.abs().max())
    # bf16 rounding (eps 7.8e-3) of two summation orders, a few layers deep
    assert float((joint_logits - separate_logits).abs().max()) < 0.03 * scale
    for name, want in separate_grads.items():
        got = joint_grads[name]
        assert got.dtype == torch.float32, name  # the master weights' gradients stay float32
        assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max()) + 1e-6, name


def test_a_forward_hook_on_a_projection_still_sees_its_call_under_autocast():
    """The gate's autocast stress probe scales q and k with forward hooks: under autocast a
    hooked projection must run as its own call, and what its hook returns must be used."""
    cfg = configs.named("tiny-368")
    model = random_decoder(cfg, std=0.3).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        plain = model(ids)
        seen = []
        hook = model.layers[0].attn.v_proj.register_forward_hook(
            lambda _m, _i, out: seen.append(out.dtype) or out * 0)
        zeroed = model(ids)
        hook.remove()
    assert seen == [torch.bfloat16]
    assert not torch.equal(plain, zeroed)


class _Casts(TorchDispatchMode):
    """Counts float32 -> bfloat16 casts by the shape of what is cast."""

    def __init__(self):
        super().__init__()
        self.shapes = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 \
                and out.dtype == torch.bfloat16:
            self.shapes[tuple(args[0].shape)] += 1
        return out


@pytest.mark.parametrize("cfg", configs.params(configs.entries("tiny-368",
                                                               "ln-swiglu-rope-allbias-gqa")))
def test_an_autocast_forward_casts_each_normalised_stream_once(cfg):
    """Each block's two normalised copies of the stream (B, T, D) feed one product each (q, k, v
    together; the MLP's first layer, gated or not), and the final norm's output feeds the
    readout: 2 L + 1 casts of a float32 (B, T, D) to bf16, where separate q, k, v (and w1, w3)
    products would cast the same tensor once per projection."""
    model = random_decoder(cfg, std=0.3)
    batch, seq_len = 2, cfg.max_seq_len
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    with _Casts() as casts, torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids)
    assert casts.shapes[(batch, seq_len, cfg.d_model)] == 2 * cfg.n_layers + 1
