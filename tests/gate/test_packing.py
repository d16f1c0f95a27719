"""packing: every packed document equals itself alone, in every form a trainer sends packed rows
in and the model takes (document_ids; a 4-D mask; position_ids alone under the model's default
cache setting and with use_cache=False; flash attention's cu_seq_lens), each leak named with its
form and setting. The expectation is each document run alone through the same model."""

from __future__ import annotations

import pytest
import torch
from zoo_packing import T as PACK_T
from zoo_packing import V as PACK_V
from zoo_packing import FlashPackedLM, PositionPackedLM
from zoo_training import PacksAcrossDocuments, PacksWithoutCausal

import decoder_audit as da

PACKED = da.TrainingPath(4, 16, pack=True)


@pytest.mark.parametrize("preset", ["tiny-368", "llama-debug"])
def test_our_decoder_packs_documents_apart(preset):
    report = da.audit(da.Decoder(da.preset(preset)), checks=["packing"], training=PACKED)
    packing = report["packing"]
    assert packing.passed, packing.detail
    assert list(packing.evidence["forms"]) == ["document_ids"]
    gradient = packing.evidence["forms"]["document_ids"]["gradient"]
    assert gradient["max_grad_on_earlier_documents"] == 0.0
    assert gradient["grad_at_own_document"] > 0


@pytest.mark.parametrize("broken", [PacksAcrossDocuments, PacksWithoutCausal])
def test_packing_that_crosses_documents_or_drops_the_triangle_fails_packing_only(broken):
    torch.manual_seed(0)
    model = broken(da.preset("llama-debug"))
    report = da.audit(model, training=PACKED)
    assert [c.name for c in report.failures] == ["packing"], report.first_failure


def test_packing_is_skipped_unless_training_packs():
    report = da.audit(da.Decoder(da.preset("tiny-368")), checks=["packing"])
    assert report["packing"].skipped and "--pack" in report["packing"].evidence["reason"]


def _hugging_face(family):
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64)).eval()
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2,
                                            n_positions=64)).eval()


def _worst(form_result):
    return max(r["max_abs_diff"] for r in form_result["alone"])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_hugging_face_position_ids_alone_leak_under_its_default_cache(family):
    """transformers reads packed documents from restarting position_ids only without a cache
    (masking_utils): with use_cache left at the config's default (True) the second document reads
    the first, a leak DataCollatorWithFlattening's users train; the 4-D mask and use_cache=False
    keep them apart."""
    report = da.audit(_hugging_face(family), checks=["packing"], training=PACKED)
    packing = report["packing"]
    forms = packing.evidence["forms"]
    assert set(forms) == {"4d_mask", "position_ids (use_cache as the model defaults)",
                          "position_ids, use_cache=False"}
    assert _worst(forms["4d_mask"]) < 1e-6 and _worst(forms["position_ids, use_cache=False"]) < 1e-6
    assert _worst(forms["position_ids (use_cache as the model defaults)"]) > 1e-3
    assert not packing.passed
    assert "position_ids (use_cache as the model defaults)" in packing.detail


def test_a_cache_off_by_default_is_tried_once():
    """config.use_cache=False (what the Trainer sets): a call without use_cache is one with
    use_cache=False, so the position_ids form is sent once, and passes."""
    model = _hugging_face("llama")
    model.config.use_cache = False
    forms = da.audit(model, checks=["packing"], training=PACKED)["packing"].evidence["forms"]
    assert set(forms) == {"4d_mask", "position_ids, use_cache=False (the model's default)"}
    assert all(_worst(result) < 1e-6 for result in forms.values())


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_trainer_that_sends_one_form_has_that_form_checked(family):
    model = _hugging_face(family)
    for form, passes in (("4d_mask", True), ("position_ids", False)):
        path = da.TrainingPath(4, 16, pack=True, pack_form=form)
        packing = da.audit(model, checks=["packing"], training=path)["packing"]
        assert packing.passed is passes, (form, packing.detail)
        assert all(label.startswith(form) for label in packing.evidence["forms"])


@pytest.mark.parametrize("model_class, defect, form", [
    (PositionPackedLM, "plain_causal", "position_ids"),
    (FlashPackedLM, "ignores_cu_seq_lens", "flash_kwargs")])
def test_a_module_of_its_own_is_checked_in_the_padding_free_form_it_takes(model_class, defect,
                                                                        form):
    facts = {"vocab_size": PACK_V, "max_seq_len": PACK_T, "training": PACKED}
    correct = da.audit(model_class(), **facts)
    assert correct.passed, correct.first_failure
    assert list(correct["packing"].evidence["forms"]) == [form]
    broken = da.audit(model_class(defect), **facts)
    assert [c.name for c in broken.failures] == ["packing"], broken.first_failure
    assert form in broken["packing"].detail


def test_a_declared_form_the_model_cannot_take_is_refused():
    with pytest.raises(da.ConfigError, match="position_ids"):
        da.audit(da.Decoder(da.preset("tiny-368")), checks=["packing"],
                 training=da.TrainingPath(4, 4, pack=True, pack_form="position_ids"))
    with pytest.raises(da.ConfigError, match="pack=True"):
        da.TrainingPath(4, 4, pack_form="4d_mask")
    with pytest.raises(da.ConfigError, match="pack_form='nope'"):
        da.TrainingPath(4, 4, pack=True, pack_form="nope")
