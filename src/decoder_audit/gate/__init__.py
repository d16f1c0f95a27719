"""The acceptance gate: every check of the seeds run as one gate, on our models or anyone's.

`audit(model)` returns an `AuditReport` whose checks (a `CheckResult` each) come in the seeds'
diagnosis order; `report.first_failure` names the first contract that broke.

The engine, here:
    registry.py    the one table of checks: name, title, family, function, what it needs, what
                   its expectation comes from
    runner.py      audit(): the working copy, the checks in order, the cost line
    facts.py       ModelFacts: what the gate knows of the model, decided once
    subject.py     the model under audit as every check sees it (state.py: put back as found;
                   wrappers.py: what is audited inside DDP, torch.compile, FSDP2, PEFT)
    tolerances.py  every tolerance, declared and justified; measure.py the measurements
    result.py      CheckResult; report.py AuditReport; render.py the text; pictures.py PNGs
    peak.py, oom.py, sharding.py   the gate's memory, out of memory, several ranks
    batch.py       audit_batch: a collator's batches (labels, shift, pads, EOS/BOS, packing);
                   documents.py the documents a batch declares (position_ids, cu_seq_lens, 4-D
                   masks)
The checks, one module per family of checks: checks/ (its __init__ says which check lives
where).
Nothing outside this package imports a module of it other than through these names.
"""

from .batch import BatchReport, audit_batch
from .documents import spans as declared_documents
from .facts import ModelFacts, TrainingPath, input_embedding, model_facts
from .checks.packing import packed_call
from .measure import allocate_large_blocks_apart
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
