"""audit_batch (gate/batch.py): the batches real collators build pass, and a batch with each of
the label bugs users report fails the check for it (the batches are built here by hand from the
report's description, or by transformers' own collators)."""

from __future__ import annotations

import pytest
import torch
from helpers import trained_bpe

import decoder_audit as da

tf = pytest.importorskip("transformers")
TEXTS = ["the cat sat on the mat<|endoftext|>", "the dog<|endoftext|>"]


def _tokenizer(pad_is_eos: bool = False):
    tf.logging.set_verbosity_error()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=trained_bpe(), eos_token="<|endoftext|>")
    if pad_is_eos:
        tok.pad_token = tok.eos_token
    else:
        tok.add_special_tokens({"pad_token": "<pad>"})
    return tok


def _lm_batch(tok):
    return tf.DataCollatorForLanguageModeling(tok, mlm=False)([tok(t) for t in TEXTS])


def test_the_language_modeling_collator_passes_and_the_pair_is_decoded():
    tok = _tokenizer()
    report = da.audit_batch(_lm_batch(tok), tok)
    assert report.passed, report.first_failure
    # the model scores input t - 1 against label t: "the" is followed by " cat"
    assert report.pair[0].split()[:2] == ["input:", "the"]
    assert report.pair[1].split()[:2] == ["target:", "cat"]


def test_the_flattening_collator_passes():
    tok = _tokenizer()
    batch = tf.DataCollatorWithFlattening()([tok(t) for t in TEXTS])
    report = da.audit_batch(batch, tok)
    assert report.passed, report.first_failure
    assert report["packed"].evidence["documents"] == 2


def test_pad_equal_to_eos_masks_every_eos():
    """transformers#23530: the collator sets every pad id's label to -100, and pad = eos."""
    tok = _tokenizer(pad_is_eos=True)
    report = da.audit_batch(_lm_batch(tok), tok)
    assert not report["last_token"].passed
    assert report["last_token"].evidence["real_eos_ignored"]


def test_pad_equal_to_eos_is_named_when_the_padding_shows_it_and_the_tokenizer_its_eos():
    """Newcomer item 3: a tokenizer that knows its eos (2) and no pad id, a batch padded with 2
    whose every 2 has its label ignored: the cause is pad = eos (the padding holds the eos id),
    not a loss mask off by one."""
    from decoder_audit.text.tokenizer import Tokenizer

    tok = Tokenizer("tiny-vocab")
    ids = torch.tensor([[1, 3, 4, 5, 2],    # <bos> A B C <eos>
                        [1, 3, 2, 2, 2]])   # <bos> A <eos>, padded with <eos>
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    labels = ids.masked_fill(ids == tok.eos_id, -100)  # every pad id's label, so every eos's
    check = da.audit_batch({"input_ids": ids, "attention_mask": mask, "labels": labels},
                           tok)["last_token"]
    assert not check.passed
    assert check.evidence["pad_is_eos"] and check.evidence["pad_id"] == tok.eos_id == 2
    assert check.evidence["real_eos_ignored"] == [[0, 4], [1, 2]]
    assert "pad = eos" in check.detail and "off by one" not in check.detail, check.detail


def test_a_row_whose_labels_are_all_ignored_fails():
    tok = _tokenizer()
    batch = _lm_batch(tok)
    batch["labels"][1] = -100  # a response template never found (trl#1191)
    report = da.audit_batch(batch, tok)
    assert not report["rows_read"].passed and report["rows_read"].evidence[
        "rows_with_every_label_ignored"] == [1]


def test_labels_shifted_by_the_collator_and_again_by_the_model_fail():
    tok = _tokenizer()
    batch = _lm_batch(tok)
    shifted = torch.full_like(batch["labels"], -100)
    shifted[:, :-1] = batch["labels"][:, 1:]  # shifted once here; HF shifts again inside
    batch["labels"] = shifted
    assert not da.audit_batch(batch, tok)["shift"].passed
    # declared as a loop that scores logit t against label t, the same batch is right
    assert da.audit_batch(batch, tok, labels_shifted=True)["shift"].passed


def test_a_loss_mask_off_by_one_fails():
    tok = _tokenizer()
    batch = _lm_batch(tok)
    last = int(batch["attention_mask"][1].sum()) - 1  # row 1 is right-padded
    batch["labels"][1, last] = -100  # the ignored region starts one token early
    report = da.audit_batch(batch, tok)
    assert not report["last_token"].passed
    assert report["last_token"].evidence["last_real_label_ignored"] == [[1, last]]


def test_packed_labels_across_a_boundary_and_a_doubled_bos_fail():
    tok = _tokenizer()
    batch = tf.DataCollatorWithFlattening()([tok(t) for t in TEXTS])
    start = int((batch["position_ids"][0] == 0).nonzero()[1])
    batch["labels"][0, start] = batch["input_ids"][0, start]  # the boundary label read
    assert not da.audit_batch(batch, tok)["packed"].passed
    bos = {"input_ids": [[5, 5, 7, 8]], "labels": [[5, 5, 7, 8]]}

    class WithBos:
        bos_token_id = 5

    assert not da.audit_batch(bos, WithBos())["bos"].passed


def test_a_batch_without_labels_names_what_it_needs():
    with pytest.raises(da.DecoderInputError, match="labels"):
        da.audit_batch({"input_ids": [[1, 2]]})


@pytest.mark.parametrize("form", ["cu_seq_lens", "4d-additive", "4d-bool"])
def test_documents_declared_by_flash_lengths_or_a_4d_mask_are_read(form):
    """Two documents of 3 and 4 tokens in one row, declared without position_ids: by flash
    attention's cu_seq_lens_q, or by a block-diagonal 4-D mask (additive or boolean), with one
    pad after them. Both are found, the pad is real in none, and the boundary label read fails
    `packed`."""
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 0]])  # (1, 8): the last is a pad
    labels = torch.tensor([[-100, 4, 5, -100, 7, 8, 9, -100]])
    document = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])
    allowed = torch.ones(8, 8, dtype=torch.bool).tril() & (document[:, None] == document[None])
    allowed[7] = False  # the pad attends to nothing
    batch = {"input_ids": ids, "labels": labels}
    if form == "cu_seq_lens":
        batch |= {"cu_seq_lens_q": torch.tensor([0, 3, 7], dtype=torch.int32),
                  "attention_mask": torch.tensor([[1] * 7 + [0]])}
    elif form == "4d-additive":
        batch["attention_mask"] = torch.zeros(1, 1, 8, 8).masked_fill(~allowed, -3.4e38)
    else:
        batch["attention_mask"] = allowed[None, None]
    report = da.audit_batch(batch)
    assert report.passed, report.first_failure
    assert report["packed"].evidence["documents"] == 3  # the pad begins one of its own
    assert da.gate.declared_documents(batch) == [[(0, 3), (3, 4)]]
    batch["labels"] = labels.clone()
    batch["labels"][0, 3] = 6  # the first label of the second document, read
    assert not da.audit_batch(batch)["packed"].passed
