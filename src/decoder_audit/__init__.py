"""decoder-audit: build decoder-only language models from one config and prove them correct
before training."""

from .accounting import account
from .accounting.ledger import Ledger, LedgerRow, measured_ledger, parameter_ledger, reconcile
from .accounting.results import Accounting
from .config import DecoderConfig
from .errors import (
    CheckpointError,
    ConfigError,
    ContextLengthError,
    DecoderInputError,
    InputShapeError,
    LeakageSuspected,
    NonFiniteLogitsError,
    TokenIdError,
    TrainingDiverged,
)
from .gate import (
    AuditReport,
    BatchReport,
    CheckResult,
    ModelFacts,
    TrainingPath,
    audit,
    audit_batch,
)
from .generation.generate import Generated, generate
from .model.decoder import Decoder
from .model.presets import preset, preset_names
from .model.trace import Trace, run_with_trace
from .references.hf import from_hf, load_hf_folder, save_hf_folder, to_hf
from .references.oracle import oracle_logits
from .references.torch_twin import TorchTwin, decoder_from_twin, twin_from_decoder
from .storage.checkpoint import load_checkpoint, save_checkpoint
from .training import GateRefusal, TrainConfig, TrainResult, train

__version__ = "0.1.0"

__all__ = [
    "Accounting", "account",
    "CheckpointError", "ConfigError", "ContextLengthError", "Decoder", "DecoderConfig",
    "DecoderInputError", "InputShapeError", "LeakageSuspected", "NonFiniteLogitsError",
    "TrainingDiverged", "Ledger", "LedgerRow", "TokenIdError", "Trace",
    "measured_ledger", "oracle_logits", "parameter_ledger", "preset", "preset_names", "reconcile",
    "run_with_trace",
    "TorchTwin", "decoder_from_twin", "from_hf", "load_checkpoint", "load_hf_folder",
    "save_checkpoint", "save_hf_folder", "to_hf", "twin_from_decoder",
    "GateRefusal", "TrainConfig", "TrainResult", "train",
    "AuditReport", "BatchReport", "CheckResult", "ModelFacts", "TrainingPath", "audit",
    "audit_batch",
    "Generated", "generate",
]
