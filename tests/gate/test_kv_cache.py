"""kv_cache through the caches a caller builds, as generate does: ours pre-sized past the prompt;
a Hugging Face model's DynamicCache and StaticCache (pre-sized), each then reset and reused for a
second prompt; and row 0 decoded beside other rows. The expectation is the model's own full
forward on the same ids."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import randomise
from hf_compat import release_bugs

import decoder_audit as da

tf = pytest.importorskip("transformers")


def _llama(cls=None):
    config = tf.LlamaConfig(vocab_size=37, hidden_size=24, intermediate_size=20,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=16)
    return randomise((cls or tf.LlamaForCausalLM)(config), seed=2, std=0.3)


def _gpt2(cls):
    """GPT-2's learned positions (a table of 64 for an audit of 16): a position shifted by a
    constant moves its logits, where RoPE's relative positions would not."""
    config = tf.GPT2Config(vocab_size=37, n_positions=64, n_embd=24, n_layer=2, n_head=4)
    return randomise(cls(config), seed=2, std=0.3)


def _check(model):
    return da.audit(model, vocab_size=37, max_seq_len=16, checks=["kv_cache"])["kv_cache"]


def test_our_decoder_decodes_through_a_pre_sized_cache():
    check = da.audit(da.Decoder(da.preset("llama-debug")), checks=["kv_cache"])["kv_cache"]
    assert check.passed, check.detail
    assert check.evidence["caller_caches"] == ["a KVCache pre-sized to 32 slots"]


def test_hugging_face_decodes_through_the_caches_a_caller_builds():
    check = _check(_llama())
    assert check.passed, check.detail
    assert check.evidence["caller_caches"] == ["DynamicCache", "StaticCache of 32 positions"]
    labels = [r["schedule"] for r in check.evidence["schedules"]]
    assert "StaticCache of 32 positions, reset and reused for a second prompt" in labels
    assert "row 0 beside other rows, cached" in labels


class StaticPositionsRestart(tf.LlamaForCausalLM):
    """Given a StaticCache and no positions, numbers each call's tokens from 0 (it reads the
    filled length only from a DynamicCache): every cache the model makes itself decodes right."""

    def forward(self, *args, position_ids=None, **kwargs):
        ids, cache = _ids_and_cache(args, kwargs)
        if isinstance(cache, tf.StaticCache) and position_ids is None:
            position_ids = torch.arange(ids.shape[1])[None]
        return super().forward(*args, position_ids=position_ids, **kwargs)


class OffsetPerCacheObject(tf.GPT2LMHeadModel):
    """Keeps its own count of the tokens each cache object has seen (a module-side position
    counter keyed by the cache, started from its length when first seen): a cache reset and
    reused for a second prompt continues from the first prompt's positions."""

    def forward(self, *args, position_ids=None, **kwargs):
        ids, cache = _ids_and_cache(args, kwargs)
        if cache is not None and position_ids is None:
            seen = self.__dict__.setdefault("_seen", {})
            length = (cache.get_seq_length() if hasattr(cache, "get_seq_length")
                      else cache[0][0].shape[-2])  # GPT-2's tuples (transformers 4)
            # first seen: its length; the cache is kept, so its id is never another's
            start = seen.get(id(cache), (cache, length))[1]
            position_ids = torch.arange(start, start + ids.shape[1])[None]
            seen[id(cache)] = (cache, start + ids.shape[1])
        return super().forward(*args, position_ids=position_ids, **kwargs)


def _ids_and_cache(args, kwargs):
    """The ids and the cache a call hands the model (the cache argument under either name
    transformers has given it)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    return kwargs.get("input_ids", args[0] if args else None), cache


# the parameter names the convention reads
StaticPositionsRestart.forward.__signature__ = inspect.signature(tf.LlamaForCausalLM.forward)
OffsetPerCacheObject.forward.__signature__ = inspect.signature(tf.GPT2LMHeadModel.forward)


def test_a_static_cache_that_restarts_the_positions_fails_kv_cache_naming_it():
    check = _check(_llama(StaticPositionsRestart))
    assert not check.passed
    bad = [r["schedule"] for r in check.evidence["schedules"] if r["positions_differing"]]
    assert bad and all(label.startswith("StaticCache") for label in bad)


def test_a_reused_cache_that_keeps_the_old_prompt_fails_kv_cache_naming_it():
    check = _check(_gpt2(OffsetPerCacheObject))
    if not any("reset and reused" in r["schedule"] for r in check.evidence.get("schedules", [])):
        pytest.skip(f"no cache was reset and reused here: {check.evidence.get('notes')}")
    assert not check.passed
    bad = [r["schedule"] for r in check.evidence["schedules"] if r["positions_differing"]]
    assert bad and all("reset and reused" in label for label in bad)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_windowed_layers_decode_through_the_caller_caches(family):
    """A sliding window of 6 in a 16-token probe: the caches a caller builds from the config
    keep only the window on the windowed layers (transformers 5: their sliding layers; 4.x:
    SlidingWindowCache and HybridCache) and still decode as the full forward."""
    torch.manual_seed(0)
    common = dict(vocab_size=37, hidden_size=24, intermediate_size=20, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                  sliding_window=6)
    if family == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**common))
    else:
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**common, head_dim=6, pad_token_id=0))
    model = randomise(model, seed=2, std=0.3)
    if "kv_cache" in release_bugs(model):  # the release's own cache (Gemma 2 before 4.53)
        pytest.skip(release_bugs(model)["kv_cache"])
    check = _check(model)
    if _release(tf.__version__) < (4, 57) and "schedules" not in check.evidence:
        assert not check.passed  # 4.56's form of the same bug: the chunk raises (a shape
        return  # mismatch writing 4 tokens into the sliding layer's one slot)
    bad = [r["schedule"] for r in check.evidence["schedules"] if r["positions_differing"]]
    if _release(tf.__version__) < (4, 57):
        # transformers#40893 (the museum's gemma2-hybrid-cache-chunk): before 4.57 the static
        # sliding layers of SlidingWindowCache and HybridCache take one token at a time, so a
        # chunk of several after the prefill decodes wrongly; one-token steps are right
        assert all(label.startswith(("SlidingWindowCache", "HybridCache")) and "chunks" in label
                   for label in bad), check.detail
    else:
        assert check.passed, check.detail
    assert len(check.evidence["caller_caches"]) >= 2


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


class StaticChunkOnePosition(tf.LlamaForCausalLM):
    """Given a StaticCache holding earlier tokens, numbers every token of a chunk of several
    with the first one's position (a pre-sized layer written one token at a time): one-token
    steps and every cache the model makes itself decode right; only chunks into a caller's
    pre-sized cache go wrong."""

    def forward(self, *args, position_ids=None, **kwargs):
        ids, cache = _ids_and_cache(args, kwargs)
        if isinstance(cache, tf.StaticCache) and position_ids is None and ids.shape[1] > 1:
            past = int(cache.get_seq_length())  # a tensor in some 5.x releases
            if past:
                position_ids = torch.full((1, ids.shape[1]), past)
        return super().forward(*args, position_ids=position_ids, **kwargs)


class DropsItsCache(tf.LlamaForCausalLM):
    """Under use_cache=True returns an output whose past_key_values field is empty (Nemotron in
    transformers 4.46 made no cache unless handed one): a caller's decoding loop has nothing to
    pass back."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        for name in ("past_key_values", "cache"):  # transformers 5.x names it both ways
            if name in out:
                out[name] = None
        return out


class KeepsItsCacheElsewhere(tf.LlamaForCausalLM):
    """Returns only logits, in an output class without a cache field (a model that keeps its
    state in the module, as RecurrentGemma does): nothing to step from outside."""

    def forward(self, *args, **kwargs):
        return tf.modeling_outputs.CausalLMOutput(logits=super().forward(*args, **kwargs).logits)


for _cls in (StaticChunkOnePosition, DropsItsCache, KeepsItsCacheElsewhere):
    _cls.forward.__signature__ = inspect.signature(tf.LlamaForCausalLM.forward)


def test_chunks_into_a_caller_cache_that_go_wrong_fail_kv_cache_naming_it():
    check = _check(_llama(StaticChunkOnePosition))
    assert not check.passed
    bad = [r["schedule"] for r in check.evidence["schedules"] if r["positions_differing"]]
    assert bad and all(label.startswith("StaticCache") and "chunks" in label for label in bad)


def test_an_output_that_leaves_its_cache_field_empty_fails_kv_cache():
    check = _check(_llama(DropsItsCache))
    assert not check.passed and not check.skipped
    assert "use_cache" in check.detail


def test_an_output_without_a_cache_field_is_skipped_with_the_reason():
    check = _check(_llama(KeepsItsCacheElsewhere))
    assert check.skipped and "CausalLMOutput" in check.detail


def test_one_caller_cache_is_counted_in_the_singular():
    """tiny-368 decodes through one cache a caller builds: "1 cache", never "1 caches"."""
    check = da.audit(da.Decoder(da.preset("tiny-368")), checks=["kv_cache"])["kv_cache"]
    assert check.passed and len(check.evidence["caller_caches"]) == 1, check.detail
    assert "1 cache a caller builds" in check.detail, check.detail
