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
import re

import families_gpt
import families_moe
import families_positions
import families_sinks
import pytest
import torch
import family_plants as fp
import torch.nn.functional as F
from conformance import Unbuildable, build_tiny, tiny_config

import decoder_audit as da
from decoder_audit.references.families import FAMILIES
from decoder_audit.references.family_black_box import BLACK_BOX
from decoder_audit.references.hf import from_hf, to_hf
from decoder_audit.references.hf_config import config_from_hf
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
    if report.facts.spec is None and ("this release" in report.facts.reference_reason or
                                      "transformers 4 release" in report.facts.reference_reason):
        pytest.skip(report.facts.reference_reason)  # an older release's modules, said so
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


_ACTIVATION_NAMES = ("act_fn", "act", "activation_fn", "activation", "gelu_impl")


class _Function(torch.nn.Module):
    """A function as the child module an activation slot takes."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


def _other_activation(model: torch.nn.Module) -> None:
    """Layer 0's MLP activation replaced: tanh-GELU where it was SiLU, SiLU otherwise; where
    the experts compute their gated unit in one method of the fused gate_up (GPT-OSS's
    `_apply_gate`, its clamped SwiGLU), Llama's plain SwiGLU of the same units instead."""
    for module in _first_layer(model).modules():
        for name in _ACTIVATION_NAMES:
            act = getattr(module, name, None)
            if callable(act) and not isinstance(act, type):
                probe = torch.linspace(-3, 3, 7)
                other = (functools.partial(F.gelu, approximate="tanh")
                         if torch.allclose(act(probe), F.silu(probe)) else F.silu)
                if isinstance(act, torch.nn.Module) and any(True for _ in act.parameters()):
                    act.forward = other  # a learned activation's parameters stay (xIELU)
                else:
                    setattr(module, name, _Function(other) if isinstance(act, torch.nn.Module)
                            else other)
                return
        if callable(getattr(module, "_apply_gate", None)):  # gate, up interleaved units
            module._apply_gate = lambda gate_up: F.silu(gate_up[..., ::2]) * gate_up[..., 1::2]
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
    """Every rotary table's frequencies 1.5x the declared ones: `inv_freq`, or one table per
    layer kind (`full_attention_inv_freq`, ...: Gemma 3, OLMo 3)."""
    tables = [(module, name) for module in model.modules()
              for name, value in {**dict(module.named_buffers(recurse=False)),
                                  **vars(module)}.items()
              if name.endswith("inv_freq") and "original" not in name
              and isinstance(value, torch.Tensor)]
    if not tables:
        pytest.skip("no rotary table (learned or no positions)")
    for module, name in tables:
        getattr(module, name).mul_(1.5)
        original = name[:-len("inv_freq")] + "original_inv_freq"  # what a dynamic RoPE resets to
        if hasattr(module, original):
            setattr(module, original, getattr(module, name).clone())


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

def _full_band(model: torch.nn.Module) -> None:
    """The rotary table spans every feature of a head (GLM rotates only the first
    partial_rotary_factor of them): RoPE turns the pass-through features too."""
    rotary, head_dim = model.model.rotary_emb, model.config.head_dim
    theta = (getattr(model.config, "rope_parameters", None) or {}).get(
        "rope_theta", getattr(model.config, "rope_theta", None))  # transformers 5, or 4
    rotary.inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    rotary.original_inv_freq = rotary.inv_freq.clone()


def _windowed_on_full_base(model: torch.nn.Module) -> None:
    """OLMo 3's windowed layers turn by the full layers' RoPE table (its own base, and any
    scaling, ignored): one table per layer kind from transformers 5.x, one module per kind in 4.x;
    a release with one table for every layer has nothing to confuse."""
    rotary = model.model.rotary_emb if hasattr(model.model, "rotary_emb") else None
    if hasattr(rotary, "sliding_attention_inv_freq"):
        tables = (rotary.full_attention_inv_freq, rotary.sliding_attention_inv_freq)
    elif hasattr(model.model, "rotary_embs"):
        tables = (model.model.rotary_embs["full_attention"].inv_freq,
                  model.model.rotary_embs["sliding_attention"].inv_freq)
    else:
        pytest.skip("this release turns every OLMo 3 layer by one RoPE table")
    if torch.equal(*tables):
        pytest.skip("both layer kinds turn by the same table in this release's config")
    tables[1].copy_(tables[0])


def _attention(i: int):
    return lambda model: fp.layer(model, i).self_attn


def _plain_layer_norm(norm: torch.nn.Module) -> None:
    """Nemotron's LayerNorm1P computing a plain LayerNorm (gain w, not 1 + w)."""
    norm.forward = lambda x: F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias,
                                          norm.eps)


def _setting(get, **values):
    """A plant that sets attributes of the module `get(model)` (a multiplier its forward reads
    from itself, a layer's flag)."""
    def plant(model):
        for name, value in values.items():
            setattr(get(model), name, value(model) if callable(value) else value)
    return plant


def _each(*plants):
    def plant(model):
        for one in plants:
            one(model)
    return plant


_LOGITS_SCALING = lambda model: model.config.logits_scaling  # noqa: E731


def _xielu_without_softplus(model: torch.nn.Module) -> None:
    """Layer 0's xIELU (transformers' XIELUActivation) takes alpha_p and alpha_n as its
    coefficients, without the softplus that keeps them positive."""
    act = fp.layer(model, 0).mlp.act_fn

    def forward(x: torch.Tensor) -> torch.Tensor:
        negative = (torch.expm1(torch.minimum(x, act.eps)) - x) * (act.beta + act.alpha_n)
        return torch.where(x > 0, act.alpha_p * x * x + act.beta * x, negative + act.beta * x)

    act.forward = forward

SPECIFIC: dict[tuple[str, str], tuple] = {
    # ---- GPT-style families (helper fam-gpt): tests/families_gpt.py ----
    **families_gpt.SPECIFIC,
    # ---- routed families (helper fam-moe): tests/families_moe.py ----
    **families_moe.SPECIFIC,
    # ---- dense Llama-named families (helper fam-llama) ----
    ("ministral", "window dropped"): (lambda m: fp.window_dropped(fp.layer(m, 0)), "window"),
    ("seed_oss", "q/k/v biases dropped"): (lambda m: [fp.bias_dropped(getattr(
        fp.layer(m, 0).self_attn, name)) for name in ("q_proj", "k_proj", "v_proj")], "oracle"),
    ("helium", "RoPE on rotated halves"): (lambda m: fp.rope_on_halves(_attention(0)(m)),
                                           "oracle"),
    ("ernie4_5", "RoPE on rotated halves"): (lambda m: fp.rope_on_halves(_attention(0)(m)),
                                             "oracle"),
    ("olmo3", "windowed layer on the full layers' base"): (_windowed_on_full_base, "oracle"),
    ("cwm", "window dropped"): (lambda m: fp.window_dropped(fp.layer(m, 1)), "window"),
    ("vaultgemma", "score scale of the head width"): (
        _setting(_attention(0), scaling=lambda m: m.config.head_dim ** -0.5), "oracle"),
    ("vaultgemma", "embedding scale dropped"): (  # the scaled embedding scaled back
        lambda m: fp.scaled_output(m.model.embed_tokens, m.config.hidden_size ** -0.5), "oracle"),
    ("starcoder2", "c_fc bias dropped"): (lambda m: fp.bias_dropped(fp.layer(m, 0).mlp.c_fc),
                                          "oracle"),
    ("starcoder2", "window dropped"): (lambda m: fp.window_dropped(fp.layer(m, 0)), "window"),
    ("glm", "every feature rotated"): (_full_band, "oracle"),
    ("glm", "RoPE on rotated halves"): (lambda m: fp.rope_on_halves(_attention(0)(m)), "oracle"),
    ("glm4", "attention post-norm skipped"): (
        lambda m: fp.norm_skipped(fp.layer(m, 0).post_self_attn_layernorm), "oracle"),
    ("smollm3", "NoPE layer rotated"): (_setting(_attention(1), use_rope=1), "oracle"),
    ("exaone4", "NoPE full layer rotated"): (_setting(_attention(1), sliding_window=None),
                                             "oracle"),
    ("arcee", "relu2 not squared"): (_setting(lambda m: fp.layer(m, 0).mlp,
                                              act_fn=lambda m: torch.nn.ReLU()), "oracle"),
    ("jais2", "relu2 not squared"): (_setting(lambda m: fp.layer(m, 0).mlp,
                                              act_fn=lambda m: torch.nn.ReLU()), "oracle"),
    ("nemotron", "LayerNorm1P without its 1"): (
        lambda m: _plain_layer_norm(fp.layer(m, 0).input_layernorm), "oracle"),
    ("granite", "residual multiplier dropped"): (
        _setting(lambda m: fp.layer(m, 0), residual_multiplier=1.0), "oracle"),
    ("granite", "embedding multiplier dropped"): (
        _setting(lambda m: m.model, embedding_multiplier=1.0), "oracle"),
    ("granite", "logits multiplied by logits_scaling"): (
        lambda m: fp.scaled_output(m.lm_head, _LOGITS_SCALING(m) ** 2), "oracle"),
    ("hyperclovax", "post norm skipped"): (
        lambda m: fp.norm_skipped(fp.layer(m, 0).post_norm1), "oracle"),
    ("hyperclovax", "logits divided by logits_scaling"): (
        lambda m: fp.scaled_output(m.lm_head, _LOGITS_SCALING(m) ** -2), "oracle"),
    ("cohere", "logit scale dropped"): (_setting(lambda m: m, logit_scale=1.0), "oracle"),
    ("cohere2", "logit scale dropped"): (_setting(lambda m: m, logit_scale=1.0), "oracle"),
    ("cohere2", "NoPE full layer rotated"): (
        _setting(_attention(1), sliding_window=lambda m: m.config.sliding_window), "oracle"),
    ("apertus", "xIELU without softplus"): (_xielu_without_softplus, "oracle"),
    ("apertus1p5_text", "xIELU without softplus"): (_xielu_without_softplus, "oracle"),
    # ---- position and norm placements (helper fam-positions): tests/families_positions.py ----
    **families_positions.SPECIFIC,
    # ---- sinks, the clamped SwiGLU, biased routers and experts, q/k norms after RoPE,
    # position-scaled queries (helper fam-sinks): tests/families_sinks.py ----
    **families_sinks.SPECIFIC,
}
"""(family, defect) -> (plant(model) in transformers' own module, the check that must fail)."""


@pytest.mark.parametrize("family, defect", sorted(SPECIFIC))
def test_a_defect_of_what_the_family_changes_fails_its_check(family, defect):
    plant, check = SPECIFIC[(family, defect)]
    model = _tiny(family)
    with torch.no_grad():
        plant(model)
    report = da.audit(model, checks=sorted({"params", "oracle", check}))
    assert not report[check].passed, f"{family}: {defect} passed {check}"
    if check == "oracle":  # a numerics defect: every weight is where the spec puts it
        assert report["params"].passed, report["params"].detail


# ---- what a family's modules read and no DecoderConfig expresses --------------------------------

@pytest.mark.parametrize("model_type, option, value, named", [
    ("cohere", "use_qk_norm", True, "use_qk_norm=True"),  # per-head LayerNorms, gains (H, Dh)
    ("apertus1p5_text", "output_vocab_size", 20, "output_vocab_size=20"),  # a pruned readout
    ("granite", "logits_scaling", 0.0, "logits_scaling=0.0"),  # the logits divided by 0
])
def test_an_option_no_spec_expresses_is_refused_naming_it(model_type, option, value, named):
    """Cohere's q/k LayerNorms and Apertus 1.5's pruned readout are refused: the model is
    audited black-box, the option named where the oracle would run. A value no model computes
    with (Granite's logits_scaling=0) is refused outright, naming it."""
    family = next(f for f in FAMILIES if f.model_type == model_type)
    config = tiny_config(model_type)
    setattr(config, option, value)
    with pytest.raises(da.ConfigError, match=re.escape(named)):
        config_from_hf(config, model_type)
    if model_type != "granite":
        report = _audit(getattr(tf, family.model_class)(config).eval())
        assert report.facts.spec is None
        assert named in report["oracle"].detail


# ---- our Decoder against transformers' module ---------------------------------------------------

FLOAT32_ONLY = {
    "xglm": "its eager attention clamps the masked scores with torch.full((), finfo(dtype).min), "
            "a float32 scalar that overflows for float64 (RuntimeError)",
}
"""Families whose transformers module does not run in float64, with why: compared in float32
(within 1e-5: float32 rounding of logits of order 0.1)."""


@pytest.mark.parametrize("model_type", _present())
def test_each_family_reads_into_a_decoder_whose_logits_are_its_own(model_type):
    """from_hf places the family's weights into a Decoder of its config (our model, written
    from the DecoderConfig alone): its logits equal transformers' in float64 (float32 for
    FLOAT32_ONLY); to_hf writes it back as the first family holding the config (not always the
    same one), logits equal."""
    dtype, scale = (torch.float32, 1e-5) if model_type in FLOAT32_ONLY else (torch.float64, 1e-6)
    model = _tiny(model_type).to(dtype)
    eager_experts(model)  # transformers' grouped expert kernel refuses float64
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # .double(): transformers 4.45 returns some families' logits in float32
        theirs = model(input_ids=ids).logits.double()
        # transformers turns RoPE in float32 whatever the model's dtype: a few float32 ulps of
        # the logits' scale, twice over for a model written back as another family
        atol = scale * max(1.0, float(theirs.abs().max()))
        ours = from_hf(model)
        torch.testing.assert_close(ours(ids).double(), theirs, atol=atol, rtol=0)
        try:
            back = to_hf(ours)
        except da.ConfigError as exc:  # no family writes this config: said, naming the fields
            assert "holds this config" in str(exc) or "converter" in str(exc), exc
            return
        torch.testing.assert_close(back(input_ids=ids).logits.double(), theirs, atol=atol,
                                   rtol=0)


# ---- the families left black-box -----------------------------------------------------------------

def test_no_family_is_both_read_as_a_spec_and_left_black_box():
    assert not {f.model_type for f in FAMILIES} & set(BLACK_BOX)


@pytest.mark.parametrize("model_type, words", [("jetmoe", "mixture of attention heads"),
                                               ("mamba", "recurrent"),
                                               ("gpt_neox_japanese", "last layer only"),
                                               ("roformer", "encoder block")])
def test_a_family_left_black_box_says_what_it_lacks(model_type, words):
    """The oracle's skip names what the family has that no DecoderConfig expresses."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        model, _ = build_tiny(model_type, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    except Unbuildable as exc:
        pytest.skip(f"{model_type} does not build here: {exc}")
    report = _audit(model)
    assert report.facts.spec is None and report["oracle"].skipped
    assert words in report["oracle"].detail and model_type in report["oracle"].detail


def test_a_family_whose_modules_lie_in_another_form_is_black_box_saying_so():
    """A release whose modules keep a family's weights under other names than the table places
    (GraniteMoE's experts before transformers 5: one fused input_linear per layer) is audited
    black-box with the reason, not failed on params: the weights are there, under names the
    table does not know. Planted here as the same weights renamed."""
    model = _tiny("granitemoe")
    layer = model.model.layers[0].block_sparse_moe
    layer.renamed_router = layer.router
    del layer.router  # the router's weight now lies under another name
    report = _audit(model)
    assert report.facts.spec is None and report["oracle"].skipped
    assert "form the families table does not place" in report.facts.reference_reason
    assert "renamed_router" in report.facts.reference_reason
