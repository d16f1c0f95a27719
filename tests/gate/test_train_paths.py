"""Train mode told apart from its noise, and the training shape probed in train mode
(gate/checks/training.py): a model whose identical train-mode calls differ (it reseeds its own dropout,
as Reformer does) is reported as nondeterministic and never called a leak; one that also leaks
in train mode is still caught; a leak that lives only in train mode at the training batch size
is caught by `causal`'s training-shape probe; packing is probed at the training batch size."""

from __future__ import annotations

import torch
from zoo_training import PathLM, ReseedingLM, T, V

import decoder_audit as da

FACTS = {"vocab_size": V, "max_seq_len": T, "intervention_len": 16}
EVAL_PATH = ["causal", "batch_independence", "prefix", "determinism"]


def test_a_model_that_reseeds_its_dropout_is_nondeterministic_not_a_leak():
    check = da.audit(ReseedingLM(), checks=["train_mode"], **FACTS)["train_mode"]
    assert check.passed, check.detail
    found = check.evidence["nondeterministic"]
    assert found["reseeds"] and found["max_abs_diff"] > 0
    assert found["checked"] == "with its 1 dropout modules off"  # then judged exactly
    assert check.evidence["leaks"] == []


def test_a_reseeding_model_that_also_leaks_in_train_mode_is_still_caught():
    model = ReseedingLM(leak=True)
    check = da.audit(model, checks=["train_mode"], **FACTS)["train_mode"]
    assert not check.passed and check.evidence["leaks"], check.detail
    assert check.evidence["nondeterministic"]["reseeds"]
    assert da.audit(ReseedingLM(leak=True), checks=EVAL_PATH, **FACTS).passed  # train mode only


def test_a_reseeding_model_with_functional_dropout_is_judged_beyond_its_spread_and_says_so():
    """No dropout module to switch off: only a movement beyond 4x the spread of identical calls
    would be a leak, and the verdict and the notes say that smaller ones were out of reach."""
    report = da.audit(ReseedingLM(functional=True), checks=["train_mode"], **FACTS)
    check = report["train_mode"]
    assert check.passed, check.detail
    found = check.evidence["nondeterministic"]
    assert found["checked"] == "beyond the spread of identical calls"
    assert found["spread_checked"] > 0
    assert check.evidence["index_noise"] >= found["spread_checked"]  # the floor the cuts met
    assert "out of reach" in check.detail and any("out of reach" in n for n in report.notes)


def test_a_model_with_steady_dropout_is_not_called_nondeterministic():
    check = da.audit(PathLM(), checks=["train_mode"], **FACTS)["train_mode"]
    assert check.passed and "nondeterministic" not in check.evidence


def test_a_leak_only_in_train_mode_at_the_training_batch_size_is_caught_by_train_mode():
    """It passed the whole gate (eval mode at every shape, train mode at the gate's own shapes)
    and trained; the training-shape probe now runs in train mode too."""
    from zoo_training import LeaksTrainingAt16

    report = da.audit(LeaksTrainingAt16(), training=da.TrainingPath(64, T), **FACTS)
    assert [c.name for c in report.failures] == ["train_mode"], report.first_failure
    check = report["train_mode"]
    assert "B=64" in check.detail and check.evidence["training_shape"]["leaks"]
    correct = da.audit(PathLM(), checks=["train_mode"], training=da.TrainingPath(64, T), **FACTS)
    assert correct.passed and correct["train_mode"].evidence["training_shape"]["passed"]


def _calls_at(model: torch.nn.Module, shape: tuple[int, int]) -> list[bool]:
    """A forward hook's record of the model's calls at `shape`: True for each in train mode."""
    seen: list[bool] = []
    model.register_forward_hook(
        lambda m, args, out: seen.append(m.training) if tuple(args[0].shape) == shape else None)
    return seen


def test_train_mode_carries_the_eval_probe_of_the_training_shape_when_its_logits_are_equal():
    """No dropout: train mode's logits at the training shape are eval mode's bit for bit, so
    `causal`'s eval-mode probe of that shape (two calls) is train mode's too, after one
    train-mode call. The train-only leak at that shape is still caught, the probe run in full."""
    from zoo_training import LeaksTrainingAt16

    path = da.TrainingPath(64, T)
    model = PathLM(dropout=0.0)
    calls = _calls_at(model, (64, T))
    check = da.audit(model, training=path, **FACTS)["train_mode"]
    assert check.passed and check.evidence["training_shape"]["as_in_eval_mode"], check.detail
    assert calls == [False, False, True]  # causal's copies and intervention, then train mode's
    alone = PathLM(dropout=0.0)
    calls = _calls_at(alone, (64, T))
    check = da.audit(alone, checks=["train_mode"], training=path, **FACTS)["train_mode"]
    assert check.passed and "as_in_eval_mode" not in check.evidence["training_shape"]
    assert calls == [False, True, True]  # no eval probe to carry: its noise floor, then the probe
    dropping = PathLM()  # dropout 0.1: the probe runs in train mode, on causal's noise floor
    calls = _calls_at(dropping, (64, T))
    check = da.audit(dropping, training=path, **FACTS)["train_mode"]
    assert check.passed and "as_in_eval_mode" not in check.evidence["training_shape"]
    assert calls == [False, False, True, True]

    report = da.audit(LeaksTrainingAt16(dropout=0.0), training=path, **FACTS)
    assert [c.name for c in report.failures] == ["train_mode"], report.first_failure
    shape = report["train_mode"].evidence["training_shape"]
    assert shape["leaks"] and "as_in_eval_mode" not in shape


def test_packing_is_probed_at_the_training_batch_size():
    from zoo_training import DropsDocumentsAt16

    path = da.TrainingPath(32, 16, pack=True)
    torch.manual_seed(0)
    report = da.audit(DropsDocumentsAt16(da.preset("llama-debug")), training=path)
    assert [c.name for c in report.failures] == ["packing"], report.first_failure
    (batched,) = [form["training_batch"] for form in report["packing"].evidence["forms"].values()]
    # every row of the big batch, each document read with the ones before it
    assert batched["batch"] == 32 and batched["rows_differing"] == list(range(32))
    assert "B=32" in report["packing"].detail
    small = da.audit(DropsDocumentsAt16(da.preset("llama-debug")), checks=["packing"],
                     training=da.TrainingPath(4, 16, pack=True))
    assert small.passed  # the 2-row probe alone passed it
    ours = da.audit(da.Decoder(da.preset("llama-debug")), checks=["packing"], training=path)
    (checked,) = [form["training_batch"] for form in ours["packing"].evidence["forms"].values()]
    assert ours.passed and checked["batch"] == 32 and checked["rows_differing"] == []


class RoundsByItsRow(torch.nn.Module):
    """Causal in exact arithmetic, and in float64 to its last digits: in train mode each row's
    hidden states pass through (h + c) - c, with c a row-wide sum of the row's embeddings (as a
    routed experts' loop groups the tokens each expert receives, so which tokens share an
    expert's matmul depends on the later tokens). Identical rows round identically, so their
    floor is 0, while a row whose later tokens changed rounds its earlier positions otherwise:
    float32 rounding, not a dependence. `leak`: c / 1e5 is added for real, a dependence float64
    keeps."""

    def __init__(self, leak: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head, self.leak = torch.nn.Embedding(V, 8), torch.nn.Linear(8, V), leak

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # (B, T, D)
        if self.training:
            c = 1.0 + 4.0 * h.sum(dim=(1, 2), keepdim=True).abs()  # (B, 1, 1): the whole row
            h = (h + c) - c + (c / 1e5 if self.leak else 0.0)
        return self.head(h)


def test_rounding_that_follows_the_rows_later_tokens_is_confirmed_in_float64_not_a_leak():
    """transformers 4.57's gpt-oss failed train_mode so (earlier rows moved by 1.5e-8 against a
    floor of 0): train mode now confirms a rounding-sized movement on the float64 twin, as
    `causal` does in eval mode; a real dependence of that size is still a leak."""
    check = da.audit(RoundsByItsRow(), checks=["train_mode"], **FACTS)["train_mode"]
    assert check.passed, check.detail
    confirmed = check.evidence["float64"]
    assert confirmed["passed"] and confirmed["float32_max_change_earlier"] > 0
    assert confirmed["max_change_earlier"] <= confirmed["allowed"]
    leaking = da.audit(RoundsByItsRow(leak=True), checks=["train_mode"], **FACTS)["train_mode"]
    assert not leaking.passed and leaking.evidence["leaks"], leaking.detail
