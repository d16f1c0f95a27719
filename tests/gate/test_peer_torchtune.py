"""torchtune (the real package, 0.6.1 with torchao 0.11.0): a TransformerDecoder keeps no config,
so its spec is read from the arguments its modules keep (references/peer_configs.py): heads,
key/value heads and head width from MultiHeadAttention, the RoPE module's class (interleaved or
rotating halves), base and Llama 3.1 scaling, the norms' eps, the FeedForward's activation and
gating, biases, a TiedLinear readout. `da.audit(model)` then runs params and oracle with no
spec=; a defect planted in its own modules fails one of them; an option no DecoderConfig
expresses fails both, named.

torchtune cannot be installed beside the project's pins (pyproject.toml says why: 0.6.1 needs a
torchao older than 0.18, and peft 0.21 refuses one older than 0.16), so these tests skip in the
project's environment and run in one of their own over it, as .ci/torchtune does:

    python=$(.venv/bin/python tests/releases.py torchtune==0.6.1 torchao==0.11.0)
    PYTHONPATH=src $python -m pytest tests/gate/test_peer_torchtune.py"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import decoder_audit as da

pytest.importorskip("torchao")
tune = pytest.importorskip("torchtune")
logging.getLogger("torchao").setLevel(logging.ERROR)  # "no triton" on every CPU import
from torchtune.models.gemma import gemma  # noqa: E402
from torchtune.models.llama3 import llama3  # noqa: E402
from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE  # noqa: E402
from torchtune.models.qwen2 import qwen2  # noqa: E402

SHAPES = dict(vocab_size=37, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32,
              max_seq_len=16, intermediate_dim=40)
SCALING = {"type": "llama3", "factor": 4.0, "original_max_seq_len": 16, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0}


def _llama3_1():
    """Llama 3.1's decoder with its scaled RoPE, scaled within the probes' 8 positions (an
    original context of 16): every pair but the fastest is divided by the factor."""
    torch.manual_seed(0)
    model = llama3(**SHAPES, rope_base=100)
    rope = Llama3ScaledRoPE(dim=8, max_seq_len=16, base=100, scale_factor=4, old_context_len=16)
    for layer in model.layers:
        layer.attn.pos_embeddings = rope
    return model.eval()


def _qwen2_tied():
    torch.manual_seed(0)
    return qwen2(**SHAPES, tie_word_embeddings=True).eval()


def _audit(model):
    report = da.audit(model, checks=["params", "oracle"])
    return report, report["params"], report["oracle"]


@pytest.mark.parametrize("build", [_llama3_1, _qwen2_tied], ids=["llama3_1", "qwen2_tied"])
def test_a_torchtune_decoder_is_audited_from_its_modules(build):
    report, params, oracle = _audit(build())
    assert params.passed and oracle.passed, (params.detail, oracle.detail)
    spec = report.facts.spec
    if build is _llama3_1:  # torchtune's RoPE pairs interleaved features
        assert (spec.rope_layout, spec.rope_theta, spec.rope_scaling) == \
            ("interleaved", 100.0, SCALING)
    else:  # Qwen2's rotates halves, biases q, k and v but not the output, ties the readout
        assert (spec.rope_layout, spec.has_bias("v_proj"), spec.has_bias("output_proj"),
                spec.tie_embeddings) == ("rotate_half", True, False, True)


def _unscaled_rope(model):  # the RoPE cache rebuilt from the unscaled frequencies
    rope = model.layers[0].attn.pos_embeddings
    rope.theta = 1.0 / (100 ** (torch.arange(0, 8, 2).float() / 8))
    rope.build_rope_cache(16)


def _layernorm(model):
    norm = model.layers[1].sa_norm
    norm.forward = lambda x: F.layer_norm(x, x.shape[-1:], norm.scale, None, norm.eps)


def _gelu_gate(model):
    mlp = model.layers[0].mlp
    mlp.forward = lambda x: mlp.w2(F.gelu(mlp.w1(x)) * mlp.w3(x))


DEFECTS = {"rope_scaling_dropped": _unscaled_rope, "layernorm": _layernorm,
           "gelu_gate": _gelu_gate}


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_a_defect_planted_in_torchtune_fails_oracle(name):
    model = _llama3_1()
    with torch.no_grad():
        DEFECTS[name](model)
    _, params, oracle = _audit(model)
    assert params.passed and not oracle.passed, (params.detail, oracle.detail)


def test_another_eps_in_one_layer_is_refused_by_name():
    model = _llama3_1()
    model.layers[1].mlp_norm.eps = 1e-2
    _, params, oracle = _audit(model)
    assert not params.passed and not oracle.passed
    assert "layers.1.mlp_norm.eps" in params.detail, params.detail


def test_gemmas_norm_is_refused_by_name():
    """torchtune's Gemma normalises with GemmaRMSNorm (a gain of 1 + w) and scales its
    embedding inside a decoder of its own: not read here, so the audit fails closed."""
    torch.manual_seed(0)
    model = gemma(vocab_size=37, num_layers=2, num_heads=4, head_dim=8, num_kv_heads=2,
                  embed_dim=32, intermediate_dim=40, max_seq_len=16).eval()
    report = da.audit(model, checks=["params", "oracle"])
    assert not report["params"].passed and not report["oracle"].passed
    assert "GemmaRMSNorm" in report["params"].detail, report["params"].detail
