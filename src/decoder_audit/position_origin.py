"""Where a model that takes position_ids numbers the first token of a row: the origin that the
position_ids of a padded batch must start from.

Most models number a row's tokens 0, 1, 2, ..., and a left-padded row gets the mask's cumulative
sum minus one (what Hugging Face `generate` passes). The fairseq lineage of encoders used as
decoders (RoBERTa, XLM-RoBERTa, CamemBERT, Data2VecText, X-MOD, ...) numbers them from
padding_idx + 1 and, given no position_ids, derives them itself from `input_ids != padding_idx`;
position_ids counted from 0 shift every one of its rows by padding_idx + 1 positions, padded or
not. Passing no position_ids instead is no cure: its cached steps number themselves from the
cache length, which counts the pads of a left-padded row.

So the origin is measured, not guessed from a class: the first candidate whose position_ids
o, o+1, ... reproduce the model's own forward (given no position_ids) on a row of content ids.
0 comes first, so a model numbering from 0 (and a model that ignores position_ids) keeps 0; a
relative scheme (RoPE, ALiBi) cannot tell origins apart and keeps 0 as well.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .objective import logits_of


def position_origin(model: nn.Module, ids: torch.Tensor, candidates: Iterable[int], *,
                    keyword: bool = True) -> int | None:
    """The first origin in `candidates` whose position_ids reproduce the model's own forward
    exactly on `ids` (1, T) of content ids (no padding id among them), or None when none does.
    `keyword`: the ids go in as input_ids= (the Hugging Face convention), else positionally."""
    seq_len = ids.shape[1]

    def run(**extra) -> torch.Tensor:
        return logits_of(model(input_ids=ids, **extra) if keyword else model(ids, **extra))

    with torch.no_grad():
        own = run()  # (1, T, V): the model's own numbering
        for origin in dict.fromkeys(candidates):  # unique, in order
            positions = torch.arange(origin, origin + seq_len, device=ids.device)[None]  # (1, T)
            given = run(position_ids=positions)  # (1, T, V)
            # exact: the same lookups and the same arithmetic give the same bits; a wrong origin
            # moves a learned table's logits at O(1), never at the level of rounding
            if given.shape == own.shape and torch.equal(given, own):
                return origin
    return None


def origin_candidates(pad_token_id: int | None) -> tuple[int, ...]:
    """0, and padding_idx + 1 when the model declares a padding id (fairseq's make_positions)."""
    if isinstance(pad_token_id, int) and not isinstance(pad_token_id, bool) and pad_token_id >= 0:
        return (0, pad_token_id + 1)
    return (0,)


__all__ = ["origin_candidates", "position_origin"]
