"""TransformerLens' HookedTransformer (3.x, the real library) against its declared spec: its
per-head matrices (W_Q as (H, D, Dh), W_O as (H, Dh, D)), its always-present biases and its
unembedding bias are placed on our names, so params, tying and the float64 oracle run on it;
each correct model passes them, each planted defect fails the check that owns it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import decoder_audit as da

lens = pytest.importorskip("transformer_lens")
# 3.x warns that HookedTransformer goes in 4.0 (4.0 wraps Hugging Face models instead, whose
# layouts the gate already places)
pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")

WHITE_BOX = ["params", "tying", "oracle", "dead_parameters"]
SHAPES = dict(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_mlp=24, d_vocab=13)


def _model(rotary: bool):
    torch.manual_seed(0)
    if rotary:  # RMSNorm, exact GELU, RoPE rotating halves, grouped-query K and V
        config = lens.HookedTransformerConfig(**SHAPES, act_fn="gelu", normalization_type="RMS",
                                              positional_embedding_type="rotary", rotary_dim=4,
                                              n_key_value_heads=2, seed=0)
    else:  # GPT-2's block: LayerNorm, tanh GELU, learned positions
        config = lens.HookedTransformerConfig(**SHAPES, act_fn="gelu_new",
                                              normalization_type="LN", seed=0)
    return lens.HookedTransformer(config).eval()


def _spec(rotary: bool) -> da.DecoderConfig:
    """What a HookedTransformer declares: biases on every projection and on the unembedding,
    an untied readout."""
    common = dict(vocab_size=13, d_model=16, n_layers=2, n_heads=4, d_ff=24, max_seq_len=8,
                  attn_bias=True, mlp_bias=True, readout_bias=True, tie_embeddings=False)
    if rotary:
        return da.DecoderConfig(**common, n_kv_heads=2, norm="rmsnorm", mlp="gelu", pos="rope",
                                rope_layout="rotate_half")
    return da.DecoderConfig(**common, norm="layernorm", mlp="gelu_tanh", pos="learned")


@pytest.mark.parametrize("rotary", [False, True])
def test_a_hooked_transformer_passes_against_its_spec(rotary):
    model = _model(rotary)
    report = da.audit(model, spec=_spec(rotary), checks=WHITE_BOX)
    assert report.passed, report.first_failure
    assert report["params"].evidence["layout"] == "TransformerLens"
    oracle = report["oracle"].evidence  # every parameter's gradient, each a canonical weight
    assert oracle["stressed"] and oracle["gradients"]["compared"] == len(list(model.parameters()))


def _scale(model):  # scores / Dh
    for block in model.blocks:
        block.attn.attn_scale = 4.0


def _exact_gelu(model):
    model.blocks[1].mlp.act_fn = F.gelu


def _eps(model):
    model.blocks[0].ln2.eps = 1e-2


def _rope_base(model):
    attn = model.blocks[1].attn
    sin, cos = attn.calculate_sin_cos_rotary(4, 8, base=1000)
    attn.rotary_sin.copy_(sin)
    attn.rotary_cos.copy_(cos)


def _unembed_bias_dropped(model):
    del model.unembed.b_U
    model.unembed.register_buffer("b_U", torch.zeros(13))


DEFECTS = {"scale": (False, _scale, "oracle"), "exact_gelu": (False, _exact_gelu, "oracle"),
           "eps": (True, _eps, "oracle"), "rope_base": (True, _rope_base, "oracle"),
           "unembed_bias_dropped": (False, _unembed_bias_dropped, "params")}


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_each_planted_defect_fails_its_check(name):
    rotary, plant, check = DEFECTS[name]
    model = _model(rotary)
    with torch.no_grad():
        plant(model)
    report = da.audit(model, spec=_spec(rotary), checks=["params", "oracle"])
    assert not report[check].passed, report.first_failure
    if check == "oracle":
        assert report["params"].passed, report["params"].detail


def test_its_unchecked_token_ids_are_caught():
    """HookedTransformer indexes W_E with the ids as given, so -1 reads the last row."""
    report = da.audit(_model(False), spec=_spec(False), checks=["inputs"])
    assert not report["inputs"].passed and "-1" in report["inputs"].detail


def test_a_gated_mlp_is_placed_and_its_unexpressed_bias_named():
    """A gated HookedTransformer computes act(x W_gate) * (x W_in + b_in): W_gate is the spec's
    w1, W_in its w3. A DecoderConfig biases w1, w3 and w2 together or none, so with mlp_bias
    the one difference params names is the w1 bias the module does not have (a known limit)."""
    torch.manual_seed(0)
    config = lens.HookedTransformerConfig(**SHAPES, act_fn="silu", gated_mlp=True,
                                          normalization_type="RMS", seed=0)
    model = lens.HookedTransformer(config).eval()
    spec = _spec(False).replace(norm="rmsnorm", mlp="swiglu")
    report = da.audit(model, spec=spec, checks=["params"])
    named = [d.split(" ")[0] for d in report["params"].evidence["differences"]]
    weights = [name for name in named if name.endswith((".weight", ".bias"))]
    assert weights == ["layers.0.ffn.w1.bias", "layers.1.ffn.w1.bias"]
