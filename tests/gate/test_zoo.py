"""Proof that the gate works: every mutant of the zoo fails with the right check named, and the
correct models (our presets, odd configs, a plain torch decoder, Hugging Face GPT-2 and Llama
from small random configs) pass."""

from __future__ import annotations

import configs
import pytest
import torch
import zoo
from torch import nn

import decoder_audit as da
from decoder_audit.gate import CHECK_ORDER

# Checks whose defects are planted outside this zoo, and where: their defect is not a model.
PLANTED_ELSEWHERE = {
    "loss_alignment": "gate/test_checks.py: the objective's shift and flattening broken",
    "kv_cache": "zoo_generation.py", "padding": "zoo_generation.py",
    "grad_causal": "zoo_generation.py", "window": "zoo_windows.py",
    "train_mode": "zoo_training.py", "checkpointing": "zoo_training.py",
    "autocast": "zoo_training.py", "packing": "zoo_training.py, zoo_packing.py",
    "model_loss": "zoo_training.py, zoo_losses.py",
    "routing_independence": "zoo_experts.py", "expert_gradients": "zoo_experts.py",
    "router_aux_loss": "gate/test_router_aux_loss.py: router logits returned other than the "
                       "router computed or softmaxed, the aux loss left out, added with another "
                       "coefficient, detached, or off its formula (Mixtral, Qwen2-MoE, OLMoE)",
}
# train_mode reruns the causal cuts and batch independence in train mode: a model that leaks in
# eval mode leaks there too, so an "only" mutant of those checks fails train_mode beside them.
ALSO_IN_TRAIN_MODE = {"causal", "batch_independence"}
# Skipped on a plain audit of our models: they run on the training path train declares (packing
# under --pack, checkpointing under --checkpointing, autocast under --precision bf16), and
# model_loss on a model that takes labels=.
TRAINING_ONLY = ["packing", "checkpointing", "autocast", "model_loss", "router_aux_loss"]


def test_every_check_of_the_registry_has_a_mutant_it_must_catch():
    """A check added to the registry without a planted defect fails here: the gate's principle
    is that every check is tested against a model with its defect."""
    assert len({case.name for case in zoo.MUTANTS}) == len(zoo.MUTANTS)
    expected = {case.expect for case in zoo.MUTANTS}
    assert expected <= set(CHECK_ORDER), expected - set(CHECK_ORDER)
    uncovered = [name for name in CHECK_ORDER
                 if name not in expected and name not in PLANTED_ELSEWHERE]
    assert uncovered == [], f"checks without a mutant in tests/zoo.py: {uncovered}"


@pytest.mark.parametrize("case", zoo.MUTANTS, ids=lambda case: case.name)
def test_mutant_is_caught_by_the_right_check(case):
    report = da.audit(case.build(), **case.kwargs)
    assert not report.passed
    failing = [c.name for c in report.failures]
    assert case.expect in failing, f"{case.name}: expected {case.expect} to fail, got {failing}"
    if case.first:
        assert report.first_failure.name == case.expect, (
            f"{case.name}: first failure {report.first_failure.name}: {report.first_failure.detail}")
    if case.only:  # every other check ran and passed: only the named check can see this defect
        allowed = {case.expect, "train_mode"} if case.expect in ALSO_IN_TRAIN_MODE else set()
        assert set(failing) <= allowed | {case.expect} and failing[0] == case.expect, {
            c.name: c.detail for c in report.failures}
    # caught by the check's own verdict, not by the check crashing on the mutant, and for this
    # defect, not for another reason the same check can fail for
    assert "exception" not in report[case.expect].evidence, report[case.expect].detail
    assert case.says in report[case.expect].detail, report[case.expect].detail


def _case(name: str) -> zoo.Case:
    return next(case for case in zoo.MUTANTS if case.name == name)


@pytest.mark.parametrize("name, moved", [
    ("batch_rows_mixed", {"other rows changed", "row run alone (B=1)"}),
    ("batch_rows_read_row_0", {"batch order reversed"}),
    ("scaled_by_batch_size", {"row run alone (B=1)"}),
])
def test_each_batch_independence_variant_catches_a_defect_the_others_miss(name, moved):
    """Other rows changed, reversed, or dropped: each variant is the only one to see one mutant
    (a batch mean is invariant under reordering; a row that reads row 0 is unchanged when only
    the other rows change; a division by B keeps B under both)."""
    check = da.audit(_case(name).build(), checks=["batch_independence"],
                     **_case(name).kwargs)["batch_independence"]
    assert not check.passed
    failed = {v["variant"] for v in check.evidence["variants"]
              if not v["max_abs_diff"] <= v["allowed"]}
    assert failed == moved, check.evidence["variants"]


@pytest.mark.parametrize("name, part", [
    ("position_table_detached", "gradient of position_embeddings.weight"),
    ("traced_path_differs_from_fast", "the eager (traced) path differs from the fast path"),
    ("gqa_tiled_not_interleaved", "fast logits differ from the slow oracle"),
])
def test_each_part_of_the_oracle_check_catches_its_own_mutant(name, part):
    """Values, traced-vs-fast and gradients: a detached position table has the right logits on
    both paths; a traced path with another score scale has the right fast logits."""
    check = da.audit(_case(name).build(), checks=["oracle"])["oracle"]
    assert not check.passed and part in check.detail, check.detail
    if name == "position_table_detached":
        assert check.evidence["max_abs_logit_error"] <= check.evidence["allowed"]
        assert check.evidence["eager_vs_fast_max_abs"] <= check.evidence["allowed"]
    if name == "traced_path_differs_from_fast":
        assert check.evidence["max_abs_logit_error"] <= check.evidence["allowed"]


def test_a_pattern_with_mass_on_the_next_key_is_seen_only_in_the_pattern():
    """The output drops the leaked mass, so the logits equal the correct model's (the oracle
    and causal agree); the pattern itself has probability on key t + 1."""
    report = da.audit(_case("pattern_mass_on_next_key_unused").build())
    check = report["attention_rows"]
    assert [c.name for c in report.failures] == ["attention_rows"]
    assert "on a future key" in check.detail and "key 1)" in check.detail, check.detail
    # float32 against the float64 oracle: a few eps of rounding, far below any dropped mass
    assert report["oracle"].evidence["max_abs_logit_error"] <= 1e-6


def _passes(model, **kwargs):
    report = da.audit(model, **kwargs)
    failures = {c.name: c.detail for c in report.failures}
    assert report.passed, failures
    return report


@pytest.mark.parametrize("name", ["tiny-368", "cs336-test", "llama-debug"])
def test_presets_pass(name):
    report = _passes(zoo.decoder(da.preset(name)))
    assert report.mode == "white-box" and report.dtype == "float32"  # the model's own dtype
    # no preset here declares a sliding window or routes experts
    expected_skips = (["routing_independence", "window"]
                      + ([] if da.preset(name).tie_embeddings else ["tying_grad"])
                      + ["expert_gradients"] + TRAINING_ONLY)
    assert [c.name for c in report.skipped] == expected_skips


@pytest.mark.parametrize("cfg", configs.params(
    configs.entries("gqa-small", "ln-gelutanh-biases-tied", "mqa-nopos-tied", "long-context-40",
                    "rope-half-gqa", "qk-norm-gqa", "qkv-bias-only", "wide-heads",
                    "ln-nobias-tied", "gemma-like", "neox-like", "rope-llama3",
                    "rope-linear-gqa", "rope-yarn-partial", "gemma2-like",
                    "window-every-layer", "olmo-like", "olmo2-like", "gemma3-like",
                    "readout-bias-tied", "granite-like", "parallel-one-norm", "nope-layer",
                    "opt-like", "mla-latent-eps",
                    "xielu-like")
    + configs.entries("alibi-embedding-norm", "alibi-no-shift", "sinusoidal-offset",
                      "post-norm-no-final", "qk-layernorm")  # helper fam-positions
    + configs.entries("sinks-windowed", "gpt-oss-like", "qk-norm-after-rope",
                      "query-position-scale", "cohere2-moe-like")  # helper fam-sinks
    + configs.grid()))
def test_odd_configs_pass(cfg):
    _passes(zoo.decoder(cfg, seed=3))


def test_dynamic_rope_past_its_original_length_is_seen_to_depend_on_the_length():
    """Dynamic NTK scaling grows RoPE's base with the sequence once it passes
    original_max_seq_len, so every row's logits depend on the total length: a one-token step
    of cached decoding (rotated at the shorter length) differs from the full forward. The gate
    says so; within the original length the same model is inert and passes."""
    cfg = configs.named("rope-dynamic")  # original length 4, max_seq_len 8
    report = da.audit(zoo.decoder(cfg, seed=3))
    assert not report["kv_cache"].passed
    assert report["kv_cache"].evidence  # the positions that differ, by how much
    inert = cfg.replace(rope_scaling={**cfg.rope_scaling, "original_max_seq_len": 8})
    _passes(zoo.decoder(inert, seed=3))


def test_hand_written_attention_passes_so_each_mutant_differs_by_its_defect_only():
    _passes(zoo.with_attention(zoo.HandAttention))
    _passes(zoo.with_attention(zoo.HandAttention, zoo.GQA))


def test_plain_torch_decoder_passes_black_box():
    torch.manual_seed(0)
    report = _passes(zoo.TorchDecoder(), **zoo.TORCH_BLACKBOX)
    assert report.mode == "black-box"
    # it takes no attention mask and keeps no cache: those checks say so instead of failing;
    # its readout is found and untied (a fact), so tying runs and tying_grad has nothing to sum
    assert {c.name for c in report.skipped} == {"attention_rows", "window", "params",
                                               "tying_grad", "oracle", "kv_cache", "padding",
                                               "routing_independence", "expert_gradients",
                                               *TRAINING_ONLY}
    assert report["tying"].evidence["structure"] == "separate"


def _transformers():
    """Hugging Face, imported per test: without it only these tests skip, never the zoo."""
    return pytest.importorskip("transformers")


def _gpt2():
    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=37, n_positions=12, n_embd=16, n_layer=2,
                                     n_head=2, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config)


def _llama():
    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=12,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config)


def test_hugging_face_gpt2_passes_black_box_with_its_attention_patterns():
    report = _passes(_gpt2(), vocab_size=37, max_seq_len=12)
    assert not report["attention_rows"].skipped  # read through output_attentions
    assert report["overlength"].evidence["error"] == "IndexError"  # position table lookup


def test_hugging_face_llama_passes_without_a_length_limit():
    report = _passes(_llama(), vocab_size=37)
    assert report["overlength"].skipped  # listed, not silently passed


def test_hugging_face_llama_does_not_reject_overlength_input():
    # RoPE models raise nothing past their trained length (DEFECTS.md D17): the gate says so.
    report = da.audit(_llama(), vocab_size=37, max_seq_len=12)
    assert [c.name for c in report.failures] == ["overlength"]
    assert report["overlength"].evidence["output_shape"] == [1, 13, 37]


# GPT-2 rejects T > 12 (its position table); Llama accepts any T, so it is given no limit.
HF_FACTS = {"gpt2": dict(vocab_size=37, max_seq_len=12), "llama": dict(vocab_size=37)}


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_hugging_face_models_match_the_oracle_fed_their_weights(build):
    from helpers import randomise

    facts = HF_FACTS["gpt2" if build is _gpt2 else "llama"]
    report = _passes(randomise(build(), seed=2, std=0.3), **facts)
    # Its config is its spec: the oracle reads its own weights where they lie, and the ledger runs
    layout = "nanoGPT / GPT-2" if build is _gpt2 else "Hugging Face Llama"
    assert report["oracle"].evidence["layout"] == layout
    assert report["oracle"].evidence["gradients"]["compared"] > 0
    assert report["params"].passed and not report["params"].evidence["leftover"]


@pytest.mark.parametrize("build, swap", [
    (_gpt2, lambda m: setattr(m.transformer.h[1].mlp, "act", nn.ReLU())),
    (_llama, lambda m: setattr(m.model.layers[0].mlp, "act_fn", nn.GELU())),
], ids=["gpt2-relu-instead-of-gelu", "llama-gelu-instead-of-silu"])
def test_a_hugging_face_model_whose_forward_breaks_its_config_fails_the_oracle(build, swap):
    """Same weights, same config, a different activation inside the forward: every invariance
    still holds, so only the reference comparison can see it."""
    model = build()
    swap(model)
    report = da.audit(model, **HF_FACTS["gpt2" if build is _gpt2 else "llama"])
    assert [c.name for c in report.failures] == ["oracle"]


@pytest.mark.parametrize("case", zoo.VARIANT_MUTANTS, ids=lambda case: case.name)
def test_each_variant_the_module_ignores_fails_its_check(case):
    report = da.audit(case.build(), **case.kwargs)
    check = report[case.expect]
    assert not check.passed and case.says in check.detail, check.detail
