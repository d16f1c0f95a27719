"""Every check of the registry says where its expectation comes from (`Check.expects`, the table
of docs/gate.md, which tests/test_docs.py holds to the registry): a check added without it fails
here. The words each kind of source is said in are those of the DESIGN principle "A check's
expectation never comes from the model it judges"."""

from __future__ import annotations

from decoder_audit.gate import CHECKS

# what an expectation may come from, in the registry's words
SOURCES = ("declared", "oracle", "weight", "definition", "rule", "relation", "second call",
           "second path", "analytic", "chain rule")


def test_every_check_says_where_its_expectation_comes_from():
    for check in CHECKS.values():
        assert check.expects.strip(), f"{check.name}: no expects= in gate/registry.py"
        assert any(word in check.expects for word in SOURCES), (check.name, check.expects)


def test_the_reworked_checks_name_their_independent_source():
    """router_aux_loss recomputes from each router's own weight; model_loss and padding hold the
    model to a second call, never to another output of the same forward."""
    assert "router's own weight" in CHECKS["router_aux_loss"].expects
    assert "second call" in CHECKS["model_loss"].expects
    assert "second call" in CHECKS["padding"].expects
