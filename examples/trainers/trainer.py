"""transformers' Trainer with the gate in front: `python examples/trainers/trainer.py`.

    --break pad-eos     the collator of a tokenizer whose pad is its eos (every eos label masked)
    --break leak        a model whose logits read the next token
    --break late-leak   the same leak, weaker and only in rows longer than 64 tokens (documents of
                        20 to 30 tokens, four flattened into a row)
    --break mask        the flattening collator's rows with an all-ones attention_mask beside
                        their restarting position_ids (transformers then reads no boundary)
    --break checkpointing  gradient_checkpointing_kwargs={"preserve_rng_state": False} on a
                        model with attention dropout

The gate reads the run's path from the trainer (the longest row the dataloader can yield, the
batches as the collator sends them, checkpointing and precision as configured), audits the model
on it, the first batches and the data's lineage, writes its report into output_dir/decoder-audit,
and refuses (GateRefusal) before the first optimizer step when a check of a path the trainer
takes fails."""

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
    """A planted leak: every position's logits read the next input id (in rows longer than
    `past` tokens, by `strength`)."""

    past, strength = 0, 30.0

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                **kwargs):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, **kwargs)
        if input_ids.shape[1] > self.past:
            out.logits = out.logits + self.strength * torch.nn.functional.one_hot(
                torch.roll(input_ids, -1, dims=1), out.logits.shape[-1])
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, out.logits.shape[-1])
        return out


def with_all_ones_mask(features: list[dict]) -> dict:
    batch = DataCollatorWithFlattening()(features)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch


def setup(defect: str | None) -> tuple[torch.nn.Module, object, list[dict], dict]:
    """(model, collator, data, extra TrainingArguments) for the run, with `defect` planted."""
    model, collator, data, extra = tiny_llama(), DataCollatorWithFlattening(), documents(), {}
    if defect == "pad-eos":
        collator = DataCollatorForLanguageModeling(tokenizer(pad_is_eos=True), mlm=False)
    elif defect in ("leak", "late-leak"):
        model = PeekingLlama(model.config)
        if defect == "late-leak":
            model.past, model.strength, data = 64, 3.0, documents(lengths=(20, 30))
    elif defect == "mask":
        collator = with_all_ones_mask
    elif defect == "checkpointing":
        model = tiny_llama(attention_dropout=0.1)
        extra = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {
            "use_reentrant": False, "preserve_rng_state": False}}
    return model, collator, data, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--break", dest="defect",
                        choices=["pad-eos", "leak", "late-leak", "mask", "checkpointing"])
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="gated-trainer-"))
    args = parser.parse_args()
    model, collator, data, extra = setup(args.defect)
    trainer = Trainer(model=model, train_dataset=data, data_collator=collator,
                      args=TrainingArguments(output_dir=args.out, per_device_train_batch_size=4,
                                             gradient_accumulation_steps=2, max_steps=20,
                                             report_to=[], use_cpu=True, save_strategy="no",
                                             logging_strategy="no", disable_tqdm=True, **extra))
    gate = gate_trainer(trainer)
    try:
        trainer.train()
    except da.GateRefusal as refusal:
        print(f"refused before step 1: {', '.join(refusal.failed)}")
        print(f"  {refusal.detail.split('; the evidence is in')[0]}")
        return
    plan = gate.verdict.plan
    print(f"trained {trainer.state.global_step} steps on the path the gate audited: "
          f"{plan.path}, {plan.global_batch} rows a step, paths {', '.join(plan.paths)}")
    for note in plan.notes:
        print(f"  {note}")
    for check in gate.verdict.checks:
        print(f"  {check.name}: {check.detail}")


if __name__ == "__main__":
    main()
