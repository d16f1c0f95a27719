"""The config's new declarations through every layer below the gate: a LayerNorm gain offset
and biases per projection in the config (validated, one spelling per architecture, JSON), the
Decoder, the float64 oracle, the analytic ledger, and the refusals of the torch.nn twin and the
Hugging Face converter; and ConfigError naming every bad field at once."""

from __future__ import annotations

import json

import pytest
import torch

import decoder_audit as da
from decoder_audit import ConfigError, DecoderConfig
from decoder_audit.references.hf_config import hf_family
from decoder_audit.references.torch_twin import TorchTwin

BASE = dict(vocab_size=11, d_model=12, n_layers=2, n_heads=3, n_kv_heads=1, d_ff=20,
            max_seq_len=9)


def make(**changes) -> DecoderConfig:
    return DecoderConfig(**{**BASE, **changes})


# ---- ConfigError names every bad field at once --------------------------------------------

def test_every_bad_field_and_every_broken_relation_is_named_at_once():
    """A divisibility error used to appear only once the per-field errors were fixed."""
    with pytest.raises(ConfigError) as info:
        make(d_model=13, norm_eps=-1.0, mlp="reglu", n_kv_heads=2, vocab_size=0,
             attn_scale=(-8) ** -0.5)
    said = str(info.value)
    for part in ("d_model=13 is not divisible by n_heads=3", "n_heads=3 is not divisible by "
                 "n_kv_heads=2", "norm_eps=-1.0", "mlp='reglu'", "vocab_size=0", "attn_scale="):
        assert part in said, part


def test_a_relation_is_judged_only_on_valid_fields():
    """An invalid n_heads names itself, not a divisibility it cannot have."""
    with pytest.raises(ConfigError) as info:
        make(n_heads=0, norm_eps=-1.0)
    assert "n_heads=0" in str(info.value) and "divisible" not in str(info.value)


def test_a_config_file_names_unknown_missing_and_invalid_fields_together():
    with pytest.raises(ConfigError) as info:
        DecoderConfig.from_dict({**BASE, "bogus": 1, "d_model": 13})
    assert "['bogus']" in str(info.value) and "d_model=13 is not divisible" in str(info.value)
    partial = {name: value for name, value in BASE.items() if name != "d_ff"}
    with pytest.raises(ConfigError) as info:
        DecoderConfig.from_dict({**partial, "vocab_size": 0, "d_model": 13, "window_layers": [1],
                                 "sliding_window": 2})
    said = str(info.value)
    assert "['d_ff']" in said and "vocab_size=0" in said and "d_model=13 is not divisible" in said
    assert "window_layers" not in said  # a list from JSON, valid: not named


def test_a_spec_nested_100000_deep_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"vocab_size": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError) as info:
        DecoderConfig.load(path)
    assert str(path) in str(info.value) and "100,001" in str(info.value)
    # deep enough to parse, too deep to be a config: refused the same way, before any repr
    path.write_text(json.dumps({**BASE, "attn_bias": json.loads("[" * 500 + "]" * 500)}))
    with pytest.raises(ConfigError, match="501 levels"):
        DecoderConfig.load(path)


def test_brackets_inside_a_json_string_are_not_nesting():
    """The depth of text too deep to parse is counted outside its strings."""
    text = '{"norm": "]]]]\\"]]]]", "vocab_size": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ConfigError, match="100,001 levels"):
        DecoderConfig.from_json(text)
    with pytest.raises(ConfigError, match="norm="):  # parsed: judged by its fields
        DecoderConfig.from_json(json.dumps({**BASE, "norm": "[[[[" * 300}))


# ---- biases per projection ------------------------------------------------------------------

@pytest.mark.parametrize("listed, flags", [
    (dict(attn_bias=["q_proj", "k_proj", "v_proj", "output_proj"]), dict(attn_bias=True)),
    (dict(attn_bias=[]), dict(attn_bias=False)),
    (dict(attn_bias=["v_proj", "k_proj", "q_proj"]), dict(attn_bias=True, attn_output_bias=False)),
    (dict(attn_bias=["output_proj"]), dict(attn_bias=False, attn_output_bias=True)),
    (dict(mlp_bias=["w1", "w2"]), dict(mlp_bias=True)),
    (dict(mlp="swiglu", mlp_bias=["w3", "w2", "w1"]), dict(mlp="swiglu", mlp_bias=True)),
    (dict(mlp_bias=[]), dict(mlp_bias=False)),
])
def test_a_list_of_biased_projections_that_the_flags_can_say_is_the_flags(listed, flags):
    assert make(**listed) == make(**flags)


def test_a_partial_list_is_kept_in_weight_order_and_round_trips_through_json():
    cfg = make(attn_bias=["v_proj", "q_proj"], mlp="swiglu", mlp_bias=["w3", "w1"])
    assert cfg.attn_bias == ("q_proj", "v_proj") and cfg.mlp_bias == ("w1", "w3")
    assert [cfg.has_bias(n) for n in ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2",
                                      "w3")] == [True, False, True, False, True, False, True]
    assert DecoderConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("changes, named", [
    (dict(attn_bias=["q_proj", "key"]), "attn_bias="),
    (dict(attn_bias=["q_proj", "q_proj"]), "attn_bias="),
    (dict(mlp_bias=["w3"]), "mlp_bias=['w3'] names w3, but mlp='gelu'"),
    (dict(attn_bias=["q_proj"], attn_output_bias=True), "attn_output_bias=True with attn_bias="),
    (dict(attn_bias="yes"), "attn_bias='yes'"),
])
def test_a_bad_bias_declaration_names_its_field(changes, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("(", r"\(")):
        make(**changes)


PARTIAL = dict(attn_bias=["q_proj", "v_proj", "output_proj"], mlp="swiglu", mlp_bias=["w1", "w3"])


def test_the_decoder_has_exactly_the_declared_biases_and_the_ledger_counts_them():
    cfg = make(**PARTIAL)
    model = da.Decoder(cfg)
    biases = {name for name, _ in model.named_parameters()
              if name.endswith(".bias") and (".attn." in name or ".ffn." in name)}
    assert biases == {f"layers.{i}.{part}.bias" for i in range(2) for part in
                      ("attn.q_proj", "attn.v_proj", "attn.output_proj", "ffn.w1", "ffn.w3")}
    # by hand: q bias H*Dh = 12, v bias Hkv*Dh = 4, output bias D = 12, w1 and w3 biases F = 20
    plain = da.parameter_ledger(make(mlp="swiglu")).total
    assert da.parameter_ledger(cfg).total == plain + 2 * (12 + 4 + 12 + 20 + 20)
    assert model.num_parameters() == da.parameter_ledger(cfg).total


def _randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every weight drawn, biases and norm gains included (fresh ones are 0 and 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def test_the_oracle_reads_each_projections_bias():
    cfg = make(**PARTIAL, pos="rope", norm="rmsnorm")
    model = _randomised(da.Decoder(cfg).double())
    ids = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fast = model(ids)
    torch.testing.assert_close(da.oracle_logits(model.state_dict(), cfg, ids), fast,
                               rtol=0, atol=1e-10)
    without = {n: t for n, t in model.state_dict().items() if not n.endswith("v_proj.bias")}
    dropped = da.oracle_logits(without, cfg, ids)  # the bias matters: the oracle used it
    assert (dropped - fast).abs().max() > 1e-3


# ---- a LayerNorm gain offset ----------------------------------------------------------------

def test_a_layernorm_with_offset_one_applies_one_plus_w():
    """The gain is 1 + w (Megatron's LayerNorm1P): a fresh model stores w = 0 and computes what
    a plain LayerNorm of gain 1 computes; holding w it equals the plain model holding 1 + w."""
    one_p, plain = make(norm_offset=1.0), make()
    torch.manual_seed(0)
    fresh = da.Decoder(one_p).double()
    assert all(torch.equal(m.weight, torch.zeros(12, dtype=torch.float64))
               for name, m in fresh.named_modules() if name.endswith(("ln1", "ln2", "ln_final")))
    model = _randomised(fresh)
    shifted = {n: t + 1 if n.endswith("weight") and ("ln" in n.split(".")[-2]) else t
               for n, t in model.state_dict().items()}
    reference = da.Decoder(plain).double()
    reference.load_state_dict(shifted)
    ids = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids), rtol=0, atol=1e-12)
        torch.testing.assert_close(da.oracle_logits(model.state_dict(), one_p, ids), model(ids),
                                   rtol=0, atol=1e-10)
        # the oracle of the plain spec on the same weights: w alone, another function
        assert (da.oracle_logits(model.state_dict(), plain, ids) - model(ids)).abs().max() > 1e-3


def test_the_ledger_counts_a_layernorm_with_offset_like_one_without():
    assert da.parameter_ledger(make(norm_offset=1.0)).as_dict() == \
        da.parameter_ledger(make()).as_dict()


# ---- what the twin and the converter cannot express ----------------------------------------

@pytest.mark.parametrize("changes, named", [
    (dict(norm_offset=1.0), "norm_offset=1.0"),
    (dict(n_kv_heads=None, attn_bias=["q_proj", "v_proj"]), "attn_bias="),
    (dict(n_kv_heads=None, mlp_bias=["w2"]), "mlp_bias=['w2']"),
])
def test_the_torch_twin_refuses_what_nn_layernorm_and_multiheadattention_cannot_do(
        changes, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        TorchTwin(make(**changes))


@pytest.mark.parametrize("changes, named", [
    (dict(norm_offset=1.0), "norm_offset=1.0"),
    (dict(attn_bias=["q_proj", "v_proj"]), "attn_bias=('q_proj', 'v_proj')"),
    (dict(norm="rmsnorm", pos="rope", mlp="swiglu", mlp_bias=["w1"]), "mlp_bias=('w1',)"),
])
def test_the_hugging_face_converter_refuses_them_naming_the_field(changes, named):
    with pytest.raises(ConfigError) as info:
        hf_family(make(n_kv_heads=None, **changes))
    assert named in str(info.value)
