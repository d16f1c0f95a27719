"""attention_rows (gate/attention.py): how keys map to positions."""

from __future__ import annotations


def test_future_keys_with_the_extra_keys_first():
    """attention._future_mask with k = S - T extra keys first (a cache, sink tokens): key j is
    position j - k, in query i's future when j - k > i; with them last, key j < T is position
    j and the extra keys are visible. Written out for T = 3, S = 5 (mutant: j + k > i)."""
    from decoder_audit.gate import attention

    f, t = False, True
    # private: which keys count as future for a layout no public model yields exactly
    assert attention._future_mask(3, 5, extra_first=True).tolist() == [
        [f, f, f, t, t], [f, f, f, f, t], [f, f, f, f, f]]
    assert attention._future_mask(3, 5, extra_first=False).tolist() == [
        [f, t, t, f, f], [f, f, t, f, f], [f, f, f, f, f]]
