"""torchtitan's Llama 3 under the gate (decoder_audit.integrations.titan and the layout
"torchtitan Llama 3"): the real package's model, fused q/k/v (its default, KV group by KV group)
or not, passes the spec audit against a spec written out here; spec_of reads its config as that
spec; planted defects fail the check named.

The models are built from torchtitan's own blocks, with torchtitan's ScaledDotProductAttention as
the inner attention: its default, flex attention, compiles for CPU in about 20 s and has no
backward there, and the gate takes gradients. The flex model's logits equal these (forward
only), a test run with DECODER_AUDIT_SLOW_TESTS=1."""

from __future__ import annotations

import functools
import os

import pytest

pytest.importorskip("torchtitan.models.llama3")
import torch  # noqa: E402
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm  # noqa: E402
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers, llama3_configs  # noqa: E402

import decoder_audit as da  # noqa: E402
from decoder_audit.integrations import TitanCall, spec_of  # noqa: E402

D, H, HKV, F, V, L = 32, 4, 2, 48, 64, 2
SPEC = da.DecoderConfig(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=HKV, d_ff=F,
                        max_seq_len=128, norm="rmsnorm", norm_eps=1e-5, norm_bias=False,
                        mlp="swiglu", pos="rope", rope_theta=10000.0, tie_embeddings=False)
FAST = {"intervention_len": 16}


def config(*, fuse_qkv=True, theta=10000.0, heads_kv=HKV, tie=False, flex=False):
    layers = _build_llama3_layers(n_layers=L, dim=D, n_heads=H, n_kv_heads=heads_kv,
                                  hidden_dim=F, fuse_qkv=fuse_qkv, attn_backend="flex",
                                  rope=ComplexRoPE.Config(dim=D // H, max_seq_len=128,
                                                          theta=theta))
    if not flex:
        for layer in layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return Llama3Model.Config(
        dim=D, vocab_size=V, enable_weight_tying=tie, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=D),
        norm=RMSNorm.Config(normalized_shape=D), lm_head=Linear.Config(in_features=D,
                                                                        out_features=V))


def build(cfg):
    torch.manual_seed(0)
    model = cfg.build()
    model.init_states()
    return model


@pytest.mark.parametrize("fuse_qkv,heads_kv", [(True, HKV), (False, HKV), (True, H)],
                         ids=["fused-gqa", "unfused", "fused-mha"])
def test_a_torchtitan_llama_passes_the_spec_audit(fuse_qkv, heads_kv):
    spec = SPEC.replace(n_kv_heads=heads_kv)
    report = da.audit(TitanCall(build(config(fuse_qkv=fuse_qkv, heads_kv=heads_kv))),
                      spec=spec, **FAST)
    assert report.passed, [(c.name, c.detail) for c in report.failures]
    assert "torchtitan Llama 3" in report["params"].evidence["layout"]
    # V x D embedding and head, per layer two norms, q and o (D x D), k and v (Hkv Dh x D) and
    # three FFN matrices, and the final norm
    per_layer = 2 * D + 2 * D * D + 2 * heads_kv * (D // H) * D + 3 * D * F
    assert not report["oracle"].skipped
    assert report["params"].evidence["measured_total"] == 2 * V * D + L * per_layer + D


def test_spec_of_reads_the_config_as_the_spec_written_out():
    assert spec_of(config()) == SPEC
    # the debug flavor: dim 256, 16 heads, 6 layers, V 2048, FFN 768 (2/3 of 4 x 256, rounded up
    # to 256), RoPE base 500000 with Llama 3 scaling (factor 8, 1 and 4, 8192 positions)
    debug = spec_of(llama3_configs["debugmodel"](attn_backend="flex"))
    assert (debug.d_model, debug.n_heads, debug.kv_heads, debug.n_layers, debug.vocab_size,
            debug.d_ff, debug.rope_theta) == (256, 16, 16, 6, 2048, 768, 500000)
    assert debug.rope_scaling == {"type": "llama3", "factor": 8.0, "original_max_seq_len": 8192,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def test_a_fused_projection_split_in_the_stock_order_fails_oracle():
    """A forward that splits the fused wqkv as all q rows, then k, then v, while its rows go KV
    group by KV group (as torchtitan stores them and its state-dict hooks read them): every
    shape fits, the heads read the wrong rows."""
    model = build(config())

    def stock_split(self, x):  # x (B, T, D)
        q, k, v = self.wqkv(x).split([H * (D // H), HKV * (D // H), HKV * (D // H)], dim=-1)
        return tuple(t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # (B, T, N, Dh)

    for layer in model.layers.values():
        fused = layer.attention.qkv_linear
        fused.forward = stock_split.__get__(fused)
    report = da.audit(TitanCall(model), spec=SPEC, **FAST)
    assert report["params"].passed and [c.name for c in report.failures] == ["oracle"]


def test_a_rope_base_other_than_the_architectures_fails_oracle():
    report = da.audit(TitanCall(build(config(theta=500000.0))), spec=SPEC, **FAST)
    assert [c.name for c in report.failures] == ["oracle"]


def test_attention_that_is_not_causal_fails_causal():
    model = build(config())
    for layer in model.layers.values():
        inner = layer.attention.inner_attention
        inner.forward = functools.partial(type(inner).forward, inner, is_causal=False)
    report = da.audit(TitanCall(model), spec=SPEC, **FAST)
    assert report.first_failure.name == "causal"


def test_a_tie_replaced_by_a_copy_fails_tying():
    model = build(config(tie=True))
    assert model.lm_head.weight is model.tok_embeddings.weight
    model.lm_head.weight = torch.nn.Parameter(model.tok_embeddings.weight.detach().clone())
    report = da.audit(TitanCall(model), spec=SPEC.replace(tie_embeddings=True), **FAST)
    assert not report["tying"].passed


def test_packed_documents_through_sdpa_read_across_documents():
    """A genuine finding: SDPA's is_causal takes no document masks, so packed documents read
    each other (why torchtitan refuses SDPA for language models); the packing check says so."""
    report = da.audit(TitanCall(build(config())), spec=SPEC, checks=["packing"],
                      training=da.TrainingPath(2, 16, pack=True, pack_form="position_ids"))
    assert not report["packing"].passed and "position_ids" in report["packing"].detail


@pytest.mark.skipif(os.environ.get("DECODER_AUDIT_SLOW_TESTS") != "1",
                    reason="flex attention compiles for CPU in about 20 s "
                           "(DECODER_AUDIT_SLOW_TESTS=1 runs it)")
def test_the_flex_attention_model_computes_the_same_logits():
    """TitanCall builds the block-causal masks flex attention needs from the positions."""
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        flex = TitanCall(build(config(flex=True)))(ids)
        sdpa = TitanCall(build(config()))(ids)
    torch.testing.assert_close(flex, sdpa)
