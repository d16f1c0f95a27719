"""A PEFT LoRA model under the gate: `python examples/trainers/lora.py`.

audit_adapters audits the model as it trains (adapters active, their zero factors drawn so
there is something to check), its merged base against the base's own config as the spec, and
that a merge and an unmerge leave the logits equal. A LoRA model trained by the Trainer is gated
the same way by TrainerGate."""

from __future__ import annotations

import peft
from tiny import tiny_llama

from decoder_audit.integrations import audit_adapters


def main() -> None:
    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    report = audit_adapters(model)
    print("LoRA:", "PASSED (as it trains, merged, and the merge)" if report.passed else
          f"FAILED ({failures_by_audit(report)})")
    print("  the merge:", report.checks[0].detail)
    print("  as it trains, dead_parameters:", report.live["dead_parameters"].detail)
    print("  merged base:", report.merged.summary())
    tied = tiny_llama(tie_word_embeddings=True)
    untied = peft.get_peft_model(tied, peft.LoraConfig(r=4, target_modules=["q_proj"],
                                                       modules_to_save=["lm_head"]))
    print("modules_to_save=['lm_head'] on a tied model:", failures_by_audit(audit_adapters(untied)))


def failures_by_audit(report) -> str:
    """Each failed check under the audit it failed in: the model as it trains, its merged base,
    the merge itself ("as it trains: tying; merged base: params, tying"). A check can fail in
    both audits: named once, it would read as listed twice by mistake."""
    parts = [("as it trains", report.live.failures), ("merged base", report.merged.failures),
             ("merge", [c for c in report.checks if not c.passed])]
    return "; ".join(f"{label}: {', '.join(c.name for c in failed)}"
                     for label, failed in parts if failed) or "none"


if __name__ == "__main__":
    main()
