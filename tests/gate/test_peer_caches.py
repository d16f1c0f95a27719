"""kv_cache through the peer libraries' own cache conventions (generation/convention.py): a
TransformerLens HookedTransformer through past_kv_cache (its key/value cache class), an
x-transformers TransformerWrapper through cache= / return_intermediates=True (as its
AutoregressiveWrapper decodes). The expectation is the model's own full forward on the same ids;
a cache bug planted in the library's own class fails the check. litgpt's set_kv_cache /
input_pos: test_peer_litgpt.py."""

from __future__ import annotations

import pytest
import torch

import decoder_audit as da

lens = pytest.importorskip("transformer_lens")
xt = pytest.importorskip("x_transformers")


def _kv_cache(model, vocab_size):
    report = da.audit(model, vocab_size=vocab_size, checks=["kv_cache"])
    return report.facts.convention.name, report["kv_cache"]


def _lens():
    torch.manual_seed(0)
    config = lens.HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=16, d_head=4, n_heads=4,
                                          d_mlp=24, d_vocab=13, act_fn="gelu", seed=0,
                                          normalization_type="RMS", rotary_dim=4,
                                          positional_embedding_type="rotary")
    return lens.HookedTransformer(config).eval()


def _xt():
    torch.manual_seed(0)
    layers = xt.Decoder(dim=16, depth=2, heads=2, attn_dim_head=8, rotary_pos_emb=True)
    return xt.TransformerWrapper(num_tokens=13, max_seq_len=16, attn_layers=layers,
                                 use_abs_pos_emb=False).eval()


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
def test_a_hooked_transformer_decodes_through_its_key_value_cache():
    convention, check = _kv_cache(_lens(), 13)
    assert convention == "past_kv_cache" and check.passed, check.detail


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")
def test_a_key_value_cache_written_one_slot_early_fails(monkeypatch):
    """Each cache entry writes the new keys and values one slot early: over the last cached
    position, which moves to the end (the length, and so every mask, stays right)."""
    from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

    def one_early(past, new):  # (B, S, Hkv, Dh) and (B, T, Hkv, Dh)
        if past.shape[1] == 0:
            return new
        return torch.cat([past[:, :-1], new, past[:, -1:]], dim=1)

    def append(self, new_keys, new_values):
        self.past_keys = one_early(self.past_keys, new_keys)
        self.past_values = one_early(self.past_values, new_values)
        return self.past_keys, self.past_values

    monkeypatch.setattr(TransformerLensKeyValueCacheEntry, "append", append)
    _, check = _kv_cache(_lens(), 13)
    assert not check.passed and "differs from the full forward" in check.detail, check.detail


def test_an_x_transformers_wrapper_decodes_through_return_intermediates():
    convention, check = _kv_cache(_xt(), 13)
    assert convention == "return_intermediates" and check.passed, check.detail
    sizes = [record["sizes"] for record in check.evidence["schedules"]]
    assert [1, 2, 3, 4, 5, 1] in sizes  # chunks after the prefill, told by cache_age


def test_an_x_transformers_cache_never_read_fails(monkeypatch):
    """Attention drops the cache it is handed: a step attends to its own tokens alone."""
    attention = xt.x_transformers.Attention
    real = attention.forward

    def uncached(self, *args, cache=None, **kwargs):
        return real(self, *args, **kwargs)

    monkeypatch.setattr(attention, "forward", uncached)
    _, check = _kv_cache(_xt(), 13)
    assert not check.passed and "position 8 (a one-token step after 8 cached)" in check.detail, \
        check.detail
