"""TRL's SFTTrainer with packing=True, gated: `python examples/trainers/sft.py`.

SFT packing (best-fit decreasing) sends padding-free rows: the documents of a batch in one row,
restarting position_ids, flash attention's cu_seq_lens. The gate audits the form the model reads
(position_ids for an eager or SDPA Llama), the bf16 autocast SFTConfig turns on, and the
checkpointing it enables; SFTTrainer computes its own loss, so the model's labels= loss is not
on this run's path. Given the source dataset, the gate counts what packing did to its examples:
BFD packing cuts those longer than max_length, which SFTConfig declares."""

from __future__ import annotations

import tempfile

from datasets import Dataset
from tiny import documents, tiny_llama, tokenizer
from trl import SFTConfig, SFTTrainer

from decoder_audit.integrations import gate_trainer


def main() -> None:
    args = SFTConfig(output_dir=tempfile.mkdtemp(prefix="gated-sft-"), packing=True,
                     max_length=32, per_device_train_batch_size=4, max_steps=10, report_to=[],
                     use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    source = Dataset.from_list(documents(lengths=(6, 40)))  # some longer than max_length
    trainer = SFTTrainer(model=tiny_llama(), args=args, processing_class=tokenizer(),
                         train_dataset=source)
    gate = gate_trainer(trainer, source=source)  # the source: for the data's lineage
    trainer.train()
    plan = gate.verdict.plan
    print(f"trained {trainer.state.global_step} steps, packed as {plan.path.pack_form} in rows "
          f"of up to {plan.path.seq_len} tokens, {plan.path.precision}, paths "
          f"{', '.join(plan.paths)}")
    for note in plan.notes:
        print(f"  note: {note}")
    (lineage,) = [c for c in gate.verdict.checks if c.name == "lineage"]
    print(f"  lineage: {lineage.detail}")


if __name__ == "__main__":
    main()
