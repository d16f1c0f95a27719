"""How each training step runs: --grad-accum, --precision bf16 and --compile.

Independent expectations:
- accumulation: the same run with the whole batch in one piece. The mean loss over B*T tokens is
  the token-weighted sum of the micro-batches' means, so the gradients agree to rounding; in
  float64 (rounding ~1e-16 per operation) the weights after a few AdamW steps agree to 1e-12.
  The step-1 loss is also recomputed here from the task's first batch (the sampler's seed) and
  the fresh weights, through the float64 oracle.
- bf16: the fp32 run of the same seed. bf16 keeps 8 mantissa bits (relative rounding 2^-9 =
  0.2%), so after a few steps the losses differ by ~1e-3 nats; the tolerance is 0.05 nats.
- compile: the eager run; the compiled graph reorders float32 sums (~1e-6 relative).
"""

from __future__ import annotations

import os

import pytest
import torch

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.errors import ConfigError
from decoder_audit.references.oracle import oracle_logits
from decoder_audit.storage.checkpoint import load_checkpoint
from decoder_audit.text.tasks import CountingTask
from decoder_audit.training import TrainConfig, train
from decoder_audit.training.state import read_trainer_state

QUIET = {"progress": False, "verbose": False}
ACCUM_RUN = {"steps": 3, "batch_size": 8, "warmup": 1, "seed": 5}
FLOAT64_TOLERANCE = 1e-12
BF16_TOLERANCE = 0.05  # nats, after 30 steps of the counting task


def _fresh_float64() -> da.Decoder:
    torch.manual_seed(11)
    return da.Decoder(da.preset("tiny-368")).double()


def _rows_and_result(model, **options):
    rows = []
    result = train(model, **ACCUM_RUN, **options, **QUIET,
                   callback=lambda step, row: rows.append(dict(row)))
    return rows, result


@pytest.fixture(scope="module")
def accumulated():
    """The same float64 model trained with the batch of 8 in 1 piece, and in 4 of 2 rows."""
    return {n: _rows_and_result(_fresh_float64(), grad_accum=n) for n in (1, 4)}


def test_accumulated_steps_give_the_whole_batchs_weights(accumulated):
    (_, whole), (_, pieces) = accumulated[1], accumulated[4]
    for name, value in whole.model.state_dict().items():
        assert value.dtype == torch.float64
        diff = (pieces.model.state_dict()[name] - value).abs().max().item()
        assert diff <= FLOAT64_TOLERANCE, (name, diff)
    # and training did move them (so equal weights are not two untouched copies)
    assert (whole.model.state_dict()["token_embeddings.weight"]
            - _fresh_float64().state_dict()["token_embeddings.weight"]).abs().max() > 1e-3


def test_accumulated_metrics_are_the_whole_batchs(accumulated):
    (whole_rows, _), (piece_rows, _) = accumulated[1], accumulated[4]
    for whole, piece in zip(whole_rows, piece_rows, strict=True):
        assert piece["loss"] == pytest.approx(whole["loss"], abs=FLOAT64_TOLERANCE)
        # the norm before clipping: a loss not scaled by 1/N would show N times larger here
        assert piece["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-10)
        assert piece["tokens"] == whole["tokens"]
    # step 1's loss: the fresh weights' mean loss over the first batch the seed draws, 8 x 4
    inputs, targets = CountingTask().batch(torch.Generator().manual_seed(ACCUM_RUN["seed"]), 8)
    fresh = _fresh_float64()
    logits = oracle_logits(fresh.state_dict(), fresh.config, inputs)  # (8, 4, V) float64
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert piece_rows[0]["loss"] == pytest.approx(expected.item(), abs=1e-12)


def test_a_batch_that_does_not_split_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"batch_size=10 is not divisible by grad_accum=4"):
        TrainConfig(batch_size=10, grad_accum=4)
    with pytest.raises(ConfigError, match=r"grad_accum=0 must be a positive integer"):
        TrainConfig(grad_accum=0)
    out = tmp_path / "run"
    assert main(["train", "--batch-size", "6", "--grad-accum", "4", "--no-progress",
                 "--out", str(out)]) == 2
    said = capsys.readouterr().err  # the command line names its flags, with the values given
    assert "--batch-size=6" in said and "--grad-accum=4" in said
    assert not out.exists()


# ----------------------------------------------------------------------------------------------
# bf16
# ----------------------------------------------------------------------------------------------

BF16_RUN = {"steps": 30, "batch_size": 16, "warmup": 4, "seed": 2}


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    runs = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path_factory.mktemp(precision) / "run"
        dtypes = []
        torch.manual_seed(0)
        model = da.Decoder(da.preset("tiny-368"))
        hook = model.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
        result = train(model, **BF16_RUN, precision=precision, out=out, **QUIET)
        hook.remove()
        runs[precision] = (result, out, dtypes)
    return runs


def test_bf16_autocasts_the_forward_and_learns_like_fp32(bf16_runs):
    (fp32, _, fp32_dtypes), (bf16, _, bf16_dtypes) = bf16_runs["fp32"], bf16_runs["bf16"]
    assert torch.bfloat16 in bf16_dtypes and torch.bfloat16 not in fp32_dtypes
    assert torch.float32 in bf16_dtypes  # the evaluations: eager, in the weights' float32
    assert bf16.final_loss < bf16.initial_loss - 0.3
    assert abs(bf16.final_loss - fp32.final_loss) <= BF16_TOLERANCE
    assert bf16.final_loss != fp32.final_loss  # it did run in another precision


def test_bf16_keeps_float32_weights_and_optimizer_state(bf16_runs):
    result, out, _ = bf16_runs["bf16"]
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
    model = load_checkpoint(out / "checkpoint")
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    meta, state = read_trainer_state(out / "checkpoint")
    assert meta["train_config"]["precision"] == "bf16"
    moments = [t for s in state["optimizer"]["state"].values() for k, t in s.items()
               if k in ("exp_avg", "exp_avg_sq")]
    assert moments and all(t.dtype == torch.float32 for t in moments)


def test_a_resumed_bf16_run_stays_bf16(bf16_runs, tmp_path):
    """Interrupted at step 12 (checkpointed every 6), resumed with no options: bitwise the
    uninterrupted bf16 run, which an fp32 continuation would not be."""
    out = tmp_path / "run"

    def stop(step, row):
        if step == 14:
            raise KeyboardInterrupt

    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        train(da.Decoder(da.preset("tiny-368")), **BF16_RUN, precision="bf16", out=out,
              save_every=6, callback=stop, **QUIET)
    resumed = train(resume=out, **QUIET)
    assert resumed.config.precision == "bf16"
    uninterrupted = bf16_runs["bf16"][0]
    for name, value in uninterrupted.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


# ----------------------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------------------

# Inductor (the default backend) generates and builds C++ for every graph: 3.5 minutes for this
# tiny run on a loaded 2-core machine. The test therefore compiles with "aot_eager" (the same
# graph capture and autograd split, run by eager kernels) unless DECODER_AUDIT_SLOW_TESTS=1 asks
# for the real compiler; the benchmark (benchmarks/training_step.py) times inductor.
BACKEND = None if os.environ.get("DECODER_AUDIT_SLOW_TESTS") == "1" else "aot_eager"


def _compile_with(monkeypatch, backend):
    real = torch.compile
    if backend is not None:
        monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend=backend))


def _losses(**options):
    torch.manual_seed(0)
    rows = []
    train(da.Decoder(da.preset("tiny-368")), steps=3, batch_size=8, warmup=1,
          callback=lambda step, row: rows.append(row["loss"]), **options, **QUIET)
    return rows


def test_compiled_training_matches_eager(monkeypatch):
    _compile_with(monkeypatch, BACKEND)
    assert _losses(compile=True) == pytest.approx(_losses(), rel=1e-5, abs=1e-6)


def test_a_compiler_failure_is_a_config_error(monkeypatch):
    def broken_backend(graph, example_inputs):
        raise RuntimeError("no C++ compiler found")

    _compile_with(monkeypatch, broken_backend)
    with pytest.raises(ConfigError, match=r"--compile: torch.compile failed on this machine.*"
                                          r"no C\+\+ compiler found.*without --compile"):
        _losses(compile=True)


def test_accumulation_under_fsdp2_equals_the_whole_batch():
    """FSDP2 on one process (a one-rank group): the micro-batches' backwards skip the gradient
    reduce-scatter until the last (set_requires_gradient_sync); the weights must still be the
    whole batch's. float32: the sums run in another order, so 1e-6 on weights of size ~1."""
    weights = {}
    for accum in (1, 2):
        result = train("tiny-368", steps=3, batch_size=8, warmup=1, seed=4, grad_accum=accum,
                       shard=True, **QUIET)
        weights[accum] = result.model.state_dict()
    for name, value in weights[1].items():
        assert (weights[2][name] - value).abs().max().item() <= 1e-6, name
