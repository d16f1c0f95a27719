"""The gate's predicted peak memory (gate/peak.py): its terms against hand formulas,
against a measured peak, the refusal that names it, and its per-rank figure under sharding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.gate.peak import PROCESS_BASELINE, check_gate_fits, gate_peak

# Layers dominate and V is small, so the float64 oracle stage sets the peak: V=64, D=64, L=4,
# H=4 (Dh=16), F=256, T=8, untied, no biases.
LAYERED = da.DecoderConfig(vocab_size=64, d_model=64, n_layers=4, n_heads=4, d_ff=256,
                           max_seq_len=8, norm="rmsnorm", mlp="swiglu", pos="rope",
                           attn_bias=False, mlp_bias=False, tie_embeddings=False)
V, D, L, H, Dh, F, T = 64, 64, 4, 4, 16, 256, 8
LAYER = 4 * D * D + 3 * D * F + 2 * D  # q, k, v, o; w1, w2, w3; two RMSNorm gains = 65,664
P = 2 * V * D + L * LAYER + D  # embeddings, untied head, blocks, final gain = 270,912


def rows(peak) -> dict[str, int]:
    return {row.name.split(" (")[0]: row.bytes for row in peak.rows}


def test_terms_of_a_small_config_match_the_hand_formulas():
    peak = gate_peak(LAYERED, torch.float32)
    assert peak.check == "oracle"
    got = rows(peak)
    assert got["process baseline"] == PROCESS_BASELINE
    assert got["weights"] == 4 * P
    # GRAD_SHARE = 0.25 of P is 67,728 weights: one layer per backward pass (two do not fit)
    assert got["fast gradients of one pass"] == 4 * LAYER
    # a layer's weights and their gradients in float64, and two copies of its largest matrix
    # (D x F): the gradient laid out as the weight, and the difference compared
    assert got["float64 oracle stage: a layer's weights and gradients, matrix copies"] == \
        8 * (2 * LAYER + 2 * D * F)
    # the fast forward at (B, T) = (2, 8): analytic.py's float32 estimate, by hand
    B = 2
    per_layer = 4 * B * T * D + B * T * 3 * H * Dh + B * H * T * T + B * T * H * Dh + 3 * B * T * F
    graph = 4 * (L * per_layer + 2 * B * T * D + 2 * B * T * V)
    assert got["activations saved for backward"] == graph
    own = 4 * LAYER + 8 * (2 * LAYER + 2 * D * F) + graph
    assert abs(got["allocator slack"] - 0.1 * (4 * P + own)) <= 1
    assert got["kernel buffers kept"] == 32 * 2**20 + 6 * D * F * 4  # largest weight: D x F
    assert peak.total == sum(got.values())
    assert dict(peak.checks)["oracle"] == peak.total == max(dict(peak.checks).values())


def test_a_tied_embedding_costs_three_vocabulary_gradients_in_tying_grad():
    cfg = da.preset("gpt2-small")
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        peak = gate_peak(cfg, dtype)
        checks = dict(peak.checks)
        base = PROCESS_BASELINE + 124_439_808 * size
        own = 3 * 50257 * 768 * size  # the readout's gradient, the lookup's, their sum
        slack = 0.1 * (124_439_808 * size + own)
        kernels = 192 * 2**20  # 32 MiB + 6 x V x D bytes, past the cap
        assert abs(checks["tying_grad"] - (base + own + slack + kernels)) <= 1
        assert peak.total >= checks["tying_grad"]


def test_sixteen_bit_halves_the_weights_and_the_fast_gradients():
    full, half = gate_peak(LAYERED, torch.float32), gate_peak(LAYERED, torch.bfloat16)
    assert rows(half)["weights"] * 2 == rows(full)["weights"]
    assert rows(half)["fast gradients of one pass"] * 2 == rows(full)["fast gradients of one pass"]
    # the oracle computes in float64 whatever the model's dtype
    name = "float64 oracle stage: a layer's weights and gradients, matrix copies"
    assert rows(half)[name] == rows(full)[name]


def test_world_size_divides_the_weights_and_gradients_and_adds_the_gathered_block():
    one, four = gate_peak(LAYERED, torch.float32), gate_peak(LAYERED, torch.float32, world_size=4)
    assert four.world_size == 4
    assert rows(four)["weights"] == -(-P // 4) * 4
    root = 2 * V * D + D  # embeddings, head and final norm, gathered together: < one layer
    assert rows(four)["gathered unit"] == 4 * max(LAYER, root)
    # sharded, the gate takes the gradients in the same passes: a rank's quarter of one
    # pass's, and the gathered block's whole until it is reduce-scattered
    one_pass = rows(one)["fast gradients of one pass"] // 4  # weights in the largest pass
    assert one_pass < P
    assert rows(four)["fast gradients of one pass"] == -(-one_pass // 4) * 4 + 4 * LAYER
    # the stage the oracle reads, and the gradient compared, gathered whole (D x F is largest)
    assert rows(four)["one layer's weights and the largest gradient, gathered whole to be read"] \
        == 4 * (LAYER + D * F)
    name = "float64 oracle stage: a layer's weights and gradients, matrix copies"
    assert rows(four)[name] == rows(one)[name]  # every rank runs the same oracle
    with pytest.raises(da.ConfigError, match="world_size=0"):
        gate_peak(LAYERED, world_size=0)


def test_llama2_7b_in_bfloat16_is_predicted_above_its_measured_peak():
    peak = gate_peak(da.preset("llama2-7b"), torch.bfloat16)
    # README "Cost at scale": verify peaked at 20.8 GB (19.4 GiB) of RSS
    assert 20.8e9 <= peak.total <= 1.25 * 20.8e9
    assert peak.check == "oracle"


def test_check_gate_fits_refuses_with_the_figure_and_passes_above_it():
    cfg = da.preset("gpt2-small")
    need = gate_peak(cfg, torch.float32)
    assert check_gate_fits(cfg, torch.float32, available=need.total) == need
    with pytest.raises(da.ConfigError) as refused:
        check_gate_fits(cfg, torch.float32, available=need.total // 2)
    said = str(refused.value)
    assert f"{need.total / 1e9:,.1f} GB" in said
    assert need.check in said
    assert f"{need.total // 2 / 1e9:,.1f} GB" in said
    # sharded over 8 ranks, the 7B gate fits where one process would not
    big = da.preset("llama2-7b")
    with pytest.raises(da.ConfigError, match="oracle"):
        check_gate_fits(big, torch.bfloat16, available=16 * 10**9)
    eighth = check_gate_fits(big, torch.bfloat16, available=16 * 10**9, world_size=8)
    assert eighth.total < 16e9
    # ... unless the eight ranks share this one memory
    with pytest.raises(da.ConfigError, match=f"{8 * eighth.total / 1e9:,.1f} GB"):
        check_gate_fits(big, torch.bfloat16, available=16 * 10**9, world_size=8, local_ranks=8)


def test_account_prints_the_gate_peak_per_dtype_and_rank(capsys):
    assert main(["account", "--preset", "cs336-test", "--no-measure", "--json", "--dtype",
                 "float32", "bfloat16", "--world-size", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    cfg = da.preset("cs336-test")
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        want = gate_peak(cfg, dtype, world_size=2)
        assert out["gate_peak"][name]["total_bytes"] == want.total
        assert out["gate_peak"][name]["check"] == want.check
        assert out["gate_peak"][name]["world_size"] == 2
    assert main(["account", "--preset", "cs336-test", "--no-measure"]) == 0
    text = capsys.readouterr().out
    assert "gate peak (verify) in float32" in text
    assert f"{gate_peak(cfg).total:,}" in text
    with pytest.raises(SystemExit) as refused:  # out of the option's range (cli/values.py)
        main(["account", "--preset", "cs336-test", "--world-size", "0"])
    assert refused.value.code == 2


# A model whose vocabulary dominates: its tied embedding's gradients, logits and probes are
# most of the gate's memory beside the interpreter, and the gate runs in a few seconds (one
# thread: a spinning second thread on a loaded machine costs more than it saves).
WIDE_VOCAB = dict(vocab_size=16000, d_model=64, n_layers=1, n_heads=2, d_ff=128, max_seq_len=16,
                  norm="layernorm", mlp="gelu", pos="learned", tie_embeddings=True)
# `decoder-audit verify --config cfg.json --json` through the CLI's own main(), as measured for
# the prediction (benchmarks/gate_peak.py), then its own peak RSS.
CHILD = """
import contextlib, io, json, sys
from decoder_audit.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    main(["verify", "--config", sys.argv[1], "--json"])
status = open("/proc/self/status").read()
peak_kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
print(json.dumps({"peak_bytes": peak_kib * 1024, "passed": json.loads(out.getvalue())["passed"]}))
"""


def test_the_prediction_bounds_a_measured_gate_from_above(tmp_path):
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(WIDE_VOCAB))
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=300, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["passed"]
    predicted = gate_peak(da.DecoderConfig(**WIDE_VOCAB), torch.float32).total
    # VmHWM is this process image's own peak (not the pytest parent's, as ru_maxrss would be)
    assert measured["peak_bytes"] <= predicted <= 1.25 * measured["peak_bytes"], \
        (measured["peak_bytes"], predicted)


def test_verify_refuses_a_gate_that_cannot_fit_before_building_it(capsys, monkeypatch):
    """verify sizes a preset's gate first: with less memory than the lowest peak the
    prediction allows it exits 2, naming the figure and the check, and builds nothing; with
    the prediction's floor available it runs (a refusal must be sure, PREDICTION_MARGIN)."""
    import decoder_audit.gate.peak as gate_memory
    from decoder_audit.model import decoder

    peak = gate_peak(da.preset("tiny-368"), torch.float32)
    floor = -int(-peak.total // gate_memory.PREDICTION_MARGIN)  # rounded up
    built = []
    original = decoder.Decoder.reset_parameters
    monkeypatch.setattr(decoder.Decoder, "reset_parameters",
                        lambda self: built.append(self) or original(self))
    monkeypatch.setattr(gate_memory, "available_bytes", lambda device: floor - 1)
    assert main(["verify", "--preset", "tiny-368", "--json"]) == 2
    said = capsys.readouterr().err
    assert f"{peak.total / 1e9:,.1f} GB" in said and peak.check in said and not built
    monkeypatch.setattr(gate_memory, "available_bytes", lambda device: floor)
    assert main(["verify", "--preset", "tiny-368", "--json"]) == 0 and built
