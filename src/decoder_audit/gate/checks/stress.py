"""The weights `oracle` writes into a module with a declared spec (spec.py) to bring each part of
the architecture into the range where a defect of it shows. Each is a function value_of(name,
shape, generator) -> the value of one canonical weight, written through the layout's places and
restored bit for bit afterwards.

  stress   every activation of order 1: embeddings N(0, 1), matrices N(0, 1/fan_in), norm gains
           1 + N(0, 0.2^2), biases and shifts N(0, 0.2^2). Fresh weights keep attention scores
           near 1e-3, where a wrong score scale, RoPE base or layout moves the logits by a few
           ulps.
  quiet    the stress weights with everything that writes into the residual stream scaled so
           its variance is the spec's norm eps: an eps of another size then moves every norm's
           output by a fifth, where an order-1 stream hides it.
  capped   the stress weights with the attention scores and the logits driven past the declared
           soft-caps (attn_softcap, logit_softcap), their spread SOFTCAP_REACH caps. Stress
           scores have a spread of about 1 and logits of about 1 (untied) or sqrt(D) (tied),
           far below Gemma 2's caps of 50 and 30, where c tanh(x / c) differs from x by
           (x / c)^2 / 3 of x: under 1e-4, inside the tolerance, so a dropped cap passed. Past
           the cap the capped scores of the largest keys crowd together at c (the softmax
           spreads over them) while uncapped ones keep their spread (it picks one): a dropped
           cap moves the logits by order 1.

The spread of a stressed score: each query and key feature is a unit-variance input through a
N(0, 1/fan_in) matrix (or a unit-RMS norm), so about 1, and q.k over Dh features times the score
scale s has spread s sqrt(Dh). Queries and keys are both multiplied by sqrt(reach c / (s sqrt(Dh)))
(their projections, or their norms' gains where q/k norms would undo it), so the scores' spread
becomes reach c. The logits' spread is sqrt(sum_d gain_d^2 W_vd^2): sqrt(D) for a tied readout
(N(0, 1) embedding rows), 1 for an untied one; the final norm's gain (or, without one, an untied
readout) is multiplied by reach c over it.
"""

from __future__ import annotations

import math

import torch

from ...config import DecoderConfig

STRESS_GAIN_STD = 0.2
"""Spread of the stress weights' norm gains around 1 and of their biases and shifts around 0."""

SOFTCAP_REACH = 1.0
"""The spread of the capped comparison's scores and logits, in caps: a third of the scores lie
past the cap (where tanh bends by a quarter and more) and the largest at 2-3 caps."""


def stress_values(spec: DecoderConfig):
    """The stress value of each canonical weight (see the module docstring): norm gains are
    1 + N(0, 0.2^2) as the norm applies them (offset + w), so w is that less norm_offset."""
    def value_of(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        noise = torch.randn(shape, generator=gen, dtype=torch.float64)
        part = name.rsplit(".", 2)
        if name.startswith(("token_embeddings", "position_embeddings")):
            return noise
        if part[-2].startswith("ln") or part[-2].endswith("_norm"):  # a norm's gain or shift
            if part[-1] == "weight":
                return 1.0 + STRESS_GAIN_STD * noise - spec.norm_offset
            return STRESS_GAIN_STD * noise
        if part[-1] == "bias" or len(shape) == 1:  # a bias (a router's selection bias too)
            return STRESS_GAIN_STD * noise
        return noise / shape[1] ** 0.5  # a matrix (out, in): unit-variance outputs
    return value_of


def quiet_variance(spec: DecoderConfig) -> float:
    """The residual stream's variance in the quiet comparison: the spec's norm eps (at least
    1e-6), so an eps ten times larger or smaller than the spec's moves every norm's output by
    a fifth or more, where the stress weights' order-1 stream hides it below rounding."""
    return max(float(spec.norm_eps), 1e-6)


def quiet_values(spec: DecoderConfig):
    """The stress values, with everything that writes into the residual stream (the
    embeddings, the output projections, the norms whose output is the stream: sandwich norms
    after the sublayers, a post-norm block's norms, the embedding norm) scaled so the stream
    keeps the quiet variance: each norm then reads a stream as small as its eps, and
    normalises it back to order 1 for the sublayer it feeds. (A fixed sinusoidal table is no
    weight: added to the embeddings it keeps the first stream of order 1.)"""
    stress, amplitude = stress_values(spec), quiet_variance(spec) ** 0.5
    into_stream = ("ln1_post", "ln2_post", "embedding_norm") + (
        ("ln1", "ln2") if spec.post_norm else ())

    def value_of(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        value = stress(name, shape, gen)
        module = name.rsplit(".", 2)[-2]
        if name.startswith("token_embeddings"):
            return value * amplitude / (spec.embedding_scale or 1.0)
        if name.startswith("position_embeddings") or module in ("output_proj", "w2"):
            return value * amplitude
        if module in into_stream:  # their gains: offset + w = amplitude * gain
            offset = spec.norm_offset if name.endswith(".weight") else 0.0
            return (value + offset) * amplitude - offset
        return value
    return value_of


def declares_softcap(spec: DecoderConfig) -> bool:
    return spec.attn_softcap is not None or spec.logit_softcap is not None


def capped_spreads(spec: DecoderConfig) -> dict[str, float]:
    """The factors of the capped comparison (module docstring): "queries_keys" for the query
    and key projections (or q/k norm gains), "readout" for the final norm's gain (or an untied
    readout), each 1.0 where no cap is declared."""
    factors = {"queries_keys": 1.0, "readout": 1.0}
    if spec.attn_softcap is not None:
        scale = spec.attn_scale if spec.attn_scale is not None else spec.head_dim ** -0.5
        spread = scale * math.sqrt(spec.head_dim)  # of a stressed score
        factors["queries_keys"] = math.sqrt(SOFTCAP_REACH * spec.attn_softcap / spread)
    if spec.logit_softcap is not None:
        spread = math.sqrt(spec.d_model) if spec.tie_embeddings else 1.0  # of a stressed logit
        factors["readout"] = SOFTCAP_REACH * spec.logit_softcap / spread
    return factors


def capped_values(spec: DecoderConfig):
    """The stress values with the scores and logits driven past the declared caps."""
    stress, factors = stress_values(spec), capped_spreads(spec)
    a, r = factors["queries_keys"], factors["readout"]

    def gain(value: torch.Tensor, factor: float) -> torch.Tensor:  # offset + w scaled
        return (value + spec.norm_offset) * factor - spec.norm_offset

    def value_of(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        value = stress(name, shape, gen)
        module, part = name.rsplit(".", 2)[-2:]
        if spec.qk_norm and module in ("q_norm", "k_norm"):  # a LayerNorm's shift scaled too
            return gain(value, a) if part == "weight" else value * a
        if not spec.qk_norm and module in ("q_proj", "k_proj"):  # weight and bias alike
            return value * a
        if name == "ln_final.weight":
            return gain(value, r)
        if name == "ln_final.bias":
            return value * r
        if name.startswith("lm_head.") and not (spec.norm_affine or spec.tie_embeddings):
            return value * r  # no final gain to carry the factor: the untied readout does
        return value
    return value_of
