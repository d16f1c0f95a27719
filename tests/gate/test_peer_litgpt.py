"""litgpt (the real package, 0.5.9): a GPT's litgpt.Config read as its spec, and its cache driven
through set_kv_cache / input_pos.

litgpt cannot be installed beside the project's pins (0.5.9 needs numpy<2 and psutil 7.0; 0.5.10
to 0.5.13 cap huggingface-hub below what transformers 5.24 needs), so these tests skip in the
project's environment and run in one of their own over it (tests/releases.py), as .ci/litgpt
does:

    python=$(.venv/bin/python tests/releases.py litgpt==0.5.9)
    PYTHONPATH=src $python -m pytest tests/gate/test_peer_litgpt.py

Its reader is also tested on a stand-in in the project's environment (test_peer_specs.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import decoder_audit as da

litgpt = pytest.importorskip("litgpt")
from litgpt.config import Config  # noqa: E402
from litgpt.model import GPT, KVCache, LLaMAMLP, RMSNorm, build_rope_cache  # noqa: E402

LLAMA = dict(name="tiny-llama", block_size=32, n_layer=2, n_embd=32, n_head=4, n_query_groups=2,
             vocab_size=37, padded_vocab_size=37, norm_class_name="RMSNorm", norm_eps=1e-5,
             rotary_percentage=1.0, parallel_residual=False, bias=False,
             mlp_class_name="LLaMAMLP", intermediate_size=48, rope_base=100,
             # Llama 3.1's scaling, biting within the probes' positions
             rope_adjustments=dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_seq_len=16))
NEOX = dict(name="tiny-neox", block_size=32, n_layer=2, n_embd=32, n_head=4, vocab_size=37,
            padded_vocab_size=37, rotary_percentage=0.5, gelu_approximate="tanh", rope_base=100)


def _gpt(**config):
    torch.manual_seed(0)
    model = GPT(Config(**config)).eval()
    model.apply(model._init_weights)
    return model


def _audit(model, checks=("params", "oracle")):
    report = da.audit(model, checks=list(checks))
    return report, *(report[name] for name in checks)


@pytest.mark.parametrize("config", [LLAMA, NEOX], ids=["llama3_1", "neox_parallel"])
def test_a_litgpt_gpt_is_audited_from_its_config(config):
    report, params, oracle = _audit(_gpt(**config))
    assert params.passed and oracle.passed, (params.detail, oracle.detail)
    spec = report.facts.spec
    if config is LLAMA:
        assert spec.rope_scaling == {"type": "llama3", **LLAMA["rope_adjustments"]}
    else:  # GptNeoxMLP, a parallel residual, a quarter of each head rotated... here half
        assert (spec.mlp, spec.parallel_residual, spec.rotary_dim) == ("gelu_tanh", True, 4)


def _rope_base(model):
    model.cos, model.sin = build_rope_cache(32, 8, base=1000,
                                            extra_config=LLAMA["rope_adjustments"])


def _layernorm(monkeypatch):
    monkeypatch.setattr(RMSNorm, "forward", lambda self, x: F.layer_norm(
        x, x.shape[-1:], self.weight, None, self.eps))


def _gelu_gate(monkeypatch):
    monkeypatch.setattr(LLaMAMLP, "forward", lambda self, x: self.proj(
        F.gelu(self.fc_1(x)) * self.fc_2(x)))


@pytest.mark.parametrize("plant", [_rope_base, _layernorm, _gelu_gate],
                         ids=["rope_base", "layernorm", "gelu_gate"])
def test_a_defect_planted_in_litgpt_fails_oracle(plant, monkeypatch):
    model = _gpt(**LLAMA)
    plant(model) if plant is _rope_base else plant(monkeypatch)
    _, params, oracle = _audit(model)
    assert params.passed and not oracle.passed, (params.detail, oracle.detail)


def test_a_litgpt_option_no_spec_expresses_is_refused_by_name():
    model = _gpt(**{**LLAMA, "mlp_class_name": "LLaMAMoE", "n_expert": 4,
                    "n_expert_per_token": 2, "moe_intermediate_size": 16})
    _, params, oracle = _audit(model)
    assert not params.passed and not oracle.passed
    assert "n_expert=4" in params.detail and "n_expert=4" in oracle.detail, params.detail


def test_a_litgpt_gpt_decodes_through_set_kv_cache_and_input_pos():
    report, check = _audit(_gpt(**LLAMA), checks=("kv_cache",))
    assert report.facts.convention.name == "input_pos" and check.passed, check.detail


def test_a_kv_cache_written_one_slot_late_fails(monkeypatch):
    """KVCache writes each step's keys and values at input_pos + 1: the slot the mask reads for
    the newest token holds nothing yet."""
    real = KVCache.forward
    monkeypatch.setattr(KVCache, "forward", lambda self, input_pos, k, v: real(
        self, input_pos + 1, k, v))
    _, check = _audit(_gpt(**LLAMA), checks=("kv_cache",))
    assert not check.passed and "differs from the full forward" in check.detail, check.detail
