"""benchmarks/training_step.py: the two sides of a timed training step do the same work.

Independent expectation: from the same weights, one step of our Decoder and one of its Hugging
Face twin (`da.to_hf`), each with its own torch AdamW on the same batch, must leave the same
weights (HF's GPT-2 names mapped back by hand below; Conv1D stores W transposed), to float32
rounding of two implementations (1e-5 absolute on weights moved by ~lr = 3e-4; bf16: see the
test). A side that skipped the backward or the optimizer would leave its weights where they
started.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

RUN_PY = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def _bench(name: str):
    """A module of the benchmarks package, importable once run.py is loaded by path."""
    if "benchmarks_run" not in sys.modules:
        spec = importlib.util.spec_from_file_location("benchmarks_run", RUN_PY)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"benchmarks.{name}")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_step_of_each_side_leaves_the_same_weights(precision):
    step_module, pair = _bench("training_step"), _bench("pair")
    row = step_module.plan_rows(_smoke_plan())[0]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, row.cfg.vocab_size, (row.batch, row.seq_len + 1), generator=gen)
    ids, targets = tokens[:, :-1], tokens[:, 1:]  # (B, T) each
    ours, theirs, _ = pair.build_pair(row.cfg, ids)
    before = ours.token_embeddings.weight.detach().clone()
    for model, is_hf in ((ours.train(), False), (theirs.train(), True)):
        optimizer = torch.optim.AdamW(list(dict.fromkeys(model.parameters())),
                                      **step_module.ADAMW)
        step_module.training_step(model, is_hf, optimizer, ids, targets, precision)()
    moved = (ours.token_embeddings.weight - before).abs().max().item()
    assert moved > 1e-4  # the step did update the weights
    pairs = {"token_embeddings.weight": theirs.transformer.wte.weight,
             "layers.0.attn.output_proj.weight": theirs.transformer.h[0].attn.c_proj.weight.T,
             "layers.1.ffn.w2.weight": theirs.transformer.h[1].mlp.c_proj.weight.T}
    ours_weights = dict(ours.named_parameters())
    lr = step_module.ADAMW["lr"]
    for name, hf_weight in pairs.items():
        diff = (ours_weights[name] - hf_weight).abs().flatten()
        if precision == "fp32":
            assert diff.max().item() <= 1e-5, (name, diff.max().item())
        else:
            # Adam's first step moves each weight by ~lr * sign(gradient); where a gradient is
            # at bf16's rounding level the two forwards may give it opposite signs (at most
            # 2 lr apart), but almost every weight must take the same step.
            assert diff.max().item() <= 2 * lr + 1e-6, (name, diff.max().item())
            assert diff.median().item() <= 1e-5, (name, diff.median().item())


def test_the_smoke_rows_report_tokens_per_second_from_their_medians():
    step_module = _bench("training_step")
    plan = _smoke_plan()
    row = step_module.plan_rows(plan)[0]
    result = step_module.measure_row(row, repeats=2, warmup=1)
    tokens = row.batch * row.seq_len
    for side in ("ours", "hf"):
        median = result[side]["seconds"]["median"]
        assert result[side]["tokens_per_s"] == pytest.approx(tokens / median)
    assert result["hf_over_ours"] == pytest.approx(
        result["hf"]["seconds"]["median"] / result["ours"]["seconds"]["median"])
    assert "| row | ours tok/s | HF tok/s |" in "\n".join(step_module.section([result]))


def _smoke_plan():
    common = _bench("common")
    return common.Plan(smoke=True, quick=False, threads=1, repeats=1, warmup=0, profile=False,
                       skip=frozenset(), ceiling=1.0, started=0.0)
