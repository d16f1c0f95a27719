"""The ids every probe of the gate is made of.

Probe ids are drawn from the content ids: [0, min(V, input vocabulary)), so each is valid both as
an input and as a target, without the model's padding id, which some models read as padding
rather than content (RoBERTa's positions skip it: a sequence holding it is not the sequence it
looks like). Without a padding id the draws are exactly `torch.randint(0, id_range, ...)`.
"""

from __future__ import annotations

import torch


class ProbeIds:
    """Content ids, drawn without ever listing them: a vocabulary is only an id range here, so a
    declared V of any size costs nothing until the model is called (a spec's vocab_size of
    10^12 is judged, not allocated)."""

    def __init__(self, id_range: int, pad_token_id: int | None = None) -> None:
        self.id_range = id_range
        self.pad_token_id = (pad_token_id if isinstance(pad_token_id, int)
                             and not isinstance(pad_token_id, bool)
                             and 0 <= pad_token_id < id_range else None)
        self.count = id_range - (self.pad_token_id is not None)  # how many content ids

    def _content(self, index: torch.Tensor) -> torch.Tensor:
        """The content id at each index in [0, count): the index itself, past the pad one up."""
        if self.pad_token_id is None:
            return index
        return index + (index >= self.pad_token_id).long()

    def _index(self, ids: torch.Tensor) -> torch.Tensor:
        if self.pad_token_id is None:
            return ids
        return ids - (ids > self.pad_token_id).long()

    def random(self, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        """(batch, seq_len) content ids drawn uniformly."""
        picks = torch.randint(0, self.count, (batch, seq_len), generator=generator)
        return self._content(picks)

    def other(self, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Content ids that differ from `ids` at every position (a random non-zero shift of each
        id's index among the content ids)."""
        if self.count < 2:
            return ids.clone()
        shift = torch.randint(1, self.count, ids.shape, generator=generator)
        return self._content((self._index(ids) + shift) % self.count)
