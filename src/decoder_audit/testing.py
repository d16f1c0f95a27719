"""The gate as an assertion, for a user's own test suite:

    from decoder_audit.testing import assert_decoder

    def test_my_decoder_is_a_causal_decoder():
        assert_decoder(build_my_model(), vocab_size=1000, max_seq_len=None, intervention_len=64)

`assert_decoder(model, **audit_options)` runs `decoder_audit.audit(model, **audit_options)` and
raises `AssertionError` when any check fails; the message lists every failing check with its
evidence (what moved, where, by how much, against which tolerance), so the pytest output alone
says what broke. On success it returns the `AuditReport` (for further asserts).
"""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from .gate import AuditReport, audit

# Evidence entries longer than this (JSON characters) are shortened in the message.
EVIDENCE_CHARS = 240


def assert_decoder(model: nn.Module, **audit_options: Any) -> AuditReport:
    """Audit `model` (keyword options as `decoder_audit.audit`: vocab_size, max_seq_len,
    intervention_len, input_vocab_size, spec, weights_map, checks, seed) and raise
    AssertionError listing the failing checks with their evidence; return the report when every
    check passes."""
    report = audit(model, **audit_options)
    if not report.passed:
        raise AssertionError(failure_message(report))
    return report


def failure_message(report: AuditReport) -> str:
    """The failing checks of `report`, first failure first, each with its detail, tolerance and
    evidence; then the checks that were skipped and why (they neither passed nor failed)."""
    failures = report.failures
    lines = [f"{report.model} ({report.mode}, {report.dtype}) is not a correct causal decoder: "
             f"{len(failures)} of {len(report.checks)} checks failed "
             f"({', '.join(c.name for c in failures)})"]
    for check in failures:
        tolerance = "" if check.tolerance is None else f" [tolerance {check.tolerance:.1e}]"
        lines.append(f"- {check.name}: {check.detail}{tolerance}")
        for key, value in check.evidence.items():
            if key == "traceback":
                continue
            lines.append(f"    {key}: {_short(value)}")
    if report.skipped:
        lines.append("skipped: " + "; ".join(
            f"{c.name} ({c.evidence.get('reason', c.detail)})" for c in report.skipped))
    return "\n".join(lines)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + " ..."


__all__ = ["assert_decoder", "failure_message"]
