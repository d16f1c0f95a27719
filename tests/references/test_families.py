"""The families table walked (references/families.py): every family whose class this release of
transformers has, built as the conformance sweep builds it (its config's defaults with every
size shrunk, its own random initialisation), is read as its config's spec with no argument and
passes `params` and `oracle`; and defects planted in transformers' own modules of each fail
them. The generic defects are planted the same way in every family:

    the other activation     layer 0's MLP computes another function than its config names
    the other norm           layer 0's first norm computes the other kind (RMSNorm <-> LayerNorm)
    RoPE band                every rotary table turns 1.5x too fast (a wrong base or band)

and `SPECIFIC` holds defects of what a family changes relative to Llama's block (a dropped
multiplier, a wrong router normalisation, ...), each failing the check it names. Expectations
come from the float64 oracle fed the model's own weights under the config's declared
architecture, never from the model. And our own Decoder is held to transformers' module:
`from_hf` reads each family into a Decoder whose logits equal the family's, and `to_hf` writes
it back where a family holds it (transformers is the independent reference of our model)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conformance import Unbuildable, build_tiny

import decoder_audit as da
from decoder_audit.references.families import FAMILIES
from decoder_audit.references.hf import from_hf, to_hf
from decoder_audit.references.hf_models import eager_experts

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


def _present() -> list[str]:
    return [family.model_type for family in FAMILIES
            if getattr(tf, family.model_class, None) is not None]


def _tiny(model_type: str) -> torch.nn.Module:
    family = next(f for f in FAMILIES if f.model_type == model_type)
    try:
        model, _ = build_tiny(model_type, family.model_class)
    except Unbuildable as exc:
        pytest.skip(f"{model_type} does not build at tiny size on this release: {exc}")
    return model


def _audit(model: torch.nn.Module) -> da.AuditReport:
    return da.audit(model, checks=["params", "oracle"])


@pytest.mark.parametrize("model_type", _present())
def test_each_family_is_read_as_its_spec_and_passes(model_type):
    model = _tiny(model_type)
    report = _audit(model)
    assert report.facts.spec is not None, report["oracle"].detail  # white-box, no argument
    assert report["params"].passed, report["params"].detail
    assert report["oracle"].passed, report["oracle"].detail


# ---- the generic defects ------------------------------------------------------------------------

def _first_layer(model: torch.nn.Module) -> torch.nn.Module:
    """Layer 0 of the decoder stack (the first ModuleList of as many blocks as the config's
    layers)."""
    layers = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == layers:
            return module[0]
    raise AssertionError(f"{type(model).__name__}: no list of {layers} layers")


_ACTIVATION_NAMES = ("act_fn", "act", "activation_fn", "activation")


class _Function(torch.nn.Module):
    """A function as the child module an activation slot takes."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


def _other_activation(model: torch.nn.Module) -> None:
    """Layer 0's MLP activation replaced: tanh-GELU where it was SiLU, SiLU otherwise."""
    for module in _first_layer(model).modules():
        for name in _ACTIVATION_NAMES:
            act = getattr(module, name, None)
            if callable(act) and not isinstance(act, type):
                probe = torch.linspace(-3, 3, 7)
                other = (functools.partial(F.gelu, approximate="tanh")
                         if torch.allclose(act(probe), F.silu(probe)) else F.silu)
                setattr(module, name, _Function(other) if isinstance(act, torch.nn.Module)
                        else other)
                return
    raise AssertionError(f"{type(model).__name__}: no activation found in layer 0")


def _is_norm(module: torch.nn.Module) -> bool:
    """A norm module (its class named so, with no modules inside: OLMo's learns nothing)."""
    return "norm" in type(module).__name__.lower() and not list(module.children())


def _other_norm(model: torch.nn.Module) -> None:
    """Layer 0's first norm computes the other kind on its own weights: an RMSNorm subtracts the
    mean first (a LayerNorm); a LayerNorm keeps it (an RMSNorm)."""
    norm = next(m for m in _first_layer(model).modules() if _is_norm(m))
    forward = norm.forward
    if "rms" in type(norm).__name__.lower():
        norm.forward = lambda x: forward(x - x.mean(-1, keepdim=True))
        return
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-5))

    def rms(x: torch.Tensor) -> torch.Tensor:
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        out = out if getattr(norm, "weight", None) is None else out * norm.weight
        return out if getattr(norm, "bias", None) is None else out + norm.bias

    norm.forward = rms


def _rope_band(model: torch.nn.Module) -> None:
    """Every rotary table's frequencies 1.5x the declared ones."""
    tables = [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    if not tables:
        pytest.skip("no rotary table (learned or no positions)")
    for module in tables:
        module.inv_freq.mul_(1.5)
        if hasattr(module, "original_inv_freq"):
            module.original_inv_freq = module.inv_freq.clone()


GENERIC = {"the other activation": _other_activation, "the other norm": _other_norm,
           "RoPE band": _rope_band}


@pytest.mark.parametrize("defect", sorted(GENERIC))
@pytest.mark.parametrize("model_type", _present())
def test_a_generic_defect_planted_in_each_family_fails_the_oracle(model_type, defect):
    model = _tiny(model_type)
    with torch.no_grad():
        GENERIC[defect](model)
    report = _audit(model)
    assert report["params"].passed, report["params"].detail  # the weights are where they were
    assert not report["oracle"].passed, f"{model_type}: {defect} passed the oracle"


# ---- what each family changes, planted wrong ----------------------------------------------------

# ---- routed families (helper fam-moe): each router's output (logits, weights, chosen) is
# rewritten by a forward hook on transformers' own router module, or a module's attribute set

def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every routed layer's router (transformers 5: a module returning (logits, weights,
    chosen experts))."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("Router")]
    assert routers, f"{type(model).__name__}: no router module"
    return routers


def _rerouted(weigh) -> callable:
    """A plant whose every router returns the weights `weigh(module, logits, weights, chosen)`
    for the experts it chose."""
    def plant(model: torch.nn.Module) -> None:
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


def _block_bias_ignored(model: torch.nn.Module) -> None:
    """MiniMax-M2: the block hands its router a zero selection bias."""
    def hook(module, args):
        hidden, bias = args
        return hidden, torch.zeros_like(bias)
    for router in _routers(model):
        router.register_forward_pre_hook(hook)


def _windowed_on_the_global_base(model: torch.nn.Module) -> None:
    """Mellum: the windowed layers turn on the full layers' base (1e4 -> 5e5)."""
    rotary = model.model.rotary_emb
    rotary.sliding_attention_inv_freq.copy_(rotary.full_attention_inv_freq)


def _residual_multiplier_dropped(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.residual_multiplier = 1.0


def _attention_multiplier_of_the_head_width(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.head_dim ** -0.5


def _shared_gate_and_up_swapped(model: torch.nn.Module) -> None:
    """GraniteMoeShared: the fused input_linear's halves read the other way round."""
    def hook(module, inputs, output):
        gate, up = output.chunk(2, dim=-1)
        return torch.cat([up, gate], dim=-1)
    for layer in model.model.layers:
        layer.shared_mlp.input_linear.register_forward_hook(hook)


def _logits_scaling_dropped(model: torch.nn.Module) -> None:
    """The readout multiplied back by logits_scaling: logits undivided."""
    scaling = model.config.logits_scaling
    model.lm_head.register_forward_hook(lambda module, inputs, output: output * scaling)


def _rope_on_the_nope_layer(model: torch.nn.Module) -> None:
    """EXAONE MoE: its full layer 1 rotates (a window of None there means RoPE)."""
    model.model.layers[1].self_attn.sliding_window = None


def _post_mlp_norm_skipped(model: torch.nn.Module) -> None:
    norm = model.model.layers[0].post_mlp_layernorm
    norm.forward = lambda x: x


def _latent_norm_skipped(model: torch.nn.Module) -> None:
    """Layer 0's key/value latent goes unnormalised into kv_b_proj."""
    norm = model.model.layers[0].self_attn.kv_a_layernorm
    norm.forward = lambda x: x


def _latent_norms_on_the_block_eps(model: torch.nn.Module) -> None:
    """GLM-4.7-Flash's latent norms built with the config's rms_norm_eps (1e-5), not 1e-6."""
    for layer in model.model.layers:
        for norm in (layer.self_attn.q_a_layernorm, layer.self_attn.kv_a_layernorm):
            norm.variance_epsilon = model.config.rms_norm_eps


def _residual_scale_dropped(model: torch.nn.Module) -> None:
    """MiniCPM3: each sublayer's output joins the stream unscaled."""
    for layer in model.model.layers:
        layer.residual_scale = 1.0


SPECIFIC: dict[tuple[str, str], tuple] = {
    # ---- routed families (helper fam-moe) ----
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


# ---- routed families (helper fam-moe): a model_type transformers registers for another
# family's class is read by that class's entry (Sarvam-MoE's config by GLM-4.5's class)
REGISTERED = {"sarvam_moe": ("Glm4MoeForCausalLM", _rerouted(_unscaled))}


@pytest.mark.parametrize("model_type", sorted(REGISTERED))
def test_a_config_registered_for_a_family_class_is_read_by_its_entry(model_type):
    """Its own defaults (Sarvam: q/k norms, every feature rotated, routed_scaling_factor 2.5)
    are read as they are, not as the class's family's defaults; a planted defect still fails."""
    class_name, plant = REGISTERED[model_type]
    try:
        model, _ = build_tiny(model_type, class_name)
    except Unbuildable as exc:
        pytest.skip(f"{model_type} does not build at tiny size on this release: {exc}")
    report = _audit(model)
    assert report.facts.spec is not None, report["oracle"].detail
    assert report["params"].passed, report["params"].detail
    assert report["oracle"].passed, report["oracle"].detail
    spec, config = report.facts.spec, model.config
    assert (spec.qk_norm, spec.rotary_dim, spec.routed_scaling) == (
        config.use_qk_norm, None, config.routed_scaling_factor)
    with torch.no_grad():
        plant(model)
    assert not _audit(model)["oracle"].passed


# an option the family's modules read and no DecoderConfig expresses: (family, the config's
# fields beside the tiny sizes, the option named in the refusal)
REFUSED = [("ernie4_5_moe", {"use_bias": True}, "use_bias"),
           ("ernie4_5_moe", {"num_hidden_layers": 3, "moe_layer_start_index": 0,
                             "moe_layer_end_index": 1}, "moe_layer_end_index"),  # layer 2 dense
           ("mellum", {"mlp_layer_types": ["sparse", "dense"]}, "mlp_layer_types"),
           ("hy_v3", {"mlp_bias": True}, "mlp_bias"),
           ("aria_text", {"mlp_bias": True}, "mlp_bias"),
           ("glm4_moe", {"n_shared_experts": 0}, "n_shared_experts"),  # zero-size weights
           ("kolibri1", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size")]


@pytest.mark.parametrize("family, fields, option", REFUSED,
                         ids=[f"{f}-{o}" for f, _, o in REFUSED])
def test_an_option_a_routed_family_cannot_express_is_refused_by_name(family, fields, option):
    from conformance import tiny_config

    from decoder_audit.references.hf_config import config_from_hf

    config = tiny_config(family)
    config = type(config)(**{**config.to_dict(), **fields})
    with pytest.raises(da.ConfigError, match=option):
        config_from_hf(config, family)


@pytest.mark.parametrize("family, defect", sorted(SPECIFIC))
def test_a_defect_of_what_the_family_changes_fails_its_check(family, defect):
    plant, check = SPECIFIC[(family, defect)]
    model = _tiny(family)
    with torch.no_grad():
        plant(model)
    report = _audit(model)
    assert not report[check].passed, f"{family}: {defect} passed {check}"
    if check == "oracle":  # a numerics defect: every weight is where the spec puts it
        assert report["params"].passed, report["params"].detail


# ---- our Decoder against transformers' module ---------------------------------------------------

@pytest.mark.parametrize("model_type", _present())
def test_each_family_reads_into_a_decoder_whose_logits_are_its_own(model_type):
    """from_hf places the family's weights into a Decoder of its config (our model, written
    from the DecoderConfig alone): its logits equal transformers' in float64; to_hf writes it
    back as the first family holding the config (not always the same one), logits equal."""
    model = _tiny(model_type).double()
    eager_experts(model)  # transformers' grouped expert kernel refuses float64
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        # transformers turns RoPE in float32 whatever the model's dtype: a few float32 ulps of
        # the logits' scale, twice over for a model written back as another family
        atol = 1e-6 * max(1.0, float(theirs.abs().max()))
        ours = from_hf(model)
        torch.testing.assert_close(ours(ids), theirs, atol=atol, rtol=0)
        try:
            back = to_hf(ours)
        except da.ConfigError as exc:  # no family writes this config: said, naming the fields
            assert "holds this config" in str(exc) or "converter" in str(exc), exc
            return
        torch.testing.assert_close(back(input_ids=ids).logits, theirs, atol=atol, rtol=0)
