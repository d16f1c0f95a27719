"""Routed experts and latent attention: our Decoder with one defect planted in a routed MLP or a
latent attention, each beside the correct model it differs from (tests/gate/test_experts_gate.py
proves the correct ones pass every check and each mutant fails its named check).

The planted defects are the ones the issue names: a wrong router order, unnormalised top-k
weights, a routed scaling ignored, a missing shared expert, an expert left out of the sum, a
selection bias that weighs as well as chooses, wrong latent ranks, the rotary part applied to
the wrong half of the heads, the latent norm skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import configs
import torch
from torch import nn
from zoo import Case, decoder

import decoder_audit as da
from decoder_audit.model.attention import LatentAttention, apply_rope
from decoder_audit.model.mlp import RoutedExperts


def correct(name: str) -> da.Decoder:
    """The named test config's Decoder, seed 3; a selection-only bias drawn N(0, 0.01^2) where
    the config has one (at 0, as initialised, choosing by it or not is the same; 0.01 is the
    spread of a fresh router's sigmoid scores, so the bias changes some choices, not all)."""
    model = decoder(configs.named(name), seed=3)
    with torch.no_grad():
        for layer in model.layers:
            bias = getattr(getattr(layer.ffn, "router", None), "selection_bias", None)
            if bias is not None:
                bias.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(5))
    return model


def _mutant(name: str, plant: Callable[[da.Decoder], None]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        model = correct(name)
        plant(model)
        return model
    return build


def _routing(layer: int, **changes) -> Callable[[da.Decoder], None]:
    """The routed layer computes with these routing fields changed (its config, not the
    model's: the declared spec stays what the model claims)."""
    def plant(model: da.Decoder) -> None:
        ffn = model.layers[layer].ffn
        ffn.cfg = ffn.cfg.replace(**changes)
    return plant


def _silenced(path: str) -> Callable[[da.Decoder], None]:
    """The module at `path` contributes nothing: its output multiplied by 0."""
    def plant(model: da.Decoder) -> None:
        model.get_submodule(path).register_forward_hook(lambda module, inputs, out: out * 0)
    return plant


def _skipped(path: str) -> Callable[[da.Decoder], None]:
    """The norm at `path` passes its input through."""
    def plant(model: da.Decoder) -> None:
        model.get_submodule(path).register_forward_hook(lambda module, inputs, out: inputs[0])
    return plant


def _set_none(path: str) -> Callable[[da.Decoder], None]:
    """The submodule at `path` removed (its weight with it)."""
    def plant(model: da.Decoder) -> None:
        owner, _, name = path.rpartition(".")
        setattr(model.get_submodule(owner), name, None)
    return plant


def _gate_squared(layer: int) -> Callable[[da.Decoder], None]:
    """The shared experts' sigmoid gate applied twice (its output squared)."""
    def plant(model: da.Decoder) -> None:
        model.layers[layer].ffn.shared.register_forward_hook(
            lambda module, inputs, out: out * torch.sigmoid(
                model.layers[layer].ffn.shared_gate(inputs[0])))
    return plant


class BiasWeighs(RoutedExperts):
    """The selection bias added to the scores that weigh the experts too, not only to those
    that choose them (DeepSeek-V3 gathers the unbiased scores)."""

    def route(self, x):
        logits, chosen, weights = super().route(x)
        bias = self.router.selection_bias[chosen]  # (N, k)
        return logits, chosen, weights + bias * self.cfg.routed_scaling


class RotatesTheFirstFeatures(LatentAttention):
    """RoPE turns each head's first R features (inside its non-rotary part) instead of its
    last R (the rotary part, which the one shared key fills)."""

    def _project(self, x, rope):
        q, k, v = super()._project(x, None)
        if rope is not None:
            R = self.rope
            q = torch.cat((apply_rope(q[..., :R], rope, self.rope_layout), q[..., R:]), dim=-1)
            k = torch.cat((apply_rope(k[..., :R], rope, self.rope_layout), k[..., R:]), dim=-1)
        return q, k, v


def _class(path: str, cls: type) -> Callable[[da.Decoder], None]:
    def plant(model: da.Decoder) -> None:
        model.get_submodule(path).__class__ = cls
    return plant


def wrong_latent_rank() -> nn.Module:
    """Built with a key/value latent of 12 while its config declares 10."""
    cfg = configs.named("mla-q-latent")
    model = decoder(cfg.replace(kv_latent_rank=12), seed=3)
    model.config = cfg
    return model


def _tiny_experts(layer: int) -> Callable[[da.Decoder], None]:
    """The layer's experts write 1e-6 of what they wrote: a routing defect there moves the
    logits less than the invariance checks' tolerance, and is seen in the routing alone."""
    def plant(model: da.Decoder) -> None:
        with torch.no_grad():
            for expert in model.layers[layer].ffn.experts:
                expert.w2.weight.mul_(1e-6)
    return plant


def _both(*plants: Callable[[da.Decoder], None]) -> Callable[[da.Decoder], None]:
    def plant(model: da.Decoder) -> None:
        for one in plants:
            one(model)
    return plant


def _never_chosen(layer: int, expert: int) -> Callable[[da.Decoder], None]:
    """A selection-only bias of -10: the router never ranks the expert among a token's top k."""
    def plant(model: da.Decoder) -> None:
        with torch.no_grad():
            model.layers[layer].ffn.router.selection_bias[expert] = -10.0
    return plant


def _detached(path: str) -> Callable[[da.Decoder], None]:
    """The module's output cut from the graph: its weights get no gradient."""
    def plant(model: da.Decoder) -> None:
        model.get_submodule(path).register_forward_hook(lambda module, inputs, out: out.detach())
    return plant


def _quiet(capacity_factor: float | None) -> Callable[[], nn.Module]:
    """moe-capacity's shape, with or without its capacity, every expert's output 1e-6 of its
    own: tokens dropped over the capacity move the logits by less than any tolerance."""
    def build() -> nn.Module:
        model = decoder(configs.named("moe-capacity").replace(capacity_factor=capacity_factor),
                        seed=3)
        _both(_tiny_experts(0), _tiny_experts(1))(model)
        return model
    return build


def _router_of_zeros(model: da.Decoder) -> None:
    """Every router weight (and selection bias) 0: every expert scores alike for every token,
    so which k are chosen is decided by the tie rule alone."""
    with torch.no_grad():
        for layer in model.layers:
            router = getattr(layer.ffn, "router", None)
            if router is not None:
                router.weight.zero_()
                if router.selection_bias is not None:
                    router.selection_bias.zero_()


def tied(name: str, plant: Callable[[da.Decoder], None] | None = None) -> nn.Module:
    """The named config's correct Decoder with a router of zeros (every score tied), and with
    `plant` planted on top where one is given."""
    model = correct(name)
    _router_of_zeros(model)
    if plant is not None:
        plant(model)
    return model


# correct models the routing checks must pass beside their mutants
UNCHOSEN_EXPERT = _mutant("moe-sigmoid-bias", _never_chosen(1, 3))
QUIET_EXPERTS = _quiet(None)

CORRECT = ("moe-softmax-shared", "moe-sigmoid-bias", "moe-topk-softmax-relu", "moe-unnormalised",
           "mla-q-latent", "mla-moe", "moe-grouped", "moe-grouped-max", "moe-shared-gate")

MUTANTS = [
    # Qwen-MoE / OLMoE weigh by the softmax over every expert; taking the top k logits first
    # and a softmax over those renormalises them
    Case("router_order_topk_then_softmax", _mutant("moe-unnormalised", _routing(
        0, router_order="topk_score")), "oracle", first=False, says="differ from the slow oracle"),
    Case("topk_weights_not_renormalised", _mutant("moe-softmax-shared", _routing(
        1, normalize_topk=False)), "oracle", first=False, says="differ from the slow oracle"),
    Case("routed_scaling_ignored", _mutant("moe-sigmoid-bias", _routing(
        1, routed_scaling=1.0)), "oracle", first=False, says="differ from the slow oracle"),
    Case("sigmoid_router_scored_by_softmax", _mutant("moe-sigmoid-bias", _routing(
        0, router_scoring="softmax")), "oracle", first=False, says="differ from the slow oracle"),
    # DeepSeek's group-limited routing dropped: a token's experts chosen from every group
    Case("expert_groups_ignored", _mutant("moe-grouped", _routing(
        0, expert_groups=None, groups_per_token=None)), "oracle", first=False,
         says="differ from the slow oracle"),
    Case("groups_ranked_by_their_best_not_their_two_best", _mutant("moe-grouped", _routing(
        1, group_score="max")), "oracle", first=False, says="differ from the slow oracle"),
    Case("selection_bias_weighs_too", _mutant("moe-sigmoid-bias", _class("layers.0.ffn",
                                                                         BiasWeighs)),
         "oracle", first=False, says="differ from the slow oracle"),
    Case("shared_expert_missing", _mutant("moe-softmax-shared", _silenced("layers.2.ffn.shared")),
         "oracle", first=False, says="differ from the slow oracle"),
    # a weight the config declares and the model lacks: no longer white-box by its own config,
    # so audited against it as a declared spec (as zoo.py's dropped sandwich norm)
    Case("shared_expert_gate_missing", _mutant("moe-shared-gate", _set_none(
        "layers.1.ffn.shared_gate")), "params", first=False,
         says="layers.1.ffn.shared_gate.weight", kwargs={"spec": configs.named("moe-shared-gate")}),
    Case("shared_expert_gate_applied_twice", _mutant("moe-shared-gate", _gate_squared(1)),
         "oracle", first=False, says="differ from the slow oracle"),
    Case("expert_left_out_of_the_sum", _mutant("moe-softmax-shared", _silenced(
        "layers.1.ffn.experts.2")), "oracle", first=False, says="differ from the slow oracle"),
    Case("expert_never_reached", _mutant("moe-softmax-shared", _silenced(
        "layers.1.ffn.experts.2")), "dead_parameters", first=False,
         says="layers.1.ffn.experts.2.w1.weight"),
    Case("latent_rank_other_than_declared", wrong_latent_rank, "params", first=False,
         says="layers.0.attn"),
    Case("rotary_part_on_the_wrong_features", _mutant("mla-q-latent", _class(
        "layers.1.attn", RotatesTheFirstFeatures)), "oracle", first=False,
         says="differ from the slow oracle"),
    Case("latent_norm_skipped", _mutant("mla-moe", _skipped("layers.0.attn.kv_a_norm")),
         "oracle", first=False, says="differ from the slow oracle"),
]

# Defects only the routing checks see (every other check passes them).
ROUTING_MUTANTS = [
    # tokens dropped over the declared capacity (the oracle drops them too), the dropped
    # experts' outputs too small for the logits to show it: a leak all the same
    Case("capacity_dropping_below_the_logits", _quiet(1.0), "routing_independence",
         only=True, says="capacity_factor=1.0"),
    # an expert cut off from the loss that the router never chooses on its own: dead_parameters
    # names it as not judged, the oracle never sees it used
    Case("unchosen_expert_cut_off", _mutant("moe-sigmoid-bias", _both(
        _never_chosen(1, 3), _detached("layers.1.ffn.experts.3"))), "expert_gradients",
         only=True, says="layers.1.ffn.experts.3"),
]
