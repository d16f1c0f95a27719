"""transformers' Trainer with the gate in front: `python examples/trainers/trainer.py`.

    --break pad-eos    the collator of a tokenizer whose pad is its eos (every eos label masked)
    --break leak       a model whose logits read the next token

The gate reads the run's path from the trainer, audits the model on it and the first batches,
writes its report into output_dir/decoder-audit, and refuses (GateRefusal) before the first
optimizer step when a check of a path the trainer takes fails."""

from __future__ import annotations

import argparse
import tempfile

import torch
from tiny import documents, tiny_llama, tokenizer
from transformers import (DataCollatorForLanguageModeling, DataCollatorWithFlattening, Trainer,
                          TrainingArguments)

import decoder_audit as da
from decoder_audit.integrations import gate_trainer


class PeekingLlama(type(tiny_llama())):
    """A planted leak: every position's logits read the next input id."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                **kwargs):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, **kwargs)
        out.logits = out.logits + 30.0 * torch.nn.functional.one_hot(
            torch.roll(input_ids, -1, dims=1), out.logits.shape[-1])
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, out.logits.shape[-1])
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--break", dest="defect", choices=["pad-eos", "leak"])
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="gated-trainer-"))
    args = parser.parse_args()
    model = PeekingLlama(tiny_llama().config) if args.defect == "leak" else tiny_llama()
    collator = (DataCollatorForLanguageModeling(tokenizer(pad_is_eos=True), mlm=False)
                if args.defect == "pad-eos" else DataCollatorWithFlattening())
    trainer = Trainer(model=model, train_dataset=documents(), data_collator=collator,
                      args=TrainingArguments(output_dir=args.out, per_device_train_batch_size=4,
                                             gradient_accumulation_steps=2, max_steps=20,
                                             report_to=[], use_cpu=True, save_strategy="no",
                                             logging_steps=5, disable_tqdm=True))
    gate = gate_trainer(trainer)
    try:
        trainer.train()
    except da.GateRefusal as refusal:
        print(f"refused before step 1: {', '.join(refusal.failed)}\n  {refusal.detail}")
        return
    plan = gate.verdict.plan
    print(f"trained {trainer.state.global_step} steps on the path the gate audited: "
          f"{plan.path}, {plan.global_batch} rows a step, paths {', '.join(plan.paths)}")


if __name__ == "__main__":
    main()
