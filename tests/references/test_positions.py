"""The fields of BLOOM, MPT, XGLM, GPT-1 and Persimmon (pos "alibi" and "sinusoidal",
position_offset, embedding_norm, post_norm, final_norm, qk_norm_kind) against independent
references: ALiBi's slopes as Press et al. publish them and as transformers' BLOOM and MPT
build them, the sinusoidal table as XGLM's module builds it; each of our variant configs written
as its Hugging Face family computes our logits and reads back as the same config; an option of
these families no DecoderConfig expresses is refused by name; the converter's GPT-2 / Llama
tables and the torch.nn twin refuse every new field by name; the gate treats ALiBi and the
sinusoidal table as positions without a hard length limit."""

from __future__ import annotations

import configs
import pytest
import torch
from helpers import assert_read_and_written_back, random_decoder
from hf_compat import hf_class

import decoder_audit as da
from decoder_audit.model.positions import alibi_slopes, sinusoids
from decoder_audit.references import hf as hfref
from decoder_audit.references.hf_config import config_to_hf
from decoder_audit.references.torch_twin import twin_unsupported

NEW = ("alibi-embedding-norm", "alibi-no-shift", "sinusoidal-offset", "post-norm-no-final",
       "qk-layernorm")


# ---- the positions against their definitions -----------------------------------------------------

def test_alibi_slopes_are_press_et_al_s():
    """The paper's slopes: 2^-1 .. 2^-8 for 8 heads; for 6 heads the 4-head sequence 2^-2,
    2^-4, 2^-6, 2^-8, then the odd terms 2^-1, 2^-3 of the 8-head one (the paper's code)."""
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(6).tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1,
                                        2.0 ** -3]
    assert alibi_slopes(1).tolist() == [2.0 ** -8]


@pytest.mark.parametrize("heads", range(1, 33))
def test_alibi_slopes_equal_bloom_s_and_mpt_s(heads):
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    mpt = pytest.importorskip("transformers.models.mpt.modeling_mpt")
    ours = alibi_slopes(heads)
    theirs = bloom._get_alibi_slopes(heads, "cpu").double()  # float32 powers
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    # MPT's bias of the key one step back (its alibi_bias_max is 8 in transformers)
    torch.testing.assert_close(ours, -mpt.build_mpt_alibi_tensor(heads, 2)[:, 0, 0].double(),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("width", [15, 16])
def test_the_sinusoidal_table_is_xglm_s(width):
    """XGLM's table (fairseq's: the sines, then the cosines, a zero column for an odd width)
    read from row t + 2."""
    xglm = pytest.importorskip("transformers.models.xglm.modeling_xglm")
    theirs = xglm.XGLMSinusoidalPositionalEmbedding.get_embedding(12, width).double()  # float32
    cfg = configs.named("sinusoidal-offset").replace(d_model=width, n_heads=1, max_seq_len=10)
    model = da.Decoder(cfg, dtype=torch.float64)
    with torch.no_grad():  # the rows positions 0..9 add, the table's rows 2..11
        ours = model._position_rows(None, 10, model.token_embeddings.weight)
        torch.testing.assert_close(ours, theirs[2:], rtol=0, atol=5e-6)
        # and the table itself, row by row
        torch.testing.assert_close(sinusoids(cfg, torch.arange(12), torch.float64), theirs,
                                   rtol=0, atol=5e-6)


def test_our_alibi_and_sinusoidal_decoders_reject_past_max_seq_len():
    """Our own Decoder rejects T > max_seq_len whatever its positions (context_policy
    "reject"), where a module an ALiBi or sinusoidal spec describes has no hard limit (below)."""
    for name in ("alibi-embedding-norm", "sinusoidal-offset"):
        cfg = configs.named(name)
        with pytest.raises(da.ContextLengthError, match=f"max_seq_len={cfg.max_seq_len}"):
            da.Decoder(cfg)(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


# ---- Hugging Face families both ways --------------------------------------------------------------

WRITTEN = {"alibi-embedding-norm": "BloomForCausalLM", "alibi-no-shift": "MptForCausalLM",
           "sinusoidal-offset": "XGLMForCausalLM", "post-norm-no-final": "OpenAIGPTLMHeadModel",
           "qk-layernorm": "PersimmonForCausalLM"}
# XGLM's eager attention raises in float64 (tests/references/test_families.py: FLOAT32_ONLY)
DTYPES = {"sinusoidal-offset": (torch.float32, 1e-5)}


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_each_variant_is_written_as_its_family_and_read_back(name):
    hf_class(WRITTEN[name])
    cfg = configs.named(name)
    dtype, tolerance = DTYPES.get(name, (torch.float64, 1e-6))
    ours = random_decoder(cfg, dtype=dtype)
    hf_model = hfref.to_hf(ours)
    assert type(hf_model).__name__ == WRITTEN[name]
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with torch.no_grad():
        expected = ours(ids)
        theirs = hf_model(ids).logits.to(expected.dtype)
    torch.testing.assert_close(theirs, expected, rtol=0,
                               atol=tolerance * float(expected.abs().max()))
    back = hfref.from_hf(hf_model)
    assert back.config == cfg
    for pname, param in back.named_parameters():
        assert torch.equal(param, dict(ours.named_parameters())[pname]), pname


def _refused(model: torch.nn.Module) -> str:
    """Why the model's config is no spec: it is audited black-box, the option named."""
    report = da.audit(model, checks=["params", "oracle"])
    assert report.facts.spec is None and report["oracle"].skipped
    return report["oracle"].detail


@pytest.mark.parametrize("family, config, changes, named", [
    ("MptForCausalLM", "MptConfig", {"attn_config": {"clip_qkv": 6.0}}, "attn_config.clip_qkv=6.0"),
    ("BloomForCausalLM", "BloomConfig", {"apply_residual_connection_post_layernorm": True},
     "apply_residual_connection_post_layernorm=True"),
    ("XGLMForCausalLM", "XGLMConfig", {"pad_token_id": 3}, "pad_token_id=3"),
    ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig", {"afn": "silu"}, "afn='silu'"),
])
def test_an_option_no_decoder_config_expresses_is_refused_by_name(family, config, changes,
                                                                  named):
    tf = pytest.importorskip("transformers")
    hf_class(family)
    sizes = dict(vocab_size=19, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    model = getattr(tf, family)(getattr(tf, config)(**sizes, **changes)).eval()
    assert named in _refused(model)


def test_persimmon_without_q_k_norms_reads_as_none():
    tf = pytest.importorskip("transformers")
    hf_class("PersimmonForCausalLM")
    config = tf.PersimmonConfig(vocab_size=19, hidden_size=16, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=24, qk_layernorm=False)
    report = da.audit(tf.PersimmonForCausalLM(config).eval(), checks=["params", "oracle"])
    assert report.facts.spec.qk_norm is False and report.facts.spec.qk_norm_kind == "rmsnorm"
    assert report["params"].passed and report["oracle"].passed


# forms of other groups' families the new fields express: OPT-350m's post-norm blocks (no final
# norm), an OPT without its final norm, Phi with per-head q/k LayerNorms (Persimmon's)
FORMS = {"opt post-norm": ("opt", "OPTForCausalLM", {"do_layer_norm_before": False}),
         "opt without a final norm": ("opt", "OPTForCausalLM",
                                      {"_remove_final_layer_norm": True}),
         "phi q/k layernorm": ("phi", "PhiForCausalLM", {"qk_layernorm": True})}


def _form(name: str) -> torch.nn.Module:
    from conformance import tiny_config

    model_type, class_name, fields = FORMS[name]
    small = tiny_config(model_type)
    torch.manual_seed(0)
    return hf_class(class_name)(type(small)(**{**small.to_dict(), **fields})).eval()


@pytest.mark.parametrize("name", sorted(FORMS))
def test_forms_of_other_families_the_new_fields_express_are_read_and_pass(name):
    model = _form(name)
    assert_read_and_written_back(model)


def test_a_post_norm_opt_run_as_pre_norm_fails_the_oracle():
    """OPT-350m's layer 0 normalising its sublayers' inputs instead of the sums: the oracle of
    its post-norm spec fails (the weights stay where they are)."""
    model = _form("opt post-norm")
    model.model.decoder.layers[0].do_layer_norm_before = True
    report = da.audit(model, checks=["params", "oracle"])
    assert report["params"].passed and not report["oracle"].passed


@pytest.mark.parametrize("family, config, sizes, limit, horizon", [
    ("BloomForCausalLM", "BloomConfig", {}, None, 2048),  # BLOOM's training length
    ("MptForCausalLM", "MptConfig", {"max_seq_len": 40}, None, 40),
    ("XGLMForCausalLM", "XGLMConfig", {"max_position_embeddings": 40}, None, 40),
    ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig", {"n_positions": 40}, 40, 40),
])
def test_alibi_and_sinusoidal_positions_have_no_hard_length_limit(family, config, sizes, limit,
                                                                  horizon):
    """BLOOM and MPT (ALiBi) and XGLM (a sinusoidal table it extends on demand) are audited
    with no hard limit, as rotary models are, their spec's max_seq_len a horizon; GPT-1's
    learned table is a hard limit."""
    tf = pytest.importorskip("transformers")
    hf_class(family)
    model = getattr(tf, family)(getattr(tf, config)(
        vocab_size=19, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        **sizes)).eval()
    facts = da.audit(model, checks=["params"]).facts
    assert facts.max_seq_len == limit
    assert facts.spec is not None and facts.spec.max_seq_len == horizon


# ---- refused where no writer expresses them ------------------------------------------------------

@pytest.mark.parametrize("changes, field", [
    (dict(pos="alibi"), "pos='alibi'"),
    (dict(pos="sinusoidal"), "pos='sinusoidal'"),
    (dict(pos="sinusoidal", position_offset=2), "position_offset=2"),
    (dict(embedding_norm=True), "embedding_norm=True"),
    (dict(final_norm=False), "final_norm=False"),
    (dict(pre_norm=False, post_norm=True), "post_norm=True"),
    (dict(qk_norm=True, qk_norm_kind="layernorm"), "qk_norm=True"),
])
def test_the_converter_and_the_twin_refuse_each_new_field_by_name(changes, field):
    cfg = configs.named("hf-gpt-gelu-biases-untied").replace(**changes)
    with pytest.raises(da.ConfigError, match=field):
        config_to_hf(cfg)
    assert any(field in problem for problem in twin_unsupported(cfg))


def test_the_twin_refuses_a_q_k_layernorm_by_name():
    cfg = configs.named("qk-layernorm")
    assert any("qk_norm_kind='layernorm'" in problem for problem in twin_unsupported(cfg))


@pytest.mark.parametrize("name", NEW)
def test_the_ledger_reconciles_with_the_model(name):
    cfg = configs.named(name)
    with torch.device("meta"):
        model = da.Decoder(cfg)
    assert da.reconcile(da.parameter_ledger(cfg), da.measured_ledger(model)) == []
