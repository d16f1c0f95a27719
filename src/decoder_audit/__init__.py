"""decoder-audit: build decoder-only language models from one config and prove them correct
before training."""

from .accounting import Accounting, account
from .checkpoint import load_checkpoint, save_checkpoint
from .config import DecoderConfig
from .errors import (
    CheckpointError,
    ConfigError,
    ContextLengthError,
    DecoderInputError,
    InputShapeError,
    TokenIdError,
)
from .gate import AuditReport, CheckResult, audit
from .generate import Generated, generate
from .ledger import Ledger, LedgerRow, measured_ledger, parameter_ledger, reconcile
from .model import Decoder
from .oracle import oracle_logits
from .presets import preset, preset_names
from .references import (
    TorchTwin,
    decoder_from_twin,
    from_hf,
    load_hf_folder,
    save_hf_folder,
    to_hf,
    twin_from_decoder,
)
from .trace import Trace, run_with_trace
from .training import GateRefusal, TrainConfig, TrainResult, train

__version__ = "0.1.0"

__all__ = [
    "Accounting", "account",
    "CheckpointError", "ConfigError", "ContextLengthError", "Decoder", "DecoderConfig",
    "DecoderInputError", "InputShapeError", "Ledger", "LedgerRow", "TokenIdError", "Trace",
    "measured_ledger", "oracle_logits", "parameter_ledger", "preset", "preset_names", "reconcile",
    "run_with_trace",
    "TorchTwin", "decoder_from_twin", "from_hf", "load_checkpoint", "load_hf_folder",
    "save_checkpoint", "save_hf_folder", "to_hf", "twin_from_decoder",
    "GateRefusal", "TrainConfig", "TrainResult", "train",
    "AuditReport", "CheckResult", "audit",
    "Generated", "generate",
]
