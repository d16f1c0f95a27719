"""The gate inside the trainers people use: callbacks built on the same gating machinery as
decoder-audit's own `train` (`training.gatekeeper.run_gate`), so there is one way to gate a run.

    gating.py    RunGate: the gate of one run, whoever runs the loop (the path, the first
                 batches, the model's own loss on them, the loss of the first steps, the report)
    losses.py    the first batches' loss: the definition, and the model's own loss against it
    sent.py      batch_as_sent: the first batches sent as the collator built them, each packed
                 document against itself alone
    lengths.py   the length a run trains at: the longest row its dataloader can yield
    lineage.py   what packing and truncation did to the source examples, judged (lineage)
    evidence.py  <output_dir>/decoder-audit: the report, gate.json, batches.md
    peek.py      the first batches of a dataloader, taken without moving the run
    trainer.py   transformers' Trainer and TRL's SFTTrainer: TrainerGate, gate_trainer
    lightning.py Lightning: LightningGate, a Callback for a LightningModule holding a decoder
    peft.py      PEFT adapters: audit_adapters (the base model's spec, the trainable adapters,
                 merge and unmerge)
    titan.py     torchtitan's decoders: TitanCall (called as their trainer calls them), spec_of

Each module imports its trainer's package only when it is used, so none of them is needed to
import this one: `from decoder_audit.integrations import TrainerGate` needs transformers,
`LightningGate` needs lightning, `audit_adapters` needs peft.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .gating import NEAR_ZERO, WATCH_STEPS, RunGate, RunPlan, Verdict

# public name -> the module of this package that defines it (imported on first use)
_LAZY = {"TrainerGate": "trainer", "gate_trainer": "trainer", "LightningGate": "lightning",
         "audit_adapters": "peft", "TitanCall": "titan", "spec_of": "titan"}

__all__ = ["NEAR_ZERO", "WATCH_STEPS", "RunGate", "RunPlan", "Verdict", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
