"""The families of attention sinks, the clamped SwiGLU, biased routers and experts, q/k norms after
RoPE and position-scaled queries, beyond what test_families.py walks: an option their modules
read that no DecoderConfig expresses is refused by name (the model then audited black-box with
that reason), and a config whose modules run no forward is refused as invalid
(tests/families_sinks.py `REFUSED`)."""

from __future__ import annotations

import re

import families_sinks
import pytest
from conformance import tiny_config

import decoder_audit as da
from decoder_audit.references.family_errors import InvalidHFConfig
from decoder_audit.references.hf_config import config_from_hf

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


@pytest.mark.parametrize("model_type", sorted(families_sinks.REFUSED))
def test_an_option_no_decoder_config_expresses_is_refused_by_name(model_type):
    """The family's tiny config with one option no DecoderConfig holds: the reader refuses it
    naming the option and its value (never a spec that leaves the option out)."""
    change, says = families_sinks.REFUSED[model_type]
    config = tiny_config(model_type)
    config = type(config)(**{**config.to_dict(), **change})
    with pytest.raises(da.ConfigError, match=re.escape(says)):
        config_from_hf(config, model_type)


def test_ministral3_without_its_query_scale_is_no_model():
    """Ministral 3's attention multiplies its queries by llama_4_scaling_beta's scale whatever
    it is: a config without it runs no forward, and is refused as invalid (not black-box)."""
    config = tiny_config("ministral3")
    rope = {k: v for k, v in config.rope_parameters.items() if k != "llama_4_scaling_beta"}
    config = type(config)(**{**config.to_dict(), "rope_parameters": rope})
    with pytest.raises(InvalidHFConfig, match="llama_4_scaling_beta=None"):
        config_from_hf(config, "ministral3")
