"""The routed and latent families of the families table beyond what test_families.py walks:
a model type transformers registers for another family's class is read by that class's entry
with its own defaults (Sarvam-MoE by GLM-4.5's), and an option a routed family's modules read
that no DecoderConfig expresses is refused by name (the model then audited black-box with that
reason), never read as something else (tests/families_moe.py `REGISTERED`, `REFUSED`)."""

from __future__ import annotations

import families_moe
import pytest
import torch
from conformance import Unbuildable, build_tiny, tiny_config

import decoder_audit as da
from decoder_audit.references.hf_config import config_from_hf

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


def _audit(model: torch.nn.Module) -> da.AuditReport:
    return da.audit(model, checks=["params", "oracle"])


@pytest.mark.parametrize("model_type", sorted(families_moe.REGISTERED))
def test_a_config_registered_for_a_family_class_is_read_by_its_entry(model_type):
    """Its own defaults (Sarvam: q/k norms, every feature rotated, routed_scaling_factor 2.5)
    are read as they are, not as the class's family's defaults; a planted defect still fails."""
    class_name, plant = families_moe.REGISTERED[model_type]
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


@pytest.mark.parametrize("family, fields, option", families_moe.REFUSED,
                         ids=[f"{f}-{o}" for f, _, o in families_moe.REFUSED])
def test_an_option_a_routed_family_cannot_express_is_refused_by_name(family, fields, option):
    config = tiny_config(family)
    config = type(config)(**{**config.to_dict(), **fields})
    with pytest.raises(da.ConfigError, match=option):
        config_from_hf(config, family)
