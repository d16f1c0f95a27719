"""The plain call a user writes, `da.audit(model, vocab_size=V)`, on decoders of an outside
library installed from the package registry (x-transformers): no false alarm, its genuine
failure named (it accepts float ids and runs them, where the input contract says reject), and
an option its modules keep that no spec expresses refused by name."""

from __future__ import annotations

import pytest
import torch

import decoder_audit as da

xt = pytest.importorskip("x_transformers")
V, T = 50, 32


def _wrapper(positions: str):
    torch.manual_seed(0)
    layers = xt.Decoder(dim=32, depth=2, heads=4, rotary_pos_emb=positions == "rotary")
    return xt.TransformerWrapper(num_tokens=V, max_seq_len=T, attn_layers=layers,
                                 use_abs_pos_emb=positions == "absolute").eval()


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
def test_x_transformers_decoders_fail_only_for_accepting_float_ids(positions):
    """The rotary decoder fails inputs alone; its modules are read as its spec (params and
    oracle pass) and its cache is driven as its AutoregressiveWrapper drives it (kv_cache
    passes). The absolute one scales its learned positions by dim ** -0.5, which no
    DecoderConfig expresses: params and oracle fail closed, naming pos_emb."""
    limit = T if positions == "absolute" else None  # a rotary model has no hard length limit
    report = da.audit(_wrapper(positions), vocab_size=V, max_seq_len=limit, intervention_len=16)
    refused = ["params", "oracle"] if positions == "absolute" else []
    assert [c.name for c in report.failures] == ["inputs", *refused], report.first_failure
    rejected = {r["probe"]: r["rejected"] for r in report["inputs"].evidence["rejections"]}
    assert rejected == {probe: probe != "float ids" for probe in rejected}
    assert all("pos_emb=AbsolutePositionalEmbedding" in report[name].detail for name in refused)
    assert report["kv_cache"].passed and report.facts.convention.name == "return_intermediates"
    assert report["tying"].passed and report["causal"].passed
