"""model_loss through every way targets reach a model's own loss: labels (shifted once inside, or
taken as the targets by a module of its own), shift_labels, num_items_in_batch and the ignore
index, called the way the model's convention takes its ids. Each expected loss below is cross
entropy written out here, not read from the check."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from zoo_losses import AlignedLossLM, IdxLossLM, NoLossLM, ShiftLabelsLM
from zoo_training import T, V

import decoder_audit as da

FACTS = {"vocab_size": V, "max_seq_len": T, "intervention_len": 16}


def _audit(model, **facts):
    return da.audit(model, checks=["model_loss"], **(facts or FACTS))


def test_positional_ids_and_a_tuple_loss_are_called_by_the_convention():
    """forward(idx, labels=None) -> (logits, loss): no input_ids= keyword exists to call."""
    check = _audit(IdxLossLM())["model_loss"]
    assert check.passed and not check.skipped, check.detail
    assert check.evidence["convention"] == "shifted_once"


def test_a_module_taking_its_labels_as_targets_passes_with_that_convention():
    model = AlignedLossLM()
    check = _audit(model)["model_loss"]
    assert check.passed, check.detail
    assert check.evidence["convention"] == "aligned"
    # the loss it was judged against: logit t scores label t, written out here
    ids = torch.randint(0, V, (2, 8))
    with torch.no_grad():
        logits, loss = model(ids, labels=ids)
    assert float(loss) == pytest.approx(float(F.cross_entropy(logits.reshape(-1, V),
                                                              ids.reshape(-1))), rel=1e-6)


def test_shift_labels_are_scored_as_given():
    check = _audit(ShiftLabelsLM())["model_loss"]
    assert check.passed, check.detail
    assert check.evidence["variants"] == ["labels", "shift_labels", "num_items_in_batch"]
    got = check.evidence["shift_labels"]
    assert got["loss"] == pytest.approx(got["expected"], rel=1e-5)


@pytest.mark.parametrize("defect", ["ignores_shift_labels", "shifts_shift_labels",
                                    "scores_ignored"])
def test_each_shift_labels_bug_fails_model_loss_only(defect):
    report = da.audit(ShiftLabelsLM(defect), **FACTS)
    assert [c.name for c in report.failures] == ["model_loss"], report.first_failure
    got = report["model_loss"].evidence["shift_labels"]
    assert got["loss"] != pytest.approx(got["expected"], rel=1e-3)
    # the labels alone are right in each: only shift_labels reveal it
    assert report["model_loss"].evidence["loss"] == pytest.approx(
        report["model_loss"].evidence["shifted_once"], rel=1e-5)


def test_a_forward_with_labels_but_no_loss_is_skipped_with_the_reason():
    check = _audit(NoLossLM())["model_loss"]
    assert check.skipped and "loss" in check.evidence["reason"]


def test_a_model_loss_failure_refuses_only_the_trainers_that_take_it():
    report = da.audit(ShiftLabelsLM("ignores_shift_labels"), **FACTS)
    assert [c.name for c in report.failures_on("model loss")] == ["model_loss"]
    assert report.failures_on("training") == []  # decoder-audit's train computes its own loss


def _tiny_llama(tf):
    torch.manual_seed(0)
    return tf.LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=32)


def test_hugging_face_llama_honours_shift_labels_and_num_items():
    tf = pytest.importorskip("transformers")
    model = tf.LlamaForCausalLM(_tiny_llama(tf)).eval()
    check = _audit(model, vocab_size=37)["model_loss"]
    assert check.passed, check.detail
    assert check.evidence["variants"] == ["labels", "shift_labels", "num_items_in_batch"]


def test_a_hugging_face_loss_that_drops_its_kwargs_fails_on_shift_labels():
    """The forward takes **kwargs but hands none to its loss (transformers#48570's bug): the
    caller's shift_labels and num_items_in_batch are silently dropped."""
    tf = pytest.importorskip("transformers")

    class DropsLossKwargs(tf.LlamaForCausalLM):
        def forward(self, input_ids=None, labels=None, **kwargs):
            out = super().forward(input_ids=input_ids)
            if labels is not None:
                out.loss = self.loss_function(logits=out.logits, labels=labels,
                                              vocab_size=self.config.vocab_size)
            return out

    check = _audit(DropsLossKwargs(_tiny_llama(tf)).eval(), vocab_size=37)["model_loss"]
    assert not check.passed
    got = check.evidence["shift_labels"]
    assert got["loss"] == pytest.approx(check.evidence["shifted_once"], rel=1e-5)


def test_a_loss_from_other_logits_than_the_plain_forward_fails():
    """Given labels=, the forward computes its logits another way (a temperature of 1.1 applied
    on that path alone) and returns them beside a loss that agrees with them: held to the
    logits returned beside it, the loss agreed with itself; held to the plain forward's
    logits (a second call, the one the oracle judges), it does not."""
    tf = pytest.importorskip("transformers")
    model = tf.LlamaForCausalLM(_tiny_llama(tf)).eval()

    def labels_path_tempered(module, args, kwargs, output):
        labels = kwargs.get("labels")
        if labels is not None:
            output.logits = output.logits * 1.1
            output.loss = F.cross_entropy(output.logits[:, :-1].reshape(-1, 37).float(),
                                          labels[:, 1:].reshape(-1), ignore_index=-100)
        return output

    model.register_forward_hook(labels_path_tempered, with_kwargs=True)
    check = _audit(model, vocab_size=37)["model_loss"]
    assert not check.passed
    ids_loss = check.evidence["loss"]
    assert ids_loss != pytest.approx(check.evidence["shifted_once"], rel=1e-4)
