"""Config fields whose form changed inside the transformers range the project supports
(docs/transformers-range.md), each read in every form. Every test builds its model from the
form a transformers 4 config.json holds (`rope_scaling` keyed `type` or `rope_type` beside a
flat `rope_theta`; no `layer_types`; GPT-NeoX's `rotary_pct`; Gemma's `hidden_activation`):
on a 4.x release that is the form the model runs on, on 5.x the form transformers converts on
loading. The expectations are read by hand from each family's modeling file; `.ci/
transformers-range` runs this file in the floor, the newest and each release where a form
changed. The last tests read the 4.x forms from a stand-in config class, on any release."""

from __future__ import annotations

import math

import pytest
import torch
from hf_compat import hf_class, layer_kwargs, release_bugs, yarn_bug

import decoder_audit as da
from decoder_audit.references.hf import hf_spec
from decoder_audit.references.hf_config import config_from_hf

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

COMMON = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_attention_heads=2,
              num_key_value_heads=1, bos_token_id=0, eos_token_id=1, pad_token_id=None,
              attn_implementation="eager")

SCALINGS = {  # rope_scaling as 4.x configs hold it -> our rope_scaling, by the papers' names
    "linear": ({"factor": 3.0}, {"type": "linear", "factor": 3.0}),
    "dynamic": ({"factor": 2.0}, {"type": "dynamic", "factor": 2.0, "original_max_seq_len": 12}),
    "llama3": ({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64},
               {"type": "llama3", "factor": 8.0, "original_max_seq_len": 64,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    "yarn": ({"factor": 4.0, "original_max_position_embeddings": 6},
             {"type": "yarn", "factor": 4.0, "original_max_seq_len": 6, "beta_fast": 32.0,
              "beta_slow": 1.0, "attention_factor": None, "truncate": True}),
}


@pytest.mark.parametrize("key", ["type", "rope_type"])
@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_a_llama_with_4x_rope_scaling_is_read_and_passes_the_oracle(kind, key):
    """Before the 4.x form was read, transformers 4 scaled these models' RoPE and the spec did
    not: `oracle` failed on every one (a false alarm)."""
    if kind == "yarn" and yarn_bug(tf.LlamaConfig):
        pytest.skip(yarn_bug(tf.LlamaConfig))
    legacy, expected = SCALINGS[kind]
    torch.manual_seed(0)
    config = tf.LlamaConfig(**COMMON, num_hidden_layers=2, head_dim=8, max_position_embeddings=12,
                            rope_theta=50.0, rope_scaling={key: kind, **legacy})
    model = tf.LlamaForCausalLM(config).eval()
    if kind == "dynamic" and not _dynamic_is_plain_below_its_length(model):
        pytest.skip("this release's dynamic RoPE keeps a base a longer call grew")
    report = da.audit(model, checks=["params", "oracle"])
    spec = report.facts.spec
    assert (spec.rope_theta, spec.rope_scaling) == (50.0, expected)
    assert report["oracle"].passed and report["oracle"].evidence["stressed"], \
        report["oracle"].detail


def _dynamic_is_plain_below_its_length(model) -> bool:
    """Dynamic NTK scales nothing up to max_position_embeddings, also after a longer call grew
    its base: the model's logits at T = 8 of 12, after a call at T = 36, equal those of the same
    weights with unscaled RoPE (5.0-5.x kept the grown base)."""
    config = tf.LlamaConfig(**COMMON, num_hidden_layers=2, head_dim=8, max_position_embeddings=12,
                            rope_theta=50.0)
    plain = tf.LlamaForCausalLM(config).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    ids = torch.arange(8)[None] % 37
    with torch.no_grad():
        model(torch.arange(36)[None] % 37)
        return torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-6, rtol=0)


def test_gemma2_without_layer_types_windows_its_even_layers():
    """Gemma 2 before 4.53 has no layer_types: its modeling windows layer i when
    `not bool(layer_idx % 2)`. Read as windowed on every layer, the odd layers failed `oracle`
    past the window (a false alarm)."""
    torch.manual_seed(0)
    config = tf.Gemma2Config(**{**COMMON, "pad_token_id": 0}, num_hidden_layers=4, head_dim=8,
                             max_position_embeddings=12, query_pre_attn_scalar=8,
                             sliding_window=3)
    model = tf.Gemma2ForCausalLM(config).eval()
    report = da.audit(model)
    assert (report.facts.spec.sliding_window, report.facts.spec.window_layers) == (3, (0, 2))
    assert report["oracle"].passed, report["oracle"].detail
    failed = {check.name for check in report.checks if not check.passed}
    assert failed <= set(release_bugs(model)), report.first_failure


def test_gemma3_sliding_window_pattern_and_local_base_are_read():
    """Gemma 3 before 4.53 windows every layer but each sliding_window_pattern-th
    (`bool((layer_idx + 1) % pattern)`), its windowed layers on rope_local_base_freq."""
    config_class = hf_class("Gemma3TextConfig")
    torch.manual_seed(0)
    config = config_class(**{**COMMON, "pad_token_id": 0}, num_hidden_layers=4, head_dim=8,
                          max_position_embeddings=12, query_pre_attn_scalar=8, sliding_window=3,
                          sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=10.0)
    report = da.audit(hf_class("Gemma3ForCausalLM")(config).eval(), checks=["params", "oracle"])
    spec = report.facts.spec
    assert (spec.window_layers, spec.rope_theta, spec.window_rope_theta) == ((0, 2), 1e6, 10.0)
    assert report["oracle"].passed, report["oracle"].detail


def test_qwen2_windows_the_layers_from_max_window_layers_on():
    """Before layer_types (4.53) Qwen2's window applies from layer max_window_layers on, when
    use_sliding_window is set; 4.53 wrote the same rule into layer_types."""
    config = tf.Qwen2Config(**COMMON, num_hidden_layers=3, max_position_embeddings=12,
                            use_sliding_window=True, sliding_window=3, max_window_layers=1)
    spec = hf_spec(tf.Qwen2ForCausalLM(config))
    assert (spec.sliding_window, spec.window_layers) == (3, (1, 2))


def test_gpt_neox_rotary_pct_and_rotary_emb_base_are_read():
    """GPT-NeoX 4.x rotates int(head_size * rotary_pct) features on base rotary_emb_base."""
    torch.manual_seed(0)
    config = tf.GPTNeoXConfig(**COMMON, num_hidden_layers=2, max_position_embeddings=12,
                              rotary_pct=0.5, rotary_emb_base=100)
    report = da.audit(tf.GPTNeoXForCausalLM(config).eval(), checks=["params", "oracle"])
    assert (report.facts.spec.rotary_dim, report.facts.spec.rope_theta) == (4, 100.0)
    assert report["oracle"].passed, report["oracle"].detail


def test_gemma_hidden_activation_is_the_gate_its_config_declares():
    """Gemma's published configs carry the legacy hidden_act="gelu" beside hidden_activation=
    "gelu_pytorch_tanh", the gate they mean (4.45-4.47 read hidden_activation; 5.20 reads
    hidden_act="gelu" as tanh). Where the release's MLP computes exact GELU instead (4.48 to
    5.19 read hidden_act alone), `oracle` names that shipped defect; elsewhere it passes."""
    torch.manual_seed(0)
    config = tf.GemmaConfig(**{**COMMON, "pad_token_id": 0}, num_hidden_layers=2, head_dim=8,
                            max_position_embeddings=12, hidden_act="gelu",
                            hidden_activation="gelu_pytorch_tanh")
    model = tf.GemmaForCausalLM(config).eval()
    x = torch.linspace(-3, 3, 61)
    tanh_gelu = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    runs_tanh = torch.allclose(model.model.layers[0].mlp.act_fn(x), tanh_gelu, atol=1e-6)
    report = da.audit(model, checks=["params", "oracle"])
    assert report.facts.spec.mlp == "geglu"
    assert report["oracle"].passed == runs_tanh, report["oracle"].detail


# ---- the 4.x forms, read from a stand-in config class on any release -------------------------

class Legacy4xConfig:
    """A transformers 4 LlamaConfig's fields as plain attributes (its `rope_scaling` is no
    property, and its class takes no layer_types); a stray rope_parameters is what 4.x's
    modeling ignores."""

    def __init__(self, **fields):
        base = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                    rms_norm_eps=1e-6, hidden_act="silu", rope_theta=10000.0, rope_scaling=None,
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                    head_dim=8)
        vars(self).update(base, **fields)


def test_the_4x_rope_form_is_read_on_any_release():
    legacy = Legacy4xConfig(rope_theta=500.0, rope_scaling={"type": "yarn", "factor": 2.0},
                            rope_parameters={"rope_type": "default", "rope_theta": 1.0})
    cfg = config_from_hf(legacy, "llama")
    assert cfg.rope_theta == 500.0  # the stray 5.x field is not read
    # no original_max_position_embeddings: max_position_embeddings, as transformers completes it
    assert (cfg.rope_scaling["type"], cfg.rope_scaling["factor"],
            cfg.rope_scaling["original_max_seq_len"]) == ("yarn", 2.0, 32)


def test_the_legacy_window_rules_are_read_on_any_release():
    gemma2 = Legacy4xConfig(sliding_window=3, hidden_activation="gelu_pytorch_tanh",
                            query_pre_attn_scalar=8, attn_logit_softcapping=None,
                            final_logit_softcapping=None,
                            layer_types=["full_attention"] * 4)  # a stray attribute: ignored
    assert config_from_hf(gemma2, "gemma2").window_layers == (0, 2)
    qwen2 = Legacy4xConfig(sliding_window=3, use_sliding_window=True, max_window_layers=3)
    assert config_from_hf(qwen2, "qwen2").window_layers == (3,)
    assert config_from_hf(Legacy4xConfig(sliding_window=3), "mistral").window_layers is None


def test_a_gemma3_without_windowed_layers_reads_with_one_base():
    """sliding_window_pattern=1 (or every layer full_attention) windows no layer: the spec has
    no window, and no windowed layers' base (it was an invalid DecoderConfig)."""
    config_class = hf_class("Gemma3TextConfig")
    config = config_class(num_hidden_layers=2, sliding_window=3, **layer_kwargs(
        config_class, ["full_attention"] * 2, sliding_window_pattern=1))
    cfg = config_from_hf(config, "gemma3_text")
    assert (cfg.sliding_window, cfg.window_rope_theta) == (None, None)


# ---- the caches a caller builds, as each release's classes behave -----------------------------

def _labels(model) -> list[str]:
    from decoder_audit.references.hf_caches import caller_caches

    return [label.split(" of ")[0] for label, _ in caller_caches(model, 2, 8)[0]]


def test_a_window_switched_off_takes_no_windowed_cache():
    """Qwen2 in 4.50-4.52 keeps sliding_window=4096 beside use_sliding_window=False: no layer
    is windowed, and a HybridCache (its even layers windowed) would be a false alarm."""
    model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, num_hidden_layers=2,
                                               max_position_embeddings=12))
    model.config.use_sliding_window, model.config.sliding_window = False, 4096
    assert not {"SlidingWindowCache", "HybridCache"} & set(_labels(model))


def test_alternating_windows_take_no_cache_that_windows_every_layer():
    """SlidingWindowCache windows every layer: Gemma 2's full odd layers would lose their keys."""
    model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**{**COMMON, "pad_token_id": 0},
                                                 num_hidden_layers=2, head_dim=8,
                                                 max_position_embeddings=12, sliding_window=3))
    assert "SlidingWindowCache" not in _labels(model)


def test_slots_kept_after_reset_is_what_the_next_prefill_appends_after():
    """A reset cache that still holds slots (4.54-5.2x's DynamicCache zeroes its tensors and
    keeps them) is seen by `slots_kept`: the next prefill's cache then holds more than its own
    tokens; one that empties says 0 and holds exactly them."""
    from decoder_audit.references.hf_caches import caller_caches, slots_kept

    model = tf.MistralForCausalLM(tf.MistralConfig(**COMMON, num_hidden_layers=2,
                                                   max_position_embeddings=12)).eval()
    ids = torch.zeros(1, 5, dtype=torch.long)
    for label, build in caller_caches(model, 1, 8)[0]:
        cache = build()
        if label != "DynamicCache" or not callable(getattr(cache, "reset", None)):
            continue  # the pre-sized caches hold their slots by design
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        cache.reset()
        kept = slots_kept(cache)
        try:
            with torch.no_grad():
                model(input_ids=ids, past_key_values=cache, use_cache=True)
            held = cache.layers[0].keys.shape[-2]
        except RuntimeError:  # the slots kept break the prefill itself (its mask is too short)
            held = None
        assert (kept == 0) == (held == ids.shape[1]), (label, kept, held)
