"""audit_batch on batches a collator gets wrong in form (issue 35): each gets a failing verdict
whose first failure is the check that names the problem, with its facts (the value, the shape,
the id), never a raw exception or a pass; and the correct batches beside them pass. The batches
are written here by hand from the issue's description of each case."""

from __future__ import annotations

import pytest
import torch

import decoder_audit as da

NAN = float("nan")
PADDED = [[5, 6, 7, 9, 9], [1, 2, 3, 4, 8]]  # row 0 right-padded with id 9 twice
MASK = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def _first(batch, **options):
    report = da.audit_batch(batch, **options)
    assert not report.passed
    return report.first_failure, report


# (case, batch, the check that must fail first, facts its detail must hold)
BROKEN = [
    ("empty", {"input_ids": [], "labels": []}, "tensors", ["(0,)"]),
    ("no tokens", {"input_ids": [[]], "labels": [[]]}, "tensors", ["(1, 0)"]),
    ("ragged", {"input_ids": [[1, 2, 3], [4, 5]], "labels": [[1, 2, 3], [4, 5]]}, "tensors",
     ["[3, 2]"]),
    ("NaN ids", {"input_ids": torch.tensor([[1.0, NAN, 3.0]]), "labels": [[1, 2, 3]]},
     "tensors", ["input_ids", "NaN"]),
    ("float labels", {"input_ids": [[1, 2, 3]], "labels": torch.tensor([[1.9, 2.0, 3.0]])},
     "tensors", ["labels", "1.9", "(0, 0)"]),
    ("mask of 2s", {"input_ids": [[1, 2]], "labels": [[1, 2]], "attention_mask": [[1, 2]]},
     "tensors", ["attention_mask", "2"]),
    ("mask of another shape", {"input_ids": [[1, 2]], "labels": [[1, 2]],
                               "attention_mask": [[1, 1, 1]]}, "tensors", ["(1, 3)", "(1, 2)"]),
    ("every label ignored", {"input_ids": [[1, 2, 3], [4, 5, 6]], "labels": [[-100] * 3] * 2},
     "rows_read", ["-100", "6"]),
    ("pad 9, no mask, pads read", {"input_ids": PADDED, "labels": PADDED}, "pads_ignored",
     ["9", "[0]"]),
    ("-1 as the ignore value", {"input_ids": PADDED, "attention_mask": MASK,
                                "labels": [[-1, 6, 7, -1, -1], [-1, 2, 3, 4, 8]]},
     "values", ["-1", "-100"]),
]


@pytest.mark.parametrize("case, batch, check, facts", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_malformed_batch_fails_at_the_check_that_names_it(case, batch, check, facts):
    first, report = _first(batch)
    assert first.name == check, (case, first)
    for fact in facts:
        assert fact in first.detail, (fact, first.detail)
    if check == "tensors":  # the rest would read what the batch does not hold
        assert all(c.skipped for c in report.checks[1:])


def test_every_check_of_the_module_is_in_the_report_in_order():
    report = da.audit_batch({"input_ids": [[1, 2]], "labels": [[1, 2]]})
    assert [c.name for c in report.checks] == ["tensors", "values", "rows_read", "shift",
                                               "pads_ignored", "last_token", "bos", "packed"]


def test_all_ignored_labels_skip_the_shift_check_rather_than_fail_it():
    _, report = _first({"input_ids": [[1, 2, 3]], "labels": [[-100] * 3]})
    assert report["shift"].skipped


def test_a_declared_pad_without_a_mask_is_found_by_its_id():
    """With the tokenizer's pad id (or pad_id=), trailing pads are padding even with one row."""
    batch = {"input_ids": [[5, 6, 7, 9]], "labels": [[5, 6, 7, 9]]}
    assert da.audit_batch(batch).passed  # one row, one trailing id: nothing says it is a pad

    class Tok:
        pad_token_id = 9

    for options in ({"tokenizer": Tok()}, {"pad_id": 9}):
        first, report = _first(batch, **options)
        assert first.name == "pads_ignored"
        assert report["pads_ignored"].evidence["padded_labels_read"] == [[0, 3]]
    batch["labels"] = [[5, 6, 7, -100]]
    assert da.audit_batch(batch, pad_id=9).passed


def test_pad_equal_to_eos_without_a_mask_keeps_the_real_end_token():
    """pad = eos = 2: the first 2 of a trailing run is the text's end, the rest pads."""
    class Tok:
        pad_token_id = eos_token_id = 2

    ids = [[5, 6, 2, 2, 2], [5, 6, 7, 8, 2]]
    good = [[5, 6, 2, -100, -100], [5, 6, 7, 8, 2]]
    assert da.audit_batch({"input_ids": ids, "labels": good}, Tok()).passed
    bad = [[5, 6, 2, 2, -100], [5, 6, 7, 8, 2]]
    first, report = _first({"input_ids": ids, "labels": bad}, tokenizer=Tok())
    assert first.name == "pads_ignored"
    assert report["pads_ignored"].evidence["padded_labels_read"] == [[0, 3]]


def test_ignore_value_declared_as_minus_one_passes():
    batch = {"input_ids": PADDED, "attention_mask": MASK,
             "labels": [[-1, 6, 7, -1, -1], [-1, 2, 3, 4, 8]]}
    assert da.audit_batch(batch, ignore_index=-1).passed


def test_ids_beyond_the_tokenizer_fail_values():
    class Tok:
        def __len__(self):
            return 8

    first, _ = _first({"input_ids": [[1, 2, 8]], "labels": [[1, 2, 8]]}, tokenizer=Tok())
    assert first.name == "values" and "8" in first.detail


CORRECT = [
    ("right-padded with a mask", {"input_ids": PADDED, "attention_mask": MASK,
                                  "labels": [[5, 6, 7, -100, -100], [1, 2, 3, 4, 8]]}),
    ("right-padded, no mask, pads ignored", {"input_ids": PADDED,
                                            "labels": [[5, 6, 7, -100, -100], [1, 2, 3, 4, 8]]}),
    ("rows that all end in one id", {"input_ids": [[5, 6, 2], [7, 8, 2]],
                                     "labels": [[5, 6, 2], [7, 8, 2]]}),
    ("a repeat at the end of one row that stands elsewhere too",
     {"input_ids": [[9, 6, 9, 9], [7, 8, 3, 4]], "labels": [[9, 6, 9, 9], [7, 8, 3, 4]]}),
    ("bool mask, int32 ids", {"input_ids": torch.tensor(PADDED, dtype=torch.int32),
                              "attention_mask": torch.tensor(MASK, dtype=torch.bool),
                              "labels": [[5, 6, 7, -100, -100], [1, 2, 3, 4, 8]]}),
]


@pytest.mark.parametrize("case, batch", CORRECT, ids=[c[0] for c in CORRECT])
def test_correct_batches_pass(case, batch):
    report = da.audit_batch(batch)
    assert report.passed, (case, report.first_failure)


def test_chunked_random_text_without_a_mask_passes():
    """Pretraining chunks: no padding, no mask; no id is taken for a pad."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        ids = torch.randint(0, 50, (8, 32), generator=gen)
        assert da.audit_batch({"input_ids": ids, "labels": ids.clone()}).passed


def test_labels_shifted_by_the_collator_keep_the_label_that_targets_the_last_token():
    """Shifted labels: label t targets input t + 1, so the last real input has no label of its
    own (not a loss mask off by one), and the label at t - 1 is the one that must be read."""
    ids = [[5, 6, 7, 0, 0], [1, 2, 3, 4, 8]]
    mask = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    shifted = [[6, 7, -100, -100, -100], [2, 3, 4, 8, -100]]
    report = da.audit_batch({"input_ids": ids, "attention_mask": mask, "labels": shifted},
                            labels_shifted=True)
    assert report.passed, report.first_failure
    dropped = [[6, -100, -100, -100, -100], [2, 3, 4, 8, -100]]  # 7 is never a target
    first, _ = _first({"input_ids": ids, "attention_mask": mask, "labels": dropped},
                      labels_shifted=True)
    assert first.name == "last_token" and first.evidence["last_real_label_ignored"] == [[0, 2]]


def test_checks_with_nothing_to_read_are_skipped_not_passed():
    report = da.audit_batch({"input_ids": [[1, 2]], "labels": [[1, 2]]})
    assert report["bos"].skipped and report["packed"].skipped
    assert not da.audit_batch({"input_ids": [[1, 1, 2]], "labels": [[1, 1, 2]]},
                              bos_id=1)["bos"].passed
