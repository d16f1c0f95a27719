"""The acceptance gate: every check of the seeds run as one gate, on our models or anyone's.

`audit(model)` returns an `AuditReport` whose checks (a `CheckResult` each) come in the seeds'
diagnosis order; `report.first_failure` names the first contract that broke. One module per
family of checks:
    inputs.py      inputs, overlength, shapes, raw_logits
    invariance.py  determinism, batch_independence, causal, prefix
    whitebox.py    attention_rows, params, tying, tying_grad, oracle
    loss.py        loss_alignment, and the next-token helpers the trainer uses
    tolerances.py  every tolerance, declared and justified
    vocab.py       the tiny model's 8-token vocabulary
    runner.py      audit() and AuditReport; report.py renders them
"""

from .loss import flatten_for_loss, next_token_batch
from .result import CHECK_ORDER, CheckResult
from .runner import AuditReport, audit
from .vocab import TINY_VOCAB, decode, encode

__all__ = ["AuditReport", "CHECK_ORDER", "CheckResult", "TINY_VOCAB", "audit", "decode", "encode",
           "flatten_for_loss", "next_token_batch"]
