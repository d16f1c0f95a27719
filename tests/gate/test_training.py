"""The training-path checks (gate/checks/training.py, and causal's training-shape probe): a correct
model with dropout passes every one; each leak that lives on one path is caught by that path's
check and only there (the eval-mode checks pass it, as they did before these checks existed)."""

from __future__ import annotations

import pytest
import torch
from zoo_training import DEFECTS, OwnLossLM, PathLM, T, V

import decoder_audit as da

FACTS = {"vocab_size": V, "max_seq_len": T, "intervention_len": 16}
# Where each defect lives: the check that must catch it, and the training path that reaches it.
CAUGHT_BY = {
    "causal_only_in_eval": ("train_mode", None),
    "mask_only_in_eval": ("train_mode", None),
    "dropout_never_applied": ("train_mode", None),
    "leak_under_autocast": ("autocast", da.TrainingPath(8, T, "bf16")),
    "leak_at_batch_16": ("causal", da.TrainingPath(64, T)),
    "checkpointing_forgets_mask": ("checkpointing", da.TrainingPath(8, T, checkpointing=True)),
    "checkpointing_reentrant": ("checkpointing", da.TrainingPath(8, T, checkpointing=True)),
}
EVAL_PATH = ["causal", "batch_independence", "prefix", "determinism"]


def test_a_correct_model_with_dropout_passes_every_training_path():
    report = da.audit(PathLM(), training=da.TrainingPath(64, T, "bf16", checkpointing=True),
                      **FACTS)
    assert report.passed, report.first_failure
    assert report["train_mode"].evidence["dropout"]  # dropout is on, its masks held per call
    assert report["causal"].evidence["training_shape"]["batch"] == 64


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_training_path_leak_is_caught_by_its_own_check(defect):
    check, path = CAUGHT_BY[defect]
    report = da.audit(PathLM(defect), training=path, **FACTS)
    assert not report[check].passed, report[check].detail
    assert "training" in report[check].paths
    plain = da.audit(PathLM(defect), checks=EVAL_PATH, **FACTS)  # the eval-mode audit
    assert plain.passed, (defect, plain.first_failure)


def test_our_decoder_passes_checkpointing_and_gets_its_switch_back():
    model = da.Decoder(da.preset("llama-debug"))
    report = da.audit(model, checks=["checkpointing"],
                      training=da.TrainingPath(2, 16, checkpointing=True))
    assert report["checkpointing"].passed, report["checkpointing"].detail
    assert report["checkpointing"].evidence["grad_max_abs_diff"] == 0.0  # recomputed bitwise
    assert not model.gradient_checkpointing


def test_train_mode_gives_the_users_flags_back():
    model = PathLM()
    model.train()
    model.drop.eval()  # a mixed state the gate must restore exactly
    da.audit(model, checks=["train_mode"], **FACTS)
    assert model.training and not model.drop.training


def test_autocast_is_skipped_unless_training_runs_under_it():
    report = da.audit(PathLM("leak_under_autocast"), checks=["autocast"], **FACTS)
    assert report["autocast"].skipped and "bf16" in report["autocast"].evidence["reason"]


def test_the_training_shape_is_bounded_by_the_probes():
    with pytest.raises(da.ConfigError, match="batch_size=0"):
        da.TrainingPath(0, 4)
    with pytest.raises(da.ConfigError, match="precision='fp8'"):
        da.TrainingPath(8, 4, "fp8")
    assert da.TrainingPath(8, 4, "fp16").precision == "fp16"  # float16 autocast is a path


def test_float16_autocast_is_audited_where_training_runs_under_it():
    """A leak only under autocast, on the fp16 path: the autocast check runs float16 there."""
    report = da.audit(PathLM("leak_under_autocast"), checks=["autocast"],
                      training=da.TrainingPath(8, T, "fp16"), **FACTS)
    assert not report["autocast"].passed
    assert "float16" in report["autocast"].evidence["autocast"]
    correct = da.audit(PathLM(), checks=["autocast"], training=da.TrainingPath(8, T, "fp16"),
                       **FACTS)
    assert correct.passed, correct.first_failure


def test_the_rng_and_the_user_streams_are_untouched():
    model = PathLM()  # its construction seeds the RNG itself
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    da.audit(model, checks=["train_mode"], **FACTS)
    assert torch.equal(torch.rand(3), expected)


def test_a_correct_own_loss_passes_model_loss_with_accumulation():
    report = da.audit(OwnLossLM(), checks=["model_loss"], **FACTS)
    check = report["model_loss"]
    assert check.passed, check.detail
    assert check.evidence["micro_batch_sum"] == pytest.approx(check.evidence["loss"], rel=1e-5)


@pytest.mark.parametrize("defect, says", [("shifted_twice", "shifted twice"),
                                          ("reads_ignored", "ignored (-100)"),
                                          ("own_count", "num_items_in_batch")])
def test_each_own_loss_bug_fails_model_loss_only(defect, says):
    report = da.audit(OwnLossLM(defect), **FACTS)
    assert [c.name for c in report.failures] == ["model_loss"], report.first_failure
    assert says in report["model_loss"].detail


def test_a_model_without_labels_is_skipped_for_model_loss():
    report = da.audit(da.Decoder(da.preset("tiny-368")), checks=["model_loss"])
    assert report["model_loss"].skipped


def test_checkpointing_already_on_in_the_model_is_audited_without_a_declaration():
    """gradient_checkpointing_enable() called on the model: the plain call audits that path (a
    checkpointed recomputation without the causal mask fails), and leaves it on."""
    broken = PathLM("checkpointing_forgets_mask")
    assert da.audit(broken, **FACTS)["checkpointing"].skipped  # off: not a path it takes
    broken.gradient_checkpointing_enable()
    report = da.audit(broken, **FACTS)
    # train mode now takes the checkpointed path too, and it leaks there as well
    assert [c.name for c in report.failures] == ["train_mode", "checkpointing"], \
        report.first_failure
    assert report.facts.checkpointing_enabled and broken.gradient_checkpointing
    correct = PathLM()
    correct.gradient_checkpointing_enable()
    check = da.audit(correct, checks=["checkpointing"], **FACTS)["checkpointing"]
    assert check.passed and not check.skipped, check.detail


def test_hugging_face_checkpointing_enabled_is_read_from_the_model():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)).eval()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    check = da.audit(model, checks=["checkpointing"])["checkpointing"]
    assert check.passed and not check.skipped, check.detail
    assert model.is_gradient_checkpointing


def test_the_gate_asks_a_hugging_face_model_about_checkpointing_without_a_deprecated_name():
    """Issue 44: every Hugging Face audit printed transformers' FutureWarning about
    `is_gradient_checkpointing`, from the gate's own read of it (and the checkpointing check's
    switches warned too): the names the release does not deprecate are used."""
    import warnings

    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        facts = da.gate.model_facts(model)
        check = da.audit(model, checks=["checkpointing"],
                         training=da.TrainingPath(2, 16, checkpointing=True))["checkpointing"]
    assert not facts.checkpointing_enabled
    assert check.passed and not check.skipped, check.detail
    deprecated = [str(w.message) for w in caught
                  if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]
    assert deprecated == []
def test_checkpointing_is_judged_with_the_weights_the_run_freezes():
    """Reentrant checkpointing behind a stem the run freezes with the embedding: the layer's
    input needs no gradient, so its weights never get one (the run trains nothing there). With
    every weight trainable, the stem carries the gradient through and nothing is lost; the
    check runs with the run's own frozen weights (requires_grad as found), and fails there."""
    def stemmed() -> PathLM:
        model = PathLM("checkpointing_reentrant", dropout=0.0)
        torch.manual_seed(1)
        model.embed = torch.nn.Sequential(torch.nn.Embedding(V, 16), torch.nn.Linear(16, 16))
        return model

    path = da.TrainingPath(2, T, checkpointing=True)
    assert da.audit(stemmed(), checks=["checkpointing"], training=path, **FACTS).passed
    frozen = stemmed()
    frozen.embed.requires_grad_(False)
    check = da.audit(frozen, checks=["checkpointing"], training=path, **FACTS)["checkpointing"]
    assert not check.passed and check.evidence["frozen_by_the_run"] == 3  # E, W, b
    assert check.evidence["grad_max_abs_diff"] == float("inf")  # a gradient lost, not moved
    assert check.evidence["worst_grad"].startswith(("qkv", "proj"))
    assert not any(p.requires_grad for p in frozen.embed.parameters())  # as the run froze them
