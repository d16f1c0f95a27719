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


CORRECT = ("moe-softmax-shared", "moe-sigmoid-bias", "moe-topk-softmax-relu", "moe-unnormalised",
           "mla-q-latent", "mla-moe")

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
    Case("selection_bias_weighs_too", _mutant("moe-sigmoid-bias", _class("layers.0.ffn",
                                                                         BiasWeighs)),
         "oracle", first=False, says="differ from the slow oracle"),
    Case("shared_expert_missing", _mutant("moe-softmax-shared", _silenced("layers.2.ffn.shared")),
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
