"""window: a declared sliding window is attended exactly, read at each layer's attention module,
whatever its size. The expectation is the declaration itself: a windowed layer of W reads token 0
from positions 1..W-1 and not from W on; a full layer reads it everywhere."""

from __future__ import annotations

import pytest
import torch
import zoo_windows
from zoo_windows import SPEC, WINDOWED, WindowLlama

import decoder_audit as da


def _reach(report):
    return {r["layer"]: (r["declared"], r["farthest_read"])
            for r in report["window"].evidence["layers"]}


def test_our_windowed_decoder_reads_exactly_its_windows():
    report = da.audit(da.Decoder(WINDOWED), checks=["window"])
    window = report["window"]
    assert window.passed, window.detail
    seq_len = window.evidence["seq_len"]
    assert seq_len == 16 + 2
    # layers 0 and 2 are windowed to 16 (token 0 read from 15 positions back at most), 1 and 3 full
    assert _reach(report) == {0: (16, 15), 1: (None, seq_len - 1), 2: (16, 15),
                              3: (None, seq_len - 1)}


@pytest.mark.parametrize("mutant, layer", [(zoo_windows.dropped_window, 0),
                                           (zoo_windows.window_on_full_layer, 1),
                                           (zoo_windows.window_one_too_wide, 0)])
def test_a_window_dropped_added_or_widened_fails_window_only(mutant, layer):
    report = da.audit(mutant())
    assert [c.name for c in report.failures] == ["window"], report.first_failure
    first = next(r for r in report["window"].evidence["layers"]
                 if r["read_outside"] or r["unread_inside"])
    assert first["layer"] == layer


def test_a_real_window_size_is_held_against_the_module():
    """A window of 4096 positions, read at T = 4098 (a tiny width keeps it fast)."""
    cfg = da.DecoderConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, d_ff=16,
                           max_seq_len=4200, norm="rmsnorm", mlp="swiglu", pos="rope",
                           sliding_window=4096, window_layers=(1,))
    correct = da.audit(da.Decoder(cfg), checks=["window"])["window"]
    assert correct.passed and correct.evidence["seq_len"] == 4098, correct.detail
    assert _reach_of(correct) == {0: 4097, 1: 4095}
    dropped = da.audit(zoo_windows.dropped_window(cfg.replace(window_layers=(0, 1))),
                       checks=["window"])["window"]
    assert not dropped.passed and dropped.evidence["layers"][0]["read_outside"][0] == 4096


def _reach_of(check):
    return {r["layer"]: r["farthest_read"] for r in check.evidence["layers"]}


def test_a_window_that_never_binds_is_skipped_with_the_reason():
    cfg = WINDOWED.replace(sliding_window=48)  # as long as max_seq_len: it excludes nothing
    check = da.audit(da.Decoder(cfg), checks=["window"])["window"]
    assert check.skipped and "48" in check.evidence["reason"]


def test_a_spec_declared_window_is_held_against_a_module_of_its_own():
    """A spec declaring a window of 16 on a module that attends every earlier token: the oracle
    (T <= 12) cannot see it, the window check does."""
    correct = da.audit(WindowLlama(16), spec=SPEC)
    assert correct.passed, correct.first_failure
    assert not correct["window"].skipped
    full = da.audit(WindowLlama(None), spec=SPEC)
    assert [c.name for c in full.failures] == ["window"], full.first_failure


def test_a_spec_window_the_window_check_cannot_read_is_held_by_the_oracle():
    """examples/learner's GPT keeps its attention in a method: no module per layer, so `window`
    is skipped. A spec declaring a window of 16 passed the full-attention model (the oracle ran
    at T = 8); the oracle now runs past the window (T = 17), so the full model fails it and the
    windowed one passes."""
    full = da.audit(zoo_windows.learner_gpt(None), spec=zoo_windows.LEARNER_SPEC)
    assert full["window"].skipped and "T = 17" in full["window"].detail
    assert [c.name for c in full.failures] == ["oracle"], full.first_failure
    assert full["oracle"].evidence["seq_len"] == 17
    windowed = da.audit(zoo_windows.learner_gpt(16), spec=zoo_windows.LEARNER_SPEC)
    assert windowed.passed, windowed.first_failure
    assert windowed["oracle"].evidence["seq_len"] == 17


def _gemma2(tf, window):
    torch.manual_seed(0)
    config = tf.Gemma2Config(vocab_size=37, hidden_size=16, intermediate_size=24,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=8, max_position_embeddings=64, pad_token_id=0,
                             sliding_window=window,
                             layer_types=["sliding_attention", "full_attention"])
    return tf.Gemma2ForCausalLM(config).eval()


def test_hugging_face_windows_are_read_from_the_config_and_held_against_the_layers():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    mistral = tf.MistralForCausalLM(tf.MistralConfig(
        vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=6)).eval()
    check = da.audit(mistral, checks=["window"])["window"]
    assert check.passed, check.detail
    assert _reach_of(check) == {0: 5, 1: 5}
    gemma = _gemma2(tf, 16)
    check = da.audit(gemma, checks=["window"])["window"]
    assert check.passed, check.detail
    assert _reach_of(check) == {0: 15, 1: 17}


def test_a_gemma2_layer_that_ignores_its_window_of_16_fails_window_not_the_oracle():
    tf = pytest.importorskip("transformers")
    model = _gemma2(tf, 16)
    model.model.layers[0].self_attn.register_forward_pre_hook(_full_mask, with_kwargs=True)
    report = da.audit(model, checks=["window", "oracle", "params"])
    assert report["oracle"].passed and report["params"].passed
    assert not report["window"].passed
    assert report["window"].evidence["layers"][0]["read_outside"][0] == 16


def test_a_gemma2_whose_config_no_longer_windows_layer_0_fails_window_at_that_layer():
    """Layer 0 built as a sliding layer of 16 (its attention module says so), then the config
    edited to call it full: the model's masks follow the edited config, so layer 0 attends every
    earlier token. The config alone declared no window there, and the model passed; the layer's
    own declaration holds it to 16."""
    tf = pytest.importorskip("transformers")
    model = _gemma2(tf, 16)
    if getattr(model.model.layers[0].self_attn, "layer_type", None) != "sliding_attention":
        pytest.skip("this release's attention module does not record the kind it was built as")
    model.config.layer_types = ["full_attention", "full_attention"]
    report = da.audit(model, checks=["window"])
    check = report["window"]
    assert not check.passed and check.evidence["windows"] == [16, None], check.detail
    assert check.evidence["layers"][0]["read_outside"][0] == 16
    assert any("model.layers.0.self_attn" in note and "16" in note for note in report.notes)
    built_full = _gemma2(tf, 16)  # the same layers built full from the start: nothing declared
    built_full.config.layer_types = ["full_attention", "full_attention"]
    for layer in built_full.model.layers:
        layer.self_attn.layer_type, layer.self_attn.sliding_window = "full_attention", None
    assert da.audit(built_full, checks=["window"])["window"].skipped


def _full_mask(_module, args, kwargs):
    """The attention path drops the sliding mask it is handed and attends the full causal
    square (the config still declares the window)."""
    mask = kwargs.get("attention_mask")
    if mask is None:
        return None
    seq_len = mask.shape[-2]
    causal = torch.ones(seq_len, mask.shape[-1], dtype=torch.bool).tril()
    full = causal if mask.dtype == torch.bool else torch.zeros(causal.shape, dtype=mask.dtype
                                                               ).masked_fill(
        ~causal, torch.finfo(mask.dtype).min)
    return args, {**kwargs, "attention_mask": full.expand(mask.shape)}


def _qwen2(tf, **fields):
    torch.manual_seed(0)
    config = tf.Qwen2Config(vocab_size=37, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=64, sliding_window=4, **fields)
    return tf.Qwen2ForCausalLM(config).eval()


def _windowed_mask(window):
    """The attention path narrows the mask it is handed to the last `window` keys (the config
    declares the layer full)."""
    def hook(_module, args, kwargs):
        mask = kwargs.get("attention_mask")
        seq_len = kwargs["hidden_states"].shape[-2] if mask is None else mask.shape[-2]
        rows = torch.arange(seq_len)
        allowed = (rows[:, None] >= rows[None]) & (rows[:, None] - rows[None] < window)
        narrowed = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        return args, {**kwargs, "attention_mask": narrowed[None, None]}
    return hook


def test_a_window_switched_on_for_no_layer_holds_every_layer_full():
    """Qwen2 with use_sliding_window and max_window_layers = its 2 layers: the window of 4 is
    declared and scoped to no layer, so both layers must read every earlier position; a layer
    windowed in anyway (transformers 4.52's mask did it) fails."""
    tf = pytest.importorskip("transformers")
    model = _qwen2(tf, use_sliding_window=True, max_window_layers=2)
    check = da.audit(model, checks=["window"])["window"]
    assert check.passed and not check.skipped, check.detail
    assert check.evidence["windows"] == [None, None]
    model.model.layers[1].self_attn.register_forward_pre_hook(_windowed_mask(4),
                                                              with_kwargs=True)
    check = da.audit(model, checks=["window"])["window"]
    assert not check.passed and "layer 1" in check.detail


def test_a_window_in_a_family_that_does_not_scope_it_per_layer_declares_nothing():
    """MiniMax's and DeepSeek-V4's layer kinds are not "sliding_attention", and their families
    window those layers anyway: with no per-layer scope (max_window_layers) nothing is read as
    declared full."""
    from types import SimpleNamespace

    from decoder_audit.references.hf_windows import declared_windows

    minimax = SimpleNamespace(model_type="minimax", sliding_window=8, num_hidden_layers=2,
                              layer_types=["full_attention", "linear_attention"])
    assert declared_windows(minimax) is None
    qwen = SimpleNamespace(model_type="qwen3", sliding_window=8, num_hidden_layers=2,
                           use_sliding_window=True, max_window_layers=2,
                           layer_types=["full_attention", "full_attention"])
    assert declared_windows(qwen) == (None, None)
