"""The gate in the model's own dtype and on its own device (issue 13): correct models pass in
bfloat16 and float16, the zoo is caught in bfloat16 except the mutants whose effect is below
bfloat16's rounding (named below, with their size), float64 stays available, and
`verify --dtype/--device` cast and move the model, or refuse a device this machine lacks."""

from __future__ import annotations

import json
import math

import configs
import pytest
import torch
import zoo
import zoo_generation as zg

import decoder_audit as da
from decoder_audit.cli import main
from decoder_audit.gate import tolerances
from decoder_audit.objective import logits_of
from decoder_audit.references.oracle import oracle_logits

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

# Mutants whose effect is below what bfloat16 resolves on the zoo's small model: eps 7.8e-3, and
# the oracle's tolerance 2.1e-2 of the logit scale there (4x the measured rounding floor, 5.2e-3).
# Each is caught in float32. name: (check, effect): the effect on the logits relative to their
# largest |logit|, measured by `_effect` below in the dtype the mutant is built in,
# independently of the gate (on other ids than the gate's probe).
# Not listed: leak_of_1e-6 (8e-5 of the logit scale, a nudge of 1e-4 of the attention outputs it
# is added to) is caught in bfloat16 too: causal compares exactly, and the nudge flips single
# roundings of earlier rows (one bfloat16 ulp, 1.2e-4 at a logit of 2e-2).
BF16_OUT_OF_REACH = {
    # a leak of exactly 1e-8 in two logits of a float64 model: rounds to nothing
    "leak_of_1e-8_float64": ("causal", 6e-9),
    # the diagonal dropped from the mask: random-init attention is nearly uniform and writes
    # little into the residual, so the logits move by 1.6e-2 (the gate's probe) to 2.2e-2 of
    # their scale: the size of bfloat16's own rounding of this model (2 to 3 eps), at its
    # tolerance's edge; in float32 it is 500x the tolerance
    "self_excluded_mask": ("oracle", 2e-2),
    # a 1/Dh score scale on the traced path only: 7e-3 of the scale (under 1 eps) even with the
    # attention sharpened to scores of ~2 (the oracle check's second comparison)
    "traced_path_differs_from_fast": ("oracle", 7e-3),
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
    check = BF16_OUT_OF_REACH[name][0]
    assert case.expect == check
    wide = da.audit(cast(case.build(), torch.float32), checks=[check], **case.kwargs)
    narrow = da.audit(cast(case.build(), torch.bfloat16), checks=[check], **case.kwargs)
    assert not wide[check].passed and narrow[check].passed


def _sharpened(model: torch.nn.Module, ids: torch.Tensor, target: float = 2.0):
    """Forward hooks scaling every layer's queries and keys by sqrt(target / its largest
    |score|), so the largest attention score of each layer becomes about `target`."""
    _, trace = model.run_with_trace(ids)
    hooks = []
    for i, layer in enumerate(model.layers):
        factor = math.sqrt(target / float(trace[f"layers.{i}.attn.scores"].abs().max()))
        for proj in (layer.attn.q_proj, layer.attn.k_proj):
            hooks.append(proj.register_forward_hook(lambda _m, _i, out, a=factor: out * a))
    return hooks


def _effect(name: str) -> float:
    """How far the mutant's logits move, relative to their largest |logit|, in the dtype it is
    built in: for a causal leak, the earlier rows when the last token changes; for a wrong mask,
    the logits against the float64 reference forward (oracle_logits); for a traced path that
    differs, traced against fast with the attention sharpened (as the oracle check does)."""
    case = next(c for c in zoo.MUTANTS if c.name == name)
    model = case.build().eval()
    cfg = getattr(model, "config", None)
    vocab = case.kwargs.get("vocab_size") or cfg.vocab_size
    ids = torch.randint(0, vocab, (2, case.kwargs.get("max_seq_len") or cfg.max_seq_len),
                        generator=torch.Generator().manual_seed(0))  # (B, T)
    with torch.no_grad():
        logits = logits_of(model(ids)).double()  # (B, T, V)
        if BF16_OUT_OF_REACH[name][0] == "causal":
            changed = ids.clone()
            changed[:, -1] = (changed[:, -1] + 1) % vocab
            moved = logits_of(model(changed)).double() - logits
            return float(moved[:, :-1].abs().max() / logits.abs().max())
        if name == "self_excluded_mask":
            exact = oracle_logits(dict(model.named_parameters()), cfg, ids)
            return float((logits - exact).abs().max() / exact.abs().max())
        hooks = _sharpened(model, ids)
        try:
            fast = logits_of(model(ids)).double()
            traced = model.run_with_trace(ids)[0].double()
        finally:
            for hook in hooks:
                hook.remove()
        return float((traced - fast).abs().max() / fast.abs().max())


@pytest.mark.parametrize("name", sorted(BF16_OUT_OF_REACH))
def test_out_of_reach_effects_are_as_listed_and_below_bfloat16s_resolution(name):
    """Each listed size is the mutant's measured effect (within a factor of 2), and of the order
    of bfloat16's rounding: below half its eps for a leak that must survive additions in bfloat16
    (causal compares exactly), within 2x the tolerance the bfloat16 audit used for the oracle
    (4x the rounding floor it measured on the same weights)."""
    check, listed = BF16_OUT_OF_REACH[name]
    effect = _effect(name)
    assert listed / 2 <= effect <= listed * 2, (name, effect)
    if check == "causal":
        assert effect < tolerances.eps(torch.bfloat16) / 2
    else:
        case = next(c for c in zoo.MUTANTS if c.name == name)
        narrow = da.audit(cast(case.build(), torch.bfloat16), checks=[check], **case.kwargs)
        assert effect < 2 * narrow[check].tolerance, (effect, narrow[check].tolerance)


# ---- the generation zoo in bfloat16 ------------------------------------------------------------

# Missed in bfloat16, with the size of the effect (relative to the logit scale) and why: none.
# sliding_window_off_by_one_in_cache (3.3e-2, 4 eps) was missed while kv_cache took the fixed
# dtype tolerance (8 eps, 6.3e-2); kv_cache and padding now take Subject.shape_tolerance(), 4x
# the measured rounding floor of the weights (1.8e-2 there; the correct cached path is at 5e-3).
BF16_GENERATION_MISSED: dict[str, str] = {}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="BF16_GENERATION_MISSED"))
    if c.name in BF16_GENERATION_MISSED else c for c in zg.MUTANTS], ids=lambda case: case.name)
def test_generation_mutant_is_caught_in_bfloat16(case):
    """The generation family's mutants (weights of order 1) are caught in bfloat16 by their
    check, except those listed above (strict: one that starts being caught fails here, to be
    taken off the list)."""
    report = da.audit(cast(case.build(), torch.bfloat16), checks=zg.GENERATION_CHECKS,
                      **case.kwargs)
    assert not report[case.expect].passed, report[case.expect].detail
    assert "exception" not in report[case.expect].evidence, report[case.expect].detail
    assert case.says in report[case.expect].detail, report[case.expect].detail


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
    # (and train_mode, which runs the same exact cuts in train mode)
    assert report.dtype == "float64"
    assert [c.name for c in report.failures] == ["causal", "train_mode"]


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


def test_an_overflowing_float16_model_is_reported_as_non_finite_not_as_a_leak():
    """Scores past float16's 65504 give inf, then NaN: the checks that compare logits say the
    logits are not finite (what happened), instead of a leak, a batch mix or nondeterminism
    that a NaN differing from itself would otherwise look like."""
    import zoo_styles

    model = zoo_styles.NanoGPT().half()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(3000.0)
    report = da.audit(model, vocab_size=zoo_styles.V, max_seq_len=zoo_styles.T)
    for name in ("determinism", "batch_independence", "causal", "prefix", "loss_alignment"):
        assert report[name].evidence["exception"] == "NonFiniteLogits", name
    assert "NaN" in report["causal"].detail and "65504" in report["causal"].detail
    assert report["grad_causal"].evidence["non_finite_positions"]
    assert not report["tying_grad"].passed
