"""Accounting: every number checked against a hand formula written here, a published figure, or
torch's own FlopCounterMode on the meta device. Nothing is compared with the code's own output."""

from __future__ import annotations

import json
import subprocess
import sys

import configs
import pytest
import torch

import decoder_audit as da
from decoder_audit.cli import main

CS336 = ["cs336-small", "cs336-medium", "cs336-large", "cs336-xl", "cs336-test"]


def cs336_params(V, D, L, F):
    """Unit 2.7's count for the untied CS336 architecture: embeddings + head, L blocks of
    4 attention matrices, 3 SwiGLU matrices and 2 RMSNorm gains, and the final RMSNorm."""
    return 2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D


def gpt2_params(V, T, D, L, F):
    """GPT-2 (tied): token + position tables; per block 4 attention matrices with biases, two MLP
    matrices with biases, two LayerNorms (gain + bias); the final LayerNorm."""
    block = (4 * D * D + 4 * D) + (2 * D * F + F + D) + 2 * 2 * D
    return V * D + T * D + L * block + 2 * D


@pytest.mark.parametrize("name", CS336)
def test_cs336_parameters_match_unit_2_7_formula_untied_and_tied(name):
    cfg = da.preset(name)
    V, D, L, F = cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.d_ff
    p = da.account(cfg, measure=False).parameters
    assert p.total == cs336_params(V, D, L, F)
    assert p.total_if_untied == cs336_params(V, D, L, F)
    assert p.total_if_tied == cs336_params(V, D, L, F) - V * D
    tied = da.account(cfg.replace(tie_embeddings=True), measure=False).parameters
    assert tied.tied and tied.total == cs336_params(V, D, L, F) - V * D
    # Without embeddings: the token table goes; RoPE has no position table; the untied head stays.
    assert p.non_embedding == cs336_params(V, D, L, F) - V * D
    assert tied.non_embedding == cs336_params(V, D, L, F) - 2 * V * D


@pytest.mark.parametrize("name", ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_gpt2_parameters_match_formula(name):
    cfg = da.preset(name)
    V, T, D, L, F = cfg.vocab_size, cfg.max_seq_len, cfg.d_model, cfg.n_layers, cfg.d_ff
    p = da.account(cfg, measure=False).parameters
    assert p.total == gpt2_params(V, T, D, L, F)
    assert p.non_embedding == gpt2_params(V, T, D, L, F) - V * D - T * D
    assert p.non_position_embedding == gpt2_params(V, T, D, L, F) - T * D  # nanoGPT's number
    assert p.total_if_untied == gpt2_params(V, T, D, L, F) + V * D


def test_published_parameter_counts_and_fp32_memory():
    xl = da.account(da.preset("cs336-xl"), measure=False)
    assert xl.parameters.total == 2_127_057_600  # CS336 transformer_accounting (a)
    assert xl.memory.weights["fp32"] == 4 * 2_127_057_600  # about 8.5 GB
    assert 8.5e9 < xl.memory.weights["fp32"] < 8.52e9
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        assert xl.memory.weights[name] == torch.finfo(dtype).bits // 8 * 2_127_057_600
    # CS336 transformer_accounting (AdamW in fp32): parameters, gradients and the two moments,
    # 4 bytes each, i.e. 16 bytes per parameter.
    assert xl.memory.training_total == 16 * 2_127_057_600
    assert da.account(da.preset("gpt2-xl"), measure=False).parameters.total == 1_557_611_200
    assert da.account(da.preset("gpt2-small"), measure=False).parameters.total == 124_439_808
    assert da.account(da.preset("cs336-test"), measure=False).parameters.total == 1_403_328


def matmul_shapes(cfg, B, T):
    """Every forward matmul as (m, n, p, count): count products of (m x n)(n x p), written from
    the architecture: per layer the q, k, v, o projections over B*T rows, one score and one
    weighted-sum product per (batch row, query head), the MLP matrices; one readout."""
    D, H, Hkv, Dh, F, V, L = (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_ff,
                              cfg.vocab_size, cfg.n_layers)
    shapes = {
        "attn.q_proj": (B * T, D, H * Dh, L),
        "attn.k_proj": (B * T, D, Hkv * Dh, L),
        "attn.v_proj": (B * T, D, Hkv * Dh, L),
        "attn.scores": (T, Dh, T, B * H * L),
        "attn.weighted_sum": (T, T, Dh, B * H * L),
        "attn.output_proj": (B * T, H * Dh, D, L),
        "ffn.w1": (B * T, D, F, L),
        "ffn.w2": (B * T, F, D, L),
        "lm_head (tied)" if cfg.tie_embeddings else "lm_head": (B * T, D, V, 1),
    }
    if cfg.mlp == "swiglu":
        shapes["ffn.w3"] = (B * T, D, F, L)
    return shapes


def matmul_flops(shapes, names=None):
    """2 FLOPs per multiply-add: 2 * m * n * p per product, times the count."""
    return sum(2 * m * n * p * count for name, (m, n, p, count) in shapes.items()
               if names is None or name in names)


def dense_terms(cfg, B, T):
    """The forward FLOPs of each group from the dense formulas (MHA: H*Dh = D)."""
    D, F, V, L = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.n_layers
    return {
        "attention projections": L * 8 * B * T * D * D,
        "attention scores + weighted sum": L * 4 * B * T * T * D,
        "MLP": L * (6 if cfg.mlp == "swiglu" else 4) * B * T * D * F,
        "readout": 2 * B * T * D * V,
    }


@pytest.mark.parametrize("name,B,T", [("cs336-xl", 1, 1024), ("gpt2-small", 3, 100),
                                      ("tiny-368", 2, 3), ("cs336-test", 5, 16)])
def test_group_flops_match_dense_formulas(name, B, T):
    cfg = da.preset(name)
    acct = da.account(cfg, batch_size=B, seq_len=T, measure=False)
    want = dense_terms(cfg, B, T)
    assert {g.name: g.flops for g in acct.groups} == want
    assert acct.forward_flops == sum(want.values())
    # Kaplan et al. 2020 (C = 6N per token): backward costs twice the forward
    assert acct.forward_backward_flops == 3 * sum(want.values())
    shapes = matmul_shapes(cfg, B, T)
    assert {mm.name: (mm.m, mm.n, mm.p, mm.count) for mm in acct.matmuls} == shapes
    assert {mm.name: mm.flops for mm in acct.matmuls} == {
        name: matmul_flops({name: shape}) for name, shape in shapes.items()}
    assert matmul_flops(shapes) == sum(want.values())


def test_cs336_xl_forward_flops_published_total():
    acct = da.account(da.preset("cs336-xl"), seq_len=1024, measure=False)
    assert acct.forward_flops == 4_513_336_524_800
    assert acct.dominant[0] == "MLP"


def test_tied_head_still_costs_2btdv_and_swiglu_has_three_matrices():
    cfg = da.preset("cs336-test")
    untied = da.account(cfg, batch_size=2, seq_len=8, measure=False)
    tied = da.account(cfg.replace(tie_embeddings=True), batch_size=2, seq_len=8, measure=False)
    assert tied.group("readout").flops == untied.group("readout").flops == 2 * 2 * 8 * 64 * 10000
    assert [mm.name for mm in untied.matmuls if mm.group == "MLP"] == ["ffn.w1", "ffn.w3", "ffn.w2"]


def test_gqa_shrinks_only_the_kv_projections():
    cfg = da.preset("llama-debug")  # D=256, H=8, Hkv=2, Dh=32, L=4
    B, T, D, L = 2, 10, 256, 4
    acct = da.account(cfg, batch_size=B, seq_len=T, measure=False)
    by_name = {mm.name: mm for mm in acct.matmuls}
    for name in ("attn.k_proj", "attn.v_proj"):
        assert (by_name[name].m, by_name[name].n, by_name[name].p) == (B * T, D, 2 * 32)
    assert (by_name["attn.q_proj"].m, by_name["attn.q_proj"].n, by_name["attn.q_proj"].p) == (
        B * T, D, 8 * 32)
    q_and_out = 2 * (2 * B * T * D * D)
    k_and_v = 2 * (2 * B * T * D * (2 * 32))
    assert acct.group("attention projections").flops == L * (q_and_out + k_and_v)
    # every query head still does its own T x T products
    assert acct.group("attention scores + weighted sum").flops == L * 4 * B * T * T * D


def test_doubling_t_quadruples_exactly_the_scores_and_weighted_sum():
    cfg = da.preset("gpt2-medium")
    short = da.account(cfg, batch_size=2, seq_len=256, measure=False)
    long = da.account(cfg, batch_size=2, seq_len=512, measure=False)
    short_mm = {mm.name: mm.flops for mm in short.matmuls}
    long_mm = {mm.name: mm.flops for mm in long.matmuls}
    for name in short_mm:
        factor = 4 if name in ("attn.scores", "attn.weighted_sum") else 2
        assert long_mm[name] == factor * short_mm[name], name
    assert long.group("attention scores + weighted sum").flops == 4 * short.group(
        "attention scores + weighted sum").flops


VARIANTS = {
    "cs336-test tied": da.preset("cs336-test").replace(tie_embeddings=True),
    "gpt2-small untied": da.preset("gpt2-small").replace(tie_embeddings=False, n_layers=2),
    "llama-debug tied": da.preset("llama-debug").replace(tie_embeddings=True),
}
# (the routed and latent presets: tests/accounting/test_experts_accounting.py, at a short T)
MEASURED = ([(name, da.preset(name)) for name in da.preset_names()
             if not (da.preset(name).routed or da.preset(name).latent_attention)]
            + list(VARIANTS.items())
            + configs.entries("gqa3-gelu-biases-untied", "mqa-rope-relu") + configs.grid())


@pytest.mark.parametrize("name,cfg", MEASURED, ids=[name for name, _ in MEASURED])
def test_measured_on_meta_equals_analytic(name, cfg):
    B = 2
    acct = da.account(cfg, batch_size=B)  # T = max_seq_len
    T = cfg.max_seq_len
    meas = acct.measured
    assert meas.matches_analytic, meas.differences
    assert meas.total == acct.forward_flops  # torch's count of the eager path
    assert meas.sdpa_meta_total == acct.forward_flops  # and of the plain (SDPA) forward on meta
    # torch's count, split by op kind, against the products written from the architecture:
    # the per-head products are the batched matmuls (bmm), everything else is F.linear.
    shapes = matmul_shapes(cfg, B, T)
    per_head = ("attn.scores", "attn.weighted_sum")
    assert meas.attention_ops_total == matmul_flops(shapes, per_head)
    assert meas.linear_ops_total == matmul_flops(shapes, set(shapes) - set(per_head))
    assert meas.total == matmul_flops(shapes)
    assert "run_with_trace" in meas.path and "meta" in meas.path


def test_bad_sizes_raise_typed_errors_naming_value_and_limit():
    cfg = da.preset("gpt2-small")
    with pytest.raises(da.ContextLengthError, match=r"T=1025.*max_seq_len=1024"):
        da.account(cfg, seq_len=1025)
    with pytest.raises(da.ContextLengthError, match="T=0"):
        da.account(cfg, seq_len=0)
    with pytest.raises(da.InputShapeError, match="B=0"):
        da.account(cfg, batch_size=0)


def test_cli_json_and_plot(tmp_path, capsys):
    png = tmp_path / "flops.png"
    assert main(["account", "--preset", "cs336-test", "--batch", "2", "--seq", "8", "--json",
                 "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    V, D, L, F = 10000, 64, 3, 128
    assert out["parameters"]["total"] == cs336_params(V, D, L, F)
    assert out["forward_flops"] == sum(dense_terms(da.preset("cs336-test"), 2, 8).values())
    assert out["measured"]["matches_analytic"] is True
    assert out["config"]["d_model"] == D
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_longer_context_variant_and_rejection(capsys):
    assert main(["account", "--preset", "gpt2-small", "--seq", "2048"]) == 2
    assert "max_seq_len=1024" in capsys.readouterr().err
    assert main(["account", "--preset", "cs336-small", "--max-seq-len", "2048", "--no-measure",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq_len"] == 2048
    assert out["forward_flops"] == sum(dense_terms(da.preset("cs336-small"), 1, 2048).values())


CHILD = """
import contextlib, io, json, sys
from decoder_audit.cli import main
results = {}
for name in ("gpt2-xl", "cs336-xl"):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["account", "--preset", name, "--json"])
    out = json.loads(buf.getvalue())
    results[name] = [rc, out["parameters"]["total"], out["measured"]["total"]]
# VmHWM is this process image's own peak RSS; ru_maxrss would include the peak inherited
# from the (pytest) parent across fork + exec.
status = open("/proc/self/status").read()
peak_kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
print(json.dumps({"peak_bytes": peak_kib * 1024, "results": results}))
"""


def test_account_never_allocates_weights():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=120, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["results"]["gpt2-xl"][:2] == [0, 1_557_611_200]
    assert report["results"]["cs336-xl"][:2] == [0, 2_127_057_600]
    fp32_weights = 4 * 1_557_611_200  # the smaller of the two, 6.2 GB
    # The whole process (Python + torch) stays far below one copy of the weights.
    assert report["peak_bytes"] < fp32_weights / 4, report["peak_bytes"]


def test_a_batch_beyond_what_a_tensor_holds_is_accounted_without_measuring():
    """B = 2^63 - 1: every analytic figure is a Python integer, exact; the meta-device forward
    would need logits of B*T*V elements, which no tensor holds (its bytes are an int64), so the
    measurement is skipped, saying which tensor (before: an Overflow from torch.zeros)."""
    cfg = da.preset("tiny-368")
    B, T = 2**63 - 1, cfg.max_seq_len
    acct = da.account(cfg, batch_size=B, seq_len=T)
    assert acct.measured is None
    assert "B*T*V" in acct.measure_skipped and f"{B * T * cfg.vocab_size:,}" in acct.measure_skipped
    readout = acct.group("readout").flops
    assert readout == 2 * B * T * cfg.d_model * cfg.vocab_size
