"""The routed and latent families of the families table (FlexOlmo, dots1, GLM-4.5, Solar Open,
HY-V3, MiniMax-M2, Aria's text model, Ernie 4.5 MoE, Mellum, GraniteMoE, GraniteMoeShared, EXAONE
MoE, Kolibri 1, Youtu, GLM-4.7-Flash, MiniCPM3): a defect of what each changes relative to
Llama's block, planted in transformers' own module (`SPECIFIC`, walked by
tests/references/test_families.py); the model types transformers registers for another family's
class (`REGISTERED`) and the options no DecoderConfig expresses (`REFUSED`), walked by
tests/references/test_families_moe.py.

Most plants rewrite a router's output (logits, weights, chosen experts) by a forward hook on
transformers' own router module; the others set a module's attribute. Each changes what the
module computes, never a weight's place: the check named beside it must fail while `params`
passes (the weights are where the spec puts them)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def _routers(model: nn.Module) -> list[nn.Module]:
    """Every routed layer's router (transformers 5: a module returning (logits, weights,
    chosen experts))."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("Router")]
    assert routers, f"{type(model).__name__}: no router module"
    return routers


def _rerouted(weigh: Callable) -> Callable[[nn.Module], None]:
    """A plant whose every router returns the weights `weigh(module, logits, weights, chosen)`
    for the experts it chose."""
    def plant(model: nn.Module) -> None:
        def hook(module, inputs, output):
            logits, weights, chosen = output
            return logits, weigh(module, logits.float(), weights, chosen).to(weights.dtype), chosen
        for router in _routers(model):
            router.register_forward_hook(hook)
    return plant


def _renormalised(module, logits, weights, chosen):  # FlexOlmo's norm_topk_prob=False ignored
    return weights / weights.sum(-1, keepdim=True)


def _unscaled(module, logits, weights, chosen):  # routed_scaling_factor dropped
    return weights / module.routed_scaling_factor


def _v3_groups_ignored(module, logits, weights, chosen):
    """DeepSeek-V3's choice made among every expert, as if n_group were 1 (the weights of the
    experts so chosen); the router's output keeps its own shape."""
    scores = logits.sigmoid()
    picked = (scores + module.e_score_correction_bias).topk(chosen.shape[-1], dim=-1).indices
    chosen.copy_(picked)  # in place: the hook returns the same tensor of indices
    picked_scores = scores.gather(-1, picked)
    if module.norm_topk_prob:
        picked_scores = picked_scores / picked_scores.sum(-1, keepdim=True)
    return picked_scores * module.routed_scaling_factor


def _v3_bias_weighs(module, logits, weights, chosen):  # the choosing bias also weighs
    biased = (logits.sigmoid() + module.e_score_correction_bias).gather(-1, chosen)
    return biased / biased.sum(-1, keepdim=True) * module.routed_scaling_factor


def _hy_v3_unnormalised(module, logits, weights, chosen):  # sigmoid scores, not renormalised
    return logits.sigmoid().gather(-1, chosen) * module.router_scaling_factor


def _softmax_over_every_expert(module, logits, weights, chosen):  # Aria, GraniteMoE: not the k
    return logits.softmax(-1).gather(-1, chosen)


def _ernie_bias_weighs(module, logits, weights, chosen):
    biased = (logits.softmax(-1) + module.moe_statics.e_score_correction_bias[0]).gather(-1, chosen)
    return biased / biased.sum(-1, keepdim=True)


def _kolibri_bias_weighs(module, logits, weights, chosen):  # sigmoid of the biased logits
    biased = (logits + module.e_score_correction_bias).gather(-1, chosen).sigmoid()
    return biased / biased.sum(-1, keepdim=True) if module.norm_topk_prob else biased


def _block_bias_ignored(model: nn.Module) -> None:
    """MiniMax-M2: the block hands its router a zero selection bias."""
    def hook(module, args):
        hidden, bias = args
        return hidden, torch.zeros_like(bias)
    for router in _routers(model):
        router.register_forward_pre_hook(hook)


def _windowed_on_the_global_base(model: nn.Module) -> None:
    """Mellum: the windowed layers turn on the full layers' base (1e4 -> 5e5)."""
    rotary = model.model.rotary_emb
    rotary.sliding_attention_inv_freq.copy_(rotary.full_attention_inv_freq)


def _residual_multiplier_dropped(model: nn.Module) -> None:
    for layer in model.model.layers:
        layer.residual_multiplier = 1.0


def _attention_multiplier_of_the_head_width(model: nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.head_dim ** -0.5


def _shared_gate_and_up_swapped(model: nn.Module) -> None:
    """GraniteMoeShared: the fused input_linear's halves read the other way round."""
    def hook(module, inputs, output):
        gate, up = output.chunk(2, dim=-1)
        return torch.cat([up, gate], dim=-1)
    for layer in model.model.layers:
        layer.shared_mlp.input_linear.register_forward_hook(hook)


def _logits_scaling_dropped(model: nn.Module) -> None:
    """The readout multiplied back by logits_scaling: logits undivided."""
    scaling = model.config.logits_scaling
    model.lm_head.register_forward_hook(lambda module, inputs, output: output * scaling)


def _rope_on_the_nope_layer(model: nn.Module) -> None:
    """EXAONE MoE: its full layer 1 rotates (a window of None there means RoPE)."""
    model.model.layers[1].self_attn.sliding_window = None


def _post_mlp_norm_skipped(model: nn.Module) -> None:
    norm = model.model.layers[0].post_mlp_layernorm
    norm.forward = lambda x: x


def _latent_norm_skipped(model: nn.Module) -> None:
    """Layer 0's key/value latent goes unnormalised into kv_b_proj."""
    norm = model.model.layers[0].self_attn.kv_a_layernorm
    norm.forward = lambda x: x


def _latent_norms_on_the_block_eps(model: nn.Module) -> None:
    """GLM-4.7-Flash's latent norms built with the config's rms_norm_eps (1e-5), not 1e-6."""
    for layer in model.model.layers:
        for norm in (layer.self_attn.q_a_layernorm, layer.self_attn.kv_a_layernorm):
            norm.variance_epsilon = model.config.rms_norm_eps


def _residual_scale_dropped(model: nn.Module) -> None:
    """MiniCPM3: each sublayer's output joins the stream unscaled."""
    for layer in model.model.layers:
        layer.residual_scale = 1.0


SPECIFIC: dict[tuple[str, str], tuple] = {
    ("flex_olmo", "top-k weights renormalised"): (_rerouted(_renormalised), "oracle"),
    ("dots1", "expert groups ignored"): (_rerouted(_v3_groups_ignored), "oracle"),
    ("glm4_moe", "routed scaling dropped"): (_rerouted(_unscaled), "oracle"),
    ("solar_open", "selection bias weighs"): (_rerouted(_v3_bias_weighs), "oracle"),
    ("hy_v3", "top-k weights unnormalised"): (_rerouted(_hy_v3_unnormalised), "oracle"),
    ("minimax_m2", "selection bias ignored"): (_block_bias_ignored, "oracle"),
    ("aria_text", "softmax over every expert"): (_rerouted(_softmax_over_every_expert),
                                                 "oracle"),
    ("ernie4_5_moe", "selection bias weighs"): (_rerouted(_ernie_bias_weighs), "oracle"),
    ("mellum", "windowed layer on the global base"): (_windowed_on_the_global_base, "oracle"),
    ("granitemoe", "residual multiplier dropped"): (_residual_multiplier_dropped, "oracle"),
    ("granitemoe", "attention multiplier of the head width"): (
        _attention_multiplier_of_the_head_width, "oracle"),
    ("granitemoeshared", "shared gate and up swapped"): (_shared_gate_and_up_swapped, "oracle"),
    ("granitemoeshared", "logits scaling dropped"): (_logits_scaling_dropped, "oracle"),
    ("exaone_moe", "rope on the nope layer"): (_rope_on_the_nope_layer, "oracle"),
    ("kolibri1", "selection bias weighs"): (_rerouted(_kolibri_bias_weighs), "oracle"),
    ("kolibri1", "post-mlp norm skipped"): (_post_mlp_norm_skipped, "oracle"),
    ("youtu", "latent norm skipped"): (_latent_norm_skipped, "oracle"),
    ("glm4_moe_lite", "latent norms on the block's eps"): (_latent_norms_on_the_block_eps,
                                                           "oracle"),
    ("glm4_moe_lite", "expert groups ignored"): (_rerouted(_v3_groups_ignored), "oracle"),
    ("minicpm3", "residual scale dropped"): (_residual_scale_dropped, "oracle"),
    ("minicpm3", "logits scaling dropped"): (_logits_scaling_dropped, "oracle"),
}
"""(family, defect) -> (plant(model) in transformers' own module, the check that must fail)."""

# a model_type transformers registers for another family's class, read by that class's entry:
# model_type -> (the class, a plant that must still fail the oracle)
REGISTERED = {"sarvam_moe": ("Glm4MoeForCausalLM", _rerouted(_unscaled))}

# an option the family's modules read and no DecoderConfig expresses: (family, the config's
# fields beside the tiny sizes, the option named in the refusal)
REFUSED = [("ernie4_5_moe", {"use_bias": True}, "use_bias"),
           ("ernie4_5_moe", {"num_hidden_layers": 3, "moe_layer_start_index": 0,
                             "moe_layer_end_index": 1}, "moe_layer_end_index"),  # layer 2 dense
           ("mellum", {"mlp_layer_types": ["sparse", "dense"]}, "mlp_layer_types"),
           ("hy_v3", {"mlp_bias": True}, "mlp_bias"),
           ("aria_text", {"mlp_bias": True}, "mlp_bias"),
           ("glm4_moe", {"n_shared_experts": 0}, "n_shared_experts"),  # zero-size weights
           ("kolibri1", {"shared_expert_intermediate_size": 0},
            "shared_expert_intermediate_size")]
