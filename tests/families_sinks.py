"""The families of attention sinks, the clamped SwiGLU, biased routers and experts, q/k norms after
RoPE and position-scaled queries (GPT-OSS, Hunyuan dense and MoE, Ministral 3, Granite SWA,
GraniteMoe SWA, Flint, Cohere 2 MoE): a defect of what each changes relative to Llama's block,
planted in transformers' own module (`SPECIFIC`, walked by tests/references/test_families.py),
and the options no DecoderConfig expresses (`REFUSED`, walked by
tests/references/test_families_sinks.py).

Each plant changes what a module computes, never a weight's place: the check named beside it
must fail while `params` passes (the weights are where the spec puts them). A weight a plant
stops reading stays registered (an instance attribute shadows it), and a bias that starts at 0
is given a trained model's values first, or dropping it would change nothing."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

def _layer(model: torch.nn.Module, index: int) -> torch.nn.Module:
    return model.model.layers[index]


def _shadow(module: torch.nn.Module, name: str, value) -> None:
    """The module's forward reads `value` where it read its Parameter or submodule `name`,
    which stays registered (the layout still finds the weight): an instance attribute shadows
    it."""
    object.__setattr__(module, name, value)


def _trained(parameter: torch.Tensor) -> None:
    """Values a trained model holds (a bias initialised at 0, dropped, changes nothing)."""
    parameter.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))


def _sinks_ignored(model: torch.nn.Module) -> None:
    """Layer 0's softmax without its sink: the logit read as -inf (a zero share)."""
    attn = _layer(model, 0).self_attn
    _shadow(attn, "sinks", torch.full_like(attn.sinks, float("-inf")))


def _router_bias_dropped(model: torch.nn.Module) -> None:
    router = _layer(model, 0).mlp.router
    _trained(router.bias)
    _shadow(router, "bias", torch.zeros_like(router.bias))


def _expert_biases_dropped(model: torch.nn.Module) -> None:
    experts = _layer(model, 0).mlp.experts
    _trained(experts.down_proj_bias)
    _shadow(experts, "down_proj_bias", torch.zeros_like(experts.down_proj_bias))


def _softmax_over_every_expert(model: torch.nn.Module) -> None:
    """GPT-OSS's router scores every expert by one softmax, then takes the top k unrenormalised
    (its definition: the top k logits, then their softmax)."""
    router = _layer(model, 0).mlp.router

    def forward(hidden_states):
        logits = F.linear(hidden_states, router.weight, router.bias)
        scores, chosen = logits.softmax(-1).topk(router.top_k, dim=-1)
        return logits, scores, chosen
    router.forward = forward


def _gate_up_as_halves(model: torch.nn.Module) -> None:
    """GPT-OSS's fused gate_up read as its first half the gate, its second the up (the
    interleaved columns misread)."""
    experts = _layer(model, 0).mlp.experts
    apply_gate = experts._apply_gate
    experts._apply_gate = lambda gate_up: apply_gate(
        torch.stack(gate_up.chunk(2, dim=-1), dim=-1).flatten(-2))


def _clamp_dropped(model: torch.nn.Module) -> None:
    _layer(model, 0).mlp.experts.limit = float("inf")


def _head_norm_before_rope(attn: torch.nn.Module) -> None:
    """Hunyuan's q/k norms applied to the projections, before RoPE (and not after it), with a
    trained model's gains (a gain of 1 commutes with the rotation)."""
    norms = (attn.query_layernorm, attn.key_layernorm)
    for norm in norms:
        _trained(norm.weight)
    for proj, norm in zip((attn.q_proj, attn.k_proj), norms):
        project = proj.forward
        proj.forward = (lambda x, project=project, norm=norm:
                        norm(project(x).unflatten(-1, (-1, attn.head_dim))).flatten(-2))
    _shadow(attn, "query_layernorm", torch.nn.Identity())
    _shadow(attn, "key_layernorm", torch.nn.Identity())


def _ntk_alpha_ignored(model: torch.nn.Module) -> None:
    """Hunyuan's RoPE on rope_theta itself, its alpha's stretch of the base left out."""
    rotary = model.model.rotary_emb
    theta, dim = model.config.rope_parameters["rope_theta"], model.config.head_dim
    rotary.inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    rotary.original_inv_freq = rotary.inv_freq.clone()


def _topk_unrenormalised(model: torch.nn.Module) -> None:
    """Hunyuan-MoE's top-k softmax weights left unrenormalised."""
    gate = _layer(model, 0).mlp.gate

    def forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1]).float()
        logits = gate.wg(hidden_states)
        weights, chosen = logits.softmax(-1).topk(gate.top_k, dim=-1)
        return logits, weights, chosen
    gate.forward = forward


def _query_scale_dropped(model: torch.nn.Module) -> None:
    """Ministral 3's layer 0 attention reads a config whose llama_4_scaling_beta is 0: its
    queries are never scaled (the model's config, the spec, keeps its beta)."""
    attn = _layer(model, 0).self_attn
    config = copy.deepcopy(attn.config)
    config.rope_parameters = {**config.rope_parameters, "llama_4_scaling_beta": 0.0}
    attn.config = config


def _window_base_for_the_full_layer(model: torch.nn.Module) -> None:
    """Granite SWA's per-layer bases mixed up: the full layer's RoPE turns on the windowed
    layers' base."""
    by_theta = {float(r.config.rope_parameters["rope_theta"]): r for r in model.model.rotary_embs}
    full, local = by_theta[500000.0], by_theta[10000.0]
    full.inv_freq = local.inv_freq.clone()
    full.original_inv_freq = local.inv_freq.clone()


def _residual_multiplier_dropped(model: torch.nn.Module) -> None:
    _layer(model, 1).residual_multiplier = 1.0


def _logits_undivided(model: torch.nn.Module) -> None:
    """Granite's logits not divided by logits_scaling (the readout multiplies it back)."""
    readout, scaling = model.lm_head.forward, model.config.logits_scaling
    model.lm_head.forward = lambda x: readout(x) * scaling


def _granite_moe_softmax_over_every_expert(model: torch.nn.Module) -> None:
    router = _layer(model, 0).block_sparse_moe.router

    def forward(hidden_states):
        logits = F.linear(hidden_states, router.weight).float()
        weights, chosen = logits.softmax(-1).topk(router.top_k, dim=-1)
        return logits, weights.type_as(hidden_states), chosen
    router.forward = forward


def _nope_layer_rotated(model: torch.nn.Module) -> None:
    """Flint's full (NoPE) layer 0 rotates as its windowed layers do."""
    _layer(model, 0).self_attn.sliding_window = 10 ** 6


def _flint_unnormalised(model: torch.nn.Module) -> None:
    _layer(model, 1).mlp.gate.norm_topk_prob = False


def _cohere2_moe_summed(model: torch.nn.Module) -> None:
    """Cohere 2 MoE's shared experts added to the routed sum, not averaged with it."""
    _layer(model, 1).mlp.shared_expert_combination_strategy = "sum"


def _cohere2_moe_nope_rotated(model: torch.nn.Module) -> None:
    """Cohere 2 MoE's full layer 2 (NoPE) rotates as if it were forced to."""
    _layer(model, 2).self_attn.force_rope = True


def _zero_output(module: torch.nn.Module) -> None:
    module.forward = lambda x: torch.zeros_like(x)


SPECIFIC: dict[tuple[str, str], tuple] = {
    ("gpt_oss", "sinks ignored"): (_sinks_ignored, "oracle"),
    ("gpt_oss", "router bias dropped"): (_router_bias_dropped, "oracle"),
    ("gpt_oss", "expert biases dropped"): (_expert_biases_dropped, "oracle"),
    ("gpt_oss", "softmax over every expert"): (_softmax_over_every_expert, "oracle"),
    ("gpt_oss", "gate and up read as halves"): (_gate_up_as_halves, "oracle"),
    ("gpt_oss", "clamp dropped"): (_clamp_dropped, "oracle"),
    ("hunyuan_v1_dense", "q/k norms before RoPE"):
        (lambda model: _head_norm_before_rope(_layer(model, 0).self_attn), "oracle"),
    ("hunyuan_v1_dense", "NTK alpha ignored"): (_ntk_alpha_ignored, "oracle"),
    ("hunyuan_v1_moe", "q/k norms before RoPE"):
        (lambda model: _head_norm_before_rope(_layer(model, 1).self_attn), "oracle"),
    ("hunyuan_v1_moe", "top-k weights unrenormalised"): (_topk_unrenormalised, "oracle"),
    ("hunyuan_v1_moe", "shared MLP dropped"):
        (lambda model: _zero_output(_layer(model, 0).mlp.shared_mlp), "oracle"),
    ("ministral3", "query scale dropped"): (_query_scale_dropped, "oracle"),
    ("granite_swa", "sinks ignored"): (_sinks_ignored, "oracle"),
    ("granite_swa", "windowed base on the full layer"):
        (_window_base_for_the_full_layer, "oracle"),
    ("granite_swa", "residual multiplier dropped"): (_residual_multiplier_dropped, "oracle"),
    ("granite_swa", "logits undivided"): (_logits_undivided, "oracle"),
    ("granitemoe_swa", "sinks ignored"): (_sinks_ignored, "oracle"),
    ("granitemoe_swa", "softmax over every expert"):
        (_granite_moe_softmax_over_every_expert, "oracle"),
    ("granitemoe_swa", "shared MLP dropped"):
        (lambda model: _zero_output(_layer(model, 0).shared_mlp), "oracle"),
    ("flint", "sinks ignored"): (_sinks_ignored, "oracle"),
    ("flint", "NoPE layer rotated"): (_nope_layer_rotated, "oracle"),
    ("flint", "top-k weights unrenormalised"): (_flint_unnormalised, "oracle"),
    ("cohere2_moe", "shared experts summed, not averaged"): (_cohere2_moe_summed, "oracle"),
    ("cohere2_moe", "NoPE layer rotated"): (_cohere2_moe_nope_rotated, "oracle"),
}
"""(family, defect) -> (plant(model) in transformers' own module, the check that must fail)."""


REFUSED = {
    # per-layer k (experts_per_layer): one E and one k for every routed layer
    "hunyuan_v1_moe": ({"moe_topk": [2, 1]}, "moe_topk=[2, 1]"),
    # two bases among the full layers: one rope_theta, one window_rope_theta only
    "granite_swa": ({"layer_rope_theta": [10000.0, 10000.0, 30000.0]}, "layer_rope_theta="),
    # a dense layer after a routed one: the dense layers come first (first_dense_layers)
    "cohere2_moe": ({"mlp_layer_types": ["sparse", "dense", "sparse"]}, "mlp_layer_types="),
}
"""model_type -> (config fields, the option and value the refusal names)."""
