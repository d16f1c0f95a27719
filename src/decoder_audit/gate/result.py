"""`CheckResult`: what one check of the gate found."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

# The checks, in the seeds' diagnosis order ("locate the first changed contract in this order:
# IDs and positions; blocks; final normalisation; tied logits; target alignment; loss"):
# first the input contract and the shape of what comes out, then the behavioural invariants of
# the blocks (a nondeterministic or batch-mixing model makes every later comparison
# meaningless, so those come first), then the white-box structure (ledger, tying, oracle), and
# last the alignment of logits with targets. The names are stable: reports and tests use them.
CHECK_ORDER = (
    "inputs", "overlength", "shapes", "raw_logits", "determinism", "batch_independence",
    "causal", "prefix", "attention_rows", "params", "tying", "tying_grad", "oracle",
    "loss_alignment",
)

CHECK_TITLES = {
    "inputs": "ids and lengths 1..max_seq_len run; bad ids rejected",
    "overlength": "max_seq_len + 1 tokens rejected, never cropped",
    "shapes": "logits (B, T, V); shape ledger of every trace site",
    "raw_logits": "forward returns raw, finite logits (no softmax)",
    "determinism": "same input twice in eval mode, identical logits",
    "batch_independence": "a row does not change when other rows do",
    "causal": "suffix changes leave earlier logits unchanged",
    "prefix": "a prefix alone equals the same rows of the full run",
    "attention_rows": "attention rows sum to 1, zero on future keys",
    "params": "measured parameter ledger reconciles with the config",
    "tying": "declared tying is one Parameter object",
    "tying_grad": "shared weight gradient = lookup + readout paths",
    "oracle": "fast forward equals the slow oracle (values, grads)",
    "loss_alignment": "inputs/targets shifted by one, rows aligned",
}


@dataclass
class CheckResult:
    """One check's verdict. `evidence` holds JSON-ready facts (which rows moved, by how much,
    for which cut); `tolerance` is the declared tolerance it was judged with (None when the
    check is exact or structural); `skipped` checks are listed but neither pass nor fail."""

    name: str
    passed: bool
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    tolerance: float | None = None
    skipped: bool = False
    arrays: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Large numeric arrays for the pictures (attention patterns); never serialised."""
    seconds: float = field(default=0.0, compare=False)
    """Wall time the check took (set by the runner)."""

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("pass" if self.passed else "FAIL")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "skipped": self.skipped,
            "detail": self.detail,
            "tolerance": self.tolerance,
            "evidence": self.evidence,
            "seconds": round(self.seconds, 3),
        }


def skipped(name: str, why: str) -> CheckResult:
    return CheckResult(name, True, f"skipped: {why}", {"reason": why}, None, skipped=True)


def crashed(name: str, exc: BaseException) -> CheckResult:
    """The model (or the gate) raised inside a check: the check fails, with the exception as
    evidence. The gate itself carries on."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return CheckResult(
        name, False, f"raised {type(exc).__name__}: {exc}",
        {"exception": type(exc).__name__, "message": str(exc),
         "traceback": "".join(frames[-6:])[-3000:]},
    )
