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

import families_gpt
import families_positions
import pytest
import torch
import torch.nn.functional as F
from conformance import Unbuildable, build_tiny

import decoder_audit as da
from decoder_audit.references.families import BLACK_BOX, FAMILIES
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


_ACTIVATION_NAMES = ("act_fn", "act", "activation_fn", "activation", "gelu_impl")


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

SPECIFIC: dict[tuple[str, str], tuple] = {
    # ---- GPT-style families (helper fam-gpt): tests/families_gpt.py ----
    **families_gpt.SPECIFIC,
    # ---- position and norm placements (helper fam-positions): tests/families_positions.py ----
    **families_positions.SPECIFIC,
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
    dtype, atol = (torch.float32, 1e-5) if model_type in FLOAT32_ONLY else (torch.float64, 1e-6)
    model = _tiny(model_type).to(dtype)
    eager_experts(model)  # transformers' grouped expert kernel refuses float64
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        ours = from_hf(model)
        torch.testing.assert_close(ours(ids), theirs, atol=atol, rtol=0)
        try:
            back = to_hf(ours)
        except da.ConfigError as exc:  # no family writes this config: said, naming the fields
            assert "holds this config" in str(exc) or "converter" in str(exc), exc
            return
        torch.testing.assert_close(back(input_ids=ids).logits, theirs, atol=atol, rtol=0)


# ---- the families left black-box -----------------------------------------------------------------

def test_no_family_is_both_read_as_a_spec_and_left_black_box():
    assert not {f.model_type for f in FAMILIES} & set(BLACK_BOX)


@pytest.mark.parametrize("model_type, words", [("jetmoe", "mixture of attention heads"),
                                               ("mamba", "recurrent")])
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
