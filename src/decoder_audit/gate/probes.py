"""The ids every probe of the gate is made of.

Probe ids are drawn from the content ids: [0, min(V, input vocabulary)), so each is valid both as
an input and as a target, without the model's padding id, which some models read as padding
rather than content (RoBERTa's positions skip it: a sequence holding it is not the sequence it
looks like). Without a padding id the draws are exactly `torch.randint(0, id_range, ...)`.
"""

from __future__ import annotations

import torch


class ProbeIds:
    def __init__(self, id_range: int, pad_token_id: int | None = None) -> None:
        self.id_range = id_range
        self.pad_token_id = (pad_token_id if isinstance(pad_token_id, int)
                             and not isinstance(pad_token_id, bool)
                             and 0 <= pad_token_id < id_range else None)
        content = torch.arange(id_range)
        self.content = content if self.pad_token_id is None else content[content != self.pad_token_id]

    def random(self, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        """(batch, seq_len) content ids drawn uniformly."""
        picks = torch.randint(0, len(self.content), (batch, seq_len), generator=generator)
        return self.content[picks]

    def other(self, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Content ids that differ from `ids` at every position (a random non-zero shift of each
        id's index among the content ids)."""
        count = len(self.content)
        if count < 2:
            return ids.clone()
        index = torch.searchsorted(self.content, ids)
        shift = torch.randint(1, count, ids.shape, generator=generator)
        return self.content[(index + shift) % count]
