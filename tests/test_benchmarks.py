"""Smoke test of benchmarks/run.py (the entry point of the benchmarks/ package): the whole
benchmark runs end to end on tiny configs with one repeat and writes JSON and Markdown with the expected keys. It asserts structure and the
arithmetic that links the figures (tokens/s = B*T / median time, ratio = HF / ours, FLOPs from
the accounting formula), never a timing: the machine is shared and timings are noise here."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import subprocess
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


# ---- Budgets, rows written as they finish, merged results files, default outputs (issue 35) --
# None of these times a model: the measurement of a row is replaced by a made-up row, or the
# budget is spent before any row starts.

REPO = RUN_PY.parents[1]


def _git_status() -> str:
    """Everything git sees changed in the working tree (untracked files included; ignored not)."""
    try:
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")


def _ignored(path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO).returncode == 0


class _Parsed(Exception):
    """Raised in place of running a command, carrying the arguments it parsed."""


def _parsed(monkeypatch, main, argv):
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        with pytest.raises(_Parsed) as parsed:
            main(argv)
    return parsed.value.args[0]


def _module(path: Path, name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.mark.parametrize("name", ["run", "gate_scale", "gate_peak", "generation",
                                  "training_step", "shard_memory", "gpu_checks",
                                  "trainer_gate"])
def test_each_benchmark_command_writes_under_an_ignored_folder_by_default(name, monkeypatch):
    _git_status()  # skips outside a git checkout
    module = _load_run_module() if name == "run" else _bench(name)
    out = Path(_parsed(monkeypatch, module.main, []).out).resolve()
    assert out.is_relative_to(REPO) and _ignored(out), out
    assert not out.is_relative_to(REPO / "benchmarks")


def test_the_docs_scripts_write_no_tracked_file_by_default(monkeypatch):
    bert = _module(REPO / "docs" / "bert_contrast.py", "bert_contrast_script")
    args = _parsed(monkeypatch, bert.main, [])
    assert args.docs is None and not Path(args.out).resolve().is_relative_to(REPO)


def _fake_row(label: str, seconds: float = 0.01) -> dict:
    """A row as rows_section reads it, with made-up figures."""
    side = {"seconds": {"median": seconds, "min": seconds, "max": seconds, "n": 1},
            "tokens_per_s": 1.0, "achieved_gflops": 1.0, "mfu": 0.1}
    return {"label": label, "ours": side, "hf": dict(side), "hf_over_ours": 1.0,
            "hf_over_ours_paired": {"min": 1.0, "max": 1.0}, "hf_over_ours_best": 1.0,
            "equality": {"max_abs_logit_diff": 0.0, "hf_attention": "sdpa"}}


ROWS_ONLY = ["--smoke", "--threads", "1", "--no-profile", "--skip-memory", "--skip-gate",
             "--skip-account", "--skip-generation", "--skip-training-step"]


def test_quick_has_a_budget_and_budget_overrides_it():
    run = _load_run_module()
    assert run.parse_args(["--quick"]).budget == 300
    assert run.parse_args(["--quick", "--budget", "60"]).budget == 60
    assert run.parse_args([]).budget is None


def test_a_spent_budget_starts_no_row_and_names_each_one(tmp_path):
    before = _git_status()
    results = _load_run_module().main(["--smoke", "--threads", "1", "--budget", "0",
                                       "--out", str(tmp_path)])
    skipped = {(s["family"], s["row"]) for s in results["skipped"]}
    labels = [r.label for r in _bench("rows").smoke_rows()]
    assert {("rows", label) for label in labels} <= skipped
    assert {"memory", "gate", "account", "generation", "training_step"} <= {f for f, _ in skipped}
    assert not results.get("rows") and results["finished"]
    on_disk = json.loads((tmp_path / "benchmark.json").read_text())
    assert on_disk["skipped"] == results["skipped"]
    md = (tmp_path / "benchmark.md").read_text()
    assert all(label in md for label in labels)
    assert _git_status() == before


def test_each_row_is_on_disk_before_the_next_starts_and_the_budget_stops_the_rest(
        tmp_path, monkeypatch):
    on_disk = []

    def fake_measure(row, warmup, repeats, ceiling, profile):
        path = tmp_path / "benchmark.json"
        on_disk.append([r["label"] for r in json.loads(path.read_text()).get("rows", [])])
        return _fake_row(row.label)

    monkeypatch.setattr(_bench("rows"), "measure_row", fake_measure)
    # the budget is spent once three rows have run (in place of the clock)
    monkeypatch.setattr(_bench("common").Plan, "over_budget", lambda plan: len(on_disk) >= 3)
    results = _load_run_module().main([*ROWS_ONLY, "--budget", "1000", "--out", str(tmp_path)])
    labels = [r.label for r in _bench("rows").smoke_rows()]
    assert on_disk == [[], labels[:1], labels[:2]]  # each row written before the next began
    assert [r["label"] for r in results["rows"]] == labels[:3]
    assert [s["row"] for s in results["skipped"]] == labels[3:]


def test_rows_already_in_the_results_folder_are_kept(tmp_path, monkeypatch):
    labels = [r.label for r in _bench("rows").smoke_rows()]
    old = _fake_row("a row of an earlier run", seconds=5.0)
    stale = _fake_row(labels[0], seconds=9.0)
    account = {"command": "decoder-audit account --preset gpt2-xl", "seconds": 3.0,
               "peak_rss_mb": 500.0}  # an earlier run's one figure
    (tmp_path / "benchmark.json").write_text(json.dumps({"rows": [old, stale],
                                                         "account": account}))
    monkeypatch.setattr(_bench("rows"), "measure_row",
                        lambda row, *args: _fake_row(row.label, seconds=0.02))
    _load_run_module().main([*ROWS_ONLY, "--out", str(tmp_path)])
    written = json.loads((tmp_path / "benchmark.json").read_text())
    assert [r["label"] for r in written["rows"]] == ["a row of an earlier run", *labels]
    assert written["rows"][0] == old  # kept as it was
    assert written["rows"][1]["ours"]["seconds"]["median"] == 0.02  # measured again: replaced
    assert written["account"] == account  # not measured this run: kept
    assert "Rows of 2 runs" in (tmp_path / "benchmark.md").read_text()


def test_an_unreadable_results_file_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "benchmark.json"
    path.write_text("{ half a file")
    with pytest.raises(_bench("common").BenchmarkError, match="benchmark.json"):
        _load_run_module().main([*ROWS_ONLY, "--out", str(tmp_path)])
    assert path.read_text() == "{ half a file"


def test_merge_rows_replaces_by_label_and_keeps_the_order():
    merge = _bench("store").merge_rows
    old = [{"label": "a", "v": 1}, {"label": "b", "v": 1}, {"label": "c", "v": 1}]
    new = [{"label": "d", "v": 2}, {"label": "b", "v": 2}]
    assert merge(old, new) == [{"label": "a", "v": 1}, {"label": "b", "v": 2},
                               {"label": "c", "v": 1}, {"label": "d", "v": 2}]


def _scale_row(preset: str, seconds: float) -> dict:
    return {"preset": preset, "dtype": "float32", "passed": True, "failures": [],
            "params": 1000, "weights_bytes": 4000, "gate_seconds": seconds,
            "forward_seconds": 0.1, "forward_equivalents": seconds / 0.1,
            "peak_rss_bytes": 4e8, "bytes_per_param": 4e5, "gate_extra_over_weights": 1.0,
            "checks": {"causal": seconds}, "load_average": [1.0, 1.0, 1.0]}


def test_gate_scale_of_one_preset_updates_its_row_and_keeps_the_others(tmp_path, monkeypatch):
    scale = _bench("gate_scale")
    rows = [_scale_row(p, 10.0) for p in ("tiny-368", "gpt2-small", "gpt2-medium")]
    (tmp_path / "gate_scale.json").write_text(json.dumps({"dtype": "float32", "rows": rows}))
    monkeypatch.setattr(scale, "run_child", lambda preset, *args: _scale_row(preset, 20.0))
    before = _git_status()
    assert scale.main(["--presets", "gpt2-small", "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "gate_scale.json").read_text())
    assert [r["preset"] for r in written["rows"]] == ["tiny-368", "gpt2-small", "gpt2-medium"]
    assert [r["gate_seconds"] for r in written["rows"]] == [10.0, 20.0, 10.0]
    assert written["rows"][0] == rows[0] and written["rows"][2] == rows[2]
    table = [line for line in (tmp_path / "gate_scale.md").read_text().splitlines()
             if line.startswith("| gpt2") or line.startswith("| tiny")]
    assert len(table) == 3 and (tmp_path / "gate_scale.png").is_file()
    assert _git_status() == before


def test_bert_contrast_copies_pictures_only_when_asked_and_keeps_a_users_folder(
        tmp_path, monkeypatch):
    bert = _module(REPO / "docs" / "bert_contrast.py", "bert_contrast_script")

    def folders(out):
        return {name: (out / name).mkdir(parents=True) or out / name for name in bert.MODELS}

    def audited(folder, report_dir):
        report_dir.mkdir(parents=True)
        for picture in bert.PICTURES:
            (report_dir / picture).write_bytes(b"png")
        return {"checks": [{"name": "causal", "status": "pass", "detail": ""}],
                "exit_status": 0}

    monkeypatch.setattr(bert, "build_folders", folders)
    monkeypatch.setattr(bert, "audit_folder", audited)
    before = _git_status()
    out, docs = tmp_path / "out", tmp_path / "docs"
    assert bert.main(["--out", str(out)]) == 0 and not docs.exists()
    assert bert.main(["--out", str(out), "--docs", str(docs)]) == 0  # its own --out: emptied
    assert sorted(p.name for p in docs.iterdir()) == sorted(
        f"{m}-{p}" for m in bert.MODELS for p in bert.PICTURES)
    assert _git_status() == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as refused:
        bert.main(["--out", str(mine)])
    assert refused.value.code == 2 and (mine / "notes.txt").read_text() == "keep me"


def test_conformance_write_docs_of_a_few_families_merges_them_into_the_full_sweep(
        tmp_path, monkeypatch):
    conformance = _module(REPO / "tests" / "conformance.py", "conformance_script")
    families = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel",
                "mistral": "MistralForCausalLM"}
    cache, docs = tmp_path / "rows.json", tmp_path / "conformance.md"
    monkeypatch.setattr(conformance, "CACHE", cache)
    monkeypatch.setattr(conformance, "DOCS", docs)
    monkeypatch.setattr(conformance, "causal_lm_families", lambda: families)
    monkeypatch.setattr(conformance, "sweep", lambda chosen, echo=False: [
        conformance.Row(f, c, True, "pass", params=2) for f, c in chosen.items()])
    written = []
    monkeypatch.setattr(conformance, "write_docs", lambda rows: written.append(rows) or docs)
    before = _git_status()
    with pytest.raises(SystemExit) as refused:  # no full sweep to merge into
        conformance.main(["llama", "--write-docs"])
    assert refused.value.code == 2 and not written
    cache.write_text(json.dumps([dataclasses.asdict(conformance.Row(f, c, True, "pass",
                                                                    params=1))
                                 for f, c in families.items()]))
    assert conformance.main(["llama", "--write-docs"]) == 0
    (rows,) = written  # llama swept again (params 2), the others as the cache had them
    assert [(r.family, r.params) for r in rows] == [("llama", 2), ("gpt2", 1), ("mistral", 1)]
    assert [r["params"] for r in json.loads(cache.read_text())] == [2, 1, 1]
    assert _git_status() == before


def _plan(quick: bool):
    return _bench("common").Plan(smoke=False, quick=quick, threads=1, repeats=1, warmup=0,
                                 profile=False, skip=frozenset(), ceiling=1.0, started=0.0)


def test_quick_rows_are_shorter_than_the_full_runs():
    """--quick ran the full run's 256-token generation rows (issue 35): every quick row of each
    family does less work than the full row of its config and mode."""
    for module, work in (("rows", lambda r: (r.config_name, r.backward, r.batch * r.seq_len)),
                         ("generation", lambda r: (r.config_name, r.batch,
                                                   r.prompt_len + r.new_tokens)),
                         ("training_step", lambda r: (r.config_name, r.precision,
                                                      r.batch * r.seq_len))):
        full = {}
        for name, mode, size in map(work, _bench(module).plan_rows(_plan(False))):
            full[(name, mode)] = min(size, full.get((name, mode), size))
        quick = [work(r) for r in _bench(module).plan_rows(_plan(True))]
        assert quick and all(size < full[(name, mode)] for name, mode, size in quick), module
    assert all(r.new_tokens < 256 for r in _bench("generation").plan_rows(_plan(True)))
