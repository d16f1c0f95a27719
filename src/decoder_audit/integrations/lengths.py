"""The length a run trains at: the longest row its dataloader can yield, read before the first
step from the dataset's examples and what the collator makes of them.

    row_length(dataset, collator, per_row, first, declared)  ->  RunLength

A collator that flattens a batch into one row (transformers' `DataCollatorWithFlattening`, TRL's
padding-free collator, what SFT `packing=True` sends) puts `per_row` examples end to end: its
longest row is the sum of the `per_row` longest examples (a shuffle may put them together). A
collator that pads puts each example in a row of its own, padded to the longest of the batch
(rounded up to `pad_to_multiple_of`): its longest row is the longest example so rounded. The
examples' lengths are read from a `datasets.Dataset` (its input_ids column, without reading a
token) or a list of mappings; another dataset (an iterable one, one that tokenizes as it is
read) or a collator of another kind leaves only the declared maximum (SFTConfig's max_length)
and the first batches, and the length says so. The first batches are rows the run trains on, so
the length is never shorter than theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RunLength:
    """T of the longest row the run trains on, and how it was found (said in the report)."""

    seq_len: int
    how: str


def row_length(dataset: Any, collator: Any, per_row: int, first: Sequence[Mapping],
               declared: int | None = None) -> RunLength:
    """The longest row (module docstring): from the examples' lengths where they can be read and
    the collator is one whose rows follow from them, else the declared maximum where there is
    one, never below the first batches' longest row."""
    seen = max(int(b["input_ids"].shape[-1]) for b in first)
    kind = collator_kind(collator)
    lengths = example_lengths(dataset)
    if lengths and kind is not None:
        longest, how = _from_lengths(sorted(lengths, reverse=True), kind, collator, per_row)
        if longest >= seen:
            return RunLength(longest, how)
    if declared is not None:
        bound = declared * per_row if kind == "flattens" else declared
        if bound >= seen:
            return RunLength(bound, f"the declared max_length={declared}" + (
                f" x {per_row} examples flattened into a row" if kind == "flattens" else "")
                + _unread(lengths, kind, collator))
    return RunLength(seen, f"the longest of the first {len(first)} batches"
                     + _unread(lengths, kind, collator))


def _from_lengths(lengths: list[int], kind: str, collator: Any, per_row: int) -> tuple[int, str]:
    """(the longest row, how it follows) from the examples' lengths, longest first."""
    if kind == "flattens":
        count = min(per_row, len(lengths))
        return sum(lengths[:count]), (f"the {count} longest of {len(lengths)} examples "
                                      f"({', '.join(map(str, lengths[:count]))} tokens) "
                                      f"flattened into one row by {type(collator).__name__}")
    multiple = getattr(collator, "pad_to_multiple_of", None) or 1
    longest = -(-lengths[0] // multiple) * multiple
    rounded = f", padded to a multiple of {multiple}" if multiple > 1 else ""
    return longest, (f"the longest of {len(lengths)} examples ({lengths[0]} tokens{rounded}), "
                     f"one example a row ({type(collator).__name__} pads)")


def _unread(lengths: list[int] | None, kind: str | None, collator: Any) -> str:
    if lengths is None:
        return ": the examples' lengths cannot be read before training (not a datasets.Dataset " \
               "or a list of examples with input_ids)"
    if kind is None:
        return (f": the rows {type(collator).__name__} builds do not follow from the examples' "
                "lengths (a collator the gate does not read)")
    return ""


def collator_kind(collator: Any) -> str | None:
    """"flattens" (a batch end to end in one row), "pads" (each example a row, padded to the
    longest), or None: a collator whose rows the gate cannot tell from the examples."""
    if getattr(collator, "padding_free", False) or _named(collator, "DataCollatorWithFlattening"):
        return "flattens"
    if any(_named(collator, name) for name in _PADDING):
        return None if getattr(collator, "padding", True) == "max_length" else "pads"
    return None


# transformers' and TRL's collators that put each example in a row, padded to the longest
_PADDING = ("DataCollatorForLanguageModeling", "DataCollatorWithPadding",
            "DataCollatorForSeq2Seq", "DataCollatorForCompletionOnlyLM")


def _named(collator: Any, name: str) -> bool:
    """An instance of a class of that name (a transformers or TRL collator or a subclass),
    found without importing either."""
    return any(cls.__name__ == name for cls in type(collator).__mro__)


def example_lengths(dataset: Any) -> list[int] | None:
    """Each example's number of input ids: a `datasets.Dataset`'s input_ids column read as
    Arrow list lengths (no token read), or a list of mappings; None for anything else."""
    if type(dataset).__name__ == "Dataset" and hasattr(dataset, "with_format"):
        try:
            import pyarrow.compute as pc

            column = dataset.with_format("arrow")["input_ids"]
            return [int(n) for n in pc.list_value_length(column).to_pylist()]
        except (KeyError, ValueError, TypeError, ImportError):
            return None
    if isinstance(dataset, (list, tuple)) and dataset and all(
            isinstance(e, Mapping) and "input_ids" in e for e in dataset):
        return [len(e["input_ids"]) if not isinstance(e["input_ids"], torch.Tensor)
                else int(e["input_ids"].shape[-1]) for e in dataset]
    return None


__all__ = ["RunLength", "collator_kind", "example_lengths", "row_length"]
