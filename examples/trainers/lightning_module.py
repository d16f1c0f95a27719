"""Lightning with the gate: `python examples/trainers/lightning_module.py`.

A LightningModule holding a decoder (here a tiny Llama, stepping on its own labels= loss, so
model_loss=True); LightningGate finds it by its attribute name, reads the path from the trainer
and the first batch, and refuses before the first step on a failure."""

from __future__ import annotations

import tempfile

import lightning.pytorch as pl
import torch
from tiny import documents, tiny_llama, tokenizer
from transformers import DataCollatorWithFlattening

from decoder_audit.integrations import LightningGate


class CausalLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama()

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    loader = torch.utils.data.DataLoader(documents(), batch_size=4, shuffle=True,
                                         collate_fn=DataCollatorWithFlattening())
    gate = LightningGate("model", model_loss=True, tokenizer=tokenizer())
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, precision="bf16-mixed",
                         default_root_dir=tempfile.mkdtemp(prefix="gated-lightning-"),
                         callbacks=[gate])
    trainer.fit(CausalLM(), loader)
    print(f"trained {trainer.global_step} steps on {gate.verdict.plan.path}")


if __name__ == "__main__":
    main()
