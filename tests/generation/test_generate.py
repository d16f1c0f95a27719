"""The generation path: the Decoder's KV cache and padding mask, and `da.generate`.

Expectations come from independent sources: the full forward (the cache must equal it), each row
run alone (padding must not change it), Hugging Face `generate` on the same weights, masks and
filtered distributions written out by hand in the tests."""

from __future__ import annotations

from types import SimpleNamespace

import configs
import pytest
import torch
from helpers import random_decoder, randomise
from torch import nn

import decoder_audit as da
from decoder_audit import ContextLengthError
from decoder_audit.generation.convention import convention
from decoder_audit.generation.generate import Sampler, generate
from decoder_audit.model.cache import attention_allowed

# Learned positions (untied, GQA 4/2, T=5), RoPE (GQA 4/2, T=7), MQA without positions (T=3),
# and the teaching model: every position kind, head grouping and tying.
CACHE_CONFIGS = configs.entries("tiny-368", "ln-gelu-learned-biases-gqa-untied", "gqa-small",
                                "mqa-nopos-tied", "long-context-40")


def _model(cfg: da.DecoderConfig, seed: int = 0) -> da.Decoder:
    return random_decoder(cfg, seed=seed, dtype=torch.float64, std=0.5)


def _ids(batch: int, seq_len: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


# ---- the cache --------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", configs.params(CACHE_CONFIGS))
def test_prefill_then_tokens_and_chunks_equal_the_full_forward(cfg):
    model = _model(cfg)
    seq_len = min(cfg.max_seq_len, 12)
    ids = _ids(3, seq_len, cfg.vocab_size)
    with torch.no_grad():
        full = model(ids)
        chunks = [1, 2, seq_len - 3] if seq_len > 3 else [seq_len]
        for sizes in ([1] * seq_len, [seq_len - 1, 1], chunks):
            cache = model.new_cache(3)
            pieces, start = [], 0
            for size in sizes:
                pieces.append(model(ids[:, start:start + size], cache=cache))
                start += size
            torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-12)


def test_cache_holds_kv_heads_in_preallocated_buffers():
    cfg = configs.named("gqa-small")  # H=4 over Hkv=2
    model = _model(cfg)
    cache = model.new_cache(2)
    assert cache.keys.shape == (cfg.n_layers, 2, cfg.kv_heads, cfg.max_seq_len, cfg.head_dim)
    pointers = (cache.keys.data_ptr(), cache.values.data_ptr())
    ids = _ids(2, cfg.max_seq_len, cfg.vocab_size)
    with torch.no_grad():
        model(ids[:, :3], cache=cache)
        for t in range(3, cfg.max_seq_len):
            model(ids[:, t:t + 1], cache=cache)
    assert (cache.keys.data_ptr(), cache.values.data_ptr()) == pointers  # never re-allocated
    assert cache.length == cfg.max_seq_len


def test_bottom_right_causal_mask_against_a_written_out_reference():
    """DEFECTS.md B11: with a non-empty cache, query i sits in slot start + i; SDPA's is_causal
    would align it top-left. Written out for q_len 1 and 3 after 4 cached slots."""
    assert attention_allowed(4, 1, None, torch.device("cpu")) is None  # one query reads all 5
    reference = torch.tensor([[1, 1, 1, 1, 1, 0, 0],
                              [1, 1, 1, 1, 1, 1, 0],
                              [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(attention_allowed(4, 3, None, torch.device("cpu"))[0, 0], reference)
    assert attention_allowed(0, 3, None, torch.device("cpu")) is None  # square: is_causal
    # Pads (slot 0 and 1 of row 0) are never read, except by the pad query itself.
    valid = torch.tensor([[False, False, True, True], [True, True, True, True]])
    allowed = attention_allowed(0, 4, valid, torch.device("cpu"))[:, 0]
    assert torch.equal(allowed[0], torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0],
                                                 [0, 0, 1, 1]], dtype=torch.bool))
    assert torch.equal(allowed[1], torch.ones(4, 4, dtype=torch.bool).tril())


def test_overlength_through_the_cache_is_rejected_before_anything_changes():
    cfg = configs.named("ln-gelu-learned-biases-gqa-untied")  # learned positions, T <= 5
    model = _model(cfg)
    cache = model.new_cache(1)
    ids = _ids(1, 6, cfg.vocab_size)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        with pytest.raises(da.ContextLengthError, match=r"6 tokens.*max_seq_len=5.*never cropped"):
            model(ids[:, 4:6], cache=cache)
        assert cache.length == 4  # untouched: the last token still fits
        model(ids[:, 4:5], cache=cache)
        with pytest.raises(da.ContextLengthError):
            model(ids[:, 5:6], cache=cache)
    small = model.new_cache(1, capacity=2)
    with pytest.raises(da.ContextLengthError, match="capacity is 2"):
        model(ids[:, :3], cache=small)
    with pytest.raises(da.InputShapeError, match="built for B=1"):
        model(_ids(2, 2, cfg.vocab_size), cache=model.new_cache(1))


@pytest.mark.parametrize("cfg", configs.params(configs.entries(
    "ln-gelu-learned-biases-gqa-untied", "gqa-small")))
def test_left_padded_rows_equal_their_unpadded_run(cfg):
    model = _model(cfg)
    seq_len = cfg.max_seq_len
    x = _ids(1, seq_len, cfg.vocab_size)
    with torch.no_grad():
        for k in range(1, seq_len):
            padded = torch.cat([_ids(1, k, cfg.vocab_size, seed=k + 10), x[:, :seq_len - k]], 1)
            mask = torch.ones(1, seq_len, dtype=torch.long)
            mask[:, :k] = 0
            alone = model(x[:, :seq_len - k])
            torch.testing.assert_close(model(padded, mask)[:, k:], alone, rtol=0, atol=1e-12)
            cache = model.new_cache(1)  # the same through the cache, one token at a time
            steps = [model(padded[:, :k + 1], mask[:, :k + 1], cache=cache)]
            steps += [model(padded[:, t:t + 1], cache=cache) for t in range(k + 1, seq_len)]
            torch.testing.assert_close(torch.cat(steps, 1)[:, k:], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mask, error", [
    (torch.ones(2, 3), "bool or integer"),
    (torch.ones(2, 4, dtype=torch.long), "shape"),
    (torch.full((2, 3), 2), "0 \\(pad\\) or 1"),
])
def test_bad_attention_masks_are_refused(mask, error):
    model = da.Decoder(da.preset("tiny-368"))
    with pytest.raises(da.InputShapeError, match=error):
        model(torch.zeros(2, 3, dtype=torch.long), mask)


# ---- generate on our Decoder --------------------------------------------------------------------

RAGGED = [[1, 5, 7, 2, 3], [4], [6, 6, 1]]


@pytest.mark.parametrize("cfg", configs.params(configs.entries("gqa-small", "long-context-40")))
def test_greedy_is_identical_with_and_without_cache_and_each_row_equals_its_run_alone(cfg):
    model = _model(cfg)
    prompts = [[i % cfg.vocab_size for i in row] for row in RAGGED]
    cached = da.generate(model, prompts, max_new_tokens=6)
    assert cached == da.generate(model, prompts, max_new_tokens=6, use_cache=False)
    for i, row in enumerate(prompts):
        alone = da.generate(model, [row], max_new_tokens=6)
        assert (alone.ids[0], alone.stop[0]) == (cached.ids[i], cached.stop[i])


def test_rows_stop_on_their_own_eos_and_context_limits():
    cfg = configs.named("gqa-small")  # max_seq_len 7: a row ends with at most 8 ids
    model = _model(cfg)
    out = da.generate(model, [[1, 2, 3, 4, 5, 6], [3]], max_new_tokens=5)
    assert [len(ids) for ids in out.ids] == [8, 6] and out.stop == ["context", "max_new_tokens"]
    eos = out.new_ids[1][2]  # the third token of row 1: it now ends there
    first = out.new_ids[1].index(eos) + 1
    stopped = da.generate(model, [[1, 2, 3, 4, 5, 6], [3]], max_new_tokens=5, eos_id=eos)
    assert stopped.new_ids[1] == out.new_ids[1][:first] and stopped.stop[1] == "eos"
    # row 0 goes on as it would alone (unless it also emits that id)
    alone = da.generate(model, [[1, 2, 3, 4, 5, 6]], max_new_tokens=5, eos_id=eos)
    assert stopped.ids[0] == alone.ids[0]
    assert da.generate(model, [1] * 7, max_new_tokens=3).stop == ["context"]  # 8 ids in all


def test_a_tensor_prompt_and_a_list_give_the_same_rows():
    model = _model(configs.named("gqa-small"))
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert da.generate(model, prompt, max_new_tokens=3) == da.generate(
        model, prompt.tolist(), max_new_tokens=3)


class Recorder(nn.Module):
    """A plain ids -> logits module (no mask, no cache) whose next token is (last id + 1) % V,
    recording the lengths it was fed."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.vocab = vocab
        self.weight = nn.Parameter(torch.zeros(()))
        self.fed: list[tuple[int, ...]] = []

    def forward(self, ids):
        self.fed.append(tuple(ids.shape))
        return nn.functional.one_hot((ids + 1) % self.vocab, self.vocab).double() * 5


def test_a_plain_module_recomputes_and_runs_ragged_prompts_row_by_row():
    model = Recorder()
    assert convention(model).name == "plain"
    out = da.generate(model, [[1, 2], [7]], max_new_tokens=3)
    assert out.ids == [[1, 2, 3, 4, 5], [7, 8, 9, 10]]
    assert model.fed == [(1, 2), (1, 3), (1, 4), (1, 1), (1, 2), (1, 3)]  # each row alone


def test_a_model_that_returns_no_cache_is_recomputed_instead():
    from zoo_generation import CacheKeptElsewhere

    model = CacheKeptElsewhere()
    assert convention(model).cached
    assert da.generate(model, [[1, 2]], max_new_tokens=3).ids == [[1, 2, 3, 4, 5]]


# ---- generate on Hugging Face models ------------------------------------------------------------

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


def _gpt2(impl: str):
    config = tf.GPT2Config(vocab_size=29, n_positions=16, n_embd=24, n_layer=2, n_head=6,
                           bos_token_id=None, eos_token_id=None, attn_implementation=impl)
    return randomise(tf.GPT2LMHeadModel(config), seed=3, std=0.3).double()


def _llama(impl: str):
    config = tf.LlamaConfig(vocab_size=29, hidden_size=24, intermediate_size=37,
                            num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                            max_position_embeddings=16, bos_token_id=None, eos_token_id=None,
                            pad_token_id=None, attn_implementation=impl)
    return randomise(tf.LlamaForCausalLM(config), seed=3, std=0.3).double()


@pytest.mark.parametrize("build, impl", [(_gpt2, "eager"), (_gpt2, "sdpa"), (_llama, "sdpa")],
                         ids=["gpt2-eager", "gpt2-sdpa", "llama-sdpa"])
def test_hugging_face_models_generate_what_their_own_generate_does(build, impl):
    model = build(impl)
    assert convention(model).name == "hugging face" and convention(model).cached
    ours = da.generate(model, RAGGED, max_new_tokens=5)
    assert ours == da.generate(model, RAGGED, max_new_tokens=5, use_cache=False)
    width = max(len(row) for row in RAGGED)
    ids = torch.tensor([[0] * (width - len(row)) + row for row in RAGGED])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in RAGGED])
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                            pad_token_id=0)
    assert ours.new_ids == theirs[:, width:].tolist()
    # ... and our Decoder holding the same weights generates the same
    assert da.generate(da.from_hf(model), RAGGED, max_new_tokens=5).new_ids == ours.new_ids


# ---- sampling ---------------------------------------------------------------------------------

def _filtered(probs: list[float], top_k=None, top_p=None) -> list[float]:
    """The written-out rule: keep the top_k most probable (ties with the k-th kept), then, in
    order of decreasing probability, each token whose more probable predecessors hold less than
    top_p of the (renormalised) mass; renormalise."""
    keep = list(range(len(probs)))
    if top_k is not None:
        kth = sorted(probs, reverse=True)[top_k - 1]
        keep = [i for i in keep if probs[i] >= kth]
    if top_p is not None:
        total = sum(probs[i] for i in keep)
        ordered = sorted(keep, key=lambda i: -probs[i])
        kept, mass = [], 0.0
        for i in ordered:
            if mass < top_p:
                kept.append(i)
            mass += probs[i] / total
        keep = kept
    total = sum(probs[i] for i in keep)
    return [probs[i] / total if i in keep else 0.0 for i in range(len(probs))]


@pytest.mark.parametrize("top_k, top_p", [(2, None), (3, None), (None, 0.6), (None, 0.75),
                                          (None, 0.95), (3, 0.8), (4, 0.5), (None, 1.0)])
def test_top_k_and_top_p_keep_what_the_written_out_rule_keeps(top_k, top_p):
    probs = [0.05, 0.4, 0.1, 0.25, 0.12, 0.08]
    sampler = Sampler(1.0, top_k, top_p, None)
    got = sampler.probabilities(torch.tensor([probs]).log())[0]
    torch.testing.assert_close(got, torch.tensor(_filtered(probs, top_k, top_p)), rtol=0, atol=1e-6)


def test_top_k_keeps_ties_and_temperature_sharpens():
    tied = torch.tensor([[0.3, 0.3, 0.3, 0.1]]).log()
    assert (Sampler(1.0, 2, None, None).probabilities(tied)[0] > 0).tolist() == [True] * 3 + [False]
    p = torch.tensor([0.6, 0.3, 0.1])
    cold = Sampler(0.5, None, None, None).probabilities(p.log()[None])[0]
    torch.testing.assert_close(cold, p ** 2 / (p ** 2).sum(), rtol=0, atol=1e-6)


def test_sampling_is_seeded_batched_and_stays_in_the_kept_set():
    model = _model(configs.named("gqa-small"))
    kwargs = dict(max_new_tokens=4, temperature=1.5, top_k=3)
    first = da.generate(model, [[1, 2]] * 6, generator=torch.Generator().manual_seed(7), **kwargs)
    again = da.generate(model, [[1, 2]] * 6, generator=torch.Generator().manual_seed(7), **kwargs)
    assert first == again
    with torch.no_grad():  # the first new token of every row is among the 3 most likely
        top3 = model(torch.tensor([[1, 2]]))[0, -1].topk(3).indices.tolist()
    assert {row[0] for row in first.new_ids} <= set(top3)


# ---- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, match", [
    (dict(max_new_tokens=0), "max_new_tokens=0 must be an integer >= 1"),
    (dict(max_new_tokens=2, temperature=-1.0), "temperature=-1.0 must be"),
    (dict(max_new_tokens=2, temperature=float("nan")), "temperature=nan"),
    (dict(max_new_tokens=2, temperature=1.0, top_k=0), "top_k=0 must be an integer >= 1"),
    (dict(max_new_tokens=2, temperature=1.0, top_k=12), "top_k=12 exceeds the vocabulary size"),
    (dict(max_new_tokens=2, temperature=1.0, top_p=0.0), r"top_p=0.0 must lie in \(0, 1\]"),
    (dict(max_new_tokens=2, temperature=1.0, top_p=1.5), r"top_p=1.5 must lie in \(0, 1\]"),
    (dict(max_new_tokens=2, top_k=5), "need temperature > 0"),
    (dict(max_new_tokens=2, eos_id=11), r"eos_id=11 must be an id in \[0, 11\)"),
    (dict(max_new_tokens=2, max_seq_len=9), "max_seq_len=9 disagrees with the model's config"),
])
def test_bad_options_raise_config_errors_naming_value_and_limit(options, match):
    model = da.Decoder(configs.named("gqa-small"))  # V = 11, max_seq_len = 7
    with pytest.raises(da.ConfigError, match=match):
        da.generate(model, [1, 2], **options)


@pytest.mark.parametrize("prompt, error, match", [
    ([], da.InputShapeError, "prompt row 0 is empty"),
    ([[1, 2], []], da.InputShapeError, "prompt row 1 is empty"),
    ([1, [2]], da.InputShapeError, "mixes ids and rows"),
    ([1, 2.5], da.InputShapeError, "2.5 is not an integer id"),
    ([1, 11], da.TokenIdError, r"token id 11 at prompt row 0, position 1 is outside "
                               r"\[0, vocab_size=11\)"),
    ([1] * 8, da.ContextLengthError, "8 tokens but the model accepts at most max_seq_len=7"),
    (torch.ones(2, 2, 2, dtype=torch.long), da.InputShapeError, r"\(T0,\) or \(B, T0\)"),
    (torch.ones(2, 2), da.InputShapeError, "integer dtype"),
])
def test_bad_prompts_raise_input_errors(prompt, error, match):
    model = da.Decoder(configs.named("gqa-small"))
    with pytest.raises(error, match=match):
        da.generate(model, prompt, max_new_tokens=2)


def one_row(model, prompt, *, max_seq_len, max_new_tokens=None, **options):
    """`generate` on one prompt, by default to the context limit: max_seq_len + 1 ids in all
    (what `decoder-audit sample` asks for without --max-new-tokens); its row's ids, new ids and
    stop reason."""
    budget = max_new_tokens if max_new_tokens is not None else max(1, max_seq_len + 1 - len(prompt))
    out = generate(model, prompt, max_new_tokens=budget, max_seq_len=max_seq_len, **options)
    return SimpleNamespace(ids=out.ids[0], new_ids=out.new_ids[0], stop=out.stop[0])


V = 8


EOS = 2


class NextTable(nn.Module):
    """Logits that put all the mass (+10) on table[last id]: a deterministic 'model'."""

    def __init__(self, table: dict[int, int], max_seq_len: int) -> None:
        super().__init__()
        self.table, self.max_seq_len = table, max_seq_len
        self.dummy = nn.Parameter(torch.zeros(()))  # so the sampler can find a device
        self.seen_lengths: list[int] = []

    def forward(self, ids):
        assert ids.shape[1] <= self.max_seq_len, "fed more than max_seq_len ids"
        self.seen_lengths.append(ids.shape[1])
        logits = torch.zeros(*ids.shape, V)
        for b in range(ids.shape[0]):
            for t in range(ids.shape[1]):
                logits[b, t, self.table[int(ids[b, t])]] = 10.0
        return logits


def test_greedy_stops_at_eos():
    # 1 -> 3 -> 4 -> 2 (<eos>)
    model = NextTable({1: 3, 3: 4, 4: EOS}, max_seq_len=8)
    out = one_row(model, [1], max_seq_len=8, eos_id=EOS)
    assert out.ids == [1, 3, 4, EOS] and out.new_ids == [3, 4, EOS] and out.stop == "eos"


def test_stops_at_context_limit_without_feeding_too_much():
    # A cycle that never emits <eos>: the sequence ends at max_seq_len + 1 ids, the longest
    # input fed is max_seq_len.
    model = NextTable({3: 4, 4: 5, 5: 3}, max_seq_len=4)
    out = one_row(model, [3, 4], max_seq_len=4, eos_id=EOS)
    assert out.ids == [3, 4, 5, 3, 4] and out.stop == "context"
    assert max(model.seen_lengths) == 4


def test_prompt_at_the_limit_gets_one_token_and_longer_is_refused():
    model = NextTable({3: 4, 4: 3}, max_seq_len=4)
    out = one_row(model, [3, 4, 3, 4], max_seq_len=4, eos_id=EOS)
    assert out.ids == [3, 4, 3, 4, 3] and out.stop == "context"
    with pytest.raises(ContextLengthError, match=r"5 tokens.*max_seq_len=4.*never cropped"):
        one_row(model, [3, 4, 3, 4, 3], max_seq_len=4, eos_id=EOS)


def test_max_new_tokens():
    model = NextTable({3: 4, 4: 3}, max_seq_len=16)
    out = one_row(model, [3], max_seq_len=16, eos_id=EOS, max_new_tokens=3)
    assert out.ids == [3, 4, 3, 4] and out.stop == "max_new_tokens"


class FixedDistribution(nn.Module):
    """Next-token logits = log p for a fixed p, whatever the input."""

    def __init__(self, probs: torch.Tensor) -> None:
        super().__init__()
        self.log_p = nn.Parameter(probs.log(), requires_grad=False)

    def forward(self, ids):
        return self.log_p.expand(*ids.shape, -1)


def test_temperature_sampling_is_seeded_and_follows_the_distribution():
    probs = torch.tensor([0.0, 0.0, 0.0, 0.7, 0.2, 0.1, 0.0, 0.0])
    model = FixedDistribution(probs)

    def draws(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [one_row(model, [1], max_seq_len=4, temperature=1.0, max_new_tokens=1,
                         generator=gen).new_ids[0] for _ in range(2000)]

    first = draws(7)
    assert first == draws(7)  # the seed fixes the samples
    freq = torch.bincount(torch.tensor(first), minlength=V).float() / len(first)
    # 2000 draws: the standard error of a frequency is <= sqrt(0.25/2000) = 0.011; allow 4 sigma.
    assert torch.allclose(freq, probs, atol=0.045)
    # A very low temperature concentrates on the mode (p^(1/T) renormalised).
    gen = torch.Generator().manual_seed(0)
    cold = {one_row(model, [1], max_seq_len=4, temperature=0.01, max_new_tokens=1,
                     generator=gen).new_ids[0] for _ in range(50)}
    assert cold == {3}


# ---- issue 26: logits that hold no distribution, ids on another device, tiny temperatures ----

class BreaksAt(nn.Module):
    """A plain module whose next token is (last id + 1) % V, except that the logits of the rows
    starting with id `first` become `value` (everywhere) once the row holds `length` ids."""

    def __init__(self, first: int, length: int, value: float, vocab: int = 11) -> None:
        super().__init__()
        self.first, self.length, self.value, self.vocab = first, length, value, vocab
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, ids):
        logits = nn.functional.one_hot((ids + 1) % self.vocab, self.vocab).float() * 5
        if ids.shape[1] >= self.length:
            logits[ids[:, 0] == self.first] = self.value
        return logits


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logits_without_a_distribution_are_refused_naming_the_row_and_the_step(value,
                                                                              temperature):
    # row 1 starts with 5; at 4 ids (2 prompt + 2 new) its logits break: step 2, the third new
    # token. Greedy argmax would have returned id 0 for NaN, multinomial a RuntimeError.
    model = BreaksAt(first=5, length=4, value=value)
    with pytest.raises(ValueError) as refused:
        da.generate(model, [[1, 2], [5, 6]], max_new_tokens=4, temperature=temperature,
                    generator=torch.Generator().manual_seed(0))
    assert not isinstance(refused.value, da.DecoderInputError)  # the prompt is fine
    assert (refused.value.row, refused.value.step) == (1, 2)
    assert "row 1" in str(refused.value) and "step 2" in str(refused.value)


def test_a_row_run_alone_is_named_by_its_place_in_the_prompt():
    # ragged prompts for a module without a mask run row by row: the error names row 2 of the
    # caller's prompt, not row 0 of the one-row call it happened in
    model = BreaksAt(first=5, length=1, value=float("nan"))
    with pytest.raises(ValueError) as refused:
        da.generate(model, [[1, 2], [3], [5, 6, 7]], max_new_tokens=2)
    assert (refused.value.row, refused.value.step) == (2, 0)


def test_a_decoder_whose_logits_are_nan_is_refused_through_its_cache():
    model = da.Decoder(da.preset("tiny-368"))
    with torch.no_grad():
        model.ln_final.weight.fill_(float("nan"))
    with pytest.raises(ValueError) as refused:
        da.generate(model, [[1, 3]], max_new_tokens=2)
    assert (refused.value.row, refused.value.step) == (0, 0)


def test_ids_on_another_device_than_the_models_are_refused_naming_both():
    model = da.Decoder(da.preset("tiny-368"))
    with pytest.raises(da.DecoderInputError) as refused:
        da.generate(model, torch.tensor([[1, 3]], device="meta"), max_new_tokens=2)
    assert "meta" in str(refused.value) and "cpu" in str(refused.value)
    with pytest.raises(da.DecoderInputError, match="meta"):  # one row of several, as a tensor
        da.generate(model, [[1, 3], torch.tensor([1], device="meta")], max_new_tokens=2)
    on_meta = da.Decoder(da.preset("tiny-368"), device="meta")
    with pytest.raises(da.DecoderInputError) as refused:
        da.generate(on_meta, torch.tensor([[1, 3]]), max_new_tokens=2)
    assert "meta" in str(refused.value) and "cpu" in str(refused.value)


@pytest.mark.parametrize("temperature", [1e-45, 5e-324])
def test_a_temperature_whose_scores_overflow_draws_among_the_maxima(temperature):
    # logits / 1e-45 overflows float32 (and 5e-324 is 0 in float32): the tokens below the
    # maximum get probability 0, their limit, so the draw is greedy's token
    model = _model(configs.named("gqa-small"))
    greedy = da.generate(model, [[1, 2], [3, 4]], max_new_tokens=4)
    cold = da.generate(model, [[1, 2], [3, 4]], max_new_tokens=4, temperature=temperature,
                       generator=torch.Generator().manual_seed(0))
    assert cold.ids == greedy.ids
    tied = torch.tensor([[2.0, 5.0, 5.0, -1.0]])
    probs = Sampler(temperature, None, None, None).probabilities(tied)[0]
    assert probs.tolist() == [0.0, 0.5, 0.5, 0.0]


@pytest.mark.parametrize("wrapper", ["BridgeLike", "WrapperLike", "KVGPTLike"])
def test_generate_drives_a_forward_whose_names_suggest_another_convention(wrapper):
    """A `past_key_values` or `cache` parameter is not taken on trust: generate calls the model
    as it works (ids positionally, no cache it cannot step), and greedy output equals the
    wrapped decoder's own."""
    import zoo_foreign
    from helpers import random_decoder

    inner = random_decoder(da.preset("tiny-368"))
    model = getattr(zoo_foreign, wrapper)(inner)
    want = da.generate(inner, [1, 3], max_new_tokens=2)
    got = da.generate(model, [1, 3], max_new_tokens=2, max_seq_len=4)
    assert got.ids == want.ids
