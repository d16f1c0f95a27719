"""loss_alignment (gate/checks/alignment.py)."""

from __future__ import annotations

import math

import zoo

import decoder_audit as da


def test_a_passing_loss_alignment_shows_the_pair_the_rows_and_the_loss():
    """The passing `loss_alignment` detail is what a user reads as proof of the shift: the seeds'
    input / target pair on tiny-368, the flattening (B=2, T=4: 8 rows of V) and the loss beside
    ln V = ln 8, which a fresh model's loss sits near (mutant 240: the detail was None)."""
    result = da.audit(zoo.decoder(zoo.TINY), checks=["loss_alignment"])["loss_alignment"]
    assert result.passed
    loss = result.evidence["loss"]
    assert abs(loss - math.log(8)) < 0.1  # near-uniform predictions of a fresh model
    assert result.detail == ("input: <bos> A B C / target: A B C <eos>; (B, T, V) -> (8, V) "
                             f"rows aligned; loss {loss:.4f} (ln V = 2.0794)")
