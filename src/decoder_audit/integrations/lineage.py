"""The data's lineage: what packing and truncation did to the source examples before the first
step, counted, and judged against the policy the trainer declares (`lineage`).

Each source example is one of:
  whole    one training document is the example, every token;
  cut      tokens of it train in one document, the rest in none (truncation);
  split    its tokens train in several documents, every one of them (a long example packed in
           pieces: SFT's packing_strategy="bfd_split");
  dropped  none of its tokens trains (a filter, or an empty example: counted apart as `empty`).
and each training document names where it came from: (source example, its first token, its
length). The documents are the trainer's rows cut at their declared boundaries (SFT's
`seq_lengths`); each is found in the source by its first tokens and compared whole.

How much of this a trainer lets one see:
  TRL's SFTTrainer  its dataset holds the packed (or truncated) rows with their document lengths;
                    the source examples are the dataset it was given (`gate_trainer(trainer,
                    source=dataset)`), tokenized by SFT's own preparation without packing or
                    truncation. Its declared policy: packing_strategy "bfd" cuts what is longer
                    than max_length, "bfd_split" splits it, "wrapped" splits across examples
                    (its rows hold no document boundaries: only the tokens are counted);
                    without packing, max_length truncates (truncation_mode).
  transformers'     the dataset is the source: its collators concatenate (flattening) or pad
  Trainer           whole examples, never cut or drop one; what a tokenizer did before the
                    dataset is not visible. The first batches' documents are counted.
A cut where the policy declares no truncation, and a dropped example that held tokens (silently:
no setting says so), fail the check.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from ..gate import CheckResult, declared_documents
from .lengths import example_lengths

ANCHOR = 8
"""Tokens a document is looked up by in the source (its first ones): a match is then compared
token by token, so a collision costs a comparison, never a wrong answer."""
MAX_TOKENS = 2_000_000
"""Tokens read at most (a dataset's, and again its source's): a larger dataset's lineage is not
counted before the first step (its matching would cost more than the gate), said as a skip."""
SHOWN = 32
"""Documents whose origin the evidence lists one by one (the counts cover every one)."""


@dataclass
class Lineage:
    """The counts, each document's origin, and the policy they are judged against."""

    examples: int
    whole: list[int] = field(default_factory=list)
    cut: list[int] = field(default_factory=list)
    split: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)
    documents: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(row, source example or -1 when not found, first token in it, length)."""
    policy: str = ""
    truncates: bool = False
    splits: bool = False
    boundaries: bool = True
    """The rows keep the documents' boundaries; where they do not (SFT's "wrapped" packing),
    only the tokens are counted."""
    source_tokens: int = 0
    trained_tokens: int = 0

    def counts(self) -> dict[str, int]:
        return {"examples": self.examples, "source_tokens": self.source_tokens,
                "trained_tokens": self.trained_tokens, "whole": len(self.whole),
                "cut": len(self.cut),
                "split": len(self.split), "dropped": len(self.dropped),
                "empty": len(self.empty), "documents": len(self.documents),
                "unmatched_documents": sum(1 for d in self.documents if d[1] < 0)}

    def lines(self) -> list[str]:
        c = self.counts()
        out = [f"policy: {self.policy}",
               f"{c['examples']} source examples: {c['whole']} whole, {c['cut']} cut, "
               f"{c['split']} split, {c['dropped']} dropped, {c['empty']} empty",
               f"{c['documents']} training documents" + (
                   f", {c['unmatched_documents']} not found in the source"
                   if c["unmatched_documents"] else "")]
        out += [f"  row {row}: example {source}, tokens {start}..{start + length - 1}"
                if source >= 0 else f"  row {row}: {length} tokens found in no example"
                for row, source, start, length in self.documents[:SHOWN]]
        if len(self.documents) > SHOWN:
            out.append(f"  ... {len(self.documents) - SHOWN} more (gate.json holds the counts)")
        return out


def sft_lineage(trainer: Any, source: Any) -> Lineage | None:
    """The lineage of an SFTTrainer's dataset from `source` (the dataset it was given), or None
    where its rows or the source's tokens cannot be read."""
    args, packed = trainer.args, trainer.train_dataset
    try:
        if sum(example_lengths(packed) or [MAX_TOKENS + 1]) > MAX_TOKENS:
            return None
        plain = copy.copy(args)
        plain.max_length, plain.packing = None, False
        tokens = trainer._prepare_dataset(source, trainer.processing_class, plain, False, None,
                                          "source")["input_ids"]
        rows = packed["input_ids"]
        lengths = packed["seq_lengths"] if "seq_lengths" in packed.column_names else None
    except Exception:  # noqa: BLE001 - a dataset or a TRL release we cannot read: not judged
        return None
    strategy = args.packing_strategy if args.packing else None
    policy, truncates, splits = _sft_policy(args, strategy)
    documents = []
    for r, (row, pieces) in enumerate(zip(rows, lengths or [[len(row)] for row in rows])):
        starts = [sum(pieces[:k]) for k in range(len(pieces))]
        documents += [(r, row[start:start + n]) for start, n in zip(starts, pieces)]
    if strategy == "wrapped":  # no boundaries inside a wrapped row: only tokens are counted
        found = Lineage(examples=len(tokens), policy=policy, truncates=truncates, splits=splits,
                        boundaries=False, source_tokens=sum(map(len, tokens)),
                        trained_tokens=sum(map(len, rows)))
        found.empty = [e for e, ids in enumerate(tokens) if not ids]
        return found
    keep_end = not args.packing and getattr(args, "truncation_mode", "") == "keep_end"
    found = match(tokens, documents, step=args.max_length,
                  tail=args.max_length if keep_end else None)
    found.policy, found.truncates, found.splits = policy, truncates, splits
    found.source_tokens, found.trained_tokens = sum(map(len, tokens)), sum(map(len, rows))
    return found


def _sft_policy(args: Any, strategy: str | None) -> tuple[str, bool, bool]:
    """(the policy said, whether it truncates, whether it splits) from SFTConfig."""
    if strategy == "bfd":
        return (f"SFT packing_strategy='bfd', max_length={args.max_length}: an example longer "
                "than max_length is cut"), True, False
    if strategy == "bfd_split":
        return (f"SFT packing_strategy='bfd_split', max_length={args.max_length}: an example "
                "longer than max_length is split, none is cut"), False, True
    if strategy == "wrapped":
        return (f"SFT packing_strategy='wrapped', max_length={args.max_length}: examples are "
                "split across rows, their boundaries not kept"), False, True
    if args.max_length is not None:
        return (f"SFT without packing, max_length={args.max_length} "
                f"(truncation_mode={args.truncation_mode!r}): a longer example is cut"), True, False
    return "SFT without packing or max_length: nothing is cut", False, False


def match(examples: list[list[int]], documents: list[tuple[int, list[int]]], *,
          step: int | None = None, tail: int | None = None, every: bool = True) -> Lineage:
    """Each document found in the examples (by its first ANCHOR tokens at the places a piece
    of an example can begin: every `step` tokens from its start (a cut keeps the start, a split
    cuts every max_length), and `tail` tokens before its end (truncation keeping the end);
    then compared whole), and each example counted by how its tokens are covered. `every`:
    every example is one the documents should come from (a whole dataset); else only the
    examples a document was found in are counted (the first batches)."""
    index: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for e, ids in enumerate(examples):
        starts = set(range(0, len(ids), step)) if step else {0}
        starts |= {len(ids) - tail} if tail and len(ids) > tail else set()
        for start in starts:
            index[tuple(ids[start:start + ANCHOR])].append((e, start))
    covered: dict[int, list[tuple[int, int]]] = defaultdict(list)
    found = Lineage(examples=len(examples) if every else 0)
    for row, ids in documents:
        ids = list(ids)
        where = next(((e, s) for e, s in index.get(tuple(ids[:ANCHOR]), ())
                      if examples[e][s:s + len(ids)] == ids), None)
        found.documents.append((row, -1, 0, len(ids)) if where is None
                               else (row, where[0], where[1], len(ids)))
        if where is not None:
            covered[where[0]].append((where[1], len(ids)))
    for e in range(len(examples)) if every else sorted(covered):
        _count(found, e, examples[e], covered.get(e, []))
    found.examples = found.examples or len(covered)
    return found


def _count(found: Lineage, e: int, ids: list[int], pieces: list[tuple[int, int]]) -> None:
    """Example e counted as whole, cut, split, dropped or empty by the pieces that train."""
    kept = len({t for start, n in pieces for t in range(start, start + n)})
    bucket = (found.empty if not ids else found.dropped if not pieces
              else found.cut if kept < len(ids) else found.split if len(pieces) > 1
              else found.whole)
    bucket.append(e)


def batch_lineage(dataset: Any, batches: list[Any]) -> Lineage | None:
    """The first batches' documents (each row's declared documents, or its real tokens) found
    in the dataset they came from (transformers' Trainer: its collators take whole examples),
    counted over the examples found; None where the dataset's tokens cannot be read."""
    examples = example_tokens(dataset)
    if examples is None:
        return None
    documents = []
    for b, batch in enumerate(batches):
        ids = batch["input_ids"].cpu()
        spans = declared_documents(batch)
        if spans is None:  # each row one example, its padding (mask 0) left out
            mask = batch.get("attention_mask")
            real = mask.cpu().bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 \
                else torch.ones_like(ids, dtype=torch.bool)
            documents += [(b, ids[r][real[r]].tolist()) for r in range(len(ids))]
            continue
        documents += [(b, ids[r, start:start + n].tolist())
                      for r, pieces in enumerate(spans) for start, n in pieces]
    found = match(examples, documents, every=False)
    found.policy = ("transformers' Trainer: the collator takes whole examples (it concatenates "
                    "or pads them), no truncation is declared; the first batches' documents")
    return found


def example_tokens(dataset: Any) -> list[list[int]] | None:
    """Each example's input ids: a `datasets.Dataset`'s column or a list of mappings, at most
    MAX_TOKENS of them in all; None for anything else."""
    lengths = example_lengths(dataset)
    if not lengths or sum(lengths) > MAX_TOKENS:
        return None
    if isinstance(dataset, (list, tuple)):
        return [list(map(int, e["input_ids"])) for e in dataset]
    return [list(ids) for ids in dataset["input_ids"]]


def check_lineage(lineage: Lineage | None, why_not: str) -> CheckResult:
    """`lineage` judged against its policy: a cut the policy does not declare, or a dropped
    example that held tokens, fails; None (not readable): skipped with `why_not`."""
    if lineage is None:
        return CheckResult("lineage", True, f"skipped: {why_not}", {}, skipped=True)
    c = lineage.counts()
    evidence = {"counts": c, "policy": lineage.policy, "cut": lineage.cut[:SHOWN],
                "split": lineage.split[:SHOWN], "dropped": lineage.dropped[:SHOWN],
                "documents": [list(d) for d in lineage.documents[:SHOWN]],
                "lines": lineage.lines()}
    if not lineage.boundaries:
        lost = c["source_tokens"] - c["trained_tokens"]
        said = (f"{c['examples']} source examples, {c['source_tokens']} tokens, "
                f"{c['trained_tokens']} of them in the training rows ({lineage.policy})")
        return CheckResult("lineage", lost == 0, said + (
            "" if lost == 0 else f": {lost} tokens never train, though the policy drops none"),
            evidence)
    said = (f"{c['examples']} source examples: {c['whole']} whole, {c['cut']} cut, "
            f"{c['split']} split, {c['dropped']} dropped ({lineage.policy})")
    if lineage.cut and not lineage.truncates:
        return CheckResult("lineage", False, f"{said}: examples {lineage.cut[:8]} are cut, "
                           "though the policy declares no truncation: their tail never trains",
                           evidence)
    if lineage.dropped:
        return CheckResult("lineage", False, f"{said}: examples {lineage.dropped[:8]} hold "
                           "tokens and none of them trains, though no setting says to drop "
                           "them", evidence)
    return CheckResult("lineage", True, said, evidence)


__all__ = ["MAX_TOKENS", "Lineage", "batch_lineage", "check_lineage", "example_tokens", "match",
           "sft_lineage"]
