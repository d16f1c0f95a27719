"""Hugging Face families whose configs declare the variants a DecoderConfig grew for them:
GPT-NeoX (attention and MLP in parallel, partial rotary, q/k/v fused head by head), StableLM
(LayerNorm, partial rotary, q/k/v biases only), Phi-3 (q/k/v and gate/up fused), Mistral (a
sliding window), Gemma 2 (sandwich norms, soft caps, a score scale, windowed layers), Gemma 3
(per-head q/k norms, its windowed layers on their own RoPE base), OLMo (norms that learn
nothing), OLMo 2 (no pre-norms, q/k norms over the projection), Llama with each RoPE scaling
(linear, Llama 3.1's, YaRN) and the routed families (Mixtral, Qwen2-MoE with its gated shared
expert and a dense first layer, Qwen3-MoE, OLMoE) and DeepSeek (latent attention, a dense first
layer, grouped routing: V3's sigmoid scores chosen with a selection bias that is a buffer, V2's
softmax). Each correct model passes with no argument; each defect planted in transformers' own
module fails the check that owns it."""

from __future__ import annotations

import copy
import math
import types

import pytest
import torch
from torch import nn

import decoder_audit as da
from hf_compat import (deepseek_class, hf_class, layer_kwargs, release_bugs, rope_kwargs,
                       skip_unless_it_runs)

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

COMMON = dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
              num_attention_heads=2, max_position_embeddings=12, bos_token_id=0, eos_token_id=1,
              pad_token_id=None)
PARTIAL = {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    # wavelengths of 6 to 3e2 against 64 / 4 and 64 / 1: every regime of the rule
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6},
}


MOE = {"mixtral": ("Mixtral", dict(num_local_experts=4)),
       "qwen2_moe": ("Qwen2Moe", dict(num_experts=4, moe_intermediate_size=8,
                                      shared_expert_intermediate_size=12, mlp_only_layers=[0])),
       "qwen3_moe": ("Qwen3Moe", dict(num_experts=4, moe_intermediate_size=8, head_dim=12,
                                      norm_topk_prob=True)),
       "olmoe": ("Olmoe", dict(num_experts=4, norm_topk_prob=False))}


# DeepSeek: 4 heads, each 4 nope + 4 rope features for q and k and 6 for v, keys and values
# through a latent of 8 (V3's queries through one of 12); layer 0 dense, layer 1 routed: 8
# experts of 8 in 4 groups, a token's 2 from its best 2 groups, beside 1 shared expert
DEEPSEEK = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8, qk_rope_head_dim=4,
                qk_nope_head_dim=4, v_head_dim=6, n_routed_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=8, n_shared_experts=1, first_k_dense_replace=1,
                n_group=4, topk_group=2)
DEEPSEEK_V3 = {"deepseek_v3": dict(q_lora_rank=12),
               "deepseek_v3-halves": dict(q_lora_rank=12, rope_interleave=False),
               "deepseek_v3-yarn": dict(q_lora_rank=12, rope_parameters={
                   "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                   "original_max_position_embeddings": 6, "mscale": 1.0,
                   "mscale_all_dim": 0.5})}


def _deepseek(family: str, **config):
    if family == "deepseek_v2":  # one q_proj; softmax scores, groups each worth their best
        c = deepseek_class("DeepseekV2Config")(**{**COMMON, **DEEPSEEK, "q_lora_rank": None,
                                                  "topk_method": "group_limited_greedy",
                                                  **config})
        return skip_unless_it_runs(deepseek_class("DeepseekV2ForCausalLM")(c).eval())
    c = deepseek_class("DeepseekV3Config")(**{**COMMON, **DEEPSEEK, **DEEPSEEK_V3[family],
                                              **config})
    model = deepseek_class("DeepseekV3ForCausalLM")(c).eval()
    with torch.no_grad():  # transformers starts it at 0; this one outweighs the scores' spread
        model.model.layers[1].mlp.gate.e_score_correction_bias.copy_(
            torch.linspace(-0.3, 0.3, 8)[torch.randperm(8)])
    return model


def _model(family: str, **config):
    torch.manual_seed(0)
    if family.startswith("deepseek"):
        return _deepseek(family, **config)
    if family.startswith("neox"):
        c = tf.GPTNeoXConfig(**COMMON, use_parallel_residual=family == "neox-parallel",
                             **rope_kwargs(tf.GPTNeoXConfig, PARTIAL), **config)
        return tf.GPTNeoXForCausalLM(c).eval()
    if family == "stablelm":
        c = tf.StableLmConfig(**COMMON, num_key_value_heads=1, use_qkv_bias=True,
                              **rope_kwargs(tf.StableLmConfig, PARTIAL), **config)
        return tf.StableLmForCausalLM(c).eval()
    if family == "phi3":
        c = tf.Phi3Config(**COMMON, num_key_value_heads=1, **rope_kwargs(tf.Phi3Config, PARTIAL),
                          **config)
        return tf.Phi3ForCausalLM(c).eval()
    if family == "gemma2":  # heads of 12 scaled by 1/sqrt(8), layer 0 windowed to 3 tokens
        c = tf.Gemma2Config(**{**COMMON, "pad_token_id": 0}, num_key_value_heads=1, head_dim=12,
                            query_pre_attn_scalar=8, attn_logit_softcapping=5.0,
                            final_logit_softcapping=3.0, sliding_window=3,
                            attn_implementation="eager",  # SDPA drops the score softcap (4.5x)
                            **layer_kwargs(tf.Gemma2Config, ["sliding_attention", "full_attention"]),
                            **config)
        return tf.Gemma2ForCausalLM(c).eval()
    if family == "gemma3":  # layer 0 windowed on base 10, the full layer on 1e6 scaled 8x
        config_class = hf_class("Gemma3TextConfig")
        rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}
        # before layer_types, every layer but each sliding_window_pattern-th is windowed
        layers = layer_kwargs(config_class, ["sliding_attention", "full_attention"],
                              sliding_window_pattern=2)
        c = config_class(**{**COMMON, "pad_token_id": 0}, num_key_value_heads=1, head_dim=8,
                         query_pre_attn_scalar=16, sliding_window=3, **layers,
                         **rope_kwargs(config_class, rope), **config)
        return hf_class("Gemma3ForCausalLM")(c).eval()
    if family in ("olmo", "olmo2"):
        name = {"olmo": "Olmo", "olmo2": "Olmo2"}[family]
        config_class, model_class = hf_class(f"{name}Config"), hf_class(f"{name}ForCausalLM")
        c = config_class(**COMMON, num_key_value_heads=1, **config)
        return model_class(c).eval()
    if family in MOE:  # 4 experts, 2 per token; Qwen's experts 8 wide beside dense layers of 24
        name, fields = MOE[family]
        config_class, model_class = hf_class(f"{name}Config"), hf_class(f"{name}ForCausalLM")
        c = config_class(**COMMON, num_key_value_heads=1, num_experts_per_tok=2,
                         **fields, **config)
        return model_class(c).eval()
    if family == "mistral-window":
        c = tf.MistralConfig(**COMMON, num_key_value_heads=1, sliding_window=3, **config)
        return tf.MistralForCausalLM(c).eval()
    c = tf.LlamaConfig(**COMMON, num_key_value_heads=1, head_dim=8,
                       **rope_kwargs(tf.LlamaConfig, {**SCALINGS[family], "rope_theta": 50.0}),
                       **config)
    return tf.LlamaForCausalLM(c).eval()


EXPECTED = {  # what each family's config declares, read by hand from transformers' modules
    "neox-parallel": dict(parallel_residual=True, rotary_dim=4, norm="layernorm", attn_bias=True,
                          mlp_bias=True, mlp="gelu", tie_embeddings=False),
    "neox-sequential": dict(parallel_residual=False, rotary_dim=4, norm="layernorm"),
    "stablelm": dict(rotary_dim=4, norm="layernorm", attn_bias=True, attn_output_bias=False,
                     n_kv_heads=1, mlp="swiglu"),
    "phi3": dict(rotary_dim=4, norm="rmsnorm", n_kv_heads=1, mlp="swiglu", attn_bias=False),
    "gemma2": dict(sandwich_norm=True, attn_scale=8 ** -0.5, attn_softcap=5.0,
                   logit_softcap=3.0, sliding_window=3, window_layers=(0,), mlp="geglu",
                   norm_offset=1.0, embedding_scale=4.0, head_width=12),
    "mistral-window": dict(sliding_window=3, window_layers=None, n_kv_heads=1),
    "gemma3": dict(qk_norm=True, qk_norm_scope="head", window_rope_theta=10.0, rope_theta=1e6,
                   rope_scaling={"type": "linear", "factor": 8.0}, window_layers=(0,),
                   attn_scale=0.25, sandwich_norm=True, logit_softcap=None),
    "olmo": dict(norm="layernorm", norm_affine=False, norm_bias=False, norm_eps=1e-5),
    "olmo2": dict(pre_norm=False, sandwich_norm=True, qk_norm=True,
                  qk_norm_scope="projection", norm="rmsnorm"),
    "mixtral": dict(n_experts=4, experts_per_token=2, expert_width=None, d_ff=24,
                    normalize_topk=True, router_scoring="softmax", router_order="score_topk",
                    n_shared_experts=0, attn_bias=False, qk_norm=False),
    "qwen2_moe": dict(n_experts=4, expert_width=8, d_ff=24, normalize_topk=False,
                      n_shared_experts=1, shared_expert_width=12, shared_expert_gate=True,
                      first_dense_layers=1, moe_every=1, attn_bias=True,
                      attn_output_bias=False),
    "qwen3_moe": dict(n_experts=4, expert_width=8, normalize_topk=True, qk_norm=True,
                      qk_norm_scope="head", head_width=12, n_shared_experts=0),
    "olmoe": dict(n_experts=4, expert_width=None, d_ff=24, normalize_topk=False, qk_norm=True,
                  qk_norm_scope="projection", pre_norm=True, sandwich_norm=False),
    "deepseek_v3": dict(kv_latent_rank=8, q_latent_rank=12, rope_head_width=4,
                        nope_head_width=4, value_head_width=6, rope_layout="interleaved",
                        attn_scale=None, n_experts=8, experts_per_token=2, expert_width=8,
                        n_shared_experts=1, shared_expert_width=None, first_dense_layers=1,
                        router_scoring="sigmoid", router_selection_bias=True, expert_groups=4,
                        groups_per_token=2, group_score="top2_sum", normalize_topk=True,
                        routed_scaling=2.5, n_kv_heads=None, norm_eps=1e-6),
    "deepseek_v3-halves": dict(rope_layout="rotate_half", kv_latent_rank=8),
    # yarn_apply_mscale: the scores scaled by (4 + 4)^-0.5 times (0.1 * 0.5 * ln 4 + 1)^2
    "deepseek_v3-yarn": dict(attn_scale=8 ** -0.5 * (0.05 * math.log(4.0) + 1.0) ** 2,
                             rope_scaling={"type": "yarn", "factor": 4.0,
                                           "original_max_seq_len": 6, "beta_fast": 32.0,
                                           "beta_slow": 1.0,
                                           "attention_factor": (0.1 * math.log(4.0) + 1.0)
                                           / (0.05 * math.log(4.0) + 1.0), "truncate": True},
                             rope_layout="interleaved"),
    # V2's router never renormalises (norm_topk_prob is read by no module of it)
    "deepseek_v2": dict(kv_latent_rank=8, q_latent_rank=None, rope_layout="interleaved",
                        router_scoring="softmax", router_selection_bias=False,
                        expert_groups=4, groups_per_token=2, group_score="max",
                        normalize_topk=False, routed_scaling=1.0, n_shared_experts=1,
                        first_dense_layers=1),
    "linear": dict(rope_scaling={"type": "linear", "factor": 3.0}, n_kv_heads=1),
    "llama3": dict(rope_scaling={"type": "llama3", "factor": 8.0, "original_max_seq_len": 64,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    "yarn": dict(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_seq_len": 6,
                               "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None,
                               "truncate": True}),
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_each_family_is_its_configs_spec_and_passes(family):
    model = _model(family)
    report = da.audit(model)
    failed = {check.name for check in report.checks if not check.passed}
    assert failed <= set(release_bugs(model)), report.first_failure
    spec = report.facts.spec
    assert {field: getattr(spec, field) for field in EXPECTED[family]} == EXPECTED[family]
    if "rope_layout" not in EXPECTED[family]:  # DeepSeek's config says its own
        assert spec.rope_layout == "rotate_half"
    oracle = report["oracle"].evidence
    assert oracle["stressed"] and oracle["gradients"]["compared"] > 0
    assert report["params"].passed


def _serial_block(model):
    for layer in model.gpt_neox.layers:
        layer.use_parallel_residual = False


def _rope_base(model):  # every rotated pair turns twice as fast: another theta
    rotary = model.gpt_neox.rotary_emb
    rotary.inv_freq.mul_(2.0)


def _gate_up_swapped(model):
    mlp = model.model.layers[1].mlp

    def forward(self, x):
        up, gate = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * self.activation_fn(gate))
    mlp.forward = types.MethodType(forward, mlp)


def _q_bias_dropped(model):
    model.model.layers[0].self_attn.q_proj = nn.Linear(16, 16, bias=False)


def _scaling_dropped(model):  # the frequencies of plain RoPE, as if rope_type were "default"
    rotary = model.model.rotary_emb
    head = model.config.head_dim
    rotary.inv_freq.copy_(50.0 ** -(torch.arange(0, head, 2, dtype=torch.float32) / head))


def _attention_factor_dropped(model):
    model.model.rotary_emb.attention_scaling = 1.0


def _score_softcap_dropped(model):
    attention = model.model.layers[0].self_attn
    attention.attn_logit_softcapping = None
    attention.config = copy.copy(attention.config)  # transformers 4 reads it from the config
    attention.config.attn_logit_softcapping = None


def _score_scale_of_the_head_width(model):  # 1/sqrt(12) where the config says 1/sqrt(8)
    model.model.layers[1].self_attn.scaling = 12 ** -0.5


def _sandwich_norm_dropped(model):
    model.model.layers[1].post_feedforward_layernorm = nn.Identity()


def _windowed_layer_on_the_global_base(model):
    rotary = model.model.rotary_emb
    if hasattr(rotary, "sliding_attention_inv_freq"):  # one rotary module for both kinds
        rotary.sliding_attention_inv_freq.copy_(rotary.full_attention_inv_freq)
    else:  # transformers 4: the windowed layers' own rotary module
        model.model.rotary_emb_local.inv_freq.copy_(rotary.inv_freq)


def _learned_layernorm(model):  # OLMo's norms learn nothing; this one has a gain and a shift
    model.model.layers[0].input_layernorm = nn.LayerNorm(16)


def _q_norm_dropped(model):
    model.model.layers[1].self_attn.q_norm = nn.Identity()


def _post_norm_eps(model):
    model.model.layers[0].post_attention_layernorm.variance_epsilon = 1e-2


def _window_ignored(model):  # the windowed layer reads every earlier token
    layer = model.model.layers[0]
    if hasattr(layer, "is_sliding"):  # before 4.53 the layer masks its own window
        layer.is_sliding = False
        return
    layer.self_attn.sliding_window = None
    layer.attention_type = "full_attention"  # 4.53-5.x: the mask the layer is given
    model.config.layer_types = ["full_attention", "full_attention"]


def _routed_block(model, layer: int) -> nn.Module:
    """A layer's routed MLP: `mlp`, or Mixtral's `block_sparse_moe` before transformers 5."""
    block = model.model.layers[layer]
    return getattr(block, "mlp", None) or block.block_sparse_moe


def _router_module(model, layer: int = 1):
    """The routed layer's router where it is a module that returns its choice (transformers 5:
    (logits, weights, indices)); before it the block chose inside its own forward."""
    gate = _routed_block(model, layer).gate
    if isinstance(gate, nn.Linear):
        pytest.skip("the router is a Linear whose choice is made inside the block's forward "
                    "(transformers 4): no module to plant the defect in")
    return gate


def _topk_unnormalised(model):  # Mixtral's top-k weights left as softmax scores
    def hook(module, inputs, output):
        logits, _, chosen = output
        return logits, logits.float().softmax(-1).gather(-1, chosen), chosen
    _router_module(model).register_forward_hook(hook)


def _topk_before_softmax(model):  # the k largest logits taken, then a softmax over them
    def hook(module, inputs, output):
        logits, weights, chosen = output
        return logits, logits.float().gather(-1, chosen).softmax(-1).to(weights.dtype), chosen
    _router_module(model).register_forward_hook(hook)


def _shared_expert_dropped(model):  # its weights still there, its output never added
    shared = model.model.layers[1].mlp.shared_expert
    shared.forward = types.MethodType(lambda self, x: torch.zeros_like(x), shared)


def _expert_left_out(model):  # expert 0 chosen, weighed, and never added to the sum
    experts = model.model.layers[1].mlp.experts
    if isinstance(experts, nn.ModuleList):  # transformers 4: one module per expert
        experts[0].forward = types.MethodType(lambda self, x: torch.zeros_like(x), experts[0])
        return

    def hook(module, args):
        hidden, chosen, weights = args
        return hidden, chosen, weights.masked_fill(chosen == 0, 0.0)
    experts.register_forward_pre_hook(hook)


def _rope_on_the_nope_half(model):
    """Each query head's rotary part taken from its first features, the non-rotary from its
    last (its halves swapped as q_b_proj writes them: nope and rope are both 4 wide), so the
    rotated half meets the shared rotary key and the other the expanded nope key."""
    attention = model.model.layers[1].self_attn
    heads = attention.num_heads

    def hook(module, inputs, output):
        return output.unflatten(-1, (heads, 2, -1)).flip(-2).flatten(-3)
    attention.q_b_proj.register_forward_hook(hook)


def _selection_bias_weighs(model):
    """V3's top-k weights taken from the biased scores that chose them (the bias is for choosing
    only), renormalised and scaled as the router does."""
    def hook(module, inputs, output):
        logits, _, chosen = output
        biased = (logits.sigmoid() + module.e_score_correction_bias).gather(-1, chosen)
        if module.norm_topk_prob:
            biased = biased / biased.sum(-1, keepdim=True)
        return logits, biased * module.routed_scaling_factor, chosen
    _router_module(model).register_forward_hook(hook)


def _v2_topk_renormalised(model):  # V2's weights divided by their sum, as V3's may be
    def hook(module, inputs, output):
        logits, weights, chosen = output
        return logits, weights / weights.sum(-1, keepdim=True), chosen
    _router_module(model).register_forward_hook(hook)


def _mscale_dropped(model):  # the scores scaled by (nope + rope)^-0.5 alone
    model.model.layers[0].self_attn.scaling = 8 ** -0.5


DEFECTS = {("neox-parallel", "serial block"): (_serial_block, "oracle"),
           ("deepseek_v3", "rope on the nope half"): (_rope_on_the_nope_half, "oracle"),
           ("deepseek_v3-halves", "rope on the nope half"): (_rope_on_the_nope_half, "oracle"),
           ("deepseek_v3", "selection bias weighs"): (_selection_bias_weighs, "oracle"),
           ("deepseek_v3-yarn", "mscale dropped"): (_mscale_dropped, "oracle"),
           ("deepseek_v2", "top-k weights renormalised"): (_v2_topk_renormalised, "oracle"),
           ("mixtral", "top-k weights unnormalised"): (_topk_unnormalised, "oracle"),
           ("olmoe", "top k before the softmax"): (_topk_before_softmax, "oracle"),
           ("qwen2_moe", "shared expert dropped"): (_shared_expert_dropped, "oracle"),
           ("qwen3_moe", "expert left out of the sum"): (_expert_left_out, "oracle"),
           ("neox-parallel", "rope base"): (_rope_base, "oracle"),
           ("phi3", "gate and up swapped"): (_gate_up_swapped, "oracle"),
           ("stablelm", "q bias dropped"): (_q_bias_dropped, "params"),
           ("linear", "scaling dropped"): (_scaling_dropped, "oracle"),
           ("llama3", "scaling dropped"): (_scaling_dropped, "oracle"),
           ("yarn", "attention factor dropped"): (_attention_factor_dropped, "oracle"),
           ("gemma2", "score softcap dropped"): (_score_softcap_dropped, "oracle"),
           ("gemma2", "score scale of the head width"): (_score_scale_of_the_head_width,
                                                         "oracle"),
           ("gemma2", "sandwich norm dropped"): (_sandwich_norm_dropped, "params"),
           ("gemma3", "windowed layer on the global base"): (_windowed_layer_on_the_global_base,
                                                             "oracle"),
           ("olmo", "learned layernorm"): (_learned_layernorm, "params"),
           ("olmo2", "q norm dropped"): (_q_norm_dropped, "params"),
           ("olmo2", "post-norm eps"): (_post_norm_eps, "oracle")}


def test_a_window_the_module_ignores_fails_the_oracle():
    """The spec is read before the defect is planted (the planted model's config says every
    layer is full), so the declared window of layer 0 is held against a module that ignores it."""
    model = _model("gemma2")
    spec = da.audit(model, checks=["params"]).facts.spec
    _window_ignored(model)
    report = da.audit(model, spec=spec, checks=["params", "oracle"])
    assert report["params"].passed and not report["oracle"].passed
    assert "layer 0" in report["oracle"].detail


@pytest.mark.parametrize("family, defect", sorted(DEFECTS))
def test_each_planted_defect_fails_its_check(family, defect):
    plant, check = DEFECTS[(family, defect)]
    model = _model(family)
    with torch.no_grad():
        plant(model)
    report = da.audit(model, checks=["params", "oracle"])
    assert not report[check].passed, report.first_failure
    if check == "oracle":  # a numerics defect: every weight is where the spec puts it
        assert report["params"].passed, report["params"].detail


def test_a_config_the_spec_cannot_express_leaves_the_model_black_box_saying_why():
    """StableLM's per-head q/k LayerNorms (qk_layernorm) are not a DecoderConfig variant: the
    oracle does not run, and the report names the field instead of failing."""
    try:
        model = _model("stablelm", qk_layernorm=True)
    except AttributeError as exc:  # 4.53-4.57 initialise its bias-free LayerNorms' bias
        pytest.skip(f"transformers cannot build StableLM with qk_layernorm=True here: {exc}")
    report = da.audit(model, checks=["params", "oracle"])
    assert report.facts.spec is None
    assert "qk_layernorm" in report["oracle"].detail


def test_a_mixtral_folder_whose_router_is_zero_passes_the_oracle_under_verify_hf(tmp_path,
                                                                                 capsys):
    """Every router weight 0: every expert scores alike, and the oracle breaks the ties as the
    model's torch.topk does (it failed, taking the first k experts by index)."""
    import json

    from decoder_audit.cli import main

    model = _model("mixtral")
    with torch.no_grad():
        for layer in range(2):
            _routed_block(model, layer).gate.weight.zero_()
    model.save_pretrained(tmp_path / "mixtral")
    main(["verify", "--hf", str(tmp_path / "mixtral"), "--json", "--no-progress"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["oracle"]["passed"] and not checks["oracle"]["skipped"], checks["oracle"]


@pytest.mark.parametrize("k", [0, 5])
def test_experts_per_token_outside_one_to_the_experts_is_refused_naming_the_field(k, tmp_path,
                                                                                    capsys):
    """A Mixtral folder routing each token to 0 of its 4 experts passed verify --hf (its oracle
    skip even said the config is invalid), and one routing to 5 failed `inputs` (torch.topk
    raising): both are configs no router computes with, refused with status 2 naming the field
    and its limit, as InvalidHFConfig refuses others."""
    import json

    from decoder_audit.cli import main
    from decoder_audit.references.family_errors import InvalidHFConfig

    folder = tmp_path / "mixtral"
    _model("mixtral").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": k}))
    assert main(["verify", "--hf", str(folder), "--no-progress"]) == 2
    line = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(line) == 1 and f"num_experts_per_tok={k}" in line[0], line
    assert "num_local_experts=4" in line[0], line
    model = _model("mixtral")
    model.config.num_experts_per_tok = k  # the same config on a built model: the Python API
    with pytest.raises(InvalidHFConfig, match=f"num_experts_per_tok={k}.*num_local_experts=4"):
        da.audit(model)


def test_experts_declared_other_than_the_fused_tensors_hold_fail_params():
    """transformers 5 keeps every expert in two tensors: a spec of other experts (one more, or
    another width) places none of them, and params names the tensors as left over."""
    model = _model("qwen3_moe")
    if isinstance(model.model.layers[1].mlp.experts, nn.ModuleList):
        pytest.skip("transformers 4: one module per expert, no fused tensors")
    spec = da.audit(model, checks=["params"]).facts.spec
    for wrong in (spec.replace(expert_width=6), spec.replace(n_experts=5)):
        params = da.audit(model, spec=wrong, checks=["params"])["params"]
        assert not params.passed
        assert "model.layers.0.mlp.experts.gate_up_proj" in params.evidence["leftover"], params.detail


def test_a_router_that_drops_tokens_over_a_capacity_fails_routing_independence():
    """A capacity of half a fair share of the forward's tokens per expert, counted over the
    flattened batch in order (Switch Transformer's dropping), planted in Mixtral's router: a
    token's weights then depend on the rows and tokens before it. The routing check reads it at
    the router, not in the logits."""
    model = _model("mixtral")

    def drop_over_capacity(module, inputs, output):
        logits, weights, chosen = output  # (N, E), (N, k), (N, k)
        capacity = chosen.numel() // (2 * logits.shape[-1])
        taken = torch.nn.functional.one_hot(chosen, logits.shape[-1]).flatten(0, 1)  # (N k, E)
        order = (taken.cumsum(0) * taken).sum(-1).view_as(chosen)  # (N, k): place in its queue
        return logits, weights.masked_fill(order > capacity, 0.0), chosen

    _router_module(model).register_forward_hook(drop_over_capacity)
    report = da.audit(model, checks=["routing_independence"])
    result = report["routing_independence"]
    assert not result.passed and not result.skipped
    assert {moved["layer"] for moved in result.evidence["moved"]} == {1}
    # the same model without the plant passes it, not skipped (test above: every check runs)
    assert not da.audit(_model("mixtral"), checks=["routing_independence"])[
        "routing_independence"].skipped


def test_latent_ranks_declared_other_than_the_module_holds_fail_params():
    """A spec of another latent width (keys and values, or queries) expects kv_a_proj, kv_a_norm
    and kv_b_proj (or q_a_proj, q_a_norm, q_b_proj) of other shapes: params names them."""
    model = _model("deepseek_v3")
    spec = da.audit(model, checks=["params"]).facts.spec
    for wrong, named in ((spec.replace(kv_latent_rank=6), "layers.0.attn.kv_a_proj.weight"),
                         (spec.replace(q_latent_rank=10), "layers.0.attn.q_a_proj.weight")):
        params = da.audit(model, spec=wrong, checks=["params"])["params"]
        assert not params.passed
        assert any(problem.startswith(named) for problem in params.evidence["differences"]), \
            params.detail


def test_the_selection_bias_buffer_is_placed_counted_and_read():
    """V3's selection bias is a buffer: params counts it as the spec's E per routed layer, the
    oracle reads it (a spec without it fails the oracle on this model, whose bias decides
    the choice), and the stress weights written into it are put back bit for bit."""
    model = _model("deepseek_v3")
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    before = bias.clone()
    report = da.audit(model, checks=["params", "oracle"])
    assert report["params"].passed and report["oracle"].passed, report.first_failure
    assert report["oracle"].evidence["stressed"]
    assert report["params"].evidence["measured"]["layers.1.ffn"] == \
        report["params"].evidence["analytic"]["layers.1.ffn"]
    assert torch.equal(bias, before)
    unbiased = report.facts.spec.replace(router_selection_bias=False)
    report = da.audit(model, spec=unbiased, checks=["params", "oracle"])
    assert not report["params"].passed  # the module has a bias the spec does not
    assert not report["oracle"].passed


@pytest.mark.parametrize("field, value", [("attention_bias", True)])
def test_a_deepseek_config_the_spec_cannot_express_is_named(field, value):
    """Latent attention with biases is not expressed: the spec is refused naming the field."""
    model = _model("deepseek_v3", **{field: value})
    report = da.audit(model, checks=["params", "oracle"])
    assert report.facts.spec is None
    assert field in report["oracle"].detail


def test_a_deepseek_latent_norm_keeps_its_own_eps():
    """The latent norms keep transformers' eps of 1e-6 whatever rms_norm_eps says: a config of
    rms_norm_eps 1e-5 is read with latent_norm_eps 1e-6 and passes; the spec with the latent
    norms on 1e-5 fails the oracle."""
    model = _model("deepseek_v3", rms_norm_eps=1e-5)
    report = da.audit(model, checks=["params", "oracle"])
    spec = report.facts.spec
    assert (spec.norm_eps, spec.latent_norm_eps) == (1e-5, 1e-6)
    assert report["params"].passed and report["oracle"].passed, report.first_failure
    one_eps = da.audit(model, spec=spec.replace(latent_norm_eps=None), checks=["oracle"])
    assert not one_eps["oracle"].passed


@pytest.mark.parametrize("family, other", [("deepseek_v3", "rotate_half"),
                                           ("deepseek_v3-halves", "interleaved")])
def test_deepseek_rope_layout_is_read_from_rope_interleave(family, other):
    """rope_interleave=True turns the rotary part's pairs (x[2j], x[2j+1]) (its output
    de-interleaved, the same for q and k: the scores are those of interleaved RoPE), False its
    halves: a spec of the other layout fails the oracle."""
    model = _model(family)
    spec = da.audit(model, checks=["params"]).facts.spec
    report = da.audit(model, spec=spec.replace(rope_layout=other), checks=["params", "oracle"])
    assert report["params"].passed and not report["oracle"].passed


def test_an_expert_cut_off_from_the_loss_is_named_by_expert_gradients():
    """The probe routes a token to every expert of a Hugging Face MoE (its router's choice
    replaced) and reads each expert's gradient from its own rows of the fused tensors: expert 1
    of layer 1, weighed by 0 whenever chosen, is the one named; the correct model's every
    expert gets one (test_each_family_is_its_configs_spec_and_passes runs the check)."""
    model = _model("mixtral")
    experts = _routed_block(model, 1).experts
    if isinstance(experts, nn.ModuleList):
        pytest.skip("transformers 4: the router's choice is made inside the block's forward")

    def cut_expert_1(module, args):
        hidden, chosen, weights = args
        return hidden, chosen, weights.masked_fill(chosen == 1, 0.0)

    experts.register_forward_pre_hook(cut_expert_1)
    result = da.audit(model, checks=["expert_gradients"])["expert_gradients"]
    assert not result.passed and not result.skipped
    assert result.evidence["dead"] == ["layers.1.ffn.experts.1"], result.evidence
    good = da.audit(_model("mixtral"), checks=["expert_gradients"])["expert_gradients"]
    assert good.passed and not good.skipped and good.evidence["experts"] == 2 * 4
