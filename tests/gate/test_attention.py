"""attention_rows (gate/checks/attention.py): how keys map to positions."""

from __future__ import annotations


def test_future_keys_with_the_extra_keys_first():
    """attention._future_mask with k = S - T extra keys first (a cache, sink tokens): key j is
    position j - k, in query i's future when j - k > i; with them last, key j < T is position
    j and the extra keys are visible. Written out for T = 3, S = 5 (mutant: j + k > i)."""
    from decoder_audit.gate.checks import attention

    f, t = False, True
    # private: which keys count as future for a layout no public model yields exactly
    assert attention._future_mask(3, 5, extra_first=True).tolist() == [
        [f, f, f, t, t], [f, f, f, f, t], [f, f, f, f, f]]
    assert attention._future_mask(3, 5, extra_first=False).tolist() == [
        [f, t, t, f, f], [f, f, t, f, f], [f, f, f, f, f]]


def test_a_traced_sink_share_completes_each_row_to_one():
    """Our trace records each row's sink share (layers.{i}.attn.sink, attn_sinks): the visible
    keys plus that share must sum to 1. Rows of 0.6 and 0.3 + 0.3 with shares 0.4 pass; a share
    that does not complete its row (0.2 beside 0.6) fails, and so does the same pattern judged
    without its shares (the shares, not a looser tolerance, make the first pass)."""
    import torch

    from decoder_audit.gate.checks import attention

    pattern = torch.tensor([[[[0.6, 0.0], [0.3, 0.3]]]])  # (B, H, T, T) = (1, 1, 2, 2)
    _, problems = attention._judge_patterns([pattern], 2,
                                            sink_shares=[torch.tensor([[[0.4, 0.4]]])])
    assert problems == []
    _, problems = attention._judge_patterns([pattern], 2,
                                            sink_shares=[torch.tensor([[[0.4, 0.2]]])])
    assert problems and "sums to 1" in problems[0]
    _, problems = attention._judge_patterns([pattern], 2)
    assert problems and "sums to 1" in problems[0]


def test_a_decoder_with_heavy_sinks_passes_attention_rows_saying_so():
    """A sink of logit 3 takes most of each row (exp(3) against a few keys of score ~0): the
    rows over the keys sum to far less than 1, the check passes, its evidence names the sink
    layers, and every head's largest sink share is recorded."""
    import configs
    import torch

    import decoder_audit as da

    model = da.Decoder(configs.named("sinks-windowed"))
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.sinks.fill_(3.0)
    check = da.audit(model, checks=["attention_rows"])["attention_rows"]
    assert check.passed, check.detail
    assert "layers [0, 1]" in check.evidence["sinks"] and "sink" in check.detail
    assert min(head["max_sink_share"] for head in check.evidence["heads"]) > 0.5
