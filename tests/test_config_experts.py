"""DecoderConfig's routed experts and latent attention: every bad field named with its value
before a weight exists, all at once; the derived widths and which layers route, against the
families' own rules written out here."""

from __future__ import annotations

import math
import re

import pytest

from decoder_audit import ConfigError, DecoderConfig

BASE = dict(vocab_size=11, d_model=16, n_layers=4, n_heads=4, d_ff=20, max_seq_len=9,
            norm="rmsnorm", mlp="swiglu", pos="rope")
MOE = dict(n_experts=4, experts_per_token=2)
MLA = dict(kv_latent_rank=8, rope_head_width=4, nope_head_width=6, value_head_width=5)


def make(**changes):
    return DecoderConfig(**{**BASE, **changes})


@pytest.mark.parametrize("changes, message", [
    (dict(n_experts=0, experts_per_token=1), "n_experts=0 must be a positive integer"),
    (dict(n_experts=4), "n_experts=4 needs experts_per_token"),
    (dict(n_experts=4, experts_per_token=5), "experts_per_token=5 exceeds n_experts=4"),
    (dict(MOE, expert_width=2.5), "expert_width=2.5 must be a positive integer"),
    (dict(MOE, n_shared_experts=-1), "n_shared_experts=-1 must be an integer >= 0"),
    (dict(MOE, shared_expert_width=8), "shared_expert_width=8 needs n_shared_experts >= 1"),
    (dict(MOE, shared_expert_gate=True), "shared_expert_gate=True needs n_shared_experts >= 1"),
    (dict(MOE, n_shared_experts=1, shared_expert_gate="yes"), "shared_expert_gate='yes' must be "
     "true or false"),
    (dict(MOE, router_scoring="relu"), "router_scoring='relu' is not one of"),
    (dict(MOE, router_order="both"), "router_order='both' is not one of"),
    (dict(MOE, normalize_topk=1), "normalize_topk=1 must be true or false"),
    (dict(MOE, router_selection_bias="yes"), "router_selection_bias='yes' must be true"),
    (dict(MOE, routed_scaling=0.0), "routed_scaling=0.0 must be a finite number > 0"),
    (dict(MOE, routed_scaling=float("inf")), "routed_scaling=inf"),
    (dict(MOE, capacity_factor=-1.0), "capacity_factor=-1.0 must be a finite number > 0"),
    (dict(MOE, moe_every=0), "moe_every=0 must be an integer >= 1"),
    (dict(MOE, first_dense_layers=4), "first_dense_layers=4, moe_every=1 leave no routed layer "
     "among n_layers=4"),
    (dict(MOE, moe_every=5), "leave no routed layer"),
    (dict(MOE, mlp_bias=True), "mlp_bias=True with n_experts=4"),
    (dict(MOE, mlp_bias=("w2",)), "mlp_bias=['w2'] with n_experts=4"),
    (dict(experts_per_token=2, routed_scaling=2.5), "experts_per_token=2, routed_scaling=2.5 "
     "need n_experts"),
    (dict(first_dense_layers=1), "first_dense_layers=1 needs n_experts"),
    (dict(capacity_factor=1.25), "capacity_factor=1.25 needs n_experts"),
    (dict(MOE, expert_groups=3, groups_per_token=1), "expert_groups=3 does not divide "
     "n_experts=4"),
    (dict(MOE, expert_groups=2), "expert_groups=2, groups_per_token=None: give both"),
    (dict(MOE, expert_groups=2, groups_per_token=3), "groups_per_token=3 exceeds "
     "expert_groups=2"),
    (dict(n_experts=8, experts_per_token=5, expert_groups=4, groups_per_token=2),
     "experts_per_token=5 exceeds the 2 x 2 experts of groups_per_token=2 groups"),
    (dict(MOE, expert_groups=4, groups_per_token=2), "group_score='top2_sum' needs groups of 2"),
    (dict(MOE, expert_groups=2, groups_per_token=1, group_score="mean"), "group_score='mean' is "
     "not one of"),
    (dict(expert_groups=2, groups_per_token=1), "expert_groups=2, groups_per_token=1 need "
     "n_experts"),
    (dict(kv_latent_rank=8), "kv_latent_rank=8 needs rope_head_width, nope_head_width, "
     "value_head_width"),
    (dict(MLA, rope_head_width=3), "rope_head_width=3 is odd"),
    (dict(MLA, kv_latent_rank=-2), "kv_latent_rank=-2 must be a positive integer"),
    (dict(MLA, q_latent_rank=0), "q_latent_rank=0 must be a positive integer"),
    (dict(MLA, pos="learned"), "pos='learned'"),
    (dict(MLA, n_kv_heads=2), "n_kv_heads=2"),
    (dict(MLA, head_width=8), "head_width=8"),
    (dict(MLA, rotary_dim=2), "rotary_dim=2"),
    (dict(MLA, attn_bias=True), "attn_bias=True"),
    (dict(MLA, qk_norm=True), "qk_norm=True"),
    (dict(q_latent_rank=6, value_head_width=5), "q_latent_rank=6, value_head_width=5 need "
     "kv_latent_rank"),
    (dict(latent_norm_eps=1e-6), "latent_norm_eps=1e-06 needs kv_latent_rank"),
    (dict(MLA, latent_norm_eps=-1.0), "latent_norm_eps=-1.0 must be a finite number >= 0"),
    (dict(MLA, latent_norm_eps=float("inf")), "latent_norm_eps=inf must be a finite number"),
])
def test_each_bad_field_is_named_with_its_value(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make(**changes)


def test_every_problem_of_experts_and_latents_is_named_at_once():
    with pytest.raises(ConfigError) as info:
        make(n_experts=3, experts_per_token=4, router_scoring="tanh", kv_latent_rank=8,
             rope_head_width=5, vocab_size=0)
    text = str(info.value)
    for part in ("vocab_size=0", "router_scoring='tanh'", "experts_per_token=4 exceeds "
                 "n_experts=3", "rope_head_width=5 is odd", "needs nope_head_width"):
        assert part in text


def test_a_config_file_missing_a_size_still_names_the_expert_fields(tmp_path):
    data = {**BASE, "n_experts": 2, "experts_per_token": 3}
    del data["d_ff"]
    with pytest.raises(ConfigError) as info:
        DecoderConfig.from_dict(data)
    assert "d_ff" in str(info.value) and "experts_per_token=3 exceeds n_experts=2" in str(
        info.value)


def test_latent_head_widths_are_their_parts():
    cfg = make(**MLA, q_latent_rank=6, d_model=12, n_heads=5)  # D / H need not divide
    assert (cfg.head_dim, cfg.value_dim, cfg.rope_dim, cfg.kv_heads) == (6 + 4, 5, 4, 5)
    plain = make()
    assert (plain.head_dim, plain.value_dim, plain.rope_dim) == (4, 4, 4)


def test_expert_widths_default_to_d_ff_and_shared_experts_add_up():
    cfg = make(**MOE, n_shared_experts=2)
    assert (cfg.expert_dim, cfg.shared_dim) == (20, 40)
    cfg = make(**MOE, expert_width=6, n_shared_experts=3, shared_expert_width=7)
    assert (cfg.expert_dim, cfg.shared_dim) == (6, 21)
    assert make(**MOE).shared_dim == 0


def _qwen2_moe_routes(layer, step):  # transformers' Qwen2MoeDecoderLayer, mlp_only_layers []
    return (layer + 1) % step == 0


def _deepseek_v3_routes(layer, first_k_dense_replace):  # DeepseekV3DecoderLayer
    return layer >= first_k_dense_replace


@pytest.mark.parametrize("step", [1, 2, 3])
def test_moe_every_is_qwen2_moe_decoder_sparse_step(step):
    cfg = make(**MOE, n_layers=6, moe_every=step)
    assert [cfg.routes(i) for i in range(6)] == [_qwen2_moe_routes(i, step) for i in range(6)]


@pytest.mark.parametrize("first", [0, 1, 3])
def test_first_dense_layers_is_deepseek_first_k_dense_replace(first):
    cfg = make(**MOE, n_layers=6, first_dense_layers=first)
    assert [cfg.routes(i) for i in range(6)] == [_deepseek_v3_routes(i, first) for i in range(6)]
    assert not any(make().routes(i) for i in range(4))


@pytest.mark.parametrize("factor, tokens, want", [(1.0, 10, 5), (1.25, 10, 7), (0.1, 3, 1)])
def test_capacity_is_the_switch_transformer_formula(factor, tokens, want):
    cfg = make(**MOE, capacity_factor=factor)
    assert cfg.expert_capacity(tokens) == want == math.ceil(factor * tokens * 2 / 4)
    assert make(**MOE).expert_capacity(tokens) is None


def test_expert_and_latent_fields_round_trip_through_json(tmp_path):
    cfg = make(**MOE, **MLA, q_latent_rank=6, n_shared_experts=1, router_scoring="sigmoid",
               router_selection_bias=True, routed_scaling=2.5, first_dense_layers=1,
               capacity_factor=1.5, normalize_topk=False, router_order="topk_score")
    cfg.save(tmp_path / "c.json")
    assert DecoderConfig.load(tmp_path / "c.json") == cfg
