"""A PEFT LoRA model under the gate: `python examples/trainers/lora.py`.

audit_adapters audits the model as it trains (adapters active, their zero factors drawn so
there is something to check), its merged base against the base's own config as the spec, and
that a merge and an unmerge leave the logits equal. Failures are labelled as the trainers' gate
labels them: the live audit's by name, the merged base's "merged:<check>". An adapter on either
side of a tied embedding unties it; a model found merged is audited merged and given back bit
for bit. TrainerGate, SFTTrainer's gate and LightningGate run the same adapter checks beside
their live audit (tests/integrations/test_peft.py)."""

from __future__ import annotations

import peft
import torch
from tiny import tiny_llama

from decoder_audit.integrations import audit_adapters


def lora(model, targets, **options):
    return peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=targets, **options))


def main() -> None:
    model = lora(tiny_llama(), ["q_proj", "v_proj"])
    report = audit_adapters(model)
    print("LoRA:", "PASSED (as it trains, merged, and the merge)" if report.passed else
          f"FAILED ({', '.join(report.labels)})")
    print("  the merge:", report.checks[0].detail)
    print("  as it trains, dead_parameters:", report.live["dead_parameters"].detail)
    print("  merged base:", report.merged.summary())
    for what, targets, options in (
            ("LoRA on embed_tokens", ["embed_tokens", "q_proj"], {}),
            ("LoRA on lm_head", ["lm_head", "q_proj"], {}),
            ("modules_to_save=['lm_head']", ["q_proj"], {"modules_to_save": ["lm_head"]})):
        failed = audit_adapters(lora(tiny_llama(tie_word_embeddings=True), targets, **options))
        print(f"{what} of a tied model:", ", ".join(failed.labels))
    with torch.no_grad():  # a trained adapter (B no longer 0), merged for inference
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    model.merge_adapter()
    ids = torch.arange(12).view(2, 6)
    before = model(input_ids=ids).logits
    found = audit_adapters(model)
    print("merged:", found.checks[0].detail, "- logits as found, bit for bit:",
          torch.equal(model(input_ids=ids).logits, before), "- failed:", ", ".join(found.labels))


if __name__ == "__main__":
    main()
