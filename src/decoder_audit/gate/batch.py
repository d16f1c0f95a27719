"""`audit_batch`: the batches a user's collator builds, checked before they train a model.

    report = da.audit_batch(collator(examples), tokenizer=tok)   # input_ids, attention_mask,
    report.passed, report.checks, report.pair                   # labels, position_ids

The label convention is Hugging Face's (a causal LM's `labels=` are the input ids themselves, the
model shifts them by one inside its loss, and `ignore_index` = -100 marks a label no loss reads);
`labels_shifted=True` declares labels already shifted by the collator (a loop that scores logit t
against label t). Checks, each a CheckResult:

  shift            the labels that are read are the inputs under the declared convention; labels
                   that are the inputs shifted by one where the model shifts again (shifted
                   twice: transformers#47395) fail
  rows_read        no row whose labels are all ignored (a response template never found: every
                   label -100, trl#1191)
  pads_ignored     a padded position (attention_mask 0) has an ignored label
  last_token       the last real token of a right-padded row keeps its label (a loss mask off by
                   one drops it: OpenRLHF#973), and with pad = eos the real end token keeps its
                   label (a collator that masks every pad id masks every eos: transformers#23530)
  bos              a row does not open with the begin token twice
  packed           with position_ids, a row's documents start where they restart at 0, and the
                   label of each document's first token is ignored (its prediction would read
                   the previous document)

The tokenizer (a Hugging Face tokenizer or ours) gives the eos, bos and pad ids and decodes the
first row's aligned pair, as the seeds write it: `input: <bos> A B C` / `target: A B C <eos>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InputShapeError
from .result import CheckResult, Verdicts

IGNORE_INDEX = -100


@dataclass
class BatchReport(Verdicts):
    """The verdict on one batch: every check, and the first row's aligned pair."""

    checks: list[CheckResult]
    pair: list[str] = field(default_factory=list)


def audit_batch(batch: Any, tokenizer: Any = None, *, labels_shifted: bool = False,
                ignore_index: int = IGNORE_INDEX) -> BatchReport:
    """Check a collator's batch (a mapping with input_ids and labels, and optionally
    attention_mask and position_ids, each (B, T)); see the module docstring."""
    tensors = _tensors(batch)
    ids, labels = tensors["input_ids"], tensors["labels"]
    mask = tensors.get("attention_mask", torch.ones_like(ids))
    positions = tensors.get("position_ids")
    special = _special_ids(tokenizer)
    read = labels != ignore_index  # (B, T): labels a loss reads
    checks = [
        _check_shift(ids, labels, read, labels_shifted),
        _check_rows_read(read),
        _check_pads(mask, read),
        _check_last_token(ids, mask, read, special),
        _check_bos(ids, mask, special),
        _check_packed(positions, read, labels_shifted),
    ]
    return BatchReport(checks, _pair(ids, labels, read, mask, tokenizer, labels_shifted))


def _tensors(batch: Any) -> dict[str, torch.Tensor]:
    if not hasattr(batch, "keys") or "input_ids" not in batch or "labels" not in batch:
        raise InputShapeError("a batch is a mapping with input_ids and labels (B, T), like a "
                              f"collator returns; got {type(batch).__name__}"
                              + (f" with keys {sorted(batch.keys())}" if hasattr(batch, "keys")
                                 else ""))
    out = {}
    for name in ("input_ids", "labels", "attention_mask", "position_ids"):
        if name not in batch or batch[name] is None:
            continue
        value = torch.as_tensor(batch[name])
        if value.dim() != 2 or value.shape != torch.as_tensor(batch["input_ids"]).shape:
            raise InputShapeError(f"batch[{name!r}] has shape {tuple(value.shape)}; every entry "
                                  "must be (B, T) like input_ids "
                                  f"{tuple(torch.as_tensor(batch['input_ids']).shape)}")
        out[name] = value.long()
    return out


def _special_ids(tokenizer: Any) -> dict[str, int | None]:
    def get(name: str) -> int | None:
        value = getattr(tokenizer, f"{name}_token_id", None)
        if value is None:
            value = getattr(tokenizer, f"{name}_id", None)
        return value if isinstance(value, int) else None
    return {name: get(name) for name in ("eos", "bos", "pad")}


def _check_shift(ids, labels, read, shifted: bool) -> CheckResult:
    same = int((labels == ids)[read].sum())  # labels equal to the input at the same position
    ahead = torch.zeros_like(read)
    ahead[:, :-1] = labels[:, :-1] == ids[:, 1:]
    next_one = int(ahead[read].sum())  # labels equal to the next input
    total = int(read.sum())
    evidence = {"labels_read": total, "equal_to_the_input": same, "equal_to_the_next_input":
                next_one, "labels_shifted": shifted}
    want, got = ("the next input", next_one) if shifted else ("the input itself", same)
    if total and got == total:
        return CheckResult("shift", True, f"every label read is {want} ({total} labels)",
                           evidence)
    if not shifted and next_one == total and total:
        return CheckResult("shift", False, f"the {total} labels read are the NEXT input ids: "
                           "they were shifted already, and a model that shifts its labels "
                           "(Hugging Face's) shifts them again, training t to predict t + 2",
                           evidence)
    wrong = total - got
    return CheckResult("shift", False, f"{wrong} of {total} labels read are not {want}: the "
                       "labels are not the inputs under the declared convention", evidence)


def _check_rows_read(read) -> CheckResult:
    empty = [int(b) for b in (~read.any(1)).nonzero().flatten()]
    evidence = {"rows_with_every_label_ignored": empty}
    if empty:
        return CheckResult("rows_read", False, f"rows {empty[:8]} have every label ignored: "
                           "they add nothing to the loss (a response template never found?)",
                           evidence)
    return CheckResult("rows_read", True, f"every one of {read.shape[0]} rows has labels read",
                       evidence)


def _check_pads(mask, read) -> CheckResult:
    bad = (read & (mask == 0)).nonzero().tolist()
    evidence = {"padded_labels_read": bad[:16]}
    if bad:
        return CheckResult("pads_ignored", False, f"{len(bad)} padded positions have labels a "
                           f"loss reads (first (row, position) {bad[0]})", evidence)
    return CheckResult("pads_ignored", True, "every padded position's label is ignored",
                       evidence)


def _check_last_token(ids, mask, read, special) -> CheckResult:
    """Right-padded rows keep their last real token's label; with pad = eos, real eos tokens
    keep theirs."""
    dropped = []
    for b in range(ids.shape[0]):
        real = mask[b].nonzero().flatten()
        if len(real) < 2 or int(real[-1]) == ids.shape[1] - 1:
            continue  # not right-padded: nothing after the last real token
        last = int(real[-1])
        if not bool(read[b, last]) and bool(read[b, real[:-1]].any()):
            dropped.append([b, last])
    eos, pad = special["eos"], special["pad"]
    masked_eos = []
    if eos is not None and eos == pad:
        real_eos = (ids == eos) & (mask == 1)
        masked_eos = (real_eos & ~read).nonzero().tolist()
    evidence = {"last_real_label_ignored": dropped, "real_eos_ignored": masked_eos[:16],
                "pad_is_eos": eos is not None and eos == pad}
    if masked_eos:
        return CheckResult("last_token", False, f"pad = eos (id {eos}) and the real end tokens "
                           f"at {masked_eos[:4]} have ignored labels: masking every pad id masked "
                           "every eos, so the model never learns to stop", evidence)
    if dropped:
        return CheckResult("last_token", False, f"rows {[b for b, _ in dropped][:8]}: the last "
                           "real token's label is ignored while the rest are read: the loss mask "
                           "is off by one", evidence)
    return CheckResult("last_token", True, "the last real token of every row keeps its label",
                       evidence)


def _check_bos(ids, mask, special) -> CheckResult:
    bos = special["bos"]
    doubled = []
    if bos is not None:
        for b in range(ids.shape[0]):
            real = ids[b][mask[b] == 1]
            if len(real) >= 2 and int(real[0]) == bos and int(real[1]) == bos:
                doubled.append(b)
    evidence = {"bos_id": bos, "rows_with_two_bos": doubled}
    if doubled:
        return CheckResult("bos", False, f"rows {doubled[:8]} open with the begin token (id {bos}) "
                           "twice: the template added one and the tokenizer another", evidence)
    return CheckResult("bos", True, "no row opens with the begin token twice"
                       if bos is not None else "no begin token declared", evidence)


def _check_packed(positions, read, shifted: bool) -> CheckResult:
    if positions is None:
        return CheckResult("packed", True, "no position_ids: not packed", {"packed": False})
    starts = (positions == 0)
    starts[:, 0] = False  # a row's first token begins its first document anyway
    crossing = starts & read if not shifted else torch.zeros_like(read)
    if shifted:  # label t is read at t; the label of the token before a start crosses
        crossing[:, :-1] = starts[:, 1:] & read[:, :-1]
    bad = crossing.nonzero().tolist()
    evidence = {"packed": True, "documents": int(starts.sum() + positions.shape[0]),
                "labels_across_documents": bad[:16]}
    if bad:
        return CheckResult("packed", False, f"{len(bad)} labels across a document boundary are "
                           f"read (first (row, position) {bad[0]}): position_ids restart there, "
                           "so the prediction would read the previous document", evidence)
    return CheckResult("packed", True, f"{evidence['documents']} packed documents; no label "
                       "across a boundary is read", evidence)


def _pair(ids, labels, read, mask, tokenizer, shifted: bool) -> list[str]:
    """The first row as the seeds show it: the inputs a loss reads and their targets."""
    if tokenizer is None or not hasattr(tokenizer, "decode"):
        return []
    row, keep = ids[0], read[0]
    if shifted:  # target t is labels[t] for input t
        inputs, targets = row[keep], labels[0][keep]
    else:  # the model scores input t - 1 against label t
        keep_next = keep[1:]
        inputs, targets = row[:-1][keep_next], labels[0][1:][keep_next]
    words = lambda values: [tokenizer.decode([int(v)]) for v in values]  # noqa: E731
    return ["input:  " + " ".join(words(inputs)), "target: " + " ".join(words(targets))]
