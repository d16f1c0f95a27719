"""Routed experts and latent attention in the ledger and the accounting: the presets' counts
against the figures their makers published, FLOPs per token against the 2 x (active matmul
weights) rule, every product against torch's FlopCounterMode (on the meta device, and on real
tensors through the expert loop), and `ledger` / `account` answering on the meta device.

Published figures (total / active parameters):
    Mixtral 8x7B   46.7B / 12.9B   Mistral AI, "Mixtral of experts" (2023-12-11 announcement and
                                   arXiv 2401.04088): "46.7B total parameters but only uses 12.9B
                                   parameters per token"
    OLMoE 1B-7B    6.9B / 1.3B     Muennighoff et al., arXiv 2409.02060 (OLMoE-1B-7B-0924)
    Qwen3-30B-A3B  30.5B / 3.3B    the Qwen/Qwen3-30B-A3B model card, which also gives 29.9B
                                   without embeddings (its two V x D tables)
    DeepSeek-V3    671B / 37B      arXiv 2412.19437; its README_WEIGHTS.md: 36.6B activated
                                   "including 0.9B for the output Head", i.e. without the input
                                   embedding, a lookup; the multi-token-prediction module apart
"""

from __future__ import annotations

import json

import configs
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import decoder_audit as da
from decoder_audit.cli import main

B = 1e9


def published(count: int, figure: float, unit: float = 0.1) -> bool:
    """Whether `figure` (billions, to `unit`) is `count` rounded or cut to its last digit: the
    makers differ (Mistral rounds 12.88 to 12.9, Qwen cuts 3.35 to 3.3, DeepSeek 37.55 to 37)."""
    return figure - unit / 2 <= count / B < figure + unit


@pytest.mark.parametrize("name, total, active", [
    ("mixtral-8x7b", 46.7, 12.9),
    ("olmoe-1b-7b", 6.9, 1.3),
    ("qwen3-30b-a3b", 30.5, 3.3),
])
def test_presets_have_their_published_total_and_active_counts(name, total, active):
    p = da.account(da.preset(name), seq_len=16, measure=False).parameters
    assert published(p.total, total) and published(p.active, active)


def test_qwen3_without_its_two_embedding_tables_is_the_published_29_9b():
    cfg = da.preset("qwen3-30b-a3b")
    total = da.parameter_ledger(cfg).total
    assert published(total - 2 * cfg.vocab_size * cfg.d_model, 29.9)


def test_deepseek_v3_has_671b_and_36_6b_activated_without_the_input_embedding():
    cfg = da.preset("deepseek-v3")
    p = da.account(cfg, seq_len=16, measure=False).parameters
    assert published(p.total, 671, unit=1)
    assert published(p.active - cfg.vocab_size * cfg.d_model, 36.6)
    assert published(p.active, 37, unit=1)  # "37B activated": both tables counted, 37.55B


def _per_token_matmul_weights(cfg) -> int:
    """The matrix weights one token multiplies by, from the architecture: attention's
    projections, the router, its k experts and the shared ones (dense layers: the MLP), the
    readout. Norm gains, the selection bias and the input table multiply nothing."""
    D, H, L = cfg.d_model, cfg.n_heads, cfg.n_layers
    if cfg.latent_attention:
        head, Dn, Dv, R = cfg.head_dim, cfg.nope_head_width, cfg.value_head_width, cfg.rope_head_width
        Cq, C = cfg.q_latent_rank, cfg.kv_latent_rank
        attention = D * Cq + Cq * H * head + D * (C + R) + C * H * (Dn + Dv) + H * Dv * D
    else:
        Dh = cfg.head_dim
        attention = 2 * D * H * Dh + 2 * D * cfg.kv_heads * Dh
    routed = sum(cfg.routes(i) for i in range(L))
    expert = 3 * D * (cfg.expert_width or cfg.d_ff)
    mlp = (L - routed) * 3 * D * cfg.d_ff + routed * (
        D * cfg.n_experts + cfg.experts_per_token * expert + 3 * D * cfg.shared_dim)
    return L * attention + mlp + cfg.vocab_size * D


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3", "olmoe-1b-7b"])
def test_one_token_costs_twice_its_active_matmul_weights(name):
    """At T = 1 every weight a token reads is multiplied once (2 FLOPs a multiply-add); the
    E - k experts it is not sent to cost nothing. The attention core of one token, apart."""
    cfg = da.preset(name)
    acct = da.account(cfg, batch_size=1, seq_len=1, measure=False)
    core = acct.group("attention scores + weighted sum").flops
    assert core == cfg.n_layers * cfg.n_heads * 2 * (cfg.head_dim + cfg.value_dim)
    assert acct.forward_flops - core == 2 * _per_token_matmul_weights(cfg)


REDUCED = {  # the presets' shapes with fewer layers (each layer kind kept), measured quickly
    "mixtral-8x7b": da.preset("mixtral-8x7b").replace(n_layers=2),
    "olmoe-1b-7b": da.preset("olmoe-1b-7b").replace(n_layers=2),
    "qwen3-30b-a3b": da.preset("qwen3-30b-a3b").replace(n_layers=2),
    "deepseek-v3": da.preset("deepseek-v3").replace(n_layers=4),  # 3 dense, 1 routed
}
MEASURED = [(name, cfg) for name, cfg in REDUCED.items()] + [
    (entry.name, entry.config) for entry in configs.entries(
        "moe-softmax-shared", "moe-sigmoid-bias", "moe-topk-softmax-relu", "mla-q-latent",
        "mla-moe")]


@pytest.mark.parametrize("name, cfg", MEASURED, ids=[name for name, _ in MEASURED])
def test_flopcountermode_on_meta_equals_the_analytic_count(name, cfg):
    acct = da.account(cfg, batch_size=2, seq_len=min(cfg.max_seq_len, 24))
    assert acct.measured.matches_analytic, acct.measured.differences
    assert acct.measured.total == acct.measured.sdpa_meta_total == acct.forward_flops


@pytest.mark.parametrize("cfg", configs.params(configs.entries(
    "moe-softmax-shared", "moe-topk-softmax-relu", "mla-moe")))
def test_the_expert_loop_on_real_tensors_costs_the_analytic_flops(cfg):
    """On values the experts loop over the tokens routed to each (model/mlp.py): however the
    tokens spread over the experts, BTk rows pass through an expert's matrices in all."""
    model = da.Decoder(cfg)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model.run_with_trace(torch.randint(0, cfg.vocab_size, (3, cfg.max_seq_len)))
    want = da.account(cfg, batch_size=3, seq_len=cfg.max_seq_len, measure=False).forward_flops
    assert counter.get_total_flops() == want


def test_ledger_and_account_answer_for_deepseek_v3_on_the_meta_device(capsys):
    assert main(["ledger", "--preset", "deepseek-v3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reconciled"] and out["measured_total"] == out["analytic_total"]
    assert published(out["analytic_total"], 671, unit=1)
    assert published(out["active_total"] - 129280 * 7168, 36.6)
    assert main(["account", "--preset", "mixtral-8x7b", "--seq", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"]["matches_analytic"]
    assert published(out["parameters"]["active"], 12.9)
    assert main(["account", "--preset", "mixtral-8x7b", "--seq", "16", "--no-measure"]) == 0
    assert "active per token: 12,879,925,248" in capsys.readouterr().out


def test_active_memory_rows_count_k_experts_per_token():
    cfg = configs.named("moe-softmax-shared")  # 1 dense layer of F=24, 2 routed: k=2 x Fe=10 + 6
    rows = {row.name: row.bytes for row in da.account(cfg, 2, 5, measure=False).memory.activations}
    assert rows["w1, w3 outputs, gated product"] == 4 * 1 * 3 * 2 * 5 * 24
    assert rows["router logits; w1, w3 outputs, gated product of the k experts and shared"] == (
        4 * 2 * 2 * 5 * (4 + 3 * (2 * 10 + 6)))


def test_accounting_a_billion_experts_returns_and_does_not_grow_with_e(tmp_path, capsys):
    """Every analytic count is a formula in E: 10^9 experts give the rows 4 experts give, and
    totals larger by (E - 4) experts of 3*D*Fe plus a router row of D each, in each of the 2
    routed layers. The measurement would build 2 x 10^9 expert modules: it is skipped, saying
    so, and `ledger` gives the analytic ledger alone (issue 44: at 10^5 both took 97 s)."""
    small = configs.named("moe-softmax-shared")  # 1 dense layer, 2 routed; Fe = 10, D = 16
    huge = small.replace(n_experts=10**9)
    per_expert = 3 * small.d_model * small.expert_width + small.d_model  # w1, w3, w2; router
    grown = 2 * (10**9 - small.n_experts) * per_expert

    a, b = da.account(small, 2, 5), da.account(huge, 2, 5)
    assert [mm.name for mm in a.matmuls] == [mm.name for mm in b.matmuls]
    assert b.parameters.total - a.parameters.total == grown
    # a token reads k experts whatever E is, and every expert's row of the router
    assert b.parameters.active - a.parameters.active == 2 * (10**9 - 4) * small.d_model
    assert b.measured is None and a.measured.matches_analytic
    assert "n_experts=1,000,000,000" in b.measure_skipped and "16,384" in b.measure_skipped
    ledgers = da.parameter_ledger(small), da.parameter_ledger(huge)
    assert [row.name for row in ledgers[0].rows] == [row.name for row in ledgers[1].rows]

    path = tmp_path / "huge.json"
    huge.save(path)
    assert main(["ledger", "--config", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["analytic_total"] == a.parameters.total + grown and out["measured"] is None
    assert "n_experts=1,000,000,000" in out["measured_skipped"]
    assert main(["ledger", "--config", str(path)]) == 0
    assert "measured ledger not built" in capsys.readouterr().out
    assert main(["account", "--config", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"] is None and "16,384" in out["measure_skipped"]
