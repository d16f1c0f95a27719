"""Soft-cap liveness: Gemma 2 at its released caps (scores 50, logits 30), where random and
stress weights keep every score and logit far below the cap and c tanh(x / c) = x to within the
tolerance. `oracle` writes capped weights (gate/checks/stress.py) that drive them past the caps, so a
cap the module drops fails; the caps are patched out of transformers' own Gemma 2 modules."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import decoder_audit as da
from decoder_audit.gate.checks.stress import SOFTCAP_REACH, capped_spreads

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


def _gemma2(**config):
    torch.manual_seed(0)
    c = tf.Gemma2Config(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                        max_position_embeddings=12, bos_token_id=0, eos_token_id=1,
                        pad_token_id=0, sliding_window=3, attn_implementation="eager", **config)
    return tf.Gemma2ForCausalLM(c).eval()


def _oracle(model, **audit) -> da.CheckResult:
    return da.audit(model, checks=["oracle"], **audit)["oracle"]


def _failed(found: dict) -> bool:
    return not found["max_abs_logit_error"] <= found["allowed"]


@pytest.mark.parametrize("tied", [True, False])
def test_gemma2_at_its_released_caps_passes_past_them(tied):
    model = _gemma2(tie_word_embeddings=tied)
    assert (model.config.attn_logit_softcapping, model.config.final_logit_softcapping) == \
        (50.0, 30.0)  # the released defaults, which the test relies on
    result = _oracle(model)
    assert result.passed, result.detail
    capped = result.evidence["capped"]
    assert capped["scores_past_cap"] and capped["logits_past_cap"]
    assert not _failed(capped)


def test_the_capped_weights_spread_scores_and_logits_over_a_cap():
    """The factors from the spec: a stressed score has spread s sqrt(Dh) (s = the config's
    query_pre_attn_scalar^-0.5, 256 by default, 224 before transformers 4.46; Dh = 8), so queries
    and keys each scale by sqrt(50 / (s sqrt(8))); a tied readout's logits have spread sqrt(D)
    = 4, so the final gain scales by 30 / 4."""
    model = _gemma2()
    spec = da.audit(model, checks=["params"]).facts.spec
    factors = capped_spreads(spec)
    scale = model.config.query_pre_attn_scalar ** -0.5
    assert factors["queries_keys"] == pytest.approx(math.sqrt(SOFTCAP_REACH * 50 /
                                                              (scale * math.sqrt(8))))
    assert factors["readout"] == pytest.approx(SOFTCAP_REACH * 30 / 4)
    untied = da.audit(_gemma2(tie_word_embeddings=False), checks=["params"]).facts.spec
    assert capped_spreads(untied)["readout"] == pytest.approx(SOFTCAP_REACH * 30)


def test_an_attention_that_drops_its_score_cap_fails_the_oracle():
    """Every layer's attention without attn_logit_softcapping (what Gemma 2's SDPA path did in
    transformers 5.20): the stress weights alone do not see it; past the cap the oracle does."""
    model = _gemma2()
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None
        layer.self_attn.config = copy.copy(layer.self_attn.config)  # transformers 4 reads it here
        layer.self_attn.config.attn_logit_softcapping = None
    result = _oracle(model)
    assert not result.passed
    ev = result.evidence
    assert not _failed(ev["as_initialised"]) and not _failed(ev["stress"])  # below the cap
    assert _failed(ev["capped"])
    assert "soft-cap" in result.detail and "layer 0" in result.detail, result.detail
    assert "attn_softcap=50" in result.detail


def test_a_readout_that_drops_its_final_cap_fails_the_oracle():
    """The spec is read before the cap is patched out of the config the forward reads, so the
    declared final_logit_softcapping of 30 is held against a readout that applies none."""
    model = _gemma2(tie_word_embeddings=False)
    spec = da.audit(model, checks=["params"]).facts.spec
    assert spec.logit_softcap == 30.0
    model.config.final_logit_softcapping = None
    result = _oracle(model, spec=spec)
    assert not result.passed
    capped = result.evidence["capped"]
    assert capped["logits_past_cap"] and _failed(capped)
    assert capped["first_stage"] == "the final norm or readout"
    # past the cap the miss is of order the cap itself, not a rounding-sized one
    assert capped["max_abs_logit_error"] > 0.5 * 30.0


def test_a_16_bit_model_skips_the_capped_comparison_saying_why():
    model = _gemma2().to(torch.bfloat16)
    result = _oracle(model)
    assert "bfloat16" in result.evidence["capped"]["skipped"]


# ---- our Decoder: the white-box oracle drives its own weights past the caps -------------------

def _decoder(**caps):
    from configs import SPECIAL

    torch.manual_seed(0)
    return da.Decoder(SPECIAL["gemma2-like"].replace(**caps)).eval()


def test_our_decoder_at_gemma2s_caps_passes_past_them_and_is_given_back_bit_for_bit():
    model = _decoder(attn_softcap=50.0, logit_softcap=30.0)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    result = _oracle(model)
    assert result.passed, result.detail
    assert "past the declared soft-caps" in result.detail
    capped = result.evidence["capped"]
    assert {"ln_final.weight", "layers.1.attn.q_proj.weight"} <= set(capped["scaled"])
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items())


def test_our_decoder_whose_attention_drops_its_cap_fails_the_oracle():
    """The cap dropped from the fast path alone, the weights as initialised: below the cap the
    plain comparison passes it; past the cap it fails."""
    model = _decoder(attn_softcap=50.0, logit_softcap=30.0)
    for layer in model.layers:
        layer.attn.score_softcap = None
    result = _oracle(model)
    assert not result.passed
    assert result.evidence["max_abs_logit_error"] <= result.evidence["allowed"]  # as initialised
    assert _failed(result.evidence["capped"])
    assert "attn_softcap=50" in result.detail
