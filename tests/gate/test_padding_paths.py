"""`padding` measures every model that takes a mask, at lengths above 1, whatever its cached path
does: a raise there is evidence, never the end of the measurement. transformers' Llama with a
defect planted by a forward pre-hook on the model (its signature, which the gate reads the call
convention from, untouched):

  - its cached steps raise on a padded batch and run without pads (Dory's defect, whose
    generate(attention_mask=...) raises too): padding fails naming the raise, with the masked
    forward's rows measured beside it;
  - its cached steps raise with or without pads (CpmAnt's: the gate steps the cache as generate
    does, the model wants the whole prefix each step): the cache is kv_cache's to judge, and
    padding judges the masked forward, which here is right;
  - the same, with its attention_mask ignored on top: padding still fails on the masked forward,
    the pads' content reaching the real tokens.
"""

from __future__ import annotations

import pytest
import torch
from helpers import randomise

import decoder_audit as da

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


def _llama() -> torch.nn.Module:
    config = tf.LlamaConfig(vocab_size=37, hidden_size=24, intermediate_size=20,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=16, attn_implementation="eager")
    return randomise(tf.LlamaForCausalLM(config), seed=2, std=0.3)


def _cached(kwargs: dict) -> bool:
    """A call that keeps a cache (use_cache on), the only way generate steps a model."""
    return bool(kwargs.get("use_cache"))


def _padded(kwargs: dict) -> bool:
    mask = kwargs.get("attention_mask")
    return mask is not None and bool((mask == 0).any())


def _raise_when(model: torch.nn.Module, when) -> torch.nn.Module:
    def hook(module, args, kwargs):
        if when(kwargs):
            raise RuntimeError("The size of tensor a (10) must match the size of tensor b (5)")
    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


def _ignore_mask(model: torch.nn.Module) -> torch.nn.Module:
    def hook(module, args, kwargs):
        kwargs.pop("attention_mask", None)
        kwargs.pop("position_ids", None)
        return args, kwargs
    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


def _audit(model) -> da.AuditReport:
    return da.audit(model, vocab_size=37, max_seq_len=16, checks=["kv_cache", "padding"])


def test_a_cache_that_raises_only_on_a_padded_batch_fails_padding_with_its_rows_measured():
    model = _raise_when(_llama(), lambda kw: _cached(kw) and _padded(kw))
    report = _audit(model)
    padding = report["padding"]
    assert report["kv_cache"].passed  # unpadded, its cache is right
    assert not padding.passed
    assert "raised RuntimeError" in padding.detail and "without pads run" in padding.detail
    rows = padding.evidence["rows"]
    masked = [r for r in rows if r["how"] == "one masked forward"]
    assert masked and all(r["max_abs_diff"] <= r["allowed"] for r in masked)
    assert {r["pad"] for r in masked} >= {1, 2}  # pads above one token measured
    raised = [r for r in rows if "raised" in r]
    assert len(raised) == 1 and raised[0]["raises_without_pads"] == ""
    assert "exception" not in padding.evidence  # the check's verdict, not a crash


def test_a_cache_that_raises_with_or_without_pads_leaves_padding_to_the_masked_forward():
    model = _raise_when(_llama(), lambda kw: _cached(kw))
    report = _audit(model)
    assert not report["kv_cache"].passed  # the cache path itself is kv_cache's failure
    padding = report["padding"]
    assert padding.passed, padding.detail
    assert "not judged" in padding.detail and "kv_cache" in padding.detail
    raised = [r for r in padding.evidence["rows"] if "raised" in r]
    assert raised and "RuntimeError" in raised[0]["raises_without_pads"]


def test_a_mask_ignored_still_fails_padding_when_the_cache_raises():
    model = _ignore_mask(_raise_when(_llama(), lambda kw: _cached(kw)))
    padding = _audit(model)["padding"]
    assert not padding.passed
    assert padding.detail.startswith("one masked forward")
    assert "pads' content reaches" in padding.detail, padding.detail


def test_the_correct_llama_passes_padding_through_the_cache():
    padding = _audit(_llama())["padding"]
    assert padding.passed and "through the cache" in padding.detail, padding.detail
    assert not any("raised" in r for r in padding.evidence["rows"])


def test_logits_that_move_with_use_cache_are_not_a_padding_defect():
    """Dory's logits differ between use_cache on (its plain call's default) and off: the padded
    batch runs with it off, and so does each real prefix alone it is held to, so padding judges
    the pads only (the use_cache dependence is the plain forward's, which prefix sees)."""
    model = _llama()

    def cache_shifts(module, args, kwargs, output):
        if kwargs.get("use_cache") is not False:
            output.logits = output.logits + 1e-3
        return output

    model.register_forward_hook(cache_shifts, with_kwargs=True)
    padding = _audit(model)["padding"]
    assert padding.passed, padding.detail
