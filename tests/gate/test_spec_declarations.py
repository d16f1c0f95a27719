"""The declarations real models need, checked by the spec path (`audit(model, spec=cfg)`): a
LayerNorm gain offset (Megatron's LayerNorm1P, Nemotron), biases on some projections only, the
Qwen3 layout of LLMs-from-scratch; and what the spec path used to miss: a norm eps the stress
weights hide, Gemma 2's negative query_pre_attn_scalar. Each correct model passes with params
and oracle run; each planted defect fails the check that owns it."""

from __future__ import annotations

import pytest
import torch
import zoo_styles
from torch import nn

import decoder_audit as da

# planted defects of the styles below, with the check that must catch each
DEFECTS = {
    ("qwen3", "eps"): "oracle",            # norm eps 1e-2 where the spec says 1e-6
    ("qwen3", "rope_layout"): "oracle",    # interleaved pairs where the spec rotates halves
    ("qwen3", "scale"): "oracle",          # scores divided by Dh, not sqrt(Dh)
    ("qwen3", "no_q_norm"): "params",      # the q norm left out of the attention
    ("megatron1p", "plain"): "oracle",     # LayerNorm1P applying w alone, not 1 + w
}
STYLES = {"qwen3": zoo_styles.ScratchQwen3, "megatron1p": zoo_styles.Megatron1P}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_each_declared_style_passes_with_params_and_oracle_run(style):
    model = STYLES[style]()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = da.audit(model, spec=zoo_styles.SPECS[style])
    assert report.passed, report.first_failure
    for name in ("params", "oracle", "dead_parameters"):
        assert report[name].passed and not report[name].skipped, name
    oracle = report["oracle"].evidence
    assert oracle["stressed"] and "quiet" in oracle
    assert oracle["gradients"]["compared"] == len(before)
    assert report["params"].evidence["measured_total"] == da.parameter_ledger(
        zoo_styles.SPECS[style]).total
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("style, defect", sorted(DEFECTS), ids=[f"{s}-{d}" for s, d in
                                                                  sorted(DEFECTS)])
def test_each_planted_declaration_defect_fails_its_check(style, defect):
    report = da.audit(STYLES[style](defect), spec=zoo_styles.SPECS[style])
    assert DEFECTS[style, defect] in [c.name for c in report.failures], report.first_failure
    assert report["causal"].passed and report["shapes"].passed


def test_llms_from_scratch_qwen3_is_placed_by_its_own_layout():
    """Its norms' gains are `scale` and its q/k norms att.q_norm/k_norm: the Llama layout of
    LLMs-from-scratch (norm1.weight) left all of them unplaced."""
    report = da.audit(zoo_styles.ScratchQwen3(), spec=zoo_styles.SPECS["qwen3"],
                      checks=["params"])
    assert report["params"].evidence["layout"] == "LLMs-from-scratch Qwen3"
    assert not report["params"].evidence["leftover"]


def test_the_qwen3_replica_computes_what_llms_from_scratch_computes():
    """Where the package is importable (it pins numpy < 2.1 and pulls tensorflow, so it is no
    test dependency), its Qwen3Model under the replica's weights gives the replica's logits,
    and passes against the same spec."""
    qwen3 = pytest.importorskip("llms_from_scratch.qwen3")
    spec = zoo_styles.SPECS["qwen3"]
    settings = {"vocab_size": spec.vocab_size, "context_length": spec.max_seq_len,
                "emb_dim": spec.d_model, "n_heads": spec.n_heads, "n_layers": spec.n_layers,
                "hidden_dim": spec.d_ff, "head_dim": spec.head_dim, "qk_norm": True,
                "n_kv_groups": spec.kv_heads, "rope_base": spec.rope_theta,
                "dtype": torch.float32}
    real = qwen3.Qwen3Model(settings).eval()
    replica = zoo_styles.ScratchQwen3()
    real.load_state_dict(replica.state_dict())
    ids = torch.randint(0, spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(real(ids), replica(ids), rtol=0, atol=1e-6)
    report = da.audit(real, spec=spec)
    assert report.passed, report.first_failure
    assert report["oracle"].evidence["stressed"]


# ---- a LayerNorm gain offset --------------------------------------------------------------

def _nemotron(norm_offset_seen: bool = True):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.NemotronConfig(vocab_size=37, hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               hidden_act="relu", max_position_embeddings=16, bos_token_id=0,
                               eos_token_id=1)
    model = tf.NemotronForCausalLM(config).eval()
    with torch.no_grad():  # trained LayerNorm1P weights lie around 0 (a gain around 1)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.1)
    if not norm_offset_seen:  # the defect: plain LayerNorms holding the same weights
        for layer in model.model.layers:
            for part in ("input_layernorm", "post_attention_layernorm"):
                old = getattr(layer, part)
                plain = nn.LayerNorm(32, eps=old.eps)
                plain.load_state_dict(old.state_dict())
                setattr(layer, part, plain)
    return model


NEMOTRON = da.DecoderConfig(vocab_size=37, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            d_ff=48, max_seq_len=16, norm="layernorm", norm_eps=1e-5,
                            norm_offset=1.0, mlp="relu", pos="rope", rope_layout="rotate_half",
                            rotary_dim=4, tie_embeddings=False)  # partial_rotary_factor 0.5


def test_hugging_face_nemotrons_layernorm1p_is_declared_with_norm_offset():
    """transformers' NemotronForCausalLM (LayerNorm1P: F.layer_norm with weight + 1, a plain
    up/down MLP, half its head width rotated) against the spec: params and oracle pass with
    norm_offset 1; the same weights under norm_offset 0, or with its norms made plain
    LayerNorms, fail the oracle."""
    report = da.audit(_nemotron(), spec=NEMOTRON,
                      checks=["params", "tying", "oracle", "dead_parameters"])
    assert report.passed, report.first_failure
    assert report["params"].evidence["layout"] == "Hugging Face Nemotron"
    assert report["oracle"].evidence["stressed"]
    wrong = da.audit(_nemotron(), spec=NEMOTRON.replace(norm_offset=0.0), checks=["oracle"])
    assert not wrong["oracle"].passed
    plain = da.audit(_nemotron(norm_offset_seen=False), spec=NEMOTRON, checks=["oracle"])
    assert not plain["oracle"].passed


# ---- biases on some projections only --------------------------------------------------------

PARTIAL = ("q_proj", "v_proj", "output_proj", "w1", "w3")  # no bias on k_proj and w2


def _partial_spec(attn=("q_proj", "v_proj", "output_proj"), mlp=("w1", "w3")):
    return zoo_styles.SPECS["tune"].replace(attn_bias=list(attn), mlp_bias=list(mlp))


def test_biases_on_some_projections_are_declared_per_projection():
    report = da.audit(zoo_styles.BiasedLlama(PARTIAL), spec=_partial_spec())
    assert report.passed, report.first_failure
    assert report["params"].evidence["measured_total"] == da.parameter_ledger(
        _partial_spec()).total
    assert report["oracle"].evidence["gradients"]["compared"] == len(list(
        zoo_styles.BiasedLlama(PARTIAL).parameters()))


@pytest.mark.parametrize("biases, missing, extra", [
    (("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w3"), None, "attn.k_proj.bias"),
    (("q_proj", "v_proj", "output_proj", "w1"), "ffn.w3.bias", None),
    (("q_proj", "v_proj", "output_proj", "w1", "w2", "w3"), None, "ffn.w2.bias"),
])
def test_a_bias_the_declaration_lacks_or_one_it_has_and_the_module_lacks_is_named(
        biases, missing, extra):
    report = da.audit(zoo_styles.BiasedLlama(biases), spec=_partial_spec(), checks=["params"])
    differences = report["params"].evidence["differences"]
    assert not report["params"].passed
    if missing:
        assert any(f"layers.0.{missing}" in d and "the module has no such weight" in d
                   for d in differences), differences
    if extra:  # named with the field that says so, as the spec file spells it
        field = "attn_bias=['q_proj', 'v_proj', 'output_proj']" if "attn" in extra else \
            "mlp_bias=['w1', 'w3']"
        assert any(f"layers.1.{extra}" in d and field in d for d in differences), differences


def test_a_gated_mlp_with_biases_on_some_matrices_is_built_and_placed_by_our_decoder():
    """Our own Decoder under the same declaration: its weights carry exactly those biases, and
    wrapped (so its names are a layout to detect) it passes against the spec."""
    spec = _partial_spec()
    model = da.Decoder(spec)
    biases = {name for name, _ in model.named_parameters() if name.endswith(".bias")}
    assert biases == {f"layers.{i}.{part}.bias" for i in range(spec.n_layers)
                      for part in ("attn.q_proj", "attn.v_proj", "attn.output_proj",
                                   "ffn.w1", "ffn.w3")}

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, ids):
            return self.inner(ids)

    report = da.audit(Wrapped(), spec=spec, checks=["params", "oracle"])
    assert report.passed, report.first_failure


# ---- a norm eps the stress weights hide ---------------------------------------------------

def _unit_embeddings(model: nn.Module) -> nn.Module:
    """The embeddings at PyTorch's own nn.Embedding initialisation, N(0, 1): the residual
    stream has variance 1, and an eps of 1e-5 against 1e-6 moves it by parts in 10^6."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)
    return model


@pytest.mark.parametrize("style, wrong_eps", [("scratch", 1e-6), ("nanogpt", 1e-6),
                                              ("tune", 1e-5)])
def test_a_spec_norm_eps_ten_times_off_fails_the_oracle_with_a_quiet_stream(style, wrong_eps):
    """LayerNorms (and RMSNorms) of eps 1e-5 declared as 1e-6 passed: as initialised and with
    stress weights the stream's variance is order 1. The quiet comparison keeps it at the
    eps, and names norm_eps; the right eps passes it."""
    spec = zoo_styles.SPECS[style]
    model = _unit_embeddings(zoo_styles.STYLES[style]())
    right = da.audit(model, spec=spec, checks=["oracle"])
    assert right.passed, right.first_failure
    assert "quiet" in right["oracle"].evidence
    report = da.audit(model, spec=spec.replace(norm_eps=wrong_eps), checks=["oracle"])
    oracle = report["oracle"]
    assert not oracle.passed
    quiet = oracle.evidence["quiet"]
    assert quiet["max_abs_logit_error"] > quiet["allowed"]
    assert f"norm_eps={wrong_eps:g}" in oracle.detail
    # the other two comparisons could not see it
    for name in ("as_initialised", "stress"):
        found = oracle.evidence[name]
        assert found["max_abs_logit_error"] <= found["allowed"], name


# ---- Gemma 2's query_pre_attn_scalar --------------------------------------------------------

def _gemma2(scalar):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.Gemma2Config(vocab_size=37, hidden_size=16, intermediate_size=24,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=8, query_pre_attn_scalar=scalar, sliding_window=4,
                             bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return tf.Gemma2ForCausalLM(config).eval()


@pytest.mark.parametrize("scalar", [-8, -1])
def test_gemma2_with_a_scalar_that_is_not_positive_is_refused_as_a_config(scalar, tmp_path):
    """(-8) ** -0.5 is complex: the model's softmax drops the imaginary part and attends
    uniformly. It was audited as a black box and passed; it is refused, naming the field."""
    model = _gemma2(scalar)
    with pytest.raises(da.ConfigError, match=f"query_pre_attn_scalar={scalar}"):
        da.audit(model)
    with pytest.raises(da.ConfigError, match="query_pre_attn_scalar"):
        da.from_hf(model)
    from decoder_audit.cli import main

    model.save_pretrained(tmp_path / "gemma2")
    assert main(["verify", "--hf", str(tmp_path / "gemma2"), "--no-progress"]) == 2


def test_gemma2_with_its_own_scalar_is_still_its_configs_spec():
    report = da.audit(_gemma2(8), checks=["params", "oracle"])
    assert report.passed and report.facts.spec.attn_scale == 8 ** -0.5
