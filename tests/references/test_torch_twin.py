"""The torch.nn twin: stock modules under transferred weights must compute our decoder.

The twin shares no code with model.py (nn.Embedding, nn.MultiheadAttention, nn.LayerNorm,
nn.Linear, nn.GELU), so agreement of logits, gradients and per-head attention weights is evidence
from an independent implementation.
"""

from __future__ import annotations

import configs
import pytest
import torch
from helpers import random_decoder
from torch import nn

import decoder_audit as da
from decoder_audit.references.torch_twin import (
    TorchTwin,
    decoder_from_twin,
    twin_from_decoder,
    twin_to_decoder_tensors,
    twin_unsupported,
)

# Odd, small GPT-style configs (D=24, H=6 -> Dh=4, F=37, V=29), tied and untied, with and without
# biases, every activation the twin can express; and every grid config the twin can express.
CONFIGS = configs.entries("tiny-368", "twin-gelutanh-biases-tied", "twin-gelu-nobias-untied",
                          "twin-relu-nopos-untied")
CONFIGS += [entry for entry in configs.grid() if not twin_unsupported(entry.config)]


def _ids(cfg: da.DecoderConfig, batch: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len), generator=generator)


def test_tiny_368_twin_is_seed_000s_table():
    """Seed 000: nn.Embedding(8,4)=32, position (4,4)=16, per block MHA 64 + two LayerNorms 16 +
    Linear(4,8)+Linear(8,4) 76, final LayerNorm 8, tied readout 0: 32+16+2*(64+16+76)+8 = 368."""
    twin = TorchTwin(da.preset("tiny-368"))
    assert sum(p.numel() for p in twin.parameters()) == 32 + 16 + 2 * (64 + 16 + 76) + 8 == 368
    assert isinstance(twin.token_embedding, nn.Embedding)
    assert isinstance(twin.position, nn.Parameter) and twin.position.shape == (4, 4)
    assert all(isinstance(b.attn, nn.MultiheadAttention) and b.attn.in_proj_bias is None
               for b in twin.blocks)
    assert sum(isinstance(m, nn.LayerNorm) for m in twin.modules()) == 2 * 2 + 1
    assert isinstance(twin.readout, nn.Linear) and twin.readout.bias is None
    assert twin.readout.weight is twin.token_embedding.weight  # one Parameter, not a copy


@pytest.mark.parametrize("cfg", configs.params(CONFIGS))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_logits_and_gradients_match_under_transferred_weights(cfg, dtype, tol):
    ours = random_decoder(cfg, dtype=dtype)
    twin = twin_from_decoder(ours)
    ids = _ids(cfg)  # T = max_seq_len: every learned position is used

    ours_logits, twin_logits = ours(ids), twin(ids)
    assert twin_logits.dtype == dtype
    torch.testing.assert_close(twin_logits, ours_logits, rtol=0, atol=tol)

    # Gradients of one scalar through both models, compared parameter by parameter.
    weights = torch.randn(ours_logits.shape, dtype=dtype, generator=torch.Generator().manual_seed(2))
    (ours_logits * weights).sum().backward()
    (twin_logits * weights).sum().backward()
    ours_grads = {n: p.grad for n, p in ours.named_parameters()}
    twin_grads = twin_to_decoder_tensors(cfg, {n: p.grad for n, p in twin.named_parameters()})
    assert set(twin_grads) == set(ours_grads)
    # Gradients reach O(50) here, and some are exactly zero in exact arithmetic (a key bias
    # shifts every score of a row equally), so the tolerance is relative to the largest one.
    scale = max(grad.abs().max().item() for grad in ours_grads.values())
    for param_name, grad in ours_grads.items():
        torch.testing.assert_close(twin_grads[param_name], grad, rtol=0, atol=tol * scale,
                                   msg=lambda m, n=param_name: f"{n}: {m}")


@pytest.mark.parametrize("cfg", configs.params(configs.entries("tiny-368",
                                                                "twin-gelutanh-biases-tied")))
def test_per_head_attention_weights_equal_our_trace(cfg):
    ours = random_decoder(cfg, dtype=torch.float64)
    twin = twin_from_decoder(ours)
    ids = _ids(cfg)
    _, patterns = twin.forward_with_patterns(ids)  # need_weights=True, average_attn_weights=False
    _, trace = ours.run_with_trace(ids)
    for i, pattern in enumerate(patterns):
        assert pattern.shape == (3, cfg.n_heads, cfg.max_seq_len, cfg.max_seq_len)  # (B, H, T, T)
        torch.testing.assert_close(pattern, trace[f"layers.{i}.attn.pattern"], rtol=0, atol=1e-12)
        # Independent of our code: nn.MultiheadAttention's own weights are zero above the
        # diagonal (True = masked in its convention) and sum to one per row.
        assert torch.all(pattern.triu(1) == 0)
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern[..., 0]))


def test_twin_mask_is_causal_by_intervention():
    """Changing the last token changes only the last row of the twin's logits."""
    cfg = configs.named("twin-gelutanh-biases-tied")
    twin = twin_from_decoder(random_decoder(cfg, dtype=torch.float64))
    ids = _ids(cfg, batch=1)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % cfg.vocab_size
    before, after = twin(ids), twin(changed)
    assert torch.equal(before[:, :-1], after[:, :-1])
    assert not torch.equal(before[:, -1], after[:, -1])


@pytest.mark.parametrize("cfg", configs.params(CONFIGS))
def test_round_trip_is_exact_and_tie_holds(cfg):
    ours = random_decoder(cfg, dtype=torch.float32)
    twin = twin_from_decoder(ours)
    back = decoder_from_twin(twin)
    assert ours.state_dict().keys() == back.state_dict().keys()
    for key, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    if cfg.tie_embeddings:
        assert twin.readout.weight is twin.token_embedding.weight
        assert back.lm_head.weight is back.token_embeddings.weight
    else:
        assert twin.readout.weight is not twin.token_embedding.weight
    # Copies, not aliases: training the twin must not move our weights.
    with torch.no_grad():
        twin.token_embedding.weight.add_(1.0)
    assert not torch.equal(twin.token_embedding.weight, ours.token_embeddings.weight)


def test_tie_survives_an_optimizer_step_in_the_twin():
    cfg = configs.named("tiny-368")
    twin = twin_from_decoder(random_decoder(cfg, dtype=torch.float32))
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    twin(_ids(cfg)).square().mean().backward()
    optimizer.step()
    assert twin.readout.weight is twin.token_embedding.weight
    # One Parameter in two slots: the slot count exceeds the unique count by exactly one.
    slots = len(list(twin.named_parameters(remove_duplicate=False)))
    assert slots == len(list(twin.parameters())) + 1


@pytest.mark.parametrize("change,field", [
    (dict(norm="rmsnorm"), "norm='rmsnorm'"),
    (dict(mlp="swiglu"), "mlp='swiglu'"),
    (dict(pos="rope"), "pos='rope'"),
    (dict(n_kv_heads=2), "n_kv_heads=2"),
    (dict(parallel_residual=True), "parallel_residual=True"),
    (dict(attn_sinks=True), "attn_sinks=True"),
    (dict(query_position_scale={"beta": 0.1, "length": 4}), "query_position_scale="),
])
def test_refuses_configs_it_cannot_express(change, field):
    cfg = configs.named("twin-gelutanh-biases-tied").replace(**change)
    assert any(field in problem for problem in twin_unsupported(cfg))
    with pytest.raises(da.ConfigError, match=field.replace("(", r"\(")):
        TorchTwin(cfg)
    with pytest.raises(da.ConfigError, match="torch.nn twin"):
        twin_from_decoder(da.Decoder(cfg))


def test_twin_keeps_the_input_contract():
    cfg = da.preset("tiny-368")
    twin = TorchTwin(cfg)
    with pytest.raises(da.ContextLengthError, match="max_seq_len=4"):
        twin(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(da.TokenIdError, match="vocab_size=8"):
        twin(torch.full((1, 2), 8))
