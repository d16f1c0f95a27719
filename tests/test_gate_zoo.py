"""Proof that the gate works: every mutant of the zoo fails with the right check named, and the
correct models (our presets, odd configs, a plain torch decoder, Hugging Face GPT-2 and Llama
from small random configs) pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import decoder_audit as da
from decoder_audit.gate import CHECK_ORDER

import configs
import zoo


def test_zoo_covers_at_least_15_defect_classes():
    assert len(zoo.MUTANTS) >= 15
    assert len({case.name for case in zoo.MUTANTS}) == len(zoo.MUTANTS)
    assert {case.expect for case in zoo.MUTANTS} <= set(CHECK_ORDER)


@pytest.mark.parametrize("case", zoo.MUTANTS, ids=lambda case: case.name)
def test_mutant_is_caught_by_the_right_check(case):
    report = da.audit(case.build(), **case.kwargs)
    assert not report.passed
    failing = [c.name for c in report.failures]
    assert case.expect in failing, f"{case.name}: expected {case.expect} to fail, got {failing}"
    if case.first:
        assert report.first_failure.name == case.expect, (
            f"{case.name}: first failure {report.first_failure.name}: {report.first_failure.detail}")
    # caught by the check's own verdict, not by the check crashing on the mutant
    assert "exception" not in report[case.expect].evidence, report[case.expect].detail


def _passes(model, **kwargs):
    report = da.audit(model, **kwargs)
    failures = {c.name: c.detail for c in report.failures}
    assert report.passed, failures
    return report


@pytest.mark.parametrize("name", ["tiny-368", "cs336-test", "llama-debug"])
def test_presets_pass(name):
    report = _passes(zoo.decoder(da.preset(name)))
    assert report.mode == "white-box" and report.dtype == "float64"
    expected_skips = [] if da.preset(name).tie_embeddings else ["tying_grad"]
    assert [c.name for c in report.skipped] == expected_skips


@pytest.mark.parametrize("cfg", configs.params(
    configs.entries("gqa-small", "ln-gelutanh-biases-tied", "mqa-nopos-tied", "long-context-40")
    + configs.grid()))
def test_odd_configs_pass(cfg):
    _passes(zoo.decoder(cfg, seed=3))


def test_hand_written_attention_passes_so_each_mutant_differs_by_its_defect_only():
    _passes(zoo.with_attention(zoo.HandAttention))
    _passes(zoo.with_attention(zoo.HandAttention, zoo.GQA))


def test_plain_torch_decoder_passes_black_box():
    torch.manual_seed(0)
    report = _passes(zoo.TorchDecoder(), **zoo.TORCH_BLACKBOX)
    assert report.mode == "black-box"
    assert {c.name for c in report.skipped} == {"attention_rows", "params", "tying", "tying_grad",
                                               "oracle"}


transformers = pytest.importorskip("transformers")


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=37, n_positions=12, n_embd=16, n_layer=2,
                                     n_head=2, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config)


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=12,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config)


def test_hugging_face_gpt2_passes_black_box_with_its_attention_patterns():
    report = _passes(_gpt2(), vocab_size=37, max_seq_len=12)
    assert not report["attention_rows"].skipped  # read through output_attentions
    assert report["overlength"].evidence["error"] == "IndexError"  # position table lookup


def test_hugging_face_llama_passes_without_a_length_limit():
    report = _passes(_llama(), vocab_size=37)
    assert report["overlength"].skipped  # listed, not silently passed


def test_hugging_face_llama_does_not_reject_overlength_input():
    # RoPE models raise nothing past their trained length (DEFECTS.md D17): the gate says so.
    report = da.audit(_llama(), vocab_size=37, max_seq_len=12)
    assert [c.name for c in report.failures] == ["overlength"]
    assert report["overlength"].evidence["output_shape"] == [1, 13, 37]


# GPT-2 rejects T > 12 (its position table); Llama accepts any T, so it is given no limit.
HF_FACTS = {"gpt2": dict(vocab_size=37, max_seq_len=12), "llama": dict(vocab_size=37)}


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_hugging_face_models_match_the_oracle_fed_their_weights(build):
    from helpers import randomise

    facts = HF_FACTS["gpt2" if build is _gpt2 else "llama"]
    report = _passes(randomise(build(), seed=2, std=0.3), **facts)
    oracle = report["oracle"]
    assert not oracle.skipped and "via references.hf.from_hf" in oracle.evidence["reference"]


@pytest.mark.parametrize("build, swap", [
    (_gpt2, lambda m: setattr(m.transformer.h[1].mlp, "act", nn.ReLU())),
    (_llama, lambda m: setattr(m.model.layers[0].mlp, "act_fn", nn.GELU())),
], ids=["gpt2-relu-instead-of-gelu", "llama-gelu-instead-of-silu"])
def test_a_hugging_face_model_whose_forward_breaks_its_config_fails_the_oracle(build, swap):
    """Same weights, same config, a different activation inside the forward: every invariance
    still holds, so only the reference comparison can see it."""
    model = build()
    swap(model)
    report = da.audit(model, **HF_FACTS["gpt2" if build is _gpt2 else "llama"])
    assert [c.name for c in report.failures] == ["oracle"]
