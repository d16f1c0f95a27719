"""The oracle's input contract (references/oracle.py): typed errors naming the value and the limit."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_decoder

import decoder_audit as da


@pytest.mark.parametrize("ids, error, says", [
    (torch.tensor([[1, -1]]), da.TokenIdError, r"token id -1 is outside \[0, vocab_size=8\)"),
    (torch.tensor([[1, 8]]), da.TokenIdError, r"token id 8 is outside \[0, vocab_size=8\)"),
    (torch.ones(1, 5, dtype=torch.long), da.ContextLengthError,
     r"T=5 is outside \[1, max_seq_len=4\]"),
    (torch.ones(1, 2, dtype=torch.long, device="meta"), da.InputShapeError,
     "on the meta device"),
    (torch.ones(1, 2), da.InputShapeError,
     r"integer tensor \(B, T\) with B >= 1, got \(1, 2\) of dtype torch.float32"),
    (torch.ones(2, 3, dtype=torch.bool), da.InputShapeError, r"got \(2, 3\) of dtype torch.bool"),
    (torch.ones(0, 3, dtype=torch.long), da.InputShapeError, r"B >= 1, got \(0, 3\)"),
    ([[1, 2]], da.InputShapeError, "got list of dtype None"),
])
def test_oracle_refuses_ids_outside_the_contract(ids, error, says):
    model = tiny_decoder()
    with pytest.raises(error, match=says):
        da.oracle_logits(model.state_dict(), model.config, ids)


def test_oracle_names_missing_weights():
    model = tiny_decoder()
    state = dict(model.state_dict())
    del state["layers.1.attn.v_proj.weight"], state["ln_final.bias"]
    with pytest.raises(da.CheckpointError, match=r"lack \['layers.1.attn.v_proj.weight', "
                                                 r"'ln_final.bias'\]"):
        da.oracle_logits(state, model.config, torch.tensor([[1, 3]]))
    ids = torch.tensor([[1, 3, 4, 5]])  # the contract holds: same numbers as before
    torch.testing.assert_close(da.oracle_logits(model.state_dict(), model.config, ids).float(),
                               model(ids), rtol=0, atol=1e-5)
