"""Run by test_distributed.py under torchrun (2 CPU processes, gloo): a tiny Llama trained by
transformers' Trainer with TrainerGate, whose collator shifts the labels twice on rank 1 only.
Each rank writes what it saw into <out>/rank<N>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch.distributed as dist  # noqa: E402
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments  # noqa: E402
from zoo_integrations import documents, shifted_twice_collator, tiny_llama  # noqa: E402

import decoder_audit as da  # noqa: E402
import decoder_audit.integrations.gating as gating  # noqa: E402
from decoder_audit.integrations import gate_trainer  # noqa: E402

flatten = DataCollatorWithFlattening()


def collator(features):
    """Rank 1's batches have their labels shifted twice; rank 0's are right."""
    return shifted_twice_collator(features) if dist.get_rank() == 1 else flatten(features)


def main(out: str) -> None:
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=2,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                             logging_strategy="no", ddp_backend="gloo")
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=documents(),
                      data_collator=collator)
    gates = []
    audit_once = gating.run_gate

    def counted(*args, **kwargs):
        gates.append(1)
        return audit_once(*args, **kwargs)

    gating.run_gate = counted
    gate = gate_trainer(trainer)
    try:
        trainer.train()
        outcome = {"refused": None}
    except da.GateRefusal as refusal:
        outcome = {"refused": refusal.check, "failed": list(refusal.failed)}
    seen = {"rank": args.process_index, "world_size": args.world_size, "gates": len(gates),
            "model_report": gate.verdict.report is not None, "step": trainer.state.global_step,
            "global_batch": gate.verdict.plan.global_batch, **outcome}
    Path(out, f"rank{args.process_index}.json").write_text(json.dumps(seen))
    # Trainer leaves its gloo group up; one torn down at interpreter exit aborts a rank now and then
    # ("terminate called without an active exception"), so both ranks meet and end it here.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(os.environ.get("GATE_OUT") or sys.argv[1])
