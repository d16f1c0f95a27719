"""DecoderConfig: validation before any weight exists, derived values, JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import configs
import pytest

import decoder_audit as da
from decoder_audit import ConfigError, DecoderConfig

BASE = dict(vocab_size=11, d_model=12, n_layers=2, n_heads=6, d_ff=20, max_seq_len=9)


def make(**changes):
    return DecoderConfig(**{**BASE, **changes})


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "n_layers", "n_heads", "d_ff",
                                   "max_seq_len"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_non_positive_or_non_integer_sizes_are_rejected_by_name(field, value):
    with pytest.raises(ConfigError, match=f"{field}={value!r}"):
        make(**{field: value})


@pytest.mark.parametrize("changes, message", [
    (dict(d_model=12, n_heads=5), "d_model=12 is not divisible by n_heads=5"),
    (dict(n_heads=6, n_kv_heads=4), "n_heads=6 is not divisible by n_kv_heads=4"),
    (dict(n_kv_heads=0), "n_kv_heads=0"),
    (dict(d_model=18, n_heads=6, pos="rope"), "Dh=3 is odd"),
    (dict(d_model=16, n_heads=4, head_width=5, pos="rope"), "Dh=5 is odd"),
    (dict(head_width=0), "head_width=0"),
    (dict(attn_output_bias="no"), "attn_output_bias='no'"),
    (dict(qk_norm=1), "qk_norm=1"),
    (dict(rope_layout="pairs"), "rope_layout='pairs' is not one of"),
    (dict(embedding_scale=0.0), "embedding_scale=0.0"),
    (dict(norm_offset=float("nan")), "norm_offset=nan"),
    (dict(norm="batchnorm"), "norm='batchnorm' is not one of"),
    (dict(mlp="reglu"), "mlp='reglu' is not one of"),
    (dict(pos="xpos"), "pos='xpos' is not one of"),
    (dict(context_policy="crop"), "context_policy='crop' is not one of ['reject']"),
    (dict(norm_eps=-1e-5), "norm_eps=-1e-05 must be a finite number >= 0"),
    (dict(rope_theta=-10.0), "rope_theta=-10.0 must be a finite number >= 0"),
    (dict(rope_theta=0.0, pos="rope"), "rope_theta=0.0 must be > 0"),
    (dict(tie_embeddings="yes"), "tie_embeddings='yes' must be true or false"),
    (dict(pos="rope", rotary_dim=3), "rotary_dim=3 must be even and at most"),
    (dict(pos="rope", rotary_dim=4, d_model=12, n_heads=6), "rotary_dim=4 must be even and at "
     "most the head width Dh=2"),
    (dict(rotary_dim=2), "need pos='rope', not 'learned'"),
    (dict(parallel_residual="yes"), "parallel_residual='yes' must be true or false"),
    (dict(pos="rope", rope_scaling={"type": "ntk"}), "rope_scaling='ntk'"),
    (dict(pos="rope", rope_scaling={"type": "linear"}), "'linear' needs 'factor'"),
    (dict(pos="rope", rope_scaling={"type": "linear", "factor": 2.0, "beta": 1}),
     "unknown key(s) ['beta']"),
    (dict(pos="rope", rope_scaling={"type": "linear", "factor": 0.0}), "factor=0.0 must be a "
     "finite number > 0"),
    (dict(pos="rope", rope_scaling={"type": "yarn", "factor": 2.0, "original_max_seq_len": 4,
                                    "truncate": 1}), "truncate=1 must be true or false"),
    (dict(pos="rope", rope_scaling={"type": "llama3", "factor": 8.0, "original_max_seq_len": 64,
                                    "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
     "high_freq_factor=1.0 must exceed low_freq_factor=4.0"),
    (dict(pos="rope", rope_scaling={"type": "dynamic", "factor": 2.0, "original_max_seq_len": 4},
          d_model=12, n_heads=6), "at least 4, got 2"),
    (dict(pos="rope", rope_scaling=[1.0]), "rope_scaling=[1.0]"),
    (dict(sliding_window=0), "sliding_window=0"),
    (dict(sliding_window=4, window_layers=(0, 2)), "window_layers=(0, 2) must list distinct "
     "layers in [0, n_layers=2)"),
    (dict(sliding_window=4, window_layers=(1, 1)), "window_layers=(1, 1)"),
    (dict(window_layers=(0,)), "window_layers=[0] needs a sliding_window"),
    (dict(attn_scale=-1.0), "attn_scale=-1.0 must be a finite number > 0"),
    (dict(attn_softcap=0.0), "attn_softcap=0.0"),
    (dict(logit_softcap=float("inf")), "logit_softcap=inf"),
    (dict(sandwich_norm=None), "sandwich_norm=None must be true or false"),
    (dict(norm_affine=False), "norm_affine=False with norm_bias=True"),
    (dict(pre_norm=0), "pre_norm=0 must be true or false"),
    (dict(readout_bias="no"), "readout_bias='no' must be true or false"),
    (dict(qk_norm_scope="all"), "qk_norm_scope='all' is not one of"),
    (dict(pos="rope", window_rope_theta=10.0), "window_rope_theta=10.0 needs pos='rope' and a "
     "sliding_window"),
    (dict(pos="rope", sliding_window=2, window_rope_theta=-1.0), "window_rope_theta=-1.0 must "
     "be a finite number > 0"),
    (dict(position_offset=-2), "position_offset=-2 must be an integer >= 0"),
    (dict(position_offset=1.5), "position_offset=1.5 must be an integer >= 0"),
    (dict(pos="rope", position_offset=2), "position_offset=2 needs pos='learned' or "
     "'sinusoidal'"),
    # the positions and norm placements of BLOOM, MPT, XGLM, GPT-1 and Persimmon
    (dict(embedding_norm="yes"), "embedding_norm='yes' must be true or false"),
    (dict(final_norm=1), "final_norm=1 must be true or false"),
    (dict(post_norm=True), "post_norm=True (x = N(x + F(x))) takes pre_norm=False"),
    (dict(post_norm=True, pre_norm=False, sandwich_norm=True), "got sandwich_norm=True"),
    (dict(post_norm=True, pre_norm=False, parallel_residual=True), "got parallel_residual=True"),
    (dict(pos="alibi", position_offset=2), "position_offset=2 needs pos='learned' or "
     "'sinusoidal'"),
    (dict(pos="sinusoidal", d_model=3, n_heads=1), "pos='sinusoidal' needs d_model >= 4"),
    (dict(qk_norm_kind="layernorm"), "qk_norm_kind='layernorm' needs qk_norm=True"),
    (dict(qk_norm=True, qk_norm_kind="batchnorm"), "qk_norm_kind='batchnorm' is not one of"),
    (dict(pos="alibi", rotary_dim=2), "need pos='rope', not 'alibi'"),
    (dict(pos="alibi", nope_layers=(1,)), "nope_layers=[1] needs pos='rope'"),
])
def test_each_bad_field_is_named_with_its_value(changes, message):
    with pytest.raises(ConfigError) as info:
        make(**changes)
    assert message in str(info.value)


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        make(vocab_size=0, norm="x", mlp="y")
    text = str(info.value)
    assert "vocab_size=0" in text and "norm='x'" in text and "mlp='y'" in text


def test_odd_head_width_is_fine_without_rope():
    assert make(d_model=18, n_heads=6, pos="learned").head_dim == 3


def test_derived_values():
    cfg = make(d_model=24, n_heads=6, n_kv_heads=2)
    assert (cfg.head_dim, cfg.kv_heads, cfg.kv_group_size) == (4, 2, 3)
    mha = make(d_model=24, n_heads=6)
    assert (mha.kv_heads, mha.kv_group_size) == (6, 1)


def test_frozen():
    cfg = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 8


def test_window_layers_read_back_from_json_as_the_same_config():
    cfg = make(sliding_window=3, window_layers=[1])
    assert cfg.window_layers == (1,) and (cfg.window(0), cfg.window(1)) == (None, 3)
    assert DecoderConfig.from_json(cfg.to_json()) == cfg
    assert make(sliding_window=3).window(0) == 3


def test_the_config_keeps_its_own_copy_of_rope_scaling():
    """The caller's dict changing later does not change a validated config."""
    scaling = {"type": "linear", "factor": 2.0}
    cfg = make(pos="rope", rope_scaling=scaling)
    scaling["factor"] = -1.0
    assert cfg.rope_scaling == {"type": "linear", "factor": 2.0}
    assert cfg.rope_parameter("factor") == 2.0
    yarn = make(pos="rope", rope_scaling={"type": "yarn", "factor": 2.0,
                                          "original_max_seq_len": 4})
    assert (yarn.rope_parameter("beta_fast"), yarn.rope_parameter("truncate")) == (32.0, True)


@pytest.mark.parametrize("cfg", configs.params(configs.everything()))
def test_json_round_trip(tmp_path, cfg):
    path = tmp_path / "cfg.json"
    cfg.save(path)
    assert DecoderConfig.load(path) == cfg
    assert json.loads(path.read_text())["n_kv_heads"] == cfg.n_kv_heads


def test_json_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="unknown config field"):
        DecoderConfig.from_dict({**BASE, "n_embd": 3})
    with pytest.raises(ConfigError, match=r"missing required config field\(s\) \['d_ff'\]"):
        DecoderConfig.from_dict({k: v for k, v in BASE.items() if k != "d_ff"})
    with pytest.raises(ConfigError, match="not valid JSON"):
        DecoderConfig.from_json("{")
    with pytest.raises(ConfigError, match="does not exist"):
        DecoderConfig.load(tmp_path / "missing.json")


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown preset 'gpt5'.*tiny-368"):
        da.preset("gpt5")


def test_cs336_test_preset_matches_the_reference_config(cs336_reference):
    ref = json.loads((cs336_reference / "model_config.json").read_text())
    cfg = da.preset("cs336-test")
    assert (cfg.vocab_size, cfg.max_seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff,
            cfg.rope_theta) == (ref["vocab_size"], ref["context_length"], ref["d_model"],
                                ref["num_layers"], ref["num_heads"], ref["d_ff"], ref["rope_theta"])
    assert (cfg.norm, cfg.pos, cfg.mlp, cfg.tie_embeddings) == ("rmsnorm", "rope", "swiglu", False)


def test_a_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(da.ConfigError, match=r"is not UTF-8 text \(byte 0xff at offset 0\)"):
        da.DecoderConfig.load(path)
