"""The gate inside Lightning (decoder_audit.integrations.lightning): a LightningModule holding a
tiny Llama trained gated; a planted leak, pad = eos masking every eos, labels shifted twice and a
checkpointing bug each stop it before the first optimizer step, naming the check; a loss that
collapses stops it with the figures."""

from __future__ import annotations

import json

import pytest

lightning = pytest.importorskip("lightning.pytorch")
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening  # noqa: E402
from zoo_integrations import (  # noqa: E402
    LeakyLlama,
    ReentrantLlama,
    documents,
    shifted_twice_collator,
    tiny_llama,
    tokenizer,
)

import decoder_audit as da  # noqa: E402
from decoder_audit.integrations import LightningGate  # noqa: E402


class Module(lightning.LightningModule):
    """A LightningModule holding a decoder, stepping on its own labels= loss. Its cache is off,
    as transformers' Trainer turns it off (TrainingArguments.use_cache=False)."""

    def __init__(self, model: torch.nn.Module, checkpointing: bool = False,
                 use_cache: bool = False) -> None:
        super().__init__()
        self.model = model
        model.config.use_cache = use_cache
        if checkpointing:
            model.gradient_checkpointing_enable()
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(module, out, *, collator=None, gate_options=None, **overrides):
    loader = torch.utils.data.DataLoader(documents(), batch_size=4, shuffle=True,
                                         collate_fn=collator or DataCollatorWithFlattening(),
                                         generator=torch.Generator().manual_seed(0))
    gate = LightningGate("model", model_loss=True, tokenizer=tokenizer(),
                         **(gate_options or {}))
    settings = dict(max_steps=2, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=str(out))
    trainer = lightning.Trainer(callbacks=[gate], **(settings | overrides))
    trainer.fit(module, loader)
    return trainer, gate


def test_a_lightning_module_holding_a_tiny_llama_trains_gated(tmp_path):
    trainer, gate = fit(Module(tiny_llama()), tmp_path, accumulate_grad_batches=2,
                        precision="bf16-mixed")
    plan = gate.verdict.plan
    first = gate.verdict.batches[0].shape
    # one flattened row; the length: the 4 longest documents end to end, the longest row the
    # dataloader can yield (a shuffle may put them together)
    longest = sum(sorted((len(d["input_ids"]) for d in documents()), reverse=True)[:4])
    assert (plan.path.batch_size, plan.path.seq_len) == (1, longest) and first[0] == 1
    assert plan.global_batch == 1 * 2 * 1 and plan.path.precision == "bf16"
    assert plan.path.pack_form == "position_ids" and plan.paths == ("training", "model loss")
    report = gate.verdict.report
    assert report.passed and not report["autocast"].skipped and not report["packing"].skipped
    assert trainer.global_step == 2
    assert (tmp_path / "decoder-audit" / "report.json").exists()


def _refused(module, out, **kwargs):
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    with pytest.raises(da.GateRefusal) as refusal:
        fit(module, out, **kwargs)
    assert module.steps == 0  # no training step ran, so no optimizer step
    assert all(torch.equal(before[n], p) for n, p in module.named_parameters())
    return refusal.value


def test_packing_with_the_cache_left_on_is_refused_naming_packing(tmp_path):
    """A genuine finding, not a planted defect: with its cache on (the config's default), a
    Llama reads packed documents across their boundaries, since transformers derives the
    documents from restarting position_ids only where no cache is in play; a LightningModule
    that does not turn the cache off, as the Trainer does, trains that leak."""
    refusal = _refused(Module(tiny_llama(), use_cache=True), tmp_path)
    assert refusal.failed == ("packing", "batch_as_sent")  # the probe rows, and the run's own
    assert "position_ids" in refusal.detail


def test_a_planted_leak_stops_lightning_before_its_first_step(tmp_path):
    assert _refused(Module(tiny_llama(LeakyLlama)), tmp_path).check == "causal"


def test_collator_bugs_stop_lightning_naming_the_check(tmp_path):
    pad_is_eos = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    assert _refused(Module(tiny_llama()), tmp_path / "a", collator=pad_is_eos).failed == (
        "last_token",)
    assert _refused(Module(tiny_llama()), tmp_path / "b",
                    collator=shifted_twice_collator).check == "shift"


def test_a_checkpointing_bug_stops_lightning_naming_checkpointing(tmp_path):
    """Checkpointing switched on in the decoder is the path its training takes: read from it."""
    refusal = _refused(Module(tiny_llama(ReentrantLlama), checkpointing=True), tmp_path)
    assert refusal.failed == ("checkpointing",)


def test_a_loss_that_collapses_stops_lightning_with_the_figures(tmp_path):
    module = Module(tiny_llama(LeakyLlama, after=2))
    with pytest.raises(da.LeakageSuspected) as stop:
        fit(module, tmp_path, max_steps=6)
    assert stop.value.step == 3 == module.steps
    assert stop.value.loss < stop.value.floor == pytest.approx(0.01 * torch.log(
        torch.tensor(37.0)).item())


def test_a_module_holding_two_decoders_must_name_the_one_to_audit():
    from decoder_audit.integrations.lightning import find_decoder

    module = Module(tiny_llama())
    module.draft = tiny_llama()
    with pytest.raises(da.ConfigError, match="draft") as unclear:
        find_decoder(module, None)
    assert "model" in str(unclear.value)
    assert find_decoder(module, "draft") is module.draft
    with pytest.raises(da.ConfigError, match="steps"):
        find_decoder(module, "steps")  # an int, not a module


class OwnLoop(lightning.LightningModule):
    """decoder-audit's own Decoder fed nanoGPT's (x, y) pairs: target t is input t + 1."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = da.Decoder(da.preset("tiny-368"))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        logits = self.decoder(inputs)  # (B, T, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _pairs(shift: int) -> torch.utils.data.DataLoader:
    cfg = da.preset("tiny-368")
    ids = torch.randint(0, cfg.vocab_size, (32, cfg.max_seq_len + 1),
                        generator=torch.Generator().manual_seed(0))
    targets = ids[:, shift:shift + cfg.max_seq_len]
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(ids[:, :cfg.max_seq_len], targets), batch_size=8)


@pytest.mark.parametrize("shift", [1, 0], ids=["targets-shifted-once", "targets-not-shifted"])
def test_our_decoder_fed_input_target_pairs_is_gated_and_an_unshifted_target_refused(
        tmp_path, shift):
    """The pairs are read in the labels convention, the decoder found as the module's one child:
    target t = input t + 1 trains, white-box; targets equal to the inputs (a loop that forgot
    the shift) are refused naming shift."""
    gate = LightningGate()
    trainer = lightning.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=str(tmp_path),
                                callbacks=[gate])
    if shift:
        trainer.fit(OwnLoop(), _pairs(shift))
        assert gate.verdict.report.mode == "white-box" and gate.verdict.report.passed
        assert trainer.global_step == 2
        return
    with pytest.raises(da.GateRefusal) as refusal:
        trainer.fit(OwnLoop(), _pairs(shift))
    assert refusal.value.check == "shift" and trainer.global_step == 0


class NeedsMask(transformers.LlamaForCausalLM):
    """A decoder whose forward requires attention_mask (a positional parameter)."""

    def forward(self, input_ids, attention_mask, labels=None, **kwargs):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                               labels=labels, **kwargs)


@pytest.mark.parametrize("case", ["forward-needs-a-mask", "to_batch-tuple", "to_batch-no-ids"])
def test_nothing_raw_leaves_lightning_gate_a_refusal_names_the_form(tmp_path, case):
    """A decoder that cannot take the batches as the flattening collator sends them (no
    attention_mask), and a to_batch= that makes no collator's mapping, were a raw TypeError or
    KeyError out of the callback: each is a GateRefusal naming batch_as_sent, with its evidence
    written, before any step."""
    model = tiny_llama(NeedsMask) if case == "forward-needs-a-mask" else tiny_llama()
    to_batch = {"to_batch-tuple": lambda item: (item["input_ids"], item["labels"], 1),
                "to_batch-no-ids": lambda item: {"ids": item["input_ids"]}}.get(case)
    refusal = _refused(Module(model), tmp_path,
                       gate_options={"to_batch": to_batch} if to_batch else None)
    assert "batch_as_sent" in refusal.failed
    verdict = json.loads((tmp_path / "decoder-audit" / "gate.json").read_text())
    assert verdict["passed"] is False and "batch_as_sent" in verdict["refused"]
    (sent,) = [c for c in verdict["checks"] if c["name"] == "batch_as_sent"]
    said = {"forward-needs-a-mask": "attention_mask", "to_batch-tuple": "to_batch= made batch 0 "
            "as a tuple", "to_batch-no-ids": "with keys ['ids']"}[case]
    assert said in sent["detail"]
