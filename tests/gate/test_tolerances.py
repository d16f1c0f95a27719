"""The declared tolerances (gate/tolerances.py)."""

from __future__ import annotations

import torch


def test_the_normalised_sum_tolerance_is_four_eps_of_a_16_bit_dtype():
    """tolerances.normalised_sum: 1e-3, or 4 eps for a dtype whose eps is larger: bfloat16 has
    7 explicit mantissa bits (eps 2^-7), float16 10 (eps 2^-10) (mutant: 4 / eps, a tolerance of
    ~1e16 in float64, under which any row "sums to 1")."""
    from decoder_audit.gate import tolerances

    assert tolerances.normalised_sum(torch.bfloat16) == 4 * 2.0 ** -7
    assert tolerances.normalised_sum(torch.float16) == 4 * 2.0 ** -10  # 3.9e-3 > 1e-3
    assert tolerances.normalised_sum(torch.float32) == 1e-3
    assert tolerances.normalised_sum(torch.float64) == 1e-3
