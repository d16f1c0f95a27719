"""Smoke test of benchmarks/run.py (the entry point of the benchmarks/ package): the whole
benchmark runs end to end on tiny configs with one repeat and writes JSON and Markdown with the expected keys. It asserts structure and the
arithmetic that links the figures (tokens/s = B*T / median time, ratio = HF / ours, FLOPs from
the accounting formula), never a timing: the machine is shared and timings are noise here."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

RUN_PY = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def _load_run_module():
    """Load the entry point by path, as `python benchmarks/run.py` runs it (registered first:
    dataclasses look their module up in sys.modules); it makes the `benchmarks` package
    importable, where the moved names live."""
    if "benchmarks_run" in sys.modules:
        return sys.modules["benchmarks_run"]
    spec = importlib.util.spec_from_file_location("benchmarks_run", RUN_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _bench(name: str):
    """A module of the benchmarks package (rows, pair, ...), importable once run.py is loaded."""
    _load_run_module()
    return importlib.import_module(f"benchmarks.{name}")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    results = _load_run_module().main(["--smoke", "--threads", "1", "--out", str(out)])
    return results, out


def _forward_flops(cfg, B: int, T: int) -> int:
    """Forward matmul FLOPs written out from the config (2 per multiply-add, full T x T scores)."""
    D, L, V, F, Dh = cfg.d_model, cfg.n_layers, cfg.vocab_size, cfg.d_ff, cfg.d_model // cfg.n_heads
    H, Hkv = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads
    n_ffn = 3 if cfg.mlp == "swiglu" else 2
    per_layer = (2 * B * T * D * (H * Dh + 2 * Hkv * Dh)  # q, k, v projections
                 + 2 * B * T * H * Dh * D  # output projection
                 + 2 * 2 * B * H * T * T * Dh  # scores and weighted sum
                 + n_ffn * 2 * B * T * D * F)  # MLP
    return L * per_layer + 2 * B * T * D * V  # + readout


def test_files_written_with_expected_keys(smoke):
    results, out = smoke
    on_disk = json.loads((out / "benchmark.json").read_text())
    for key in ("command", "machine", "ceiling", "rows", "memory", "gate", "account",
                "repeats", "warmup", "wall_seconds"):
        assert key in on_disk, key
    for key in ("cpu_model", "logical_cpus", "threads_used", "torch", "transformers"):
        assert key in on_disk["machine"], key
    assert on_disk["machine"]["threads_used"] == 1
    md = (out / "benchmark.md").read_text()
    assert "| row | ours ms | HF ms |" in md and "Ceiling used for MFU" in md
    assert "## Peak memory" in md and "forward-equivalents" in md and "## Accounting" in md
    assert "```" in (out / "profiles.md").read_text()  # profiler tables were written
    assert on_disk["rows"] == json.loads(json.dumps(results["rows"]))


def test_rows_cover_the_three_architectures_and_both_modes(smoke):
    results, _ = smoke
    rows = results["rows"]
    assert {(r["config"], r["mode"]) for r in rows} == {
        (name, mode) for name in _bench("rows").SMOKE_CONFIGS for mode in ("forward", "forward+backward")}
    # GPT-2 goes to GPT2LMHeadModel; the GQA Llama shape and the CS336 architecture (RMSNorm,
    # SwiGLU, interleaved RoPE, no biases) both go to LlamaForCausalLM.
    hf_class = {r["config"]: r["equality"]["hf_class"] for r in rows}
    assert hf_class == {"gpt2-tiny": "GPT2LMHeadModel", "llama-gqa-tiny": "LlamaForCausalLM",
                        "cs336-tiny": "LlamaForCausalLM"}


def test_row_arithmetic(smoke):
    results, _ = smoke
    ceiling = results["ceiling"]["ceiling_gflops"]
    for r in results["rows"]:
        cfg = _bench("rows").SMOKE_CONFIGS[r["config"]]
        B, T = r["batch"], r["seq_len"]
        forward = _forward_flops(cfg, B, T)
        assert r["flops"] == (3 * forward if r["mode"] == "forward+backward" else forward)
        assert r["equality"]["max_abs_logit_diff"] <= _bench("pair").EQUALITY_TOL * (
            1 + r["equality"]["logit_scale"])
        for side in ("ours", "hf"):
            s = r[side]
            median = s["seconds"]["median"]
            assert s["seconds"]["n"] == 1 and s["seconds"]["min"] <= median <= s["seconds"]["max"]
            assert s["tokens_per_s"] == pytest.approx(B * T / median)
            assert s["achieved_gflops"] == pytest.approx(r["flops"] / median / 1e9)
            assert s["mfu"] == pytest.approx(s["achieved_gflops"] / ceiling)
        assert r["hf_over_ours"] == pytest.approx(
            r["hf"]["seconds"]["median"] / r["ours"]["seconds"]["median"])


def test_memory_gate_and_account_sections(smoke):
    results, _ = smoke
    (mem,) = results["memory"]
    for side in ("ours", "hf"):
        assert mem[side]["peak_rss_mb"] >= mem[side]["rss_before_steps_mb"] > 0
    gate = results["gate"]
    assert gate["passed"] and gate["preset"] == "tiny-368"
    biggest = gate["largest_pass"]
    assert gate["forward_equivalents_tokens"] == pytest.approx(gate["tokens"] / biggest["tokens"])
    assert gate["tokens"] >= biggest["tokens"] > 0 and gate["seconds_by_step"]
    assert gate["forward_equivalents_max_len"] == pytest.approx(gate["tokens"] / 4)  # tiny-368: T<=4
    assert results["account"]["peak_rss_mb"] > 0 and results["account"]["seconds"] > 0


def test_unequal_models_are_refused(monkeypatch):
    """The benchmark must not time a pair that computes different functions."""
    import torch

    import decoder_audit as da

    pair = _bench("pair")
    cfg = _bench("rows").SMOKE_CONFIGS["gpt2-tiny"]
    real_to_hf = da.to_hf

    def broken_to_hf(decoder):
        hf = real_to_hf(decoder)
        with torch.no_grad():
            hf.transformer.ln_f.bias.add_(0.5)  # a planted conversion bug
        return hf

    monkeypatch.setattr(da, "to_hf", broken_to_hf)
    with pytest.raises(_bench("common").BenchmarkError, match="refusing to time unequal models"):
        pair.build_pair(cfg, torch.zeros(1, 4, dtype=torch.long))
