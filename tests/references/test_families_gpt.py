"""The GPT-style families of the families table read in every form their configs choose
(tests/families_gpt.py `VARIANTS`: GPT-BigCode without multi_query, whose c_attn has GPT-2's name
and shape and its rows head by head; Falcon's new architecture with one norm or two and its
sequential block; GPT-Neo's local layers...): each correct tiny model passes params and oracle
with no argument, and our Decoder read from it computes its logits in float64 and is written
back to a model that does too. What a config chooses that no DecoderConfig expresses is refused
by name (the model is then audited black-box with that reason), never read as something else."""

from __future__ import annotations

import families_gpt
import pytest
import torch
from conformance import tiny_config
from helpers import assert_read_and_written_back

import decoder_audit as da
from decoder_audit.references.hf import hf_spec
from decoder_audit.references.hf_config import config_from_hf

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

CLASSES = {"gpt_bigcode": "GPTBigCodeForCausalLM", "falcon": "FalconForCausalLM",
           "gpt_neo": "GPTNeoForCausalLM", "gptj": "GPTJForCausalLM", "opt": "OPTForCausalLM",
           "biogpt": "BioGptForCausalLM", "phi": "PhiForCausalLM",
           "codegen": "CodeGenForCausalLM"}


def _config(model_type: str, **fields):
    """The conformance sweep's tiny config of the family, with `fields` changed."""
    small = tiny_config(model_type)
    return type(small)(**{**small.to_dict(), **fields})


def _model(name: str) -> torch.nn.Module:
    model_type, fields = families_gpt.VARIANTS[name]
    cls = getattr(tf, CLASSES[model_type], None)
    if cls is None:
        pytest.skip(f"transformers {tf.__version__} has no {CLASSES[model_type]}")
    torch.manual_seed(0)
    return cls(_config(model_type, **fields)).eval()


@pytest.mark.parametrize("name", sorted(families_gpt.VARIANTS))
def test_each_form_a_config_chooses_is_read_and_passes(name):
    model = _model(name)
    assert_read_and_written_back(model)


def test_gpt_bigcode_multi_head_rows_are_read_head_by_head_from_its_config():
    """Without multi_query c_attn has GPT-2's name and shape (3D, D), its rows head by head: the
    family's own layout places them (named by its entry, never detected from the shape), also
    under a declared spec; the same weights read as GPT-2's q | k | v rows (what the names
    alone detect) fail the oracle."""
    from decoder_audit.references.layouts import detect, placeable

    model = _model("gpt_bigcode multi-head")
    spec = hf_spec(model)
    assert spec.kv_heads == spec.n_heads  # multi_query=False: a key/value head per query head
    for report in (da.audit(model, checks=["params", "oracle"]),
                   da.audit(model, checks=["params", "oracle"], spec=spec)):
        assert report["oracle"].passed, report["oracle"].detail
        assert report["oracle"].evidence["layout"].startswith("Hugging Face GPT-BigCode")
    placement = detect(placeable(model), spec)
    assert placement.layout.startswith("nanoGPT / GPT-2")  # the names tell no other
    as_gpt2 = da.audit(model, checks=["params", "oracle"], spec=spec,
                       weights_map=lambda state: {name: spot.view(state[spot.source])
                                                  for name, spot in placement.spots.items()})
    assert as_gpt2["params"].passed and not as_gpt2["oracle"].passed


@pytest.mark.parametrize("model_type, fields, named", [
    ("falcon", {"alibi": True}, "alibi=True"),
    ("falcon", {"new_decoder_architecture": True, "parallel_attn": False},
     "parallel_attn=False"),
    ("falcon", {"parallel_attn": True, "num_ln_in_parallel_attn": 2},
     "num_ln_in_parallel_attn=2"),
    ("opt", {"word_embed_proj_dim": 16}, "word_embed_proj_dim=16"),
    ("gpt_bigcode", {"add_cross_attention": True, "multi_query": False},
     "add_cross_attention=True"),
    ("gpt_neo", {"activation_function": "silu"}, "activation_function='silu'"),
])
def test_what_a_config_chooses_and_no_spec_expresses_is_refused_by_name(model_type, fields,
                                                                        named):
    if getattr(tf, CLASSES[model_type], None) is None:
        pytest.skip(f"transformers {tf.__version__} has no {CLASSES[model_type]}")
    with pytest.raises(da.ConfigError, match=named.replace("(", r"\(")):
        config_from_hf(_config(model_type, **fields), model_type)


def test_gptj_without_a_rotary_dim_is_refused_as_no_model_computes_with_it():
    """rotary_dim=None makes GPT-J's sin/cos table hidden_size wide: with more than one head its
    forward fails, so the config is refused outright (not audited black-box). transformers 4
    configs take it; 5's strict config class refuses it, so it is set past the validation."""
    from decoder_audit.references.family_errors import InvalidHFConfig

    config = _config("gptj")
    object.__setattr__(config, "rotary_dim", None)
    with pytest.raises(InvalidHFConfig, match="rotary_dim=None"):
        config_from_hf(config, "gptj")
