"""The Hugging Face families beyond GPT-2 and Llama, both ways (references.hf_families): each
variant config written as its family's model computes the logits our Decoder computes (HF's
own modules are the independent reference), reads back as the same config with the same
weights bitwise, and survives a save_pretrained folder; what no family holds is refused by name.

Tolerance: HF computes RoPE's angles in float32 even for a float64 model, and the Gemma
families their whole RMSNorm (x in float32, times 1 + w in float32), so the float64 comparison
is bounded near 1e-7 of the largest logit for most families and measured up to 1.4e-6 of it for
Gemma (weights of std 0.3 through 2 layers); asserted 2e-5 of it."""

from __future__ import annotations

import configs
import pytest
import torch
from helpers import random_decoder
from hf_compat import deepseek_class, hf_class, skip_unless_it_runs

import decoder_audit as da
from decoder_audit.references import hf as hfref
from decoder_audit.references.family_entry import takes

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

FAMILIES = {  # our variant config -> the class it must be written as
    "neox-like": "GPTNeoXForCausalLM", "gemma2-like": "Gemma2ForCausalLM",
    "gemma3-like": "Gemma3ForCausalLM", "olmo-like": "OlmoForCausalLM",
    "olmo2-like": "Olmo2ForCausalLM", "qk-norm-gqa": "Qwen3ForCausalLM",
    "qkv-bias-only": "Qwen2ForCausalLM", "gemma-like": "GemmaForCausalLM",
    "window-every-layer": "MistralForCausalLM", "wide-heads": "Qwen3ForCausalLM",
    "mixtral-like": "MixtralForCausalLM", "moe-shared-gate": "Qwen2MoeForCausalLM",
    "moe-unnormalised": "Qwen3MoeForCausalLM", "olmoe-like": "OlmoeForCausalLM",
}


def _same_architecture(a: da.DecoderConfig, b: da.DecoderConfig) -> bool:
    plain = lambda c: c.replace(head_width=None) if c.head_dim * c.n_heads == c.d_model else c  # noqa: E731
    return plain(a) == plain(b)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_variant_is_written_as_its_family_and_read_back(name):
    hf_class(FAMILIES[name])  # a family this release lacks is skipped
    cfg = configs.named(name)
    cfg = cfg.replace(rope_layout="rotate_half") if cfg.pos == "rope" else cfg
    ours = random_decoder(cfg, dtype=torch.float64)
    try:
        hf_model = hfref.to_hf(ours)
    except da.ConfigError:
        config_class = hf_class(FAMILIES[name]).config_class
        if cfg.window_layers is not None and not takes(config_class, "layer_types"):
            pytest.skip(f"{config_class.__name__} of this release takes no layer_types, and its "
                        f"own rule does not window layers {cfg.window_layers} alone")
        raise
    assert type(hf_model).__name__ == FAMILIES[name]
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with torch.no_grad():
        expected = ours(ids)
        scale = float(expected.abs().max())
        theirs = hf_model(ids).logits.to(expected.dtype)  # 4.45: float32 logits
        torch.testing.assert_close(theirs, expected, rtol=0, atol=2e-5 * scale)
    back = hfref.from_hf(hf_model)
    assert _same_architecture(back.config, ours.config)
    theirs = dict(back.named_parameters())
    for pname, param in ours.named_parameters():
        assert torch.equal(theirs[pname], param), pname
    assert (back.lm_head.weight is back.token_embeddings.weight) == cfg.tie_embeddings


@pytest.mark.parametrize("name", ["neox-like", "gemma2-like", "mixtral-like"])
def test_a_family_folder_saves_and_loads_back(tmp_path, name):
    if name == "neox-like" and tf.GPTNeoXConfig(rope_parameters={
            "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
            ).rope_parameters.get("partial_rotary_factor") != 0.5:
        pytest.skip("this release's GPTNeoXConfig replaces rope_parameters' partial rotary "
                    "factor by rotary_pct on loading (5.0-5.4), so a saved folder loads another")
    ours = random_decoder(configs.named(name), dtype=torch.float32)
    hfref.save_hf_folder(ours, tmp_path / "model")
    back = hfref.load_hf_folder(tmp_path / "model")
    assert _same_architecture(back.config, ours.config)
    ids = torch.randint(0, ours.config.vocab_size, (2, ours.config.max_seq_len))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), ours(ids), rtol=0, atol=0)


def test_a_config_no_family_holds_is_refused_naming_why():
    # YaRN over a partial rotary with RMSNorm: no family (Phi-3 scales only by longrope)
    cfg = configs.named("rope-yarn-partial").replace(rope_layout="rotate_half")
    with pytest.raises(da.ConfigError, match="rotary_dim=8") as info:
        hfref.to_hf(random_decoder(cfg))
    assert "gpt_neox" in str(info.value)  # the families tried are listed
    interleaved = configs.named("qk-norm-gqa").replace(rope_layout="interleaved")
    with pytest.raises(da.ConfigError, match="rope_layout='interleaved'"):
        hfref.to_hf(random_decoder(interleaved))


def test_a_family_model_whose_weights_do_not_fit_its_config_is_refused():
    hf_class("Olmo2ForCausalLM")
    model = hfref.to_hf(random_decoder(configs.named("olmo2-like")))
    model.model.layers[0].self_attn.q_norm = torch.nn.Identity()
    with pytest.raises(da.ConfigError, match="layers.0.attn.q_norm.weight"):
        hfref.from_hf(model)


@pytest.mark.parametrize("family", ["DeepseekV3", "DeepseekV2"])
def test_a_deepseek_model_is_read_as_a_decoder(family):
    """DeepSeek's models are read (not written): latent attention, a dense first layer, 8
    experts in 4 groups beside a shared one; V3's selection bias, a buffer there, becomes our
    Decoder's ffn.router.selection_bias. HF's modules are the reference for the logits."""
    torch.manual_seed(0)
    deepseek_class(f"{family}ForCausalLM")
    config = hf_class(f"{family}Config")(
        vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=12,
        kv_lora_rank=8, q_lora_rank=12 if family == "DeepseekV3" else None, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=6, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=8, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
        topk_group=2, **({} if family == "DeepseekV3" else {"topk_method": "group_limited_greedy"}))
    hf_model = skip_unless_it_runs(hf_class(f"{family}ForCausalLM")(config).eval()).double()
    from decoder_audit.references.hf_models import eager_experts
    eager_experts(hf_model)  # the grouped kernel refuses float64
    if family == "DeepseekV3":
        with torch.no_grad():
            hf_model.model.layers[1].mlp.gate.e_score_correction_bias.copy_(
                torch.linspace(-0.3, 0.3, 8, dtype=torch.float64))
    ours = hfref.from_hf(hf_model)
    assert ours.config.latent_attention and ours.config.routes(1)
    if family == "DeepseekV3":
        assert torch.equal(ours.layers[1].ffn.router.selection_bias,
                           hf_model.model.layers[1].mlp.gate.e_score_correction_bias)
    ids = torch.randint(0, 37, (2, 10))
    with torch.no_grad():
        expected = hf_model(ids).logits
        torch.testing.assert_close(ours(ids), expected, rtol=0,
                                   atol=2e-5 * float(expected.abs().max()))


# Latent Decoders DeepSeek's families hold: norm_eps 1e-6 (the eps of transformers' latent
# norms), heads of 4 + 2 and values of 6 through a latent of 8
_LATENT = dict(vocab_size=13, d_model=16, n_layers=2, n_heads=2, d_ff=24, max_seq_len=6,
               norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", pos="rope", rope_theta=500.0,
               kv_latent_rank=8, rope_head_width=2, nope_head_width=4, value_head_width=6,
               tie_embeddings=False)
DEEPSEEK = {  # name -> (config, the class it must be written as)
    # V3: queries through a latent of 6, 8 experts in 4 groups, sigmoid and selection bias
    "v3-grouped": (da.DecoderConfig(**_LATENT, q_latent_rank=6, n_experts=8, experts_per_token=2,
                                    expert_width=6, n_shared_experts=1, first_dense_layers=1,
                                    router_scoring="sigmoid", router_selection_bias=True,
                                    expert_groups=4, groups_per_token=2, routed_scaling=2.5),
                   "DeepseekV3ForCausalLM"),
    # V3 on rotated halves and without groups (written as one group of every expert)
    "v3-halves": (da.DecoderConfig(**{**_LATENT, "rope_layout": "rotate_half"}, n_experts=4,
                                   experts_per_token=2, expert_width=6, n_shared_experts=1,
                                   first_dense_layers=1, router_scoring="sigmoid",
                                   router_selection_bias=True), "DeepseekV3ForCausalLM"),
    # V2: one q_proj, softmax, groups each worth their best, unnormalised, 2 shared experts
    "v2-grouped": (da.DecoderConfig(**_LATENT, n_experts=6, experts_per_token=3, expert_width=4,
                                    n_shared_experts=2, expert_groups=3, groups_per_token=2,
                                    group_score="max", normalize_topk=False),
                   "DeepseekV2ForCausalLM"),
    "latent-dense": (da.DecoderConfig(**_LATENT, q_latent_rank=6), "DeepseekV3ForCausalLM"),
}


@pytest.mark.parametrize("name", sorted(DEEPSEEK))
def test_a_latent_decoder_is_written_as_deepseek_and_read_back(name):
    cfg, family = DEEPSEEK[name]
    deepseek_class(family)
    ours = random_decoder(cfg, dtype=torch.float64)
    hf_model = hfref.to_hf(ours)
    assert type(hf_model).__name__ == family
    skip_unless_it_runs(hf_model)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with torch.no_grad():
        expected = ours(ids)
        theirs = hf_model(ids).logits.to(expected.dtype)
        torch.testing.assert_close(theirs, expected, rtol=0,
                                   atol=2e-5 * float(expected.abs().max()))
    back = hfref.from_hf(hf_model)
    assert back.config == cfg
    theirs = dict(back.named_parameters())
    for pname, param in ours.named_parameters():
        assert torch.equal(theirs[pname], param), pname


def test_a_latent_decoder_deepseek_cannot_hold_is_refused():
    """norm_eps 1e-5: DeepSeek's latent norms keep 1e-6, so no family reads back the Decoder."""
    deepseek_class("DeepseekV3ForCausalLM")  # a release without it names no DeepSeek family
    ours = random_decoder(da.DecoderConfig(**{**_LATENT, "norm_eps": 1e-5}), dtype=torch.float64)
    with pytest.raises(da.ConfigError, match="deepseek_v3"):
        hfref.to_hf(ours)


# ---- routed families (helper fam-moe) ----

def test_a_decoder_rotating_interleaved_pairs_is_written_by_the_family_that_does():
    """Ernie 4.5 MoE rotates interleaved pairs: a routed Decoder with rope_layout='interleaved'
    (softmax scores chosen with a selection bias, a shared expert, a dense first layer) is
    written as it, not refused for its RoPE layout, and read back bitwise; transformers' logits
    are ours (its RoPE in float32)."""
    hf_class("Ernie4_5_MoeForCausalLM")
    cfg = da.DecoderConfig(vocab_size=37, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2,
                           d_ff=24, max_seq_len=12, norm="rmsnorm", mlp="swiglu", pos="rope",
                           rope_layout="interleaved", n_experts=4, experts_per_token=2,
                           expert_width=8, n_shared_experts=1, router_selection_bias=True,
                           first_dense_layers=1)
    ours = random_decoder(cfg, dtype=torch.float64)
    try:
        model = hfref.to_hf(ours)
    except da.ConfigError:
        config_class = hf_class("Ernie4_5_MoeConfig")
        built = hf_class("Ernie4_5_MoeForCausalLM")(config_class(
            vocab_size=37, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, moe_num_experts=4, moe_k=2))
        if not any(name.endswith("experts.gate_up_proj") for name, _ in built.named_parameters()):
            pytest.skip("this release keeps one module per expert, a form the table does not "
                        "write (transformers 5 fuses them)")
        raise
    assert type(model).__name__ == "Ernie4_5_MoeForCausalLM"
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ours(ids)
        scale = float(expected.abs().max())
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0,
                                   atol=1e-6 * scale)
    back = hfref.from_hf(model)
    assert back.config == cfg
    theirs = dict(back.named_parameters())
    for name, param in ours.named_parameters():
        assert torch.equal(theirs[name], param), name
