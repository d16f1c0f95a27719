"""The parameter ledger against the seeds' table, independent formulas and published figures."""

from __future__ import annotations

import configs
import pytest
import torch
from torch import nn

import decoder_audit as da


def test_tiny_368_ledger_row_by_row():
    """The seeds' table: token embedding 8x4 = 32, learned positions 4x4 = 16,
    per block two LayerNorm(4) = 16, bias-free Q/K/V/O 4 x 4x4 = 64, biased 4->8->4 MLP
    (4*8 + 8) + (8*4 + 4) = 76, two blocks 2 x 156 = 312, final LayerNorm 8, tied readout 0."""
    ledger = da.parameter_ledger(da.preset("tiny-368"))
    rows = ledger.as_dict()
    assert rows["token_embeddings"] == 32
    assert rows["position_embeddings"] == 16
    for i in range(2):
        assert rows[f"layers.{i}.norms"] == 16
        assert rows[f"layers.{i}.attn"] == 64
        assert rows[f"layers.{i}.ffn"] == 76
    assert sum(rows[f"layers.{i}.{p}"] for i in range(2) for p in ("norms", "attn", "ffn")) == 312
    assert rows["ln_final"] == 8
    assert rows["lm_head"] == 0
    assert ledger.total == 368


def test_tiny_368_model_is_truly_tied():
    model = da.Decoder(da.preset("tiny-368"))
    assert model.lm_head.weight is model.token_embeddings.weight
    assert model.lm_head.weight.data_ptr() == model.token_embeddings.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == 368
    names_by_object = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_object.setdefault(id(param), []).append(name)
    assert ["token_embeddings.weight", "lm_head.weight"] in names_by_object.values()
    measured = da.measured_ledger(model)
    assert da.reconcile(da.parameter_ledger(model.config), measured) == []


def test_a_same_valued_copy_is_not_tying():
    """Seed 000, Q1: copying the embedding into a separate readout gives 400 parameters."""
    model = da.Decoder(da.preset("tiny-368"))
    model.lm_head.weight = nn.Parameter(model.token_embeddings.weight.detach().clone())
    assert torch.equal(model.lm_head.weight, model.token_embeddings.weight)
    measured = da.measured_ledger(model)
    assert measured.total == 400
    problems = da.reconcile(da.parameter_ledger(model.config), measured)
    assert any("lm_head: analytic 0 vs measured 32" in p and "separate Parameter" in p
               for p in problems)


def test_tying_survives_to_empty():
    """DEFECTS A1: materialising from meta gives each slot fresh storage; the Decoder re-ties."""
    with torch.device("meta"):
        model = da.Decoder(da.preset("tiny-368"))
    model.to_empty(device="cpu")
    assert model.lm_head.weight is model.token_embeddings.weight
    assert model.num_parameters() == 368


def _independent_count(cfg: da.DecoderConfig) -> int:
    """Unique parameters written directly from the architecture, not from ledger.py."""
    V, D, L, F, T = cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.max_seq_len
    dh = cfg.head_width or D // cfg.n_heads  # a declared head width, else D / H
    q, kv = cfg.n_heads * dh, cfg.kv_heads * dh
    norm = 2 * D if cfg.norm == "layernorm" and cfg.norm_bias else D
    norm = norm if cfg.norm_affine else 0  # OLMo's norms learn nothing
    qk = (q + kv if cfg.qk_norm_scope == "projection" else 2 * dh) if cfg.qk_norm else 0
    if cfg.qk_norm_kind == "layernorm" and cfg.norm_bias:
        qk *= 2  # Persimmon's q/k LayerNorms: a shift beside each gain
    attn = (2 * D * q + 2 * D * kv + (q + 2 * kv if cfg.attn_bias else 0)
            + (D if cfg.output_bias else 0) + qk + (cfg.n_heads if cfg.attn_sinks else 0))
    if cfg.kv_latent_rank is not None:  # DeepSeek's MLA, as its modeling file builds it
        attn = _latent_attention_count(cfg)
    n_mat = 3 if cfg.mlp in ("swiglu", "geglu", "swiglu_clamped") else 2  # gated: w1, w3, w2
    mlp = n_mat * D * F + ((n_mat - 1) * F + D if cfg.mlp_bias else 0)
    mlp += 2 if cfg.mlp == "xielu" else 0  # Apertus' activation learns a_p and a_n per layer
    # before each sublayer unless OLMo 2's (one before both of GPT-J's parallel sublayers),
    # after it too in Gemma 2's and OLMo 2's
    # after each add instead in GPT-1's post-norm blocks
    norms = ((1 if cfg.shared_norm else 2) if cfg.pre_norm or cfg.post_norm else 0) + (
        2 if cfg.sandwich_norm else 0)
    blocks = sum(norms * norm + attn + (_routed_count(cfg) if _routes(cfg, i) else mlp)
                 for i in range(L))
    # a learned table of T positions, after the rows OPT's keeps before position 0's
    positions = (cfg.position_offset + T) * D if cfg.pos == "learned" else 0
    outer = (cfg.embedding_norm + cfg.final_norm) * norm  # BLOOM's embedding norm; GPT-1: none
    return (V * D + positions + blocks + outer
            + (0 if cfg.tie_embeddings else V * D) + (V if cfg.readout_bias else 0))


def _routes(cfg: da.DecoderConfig, layer: int) -> bool:
    """DeepSeek's first_k_dense_replace, then Qwen2-MoE's (layer + 1) % decoder_sparse_step."""
    return (cfg.n_experts is not None and layer >= cfg.first_dense_layers
            and (layer + 1) % cfg.moe_every == 0)


def _routed_count(cfg: da.DecoderConfig) -> int:
    """A routed MLP: the router (E x D, DeepSeek's correction bias E, GPT-OSS's logit bias E),
    E experts of 3 (gated) or 2 matrices D x Fe (and GPT-OSS's biases: Fe per input matrix, D
    for the output), the shared experts' matrices D x (n_shared x their width) and their
    gate."""
    D, E = cfg.d_model, cfg.n_experts
    width = cfg.expert_width or cfg.d_ff
    shared = cfg.n_shared_experts * (cfg.shared_expert_width or width)
    matrices = 3 if cfg.mlp in ("swiglu", "geglu", "swiglu_clamped") else 2
    biases = E * ((matrices - 1) * width + D) if cfg.expert_bias else 0
    return (E * D + (E if cfg.router_selection_bias else 0) + (E if cfg.router_bias else 0)
            + matrices * D * (E * width + shared) + biases
            + (D if cfg.shared_expert_gate else 0))  # Qwen2-MoE's shared_expert_gate (1, D)


def _latent_attention_count(cfg: da.DecoderConfig) -> int:
    """q_a_proj D x q_lora_rank, its RMSNorm, q_b_proj to H heads of nope + rope (or one
    q_proj); kv_a_proj_with_mqa D x (kv_lora_rank + rope), its RMSNorm, kv_b_proj to H heads
    of nope + v; o_proj H*v x D."""
    D, H = cfg.d_model, cfg.n_heads
    head = cfg.nope_head_width + cfg.rope_head_width
    rank = cfg.q_latent_rank
    query = D * H * head if rank is None else D * rank + rank + rank * H * head
    latent = cfg.kv_latent_rank
    kv = D * (latent + cfg.rope_head_width) + latent + latent * H * (
        cfg.nope_head_width + cfg.value_head_width)
    return query + kv + H * cfg.value_head_width * D


@pytest.mark.parametrize("name", da.preset_names())
def test_every_preset_reconciles_on_the_meta_device(name):
    cfg = da.preset(name)
    model = da.Decoder(cfg, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    expected = _independent_count(cfg)
    assert da.measured_ledger(model).total == da.parameter_ledger(cfg).total == expected
    assert da.reconcile(da.parameter_ledger(cfg), da.measured_ledger(model)) == []


@pytest.mark.parametrize("cfg", configs.params(configs.everything()))
def test_every_test_config_has_the_independent_count(cfg):
    """Every combination of biases, MLP kind, norm, positions and tying in the grid: a bias or
    matrix the config asks for and the model lacks (or the reverse) changes the count."""
    with torch.device("meta"):
        model = da.Decoder(cfg)
    assert model.num_parameters() == _independent_count(cfg)


@pytest.mark.parametrize("name, published", [
    ("gpt2-small", 124_439_808),   # GPT-2 small, tied (HF GPT2LMHeadModel unique parameters)
    ("gpt2-xl", 1_557_611_200),    # GPT-2 XL, tied
    ("cs336-xl", 2_127_057_600),   # CS336 transformer_accounting (a), untied
    ("cs336-test", 1_403_328),     # CS336 reference test model (FACTS.md)
    ("llama2-7b", 6_738_415_616),  # Llama-2-7b-hf: LlamaForCausalLM.num_parameters()
    ("llama3-8b", 8_030_261_248),  # Meta-Llama-3-8B: the same, grouped-query 32/8
])
def test_published_parameter_counts(name, published):
    with torch.device("meta"):
        model = da.Decoder(da.preset(name))
    assert model.num_parameters() == published


def test_unit_2_7_formula_for_the_cs336_architecture():
    """Unit 2.7: untied bias-free MHA + 2 RMSNorms + SwiGLU is 2VD + L(4D^2 + 3DF + 2D) + D;
    tying subtracts VD; RoPE adds nothing."""
    cfg = da.preset("cs336-medium")
    V, D, L, F = cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.d_ff
    untied = 2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D
    assert da.parameter_ledger(cfg).total == untied
    assert da.parameter_ledger(cfg.replace(tie_embeddings=True)).total == untied - V * D


def test_extra_parameters_are_reported_where_they_differ():
    model = da.Decoder(da.preset("tiny-368"))
    model.layers[1].attn.q_proj.bias = nn.Parameter(torch.zeros(4))  # a bias the config forbids
    problems = da.reconcile(da.parameter_ledger(model.config), da.measured_ledger(model))
    assert problems[0] == "layers.1.attn: analytic 64 vs measured 68 (+4)"


def test_parameter_ledger_takes_a_dict_and_names_a_wrong_type():
    assert da.parameter_ledger(da.preset("tiny-368").to_dict()).total == 368
    with pytest.raises(da.ConfigError, match="missing required config field"):
        da.parameter_ledger({"vocab_size": 8})
    with pytest.raises(TypeError, match="needs a DecoderConfig .* got list"):
        da.parameter_ledger([8, 4])
