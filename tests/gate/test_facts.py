"""The facts the gate decides once about a model (gate/facts.py): read from its DecoderConfig or
its Hugging Face config, or given; an argument that contradicts what the model declares is
refused naming both values; the report says where each fact came from."""

from __future__ import annotations

import pytest
import torch

import decoder_audit as da
from decoder_audit.gate import model_facts

tf = pytest.importorskip("transformers")


def _gpt2(**changes):
    config = tf.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=12,
                           pad_token_id=3, **changes)
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(config).eval()


def test_a_decoder_config_declares_v_and_max_seq_len_and_a_contradiction_names_both():
    model = da.Decoder(da.preset("tiny-368"))
    facts = model_facts(model)
    assert (facts.vocab_size, facts.max_seq_len, facts.whitebox) == (8, 4, True)
    assert facts.origin["vocab_size"] == facts.origin["max_seq_len"] == "config"
    with pytest.raises(da.ConfigError, match=r"vocab_size=9.*vocab_size=8"):
        model_facts(model, vocab_size=9)
    with pytest.raises(da.ConfigError, match=r"max_seq_len=5.*max_seq_len=4"):
        da.audit(model, max_seq_len=5)


def test_the_plain_call_reads_a_hugging_face_models_facts_from_its_config():
    model = _gpt2()
    report = da.audit(model, checks=["inputs"])
    facts = report.facts
    assert (facts.vocab_size, facts.max_seq_len, facts.pad_token_id) == (50, 12, 3)
    assert facts.origin["vocab_size"] == facts.origin["pad_token_id"] == "hugging face"
    assert report.to_dict()["facts"]["origin"]["max_seq_len"] == "hugging face"
    assert any("learned position table" in note for note in report.notes)


def test_an_explicit_length_or_pad_id_wins_but_a_wrong_v_is_refused():
    model = _gpt2()
    facts = model_facts(model, max_seq_len=8, pad_token_id=0)
    assert (facts.max_seq_len, facts.pad_token_id) == (8, 0)
    assert facts.origin["max_seq_len"] == facts.origin["pad_token_id"] == "argument"
    with pytest.raises(da.ConfigError, match=r"vocab_size=51.*vocab_size=50"):
        model_facts(model, vocab_size=51)


def test_a_black_box_needs_v_and_facts_come_whole_or_one_by_one():
    box = torch.nn.Linear(3, 3)
    with pytest.raises(da.ConfigError, match="vocab_size"):
        model_facts(box)
    with pytest.raises(da.ConfigError, match="input_vocab_size=0"):
        model_facts(box, vocab_size=4, input_vocab_size=0)
    facts = model_facts(da.Decoder(da.preset("tiny-368")))
    with pytest.raises(da.ConfigError, match=r"vocab_size"):
        da.audit(da.Decoder(da.preset("tiny-368")), facts=facts, vocab_size=8)


def test_a_plain_modules_oracle_skip_says_transformers_is_installed_when_it_is(monkeypatch):
    """transformers installed but not imported (as in a process that never touched it): the
    reason the oracle is skipped says it is installed, not that it is missing or "not loaded"."""
    from torch import nn

    from decoder_audit.references.hf import hf_reference

    monkeypatch.delitem(__import__("sys").modules, "transformers")
    reference, why = hf_reference(nn.Linear(3, 3))
    assert reference is None
    assert "installed" in why and "not installed" not in why and "not loaded" not in why, why
