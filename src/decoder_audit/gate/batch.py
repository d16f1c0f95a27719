"""`audit_batch`: the batches a user's collator builds, checked before they train a model.

    report = da.audit_batch(collator(examples), tokenizer=tok)   # input_ids, attention_mask,
    report.passed, report.checks, report.pair                   # labels, position_ids

The label convention is Hugging Face's (a causal LM's `labels=` are the input ids themselves, the
model shifts them by one inside its loss, and `ignore_index` = -100 marks a label no loss reads);
`labels_shifted=True` declares labels already shifted by the collator (a loop that scores logit t
against label t). Checks, each a CheckResult, in this order (the first failure names the problem):

  tensors          every entry is one integer (B, T) tensor, B, T >= 1, all of input_ids' shape:
                   no empty batch, no ragged rows, no float ids or labels (NaN, 1.9 where .long()
                   would silently make it 1), an attention_mask of 0s and 1s. When it fails the
                   other checks are skipped: they would read what the batch does not hold
  values           ids are >= 0 (and below the tokenizer's size), labels are ids or the ignore
                   index: -1 used as the ignore value is named (cross_entropy ignores -100 only)
  rows_read        no row whose labels are all ignored (a response template never found: every
                   label -100, trl#1191), and not every label of the batch
  shift            the labels that are read are the inputs under the declared convention; labels
                   that are the inputs shifted by one where the model shifts again (shifted
                   twice: transformers#47395) fail
  pads_ignored     a padded position has an ignored label. Padding is what attention_mask marks
                   0; with no mask, the trailing pad ids of a right-padded row (the pad id of
                   `pad_id=` or the tokenizer; with neither, an id that stands only in ragged
                   trailing runs of two or more: right padding, by its look)
  last_token       the last real token of a right-padded row keeps its label (a loss mask off by
                   one drops it: OpenRLHF#973), and with pad = eos the real end token keeps its
                   label (a collator that masks every pad id masks every eos: transformers#23530)
  bos              a row does not open with the begin token twice
  packed           where the batch declares packed documents (restarting position_ids, flash
                   attention's cu_seq_lens_q, a 4-D block-diagonal attention_mask, document_ids:
                   documents.py), the label of each document's first token is ignored (its
                   prediction would read the previous document)

The tokenizer (a Hugging Face tokenizer or ours) gives the eos, bos and pad ids and its size, and
decodes the first row's aligned pair, as the seeds write it: `input: <bos> A B C` /
`target: A B C <eos>`. A 4-D attention_mask (B, 1, T, T) is read for the tokens that are real
(those that may attend to themselves) and for the documents it draws. A batch that is not a mapping holding input_ids and labels is no batch at
all: InputShapeError, naming what it holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..errors import InputShapeError
from .render import passed_line
from .documents import SIGNALS, real_tokens, starts
from .result import CheckResult, Verdicts, skipped

IGNORE_INDEX = -100
# Every check, in the order it runs, and what it holds (the command's --help and docs list these).
CHECK_TITLES = {
    "tensors": "each entry one integer (B, T) tensor: not empty, not ragged, no float ids or "
               "labels, a 0/1 attention_mask",
    "values": "ids are token ids; labels are ids or the ignore index (-1 used for it is named)",
    "rows_read": "no row, nor the whole batch, with every label ignored",
    "shift": "the labels read are the inputs under the declared convention (not shifted twice)",
    "pads_ignored": "no padded position's label is read (no mask: trailing pad ids)",
    "last_token": "the last real token keeps its label; with pad = eos, the real eos keeps its",
    "bos": "no row opens with the begin token twice",
    "packed": "with packed documents declared, no label across a document boundary is read",
}
CHECKS = tuple(CHECK_TITLES)
ENTRIES = ("input_ids", "labels", "attention_mask", "position_ids")
# A run of one id at the end of rows, at least this long, read as padding when no mask or pad id
# says what padding is: one repeat at the end of a row is too common in text to mean padding.
SUSPECTED_PAD_RUN = 2
REPORT_FILES = ("report.md", "report.json")


@dataclass
class BatchReport(Verdicts):
    """The verdict on one batch: every check, the first row's aligned pair, and its (B, T)
    (None when its entries are not (B, T) tensors)."""

    checks: list[CheckResult]
    pair: list[str] = field(default_factory=list)
    shape: tuple[int, int] | None = None
    entries: list[str] = field(default_factory=list)  # the batch's keys that were read
    CHECK_TITLES: ClassVar[dict[str, str]] = CHECK_TITLES

    def to_dict(self, command: str | None = None) -> dict[str, Any]:
        first = self.first_failure
        return {"kind": "audit_batch", "passed": self.passed,
                "first_failure": None if first is None else first.name,
                "shape": None if self.shape is None else list(self.shape),
                "entries": self.entries, "checks": [c.to_dict() for c in self.checks],
                "pair": self.pair, "command": command}

    def lines(self, command: str | None = None) -> list[str]:
        """The report as plain text: one line per check, the pair, the verdict, the rerun."""
        shape = "not (B, T)" if self.shape is None else f"B={self.shape[0]}, T={self.shape[1]}"
        lines = [f"batch: {', '.join(self.entries)} ({shape})"]
        width = max(len(name) for name in CHECKS)
        lines += [f"{i:2d} {c.name:<{width}} {c.status:<4} {c.detail}"
                  for i, c in enumerate(self.checks, start=1)]
        lines += self.pair
        first = self.first_failure
        lines.append(passed_line(self.checks) if first is None else
                     f"FAILED: first broken contract is '{first.name}': {first.detail}")
        return lines + ([f"rerun: {command}"] if command else [])

    def write(self, directory: str | Path, command: str | None = None) -> Path:
        """report.md and report.json into `directory`, swapped in whole (storage's atomic
        folder): an existing folder is replaced only when it holds an earlier batch report and
        nothing else."""
        from ..storage.folder import write_folder_atomically

        def write(folder: Path) -> None:
            (folder / "report.json").write_text(json.dumps(self.to_dict(command), indent=2,
                                                           default=str) + "\n")
            (folder / "report.md").write_text("# audit_batch\n\n```\n"
                                              + "\n".join(self.lines(command)) + "\n```\n")

        return write_folder_atomically(directory, write, same_kind=_is_batch_report,
                                       what="batch report", names=REPORT_FILES)


def _is_batch_report(folder: Path) -> bool:
    try:
        return json.loads((folder / "report.json").read_text()).get("kind") == "audit_batch"
    except (OSError, ValueError, AttributeError):
        return False


def audit_batch(batch: Any, tokenizer: Any = None, *, labels_shifted: bool = False,
                ignore_index: int = IGNORE_INDEX, pad_id: int | None = None,
                bos_id: int | None = None) -> BatchReport:
    """Check a collator's batch (a mapping with input_ids and labels, and optionally
    attention_mask and position_ids, each (B, T)); `pad_id` and `bos_id` say those ids where
    the tokenizer does not (and win over its). See the module docstring."""
    entries = _entries(batch)
    tensors, form = _read_tensors(entries)
    if not form.passed:
        why = "the batch's entries are not integer (B, T) tensors (see 'tensors')"
        return BatchReport([form] + [skipped(name, why) for name in CHECKS[1:]],
                           entries=list(entries))
    ids, labels = tensors["input_ids"], tensors["labels"]
    begins = starts({**{k: batch[k] for k in SIGNALS if isinstance(batch.get(k), torch.Tensor)},
                     "input_ids": ids})  # (B, T) or None: the documents the batch declares
    special = _special_ids(tokenizer, pad=pad_id, bos=bos_id)
    read = labels != ignore_index  # (B, T): labels a loss reads
    mask, padding = _padding(ids, tensors.get("attention_mask"), special)
    checks = [
        form,
        _check_values(ids, labels, ignore_index, _vocab_size(tokenizer)),
        _check_rows_read(read, ignore_index),
        _check_shift(ids, labels, read, labels_shifted),
        _check_pads(mask, read, padding),
        _check_last_token(ids, mask, _targets_read(read, labels_shifted), special),
        _check_bos(ids, mask, special),
        _check_packed(begins, read, labels_shifted),
    ]
    return BatchReport(checks, _pair(ids, labels, read, tokenizer, labels_shifted),
                       shape=tuple(ids.shape), entries=list(entries))


def _entries(batch: Any) -> dict[str, Any]:
    """The batch's entries this audit reads (None values left out), or InputShapeError when it
    is not a mapping holding input_ids and labels."""
    if not hasattr(batch, "keys") or "input_ids" not in batch or "labels" not in batch:
        raise InputShapeError("a batch is a mapping with input_ids and labels (B, T), like a "
                              f"collator returns; got {type(batch).__name__}"
                              + (f" with keys {sorted(map(str, batch.keys()))}"
                                 if hasattr(batch, "keys") else ""))
    found = {name: batch[name] for name in ENTRIES if name in batch and batch[name] is not None}
    mask = found.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() in (3, 4) and mask.shape[-1] == \
            mask.shape[-2]:
        found["attention_mask"] = real_tokens(mask).long()  # (B, T): a 4-D mask's real tokens
    return found


def _read_tensors(entries: dict[str, Any]) -> tuple[dict[str, torch.Tensor], CheckResult]:
    """The "tensors" check: each entry as a (B, T) torch.long tensor, or every problem named."""
    tensors, problems = {}, []
    for name, value in entries.items():
        tensor, problem = _as_tensor(name, value)
        if problem:
            problems.append(problem)
        else:
            tensors[name] = tensor
    shape = tensors["input_ids"].shape if "input_ids" in tensors else None
    for name, tensor in tensors.items():
        if shape is not None and tensor.shape != shape:
            problems.append(f"{name} has shape {tuple(tensor.shape)}, input_ids "
                            f"{tuple(shape)}: every entry is (B, T) like input_ids")
    evidence = {"entries": {name: {"shape": list(t.shape), "dtype": str(t.dtype)}
                            for name, t in tensors.items()}, "problems": problems}
    if problems:
        return {}, CheckResult("tensors", False, "; ".join(problems), evidence)
    return ({name: t.long() for name, t in tensors.items()},
            CheckResult("tensors", True, f"{', '.join(tensors)}: integer tensors of "
                        f"(B, T) = {tuple(shape)}", evidence))


def _as_tensor(name: str, value: Any) -> tuple[torch.Tensor | None, str | None]:
    """(the entry as a tensor, None) or (None, what is wrong with it)."""
    if isinstance(value, (list, tuple)):
        lengths = _row_lengths(value)
        if lengths is not None and len(set(lengths)) > 1:
            return None, (f"{name} is ragged: its rows have lengths {lengths[:8]}; a collator "
                          "pads them to one length T (and marks the pads in attention_mask)")
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        return None, f"{name} cannot be read as a tensor ({type(exc).__name__}: {first})"
    if tensor.numel() == 0:
        return None, (f"{name} is empty (shape {tuple(tensor.shape)}): a batch holds B >= 1 "
                      "rows of T >= 1 tokens")
    if tensor.dim() != 2:
        return None, f"{name} has shape {tuple(tensor.shape)}: a batch entry is (B, T)"
    problem = _mask_problem(tensor) if name == "attention_mask" else _integer_problem(name,
                                                                                      tensor)
    return (None, problem) if problem else (tensor, None)


def _row_lengths(rows: list | tuple) -> list[int] | None:
    try:
        return [len(row) for row in rows]
    except TypeError:  # rows of numbers (one dimension), or of 0-d tensors
        return None


def _integer_problem(name: str, tensor: torch.Tensor) -> str | None:
    """Why ids, labels or positions of this dtype are not token ids; None when they are. A
    float tensor fails even when its values are whole: an embedding refuses it, and .long()
    would truncate 1.9 to 1 without a word."""
    dtype = tensor.dtype
    if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
        return None
    if not dtype.is_floating_point:
        return f"{name} is {dtype}: token ids and labels are integers (torch.long)"
    nan, inf = int(tensor.isnan().sum()), int(tensor.isinf().sum())
    fractional = tensor.isfinite() & (tensor != tensor.round())  # (B, T)
    found = [f"{nan} NaN"] * bool(nan) + [f"{inf} infinite"] * bool(inf)
    if fractional.any():
        b, t = (int(i) for i in fractional.nonzero()[0])
        found.append(f"{int(fractional.sum())} not whole (first {float(tensor[b, t]):g} at "
                     f"(row, position) ({b}, {t}), which .long() would make "
                     f"{int(tensor[b, t].long())})")
    values = ", ".join(found) if found else "whole values"
    return (f"{name} holds {dtype} values ({values}), not integer ids: an embedding and "
            "cross_entropy read torch.long ids")


def _mask_problem(mask: torch.Tensor) -> str | None:
    bad = ~((mask == 0) | (mask == 1))  # NaN is neither
    if not bad.any():
        return None
    shown = sorted({str(v) for v in mask[bad].tolist()})[:4]
    return (f"attention_mask holds {int(bad.sum())} values other than 0 and 1 (e.g. "
            f"{', '.join(shown)}): it marks each position real (1) or padding (0)")


def _special_ids(tokenizer: Any, **declared: int | None) -> dict[str, int | None]:
    def get(name: str) -> int | None:
        value = getattr(tokenizer, f"{name}_token_id", None)
        if value is None:
            value = getattr(tokenizer, f"{name}_id", None)
        return value if isinstance(value, int) else None
    special = {name: get(name) for name in ("eos", "bos", "pad")}
    return {**special, **{name: v for name, v in declared.items() if v is not None}}


def _vocab_size(tokenizer: Any) -> int | None:
    """The number of ids the tokenizer makes (a Hugging Face tokenizer's len() counts its added
    tokens; ours has vocab_size), or None."""
    try:
        size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
    except (AttributeError, TypeError):
        return None
    return size if isinstance(size, int) and size > 0 else None


def _check_values(ids, labels, ignore_index: int, vocab: int | None) -> CheckResult:
    """Ids in [0, vocab) (the tokenizer's size, when known); labels ids or the ignore index."""
    beyond = ids.new_tensor(vocab if vocab is not None else torch.iinfo(torch.long).max)
    bad_ids = (ids < 0) | (ids >= beyond)  # (B, T)
    bad_labels = ((labels < 0) & (labels != ignore_index)) | (labels >= beyond)  # (B, T)
    strays = labels[bad_labels].unique().tolist()[:8]
    evidence = {"ids_out_of_range": int(bad_ids.sum()), "labels_out_of_range":
                int(bad_labels.sum()), "stray_label_values": strays,
                "ignore_index": ignore_index, "tokenizer_ids": vocab}
    problems = []
    if bad_ids.any():
        b, t = (int(i) for i in bad_ids.nonzero()[0])
        problems.append(f"{int(bad_ids.sum())} input ids are outside [0, {vocab or 'V'}) "
                        f"(first {int(ids[b, t])} at (row, position) ({b}, {t}))")
    if bad_labels.any():
        b, t = (int(i) for i in bad_labels.nonzero()[0])
        negative = next((v for v in strays if v < 0), None)
        hint = "" if negative is None else (
            f": if {negative} marks ignored labels, the loss ignores {ignore_index} only "
            f"(cross_entropy raises on {negative}); use {ignore_index}, or declare "
            f"{negative} the ignore index (ignore_index={negative}, --ignore-index {negative})")
        problems.append(f"{int(bad_labels.sum())} labels (values {strays}) are neither token "
                        f"ids nor the ignore index {ignore_index} (first at (row, position) "
                        f"({b}, {t})){hint}")
    if problems:
        return CheckResult("values", False, "; ".join(problems), evidence)
    return CheckResult("values", True, "ids are token ids; labels are ids or the ignore index "
                       f"{ignore_index}", evidence)


def _padding(ids, mask, special) -> tuple[torch.Tensor, dict[str, Any]]:
    """(the mask of real positions (B, T), how it was found): the batch's attention_mask; else
    the trailing pad ids of each row (pad = eos: the first of them is the real end token); else
    all ones. The pad id is the declared one, or one that only right padding would leave."""
    if mask is not None:
        return mask, {"from": "attention_mask"}
    pad, how = special["pad"], "declared"
    if pad is None:
        pad, how = _suspected_pad(ids), "suspected"
    if pad is None:
        return torch.ones_like(ids), {"from": "no attention_mask and no pad id: none padded"}
    run = _trailing_run(ids, pad)  # (B,)
    if pad == special["eos"]:
        run = (run - 1).clamp(min=0)  # the first eos of the run ends the text
    real = torch.arange(ids.shape[1]) < (ids.shape[1] - run)[:, None]  # (B, T)
    return real.long(), {"from": f"trailing pad ids ({how} pad id {pad}), no attention_mask",
                         "pad_id": pad, "pad_id_is": how}


def _trailing_run(ids, value: int) -> torch.Tensor:
    """(B,): how many positions at the end of each row hold `value`."""
    return (ids == value).flip(1).long().cumprod(1).sum(1)


def _suspected_pad(ids) -> int | None:
    """An id that stands only in trailing runs, one of them SUSPECTED_PAD_RUN or longer, whose
    lengths differ between rows: right padding by its look (no text ends that way)."""
    for value in ids[:, -1].unique().tolist():
        run = _trailing_run(ids, value)  # (B,)
        only_there = bool(((ids == value).sum(1) == run).all())
        if only_there and int(run.max()) >= SUSPECTED_PAD_RUN and len(set(run.tolist())) > 1:
            return value
    return None


def _check_shift(ids, labels, read, shifted: bool) -> CheckResult:
    same = int((labels == ids)[read].sum())  # labels equal to the input at the same position
    ahead = torch.zeros_like(read)
    ahead[:, :-1] = labels[:, :-1] == ids[:, 1:]
    next_one = int(ahead[read].sum())  # labels equal to the next input
    total = int(read.sum())
    evidence = {"labels_read": total, "equal_to_the_input": same, "equal_to_the_next_input":
                next_one, "labels_shifted": shifted}
    if not total:
        return skipped("shift", "no label is read: there is nothing to compare (see "
                       "'rows_read')")
    want, got = ("the next input", next_one) if shifted else ("the input itself", same)
    if got == total:
        return CheckResult("shift", True, f"every label read is {want} ({total} labels)",
                           evidence)
    if not shifted and next_one == total:
        return CheckResult("shift", False, f"the {total} labels read are the NEXT input ids: "
                           "they were shifted already, and a model that shifts its labels "
                           "(Hugging Face's) shifts them again, training t to predict t + 2",
                           evidence)
    wrong = total - got
    return CheckResult("shift", False, f"{wrong} of {total} labels read are not {want}: the "
                       "labels are not the inputs under the declared convention", evidence)


def _check_rows_read(read, ignore_index: int) -> CheckResult:
    empty = [int(b) for b in (~read.any(1)).nonzero().flatten()]
    evidence = {"rows_with_every_label_ignored": empty}
    if len(empty) == read.shape[0]:
        return CheckResult("rows_read", False, f"every label of the batch ({read.numel()} in "
                           f"{read.shape[0]} rows) is the ignore index {ignore_index}: the batch "
                           "trains nothing (a response template never found? or masked with "
                           "the wrong value?)", evidence)
    if empty:
        return CheckResult("rows_read", False, f"rows {empty[:8]} have every label ignored: "
                           "they add nothing to the loss (a response template never found?)",
                           evidence)
    return CheckResult("rows_read", True, f"each of the {read.shape[0]} rows has labels read",
                       evidence)


def _check_pads(mask, read, padding: dict[str, Any]) -> CheckResult:
    bad = (read & (mask == 0)).nonzero().tolist()
    evidence = {"padded_labels_read": bad[:16], "padding": padding}
    if bad and padding.get("pad_id_is") == "suspected":
        rows = sorted({b for b, _ in bad})
        return CheckResult("pads_ignored", False, f"with no attention_mask and no pad id "
                           f"declared, rows {rows[:8]} end in runs of id {padding['pad_id']}, "
                           "which stands nowhere else: right padding by its look, and its "
                           f"{len(bad)} labels are read, so the loss trains the model to predict "
                           "pads; give the attention_mask, set the pads' labels to the ignore "
                           "index, or declare the pad id (a tokenizer that has one, pad_id=, "
                           "--pad-id)", evidence)
    if bad:
        where = ("attention_mask 0" if padding["from"] == "attention_mask" else
                 f"trailing pad id {padding['pad_id']}, no attention_mask")
        return CheckResult("pads_ignored", False, f"{len(bad)} padded positions ({where}) have "
                           f"labels a loss reads (first (row, position) {bad[0]})", evidence)
    return CheckResult("pads_ignored", True, "every padded position's label is ignored ("
                       f"padding: {padding['from']})", evidence)


def _targets_read(read, shifted: bool) -> torch.Tensor:
    """(B, T): whether the label that has the input at t as its target is read: the label at t,
    or with labels shifted by the collator the one at t - 1 (none for t = 0)."""
    if not shifted:
        return read
    targets = torch.zeros_like(read)
    targets[:, 1:] = read[:, :-1]
    return targets


def _check_last_token(ids, mask, read, special) -> CheckResult:
    """Right-padded rows keep their last real token's label; with pad = eos, real eos tokens
    keep theirs. `read` says, per input position, whether the label targeting it is read. The
    pad id is the declared or the tokenizer's, else the one id every padded position holds."""
    dropped = []
    for b in range(ids.shape[0]):
        real = mask[b].nonzero().flatten()
        if len(real) < 2 or int(real[-1]) == ids.shape[1] - 1:
            continue  # not right-padded: nothing after the last real token
        last = int(real[-1])
        if not bool(read[b, last]) and bool(read[b, real[:-1]].any()):
            dropped.append([b, last])
    eos, pad = special["eos"], special["pad"]
    padded = ids[mask == 0].unique().tolist()
    if pad is None and len(padded) == 1:  # the batch shows its pad id: the id padding holds
        pad = padded[0]
    pad_is_eos = eos is not None and eos == pad
    masked_eos = []
    if pad_is_eos:
        real_eos = (ids == eos) & (mask == 1)
        masked_eos = (real_eos & ~read).nonzero().tolist()
    evidence = {"last_real_label_ignored": dropped, "real_eos_ignored": masked_eos[:16],
                "pad_is_eos": pad_is_eos, "pad_id": pad}
    # With pad = eos an ignored end label is the collator masking every pad id, which masks
    # every eos too (transformers#23530): named before any off-by-one mask is suspected.
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
    if bos is None:
        return skipped("bos", "no begin token id: the tokenizer (if any) declares none")
    doubled = []
    for b in range(ids.shape[0]):
        real = ids[b][mask[b] == 1]
        if len(real) >= 2 and int(real[0]) == bos and int(real[1]) == bos:
            doubled.append(b)
    evidence = {"bos_id": bos, "rows_with_two_bos": doubled}
    if doubled:
        return CheckResult("bos", False, f"rows {doubled[:8]} open with the begin token (id {bos}) "
                           "twice: the template added one and the tokenizer another", evidence)
    return CheckResult("bos", True, f"no row opens with the begin token (id {bos}) twice",
                       evidence)


def _check_packed(begins, read, shifted: bool) -> CheckResult:
    if begins is None:
        return skipped("packed", "the batch declares no packed documents")
    inner = begins.clone()
    inner[:, 0] = False  # a row's first token begins its first document anyway
    crossing = inner & read if not shifted else torch.zeros_like(read)
    if shifted:  # label t is read at t; the label of the token before a start crosses
        crossing[:, :-1] = inner[:, 1:] & read[:, :-1]
    bad = crossing.nonzero().tolist()
    evidence = {"packed": True, "documents": int(begins.sum()),
                "labels_across_documents": bad[:16]}
    if bad:
        return CheckResult("packed", False, f"{len(bad)} labels across a document boundary are "
                           f"read (first (row, position) {bad[0]}): a document begins there, "
                           "so the prediction would read the previous document", evidence)
    return CheckResult("packed", True, f"{evidence['documents']} packed documents; no label "
                       "across a boundary is read", evidence)


def _pair(ids, labels, read, tokenizer, shifted: bool) -> list[str]:
    """The first row as the seeds show it: the inputs a loss reads and their targets."""
    if tokenizer is None or not hasattr(tokenizer, "decode"):
        return []
    row, keep = ids[0], read[0]
    if shifted:  # target t is labels[t] for input t
        inputs, targets = row[keep], labels[0][keep]
    else:  # the model scores input t - 1 against label t
        keep_next = keep[1:]
        inputs, targets = row[:-1][keep_next], labels[0][1:][keep_next]
    words = lambda values: [_word(tokenizer, int(v)) for v in values]  # noqa: E731
    return ["input:  " + " ".join(words(inputs)), "target: " + " ".join(words(targets))]


def _word(tokenizer: Any, value: int) -> str:
    """One id decoded; an id the tokenizer cannot decode (a stray label) shown as <id N>."""
    try:
        return tokenizer.decode([value]) if value >= 0 else f"<id {value}>"
    except Exception:  # noqa: BLE001 - a tokenizer's own refusal of an id it lacks
        return f"<id {value}>"
