"""The acceptance gate: every check of the seeds run as one gate, on our models or anyone's.

`audit(model)` returns an `AuditReport` whose checks (a `CheckResult` each) come in the seeds'
diagnosis order; `report.first_failure` names the first contract that broke.
    registry.py    the one table of checks: name, title, family, function, what it needs
    runner.py      audit(): the working copy, the checks in order, the cost line
    facts.py       ModelFacts: what the gate knows of the model, decided once
    subject.py     the model under audit as every check sees it
    wrappers.py    what is audited inside DDP, torch.compile, FSDP2 and a PEFT model
    tolerances.py  every tolerance, declared and justified
    result.py      CheckResult; report.py AuditReport; render.py the text; pictures.py PNGs
One module per family of checks:
    inputs.py      inputs, overlength, shapes, raw_logits
    invariance.py  determinism, batch_independence, causal, prefix
    attention.py   attention_rows
    weights.py     params, tying, tying_grad
    training.py    train_mode, autocast
    reference.py   oracle
    alignment.py   loss_alignment
    batch.py       audit_batch: a collator's batches (labels, shift, pads, EOS/BOS, packing)
    documents.py   the documents a batch declares (position_ids, cu_seq_lens, 4-D masks)
    trainshape.py  the training shape: causal and batch independence at the run's (B, T)
Nothing outside this package imports a module of it other than through these names.
"""

from .batch import BatchReport, audit_batch
from .documents import spans as declared_documents
from .facts import ModelFacts, TrainingPath, input_embedding, model_facts
from .measure import allocate_large_blocks_apart
from .packing import packed_call
from .peak import GatePeak, check_gate_fits, gate_peak
from .registry import CHECK_ORDER, CHECK_TITLES, CHECKS, Check
from .render import print_report, to_json
from .report import AuditReport
from .result import CheckResult
from .runner import audit
from .oom import GateOutOfMemory
from .sharding import RanksDisagree, store_reports
from .tolerances import shape_change

__all__ = ["AuditReport", "BatchReport", "GatePeak", "allocate_large_blocks_apart", "check_gate_fits", "gate_peak", "CHECKS", "CHECK_ORDER", "CHECK_TITLES", "Check",
           "CheckResult", "GateOutOfMemory", "ModelFacts", "RanksDisagree", "store_reports", "TrainingPath", "audit", "audit_batch", "declared_documents", "input_embedding",
           "model_facts", "packed_call", "print_report", "shape_change", "to_json"]
