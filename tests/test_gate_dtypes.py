"""The gate in the model's own dtype and on its own device (issue 13): correct models pass in
bfloat16 and float16, the zoo is caught in bfloat16 except the mutants whose effect is below
bfloat16's rounding (named below, with their size), float64 stays available, and
`verify --dtype/--device` cast and move the model, or refuse a device this machine lacks."""

from __future__ import annotations

import json

import pytest
import torch

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.gate import tolerances

import configs
import zoo

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Every floating parameter and buffer in `dtype`, the Parameter objects kept: a mutant's
    structure (a false tie, a second Parameter over one storage) survives, where Decoder.to()
    would re-tie it."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(dtype)
    return model


def _passes(model, **kwargs):
    report = da.audit(model, **kwargs)
    assert report.passed, {c.name: c.detail for c in report.failures}
    return report


# ---- correct models pass in the 16-bit types ---------------------------------------------------

@pytest.mark.parametrize("name, dtype", [
    ("tiny-368", torch.bfloat16), ("cs336-test", torch.bfloat16), ("llama-debug", torch.bfloat16),
    ("tiny-368", torch.float16), ("cs336-test", torch.float16),
], ids=["tiny-368-bf16", "cs336-test-bf16", "llama-debug-bf16", "tiny-368-fp16",
        "cs336-test-fp16"])
def test_presets_pass_in_16_bit(name, dtype):
    report = _passes(cast(zoo.decoder(da.preset(name)), dtype))
    assert report.dtype == str(dtype).removeprefix("torch.")
    floor = report["oracle"].evidence["rounding_floor"]
    # the measured floor sets the tolerance: 4x it, never below 2 eps of the dtype
    assert 0 < floor < 4 * tolerances.eps(dtype)
    assert report["oracle"].tolerance == pytest.approx(tolerances.shape_change(dtype, floor))
    assert any("checks ran in" in note for note in report.notes)


@pytest.mark.parametrize("cfg", configs.params(configs.grid()[:8] + configs.entries(
    "gqa-small", "long-context-40")))
def test_odd_configs_pass_in_bfloat16(cfg):
    _passes(cast(zoo.decoder(cfg, seed=3), torch.bfloat16))


def test_hand_written_attention_and_a_torch_decoder_pass_in_bfloat16():
    _passes(cast(zoo.with_attention(zoo.HandAttention, zoo.GQA), torch.bfloat16))
    torch.manual_seed(0)
    report = _passes(cast(zoo.TorchDecoder(), torch.bfloat16), **zoo.TORCH_BLACKBOX)
    assert report.mode == "black-box" and report.dtype == "bfloat16"


# ---- the zoo in bfloat16 -----------------------------------------------------------------------

# Mutants whose effect on the logits is below what bfloat16 can resolve (eps 7.8e-3 of the logit
# scale; the tolerance is 4x the measured rounding floor, 2.6 eps for the zoo's small model).
# Each is caught in float32. Effects measured on the zoo's models, relative to the logit scale:
BF16_OUT_OF_REACH = {
    # a leak of 1e-6 of the last token's residual: rounds to nothing, 0 change in every row
    "leak_of_1e-6": "causal",
    # a leak of 1e-8 built for float64: rounds to nothing
    "leak_of_1e-8_float64": "causal",
    # the diagonal dropped from the mask: random-init attention is nearly uniform and writes
    # little into the residual, so logits move by 1.5e-2 of their scale (2.0 eps), inside 2.6 eps
    "self_excluded_mask": "oracle",
    # a 1/Dh score scale on the traced path only: 4e-3 of the scale (0.5 eps) even with the
    # attention sharpened to scores of ~2
    "traced_path_differs_from_fast": "oracle",
}


@pytest.mark.parametrize("case", [c for c in zoo.MUTANTS if c.name not in BF16_OUT_OF_REACH],
                         ids=lambda case: case.name)
def test_mutant_is_caught_in_bfloat16(case):
    report = da.audit(cast(case.build(), torch.bfloat16), **case.kwargs)
    failing = [c.name for c in report.failures]
    assert case.expect in failing, f"{case.name}: expected {case.expect}, got {failing}"
    if case.first:
        assert report.first_failure.name == case.expect, report.first_failure.detail
    assert "exception" not in report[case.expect].evidence, report[case.expect].detail


@pytest.mark.parametrize("name", sorted(BF16_OUT_OF_REACH))
def test_mutants_out_of_bfloat16s_reach_are_caught_in_float32(name):
    """The list above is exact: each of these passes its check in bfloat16 (its effect is below
    the rounding) and fails it in float32."""
    case = next(c for c in zoo.MUTANTS if c.name == name)
    check = BF16_OUT_OF_REACH[name]
    assert case.expect == check
    wide = da.audit(cast(case.build(), torch.float32), checks=[check], **case.kwargs)
    narrow = da.audit(cast(case.build(), torch.bfloat16), checks=[check], **case.kwargs)
    assert not wide[check].passed and narrow[check].passed


# ---- float64 stays available -------------------------------------------------------------------

def test_float64_audits_with_the_tight_tolerances():
    report = _passes(zoo.decoder().double())
    assert report.dtype == "float64"
    assert report["oracle"].tolerance == tolerances.ORACLE_FP64
    assert report["oracle"].evidence["max_abs_logit_error"] < 1e-12
    assert report["prefix"].tolerance == tolerances.SHAPE_CHANGE_FP64


def test_leak_of_1e_8_is_caught_in_float64_only_by_causal():
    case = next(c for c in zoo.MUTANTS if c.name == "leak_of_1e-8_float64")
    report = da.audit(case.build(), **case.kwargs)
    assert report.dtype == "float64" and [c.name for c in report.failures] == ["causal"]


# ---- the command line --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_cli_verify_dtype_casts_the_model_before_the_gate(dtype, capsys):
    assert main(["verify", "--dtype", dtype, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["dtype"] == dtype and data["device"] == "cpu"
    assert data["command"] == f"decoder-audit verify --preset tiny-368 --dtype {dtype}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cli_verify_refuses_cuda_without_one_in_one_line_before_the_gate(capsys):
    assert main(["verify", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing built, nothing audited
    assert err.count("\n") == 1 and "CUDA is not available" in err and "--device cuda" in err


def test_cli_verify_refuses_a_device_name_torch_does_not_know(capsys):
    assert main(["verify", "--device", "gpu0"]) == 2
    assert "is not a device" in capsys.readouterr().err


# ---- CUDA (skipped without one; benchmarks/gpu_checks.py runs the larger GPU checks) -----------

@cuda
def test_the_gate_runs_on_a_cuda_model_in_bfloat16_with_the_oracle_on_the_cpu():
    model = zoo.decoder(da.preset("llama-debug")).cuda().to(torch.bfloat16)
    report = _passes(model)
    assert report.device.startswith("cuda") and report.dtype == "bfloat16"
    assert next(model.parameters()).device.type == "cuda"
    assert all(p.grad is None for p in model.parameters())


@cuda
def test_cuda_zoo_mutants_are_caught():
    for name in ("no_causal_mask", "finite_mask_1e4", "gqa_tiled_not_interleaved",
                 "batch_rows_mixed"):
        case = next(c for c in zoo.MUTANTS if c.name == name)
        report = da.audit(case.build().cuda(), **case.kwargs)
        assert case.expect in [c.name for c in report.failures], name


@cuda
def test_cli_verify_on_cuda(capsys):
    assert main(["verify", "--device", "cuda", "--dtype", "bfloat16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"].startswith("cuda") and data["passed"]
