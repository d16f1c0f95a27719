"""One training run's gate, whoever runs the loop: what the callbacks of transformers' Trainer,
TRL and Lightning share.

A callback reads from its trainer how the run will call the model (a `RunPlan`: the
`TrainingPath`, the gate's paths the trainer takes, the global batch) and the first batches its
dataloader yields, and hands them to `RunGate`:

  before_training  the full gate on the model on that path (`training.gatekeeper.run_gate`, the
                   one `decoder-audit train` runs: rank 0 audits, every rank learns the
                   verdict), `audit_batch` on each first batch, the batches as sent
                   (`batch_as_sent`, sent.py), the model's own loss on them where the trainer
                   takes it (`batch_loss`), the loss before any step (`first_loss`: not near
                   zero, not below a declared floor), and the trainer's own checks of its data
                   (`lineage`). The evidence is written once, by rank 0, into
                   `<output_dir>/decoder-audit/` (evidence.py); any failure of a path the
                   trainer takes raises `GateRefusal` naming every failing check, before the
                   first optimizer step, and so does any other problem met before it
                   (`RunGate.refusing`: nothing raw leaves a callback).
  after_step       each step's loss against the declared floor, and in the first
                   `watch_steps` steps against near zero: `LeakageSuspected` with the figures.

Every process runs the gate once: the model audit on rank 0 (its verdict shared), the batches on
each rank (each has its own), and every rank learns every rank's batch failures, so all of them
refuse together.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..console import console, literal
from ..errors import ConfigError, LeakageSuspected
from ..gate import AuditReport, BatchReport, CheckResult, TrainingPath, audit_batch, model_facts
from ..objective import logits_of
from ..training.distributed import RankInfo
from ..training.gatekeeper import GateRefusal, run_gate
from ..training.run import refuse_below_floor
from .evidence import write_evidence
from .losses import LossCall, check_batch_loss, model_inputs, summed_loss
from .sent import check_batch_as_sent, in_eval_mode, sent_outputs

NEAR_ZERO = 0.01
"""A loss below this fraction of ln V in the first steps is near zero: the model puts about
(1/V)^0.01 of its probability, over 90% for V = 32000, on tokens it has not learnt to predict
yet. No model reaches it in a few steps on text unless it reads its targets (the seeds: "loss
near zero before training: target leakage or incorrect shift")."""
WATCH_STEPS = 10
"""The first steps whose loss is held against NEAR_ZERO."""


@dataclass(frozen=True)
class RunPlan:
    """How a trainer will call the model, read from the trainer (see the callbacks)."""

    path: TrainingPath
    """Rows and length of one forward (the first batch's (B, T)), precision, checkpointing and
    the packed form the collator sends."""
    paths: tuple[str, ...]
    """The gate's paths (gate.result.PATHS) the trainer takes: "training", and "model loss"
    when it calls the model's own labels= loss."""
    global_batch: int
    """Rows per optimizer step: per device x accumulation x world size."""
    accumulation: int = 1
    world_size: int = 1
    trainer: str = ""
    """The trainer's class name."""
    notes: tuple[str, ...] = ()
    """How the plan was read and what it could not audit, said in the report."""
    router_aux: bool = True
    """A routed model's load-balancing loss is added to the loss the trainer steps on (its
    config's output_router_logits, or the flag the trainer passes). Where it is not, a failure
    of `router_aux_loss` is reported and does not refuse: the run never adds that term."""

    def to_dict(self) -> dict[str, Any]:
        p = self.path
        return {"trainer": self.trainer, "paths": list(self.paths),
                "router_aux": self.router_aux,
                "global_batch": self.global_batch, "accumulation": self.accumulation,
                "world_size": self.world_size, "notes": list(self.notes),
                "training": {"batch_size": p.batch_size, "seq_len": p.seq_len,
                             "precision": p.precision, "checkpointing": p.checkpointing,
                             "pack": p.pack, "pack_form": p.pack_form}}


@dataclass
class Verdict:
    """What the gate found before training (rank 0's model report; this rank's batches)."""

    plan: RunPlan | None
    """None when the path could not be read (a refusal before it: `RunGate.refusing`)."""
    report: AuditReport | None
    batches: list[BatchReport]
    checks: list[CheckResult]
    """The run's own checks: batch_as_sent, batch_loss, first_loss."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(check, detail) of every failure on a path the trainer takes, in order."""
    adapters: Any = None
    """A PEFT model's adapter checks beside `report` (the live audit), on rank 0: the merged
    base's audit, adapter_merge, notes, and the state the adapters were found in
    (`AdapterGate`); None for any other model."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "trainer gate", "passed": not self.refused,
                "refused": [name for name, _ in self.refused],
                "plan": None if self.plan is None else self.plan.to_dict(),
                "model": None if self.report is None else {"passed": self.report.passed,
                                                           "summary": self.report.summary()},
                "checks": [c.to_dict() for c in self.checks],
                "batches": [b.to_dict() for b in self.batches],
                **({} if self.adapters is None else {"adapters": self.adapters.to_dict()})}


def _silent(*args: Any, **kwargs: Any) -> None:
    return None


def ranks_of(rank: int, world_size: int) -> RankInfo:
    """This process's place, as the trainer says it (the process group is the trainer's)."""
    return RankInfo(rank=rank, world_size=world_size)


def readable(batches: Sequence[Any], source: str) -> list[Mapping]:
    """The first batches, each a collator's mapping holding input_ids (B, T); TypeError naming
    what `source` (where they came from) gave otherwise."""
    for i, batch in enumerate(batches):
        if not isinstance(batch, Mapping) or "input_ids" not in batch:
            held = f" with keys {sorted(map(str, batch))}" if isinstance(batch, Mapping) else ""
            raise TypeError(f"{source} batch {i} as a {type(batch).__name__}{held}, not a "
                            "mapping holding input_ids (B, T)")
        batch_size_and_length(batch)
    return list(batches)


def batch_size_and_length(batch: Mapping[str, Any]) -> tuple[int, int]:
    """(B, T) of a collator's batch: its input_ids' shape."""
    ids = batch["input_ids"]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise TypeError(f"the trainer's first batch holds input_ids of "
                        f"{getattr(ids, 'shape', type(ids).__name__)}, not a (B, T) tensor")
    return int(ids.shape[0]), int(ids.shape[1])


Forward = Callable[[Mapping[str, Any]], Any]
"""Calls the model on one batch for its logits (no labels), as the trainer feeds it."""


class RunGate:
    """The gate of one training run (see the module docstring). `loss_floor`: a loss no model
    can go below on this data (its entropy), held against every step; `near_zero`: the fraction
    of ln V a loss of the first `watch_steps` steps must stay above (None: not watched);
    `audit_options`: facts for `model_facts` (vocab_size=, max_seq_len=, spec=, ...)."""

    def __init__(self, *, loss_floor: float | None = None, near_zero: float | None = NEAR_ZERO,
                 watch_steps: int = WATCH_STEPS, seed: int = 0,
                 audit_options: Mapping[str, Any] | None = None,
                 tokenizer: Any = None, labels_shifted: bool = False,
                 say: Callable[..., None] | None = None) -> None:
        if loss_floor is not None and not (math.isfinite(loss_floor) and loss_floor > 0):
            raise ValueError(f"loss_floor={loss_floor!r} must be a positive finite loss")
        if near_zero is not None and not 0 < near_zero < 1:
            raise ValueError(f"near_zero={near_zero!r} is a fraction of ln V, in (0, 1)")
        if watch_steps < 0:
            raise ValueError(f"watch_steps={watch_steps!r} must be >= 0")
        self.loss_floor, self.near_zero, self.watch_steps = loss_floor, near_zero, watch_steps
        self.seed, self.audit_options = seed, dict(audit_options or {})
        self.tokenizer, self.labels_shifted = tokenizer, labels_shifted
        self._say = say
        self.vocab_size: int | None = None
        self.router_aux_coef: float | None = None
        self.verdict: Verdict | None = None
        self.ranks = RankInfo()

    # ---- before the first step ---------------------------------------------------------------
    def before_training(self, model: nn.Module, plan: RunPlan, batches: Sequence[Mapping],
                        ranks: RankInfo, out_dir: str | Path | None, *,
                        loss_call: LossCall | None = None,
                        forward: Forward | None = None,
                        extra: Sequence[CheckResult] = ()) -> Verdict:
        """The gate before any step (module docstring), said on rank 0 (through `say`, or the
        console) and silent elsewhere. `loss_call` calls the model's own loss
        as the trainer will (None: the trainer does not take it); `forward` calls the model for
        logits as the trainer does (default: model(**batch) without its labels, as a Hugging
        Face model is fed); `extra`: the trainer's own checks of its data (lineage), judged
        with the others."""
        self.ranks = ranks
        self.say = (self._say or console(stderr=True).print) if ranks.is_main else _silent
        facts, plan = self._facts(model, plan)
        self.vocab_size, self.router_aux_coef = facts.vocab_size, facts.router_aux_coef
        report, refused = self._model_gate(model, facts, plan)
        adapter_gate = None if adapters_of(model) is None else self._adapter_gate(model, plan,
                                                                                   ranks)
        audited = [audit_batch(b, self.tokenizer, labels_shifted=self.labels_shifted)
                   for b in batches]
        forward = forward or (lambda batch: model(**model_inputs(batch, model)))
        checks = self._run_checks(model, batches, loss_call, forward, facts.vocab_size)
        checks += list(extra)
        mine = [(c.name, f"batch {i} of the trainer's dataloader: {c.detail}")
                for i, b in enumerate(audited) for c in b.checks if not c.passed]
        mine += [(c.name, c.detail) for c in checks if not c.passed and not c.skipped]
        if adapter_gate is not None and ranks.is_main:
            mine = adapter_gate.refused(plan.paths) + mine
        refused += _agreed(ranks, mine)
        self.verdict = Verdict(plan, report, audited, checks, refused, adapter_gate)
        written = write_evidence(self.verdict, out_dir) if ranks.is_main else None
        if refused:
            where = f"; the evidence is in {written}" if written else ""
            name, detail = refused[0]
            raise GateRefusal(name, detail + where, report,
                              failed=tuple(dict.fromkeys(n for n, _ in refused)))
        self.say(f"gate: the run passed before its first step ({len(batches)} batches audited)"
                 + (f"; evidence in {literal(written)}" if written else ""))
        return self.verdict

    def _adapter_gate(self, model: nn.Module, plan: RunPlan, ranks: RankInfo
                      ) -> AdapterGate | None:
        """A PEFT model's adapter checks beside the live audit (peft.adapter_checks: its merged
        base audited, adapter_merge), in the state the adapters are in, on rank 0 (on every
        rank of a sharded model, whose forwards need them all), said beside the live gate."""
        if not (ranks.is_main or ranks.sharded):
            return None
        from . import peft

        state = peft.adapter_state(model)
        try:
            merged, checks, notes = peft.adapter_checks(model, training=plan.path,
                                                        seed=self.seed, **self.audit_options)
        except Exception as exc:  # noqa: BLE001 - a refusal that names it, never a raw error
            merged, notes = None, []
            checks = [CheckResult("adapter_merge", False, f"the adapter checks raised "
                                  f"{type(exc).__name__}: {exc}", {"exception": repr(exc)})]
        gate = AdapterGate(state, merged, checks, notes)
        self.say(literal(gate.summary(plan.paths)))
        return gate

    def _facts(self, model: nn.Module, plan: RunPlan) -> tuple[Any, RunPlan]:
        """The model's facts on the plan's path. A packed form the forward does not declare is
        not an error here: the packing check then sends the forms it does declare, and
        batch_as_sent judges the batches in the form the collator sends (the plan's notes say
        so)."""
        try:
            return facts_of(model, training=plan.path, **self.audit_options), plan
        except ConfigError as exc:
            if plan.path.pack_form is None or "pack_form" not in str(exc):
                raise
            path = replace(plan.path, pack_form=None)
            said = (f"the collator sends packed rows as {plan.path.pack_form}, which "
                    f"{type(model).__name__}'s forward does not declare ({exc}): batch_as_sent "
                    "judges whether it takes them")
            plan = replace(plan, path=path, notes=plan.notes + (said,))
            return facts_of(model, training=path, **self.audit_options), plan

    def _model_gate(self, model: nn.Module, facts: Any, plan: RunPlan
                    ) -> tuple[AuditReport | None, list[tuple[str, str]]]:
        """run_gate on the model (a PEFT model with its zero adapter factors drawn: peft.py, a
        fresh adapter adds nothing to check, and its other factor would get no gradient): its
        report and the failures of the paths the trainer takes."""
        adapters = adapters_of(model)
        try:
            with nullcontext() if adapters is None else adapters.live(model, self.seed):
                return run_gate(model, self.ranks, facts, seed=self.seed, say=self.say,
                                paths=plan.paths), []
        except GateRefusal as refusal:
            report = refusal.report
            if report is None:
                return None, [(refusal.check, refusal.detail)]
            off = () if plan.router_aux else ("router_aux_loss",)  # a term the run never adds
            for name in (n for n in refusal.failed if n in off):
                self.say(f"  note: {name} failed, but this run's loss does not add the router "
                         "aux loss (output_router_logits is off): not refused")
            return report, [(c.name, c.detail) for c in report.checks
                            if c.name in refusal.failed and c.name not in off]

    def _run_checks(self, model: nn.Module, batches: Sequence[Mapping],
                    loss_call: LossCall | None, forward: Forward, vocab_size: int
                    ) -> list[CheckResult]:
        """batch_as_sent, then batch_loss (the model's own loss on the first batches, where the
        trainer takes it) and first_loss (their mean token loss before any step), all from one
        call of each batch as the trainer makes it (with the labels where it steps on the
        model's own loss, so a model that reads them shows it), in eval mode."""
        call = loss_call or (lambda batch: (forward(batch), None))
        with in_eval_mode(model):
            outputs, refused = sent_outputs(batches, call)
            sent = check_batch_as_sent(batches, [out for out, _ in outputs], refused,
                                       lambda ids: forward({"input_ids": ids}))
        if refused is not None:
            why = "skipped: the model cannot take the batches as sent (batch_as_sent)"
            return [sent] + [CheckResult(name, True, why, {}, skipped=True)
                             for name in ("batch_loss",) * (loss_call is not None)
                             + ("first_loss",)]
        results = [sent] + ([check_batch_loss(batches, outputs, self.router_aux_coef)]
                            if loss_call else [])
        losses = [summed_loss(batch, logits_of(out), self.labels_shifted)
                  for batch, (out, _) in zip(batches, outputs)]
        return results + [self._check_first_loss(losses, vocab_size)]

    def _check_first_loss(self, losses: list[tuple[float, int]], vocab_size: int
                          ) -> CheckResult:
        scored = sum(n for _, n in losses)
        if scored == 0:
            return CheckResult("first_loss", True, "skipped: the first batches score no label",
                               {}, skipped=True)
        mean = sum(total for total, _ in losses) / scored
        evidence = {"loss": mean, "tokens": scored, "ln_V": math.log(vocab_size),
                    "near_zero": self.near_zero, "loss_floor": self.loss_floor}
        low = self._low_loss(mean, step=0, what="loss before training")
        return CheckResult("first_loss", low is None, low[0] if low else (
            f"the loss on the first batches before any step is {mean:.4g} over {scored} "
            f"tokens (ln V = {math.log(vocab_size):.4g})"), evidence)

    def _low_loss(self, loss: float, *, step: int, what: str) -> tuple[str, float] | None:
        """(why `loss` at `step` stops the run, the limit it fell below): below the declared
        floor, or near zero within the first steps; None when it does not."""
        try:
            refuse_below_floor(loss, self.loss_floor, step, "training loss")
        except LeakageSuspected as below:
            return str(below), below.floor
        if self.near_zero is None or self.vocab_size is None or step > self.watch_steps:
            return None
        limit = self.near_zero * math.log(self.vocab_size)
        if loss < limit:
            return (f"the {what} at step {step} is {loss:.4g}, near zero: below "
                    f"{self.near_zero:g} x ln V = {limit:.4g} within the first "
                    f"{self.watch_steps} steps, which no model reaches without reading its "
                    "targets (target leakage or an incorrect shift)"), limit
        return None

    @contextmanager
    def refusing(self, check: str, what: str, ranks: RankInfo, out_dir: str | Path | None
                 ) -> Iterator[None]:
        """Within the block (a callback's work before the first step), any exception but the
        gate's own verdicts becomes a GateRefusal naming `check`, its detail `what` and the
        exception, with the evidence written (gate.json: the refusal and the error): nothing
        raw leaves a callback, and nothing trains."""
        try:
            yield
        except (GateRefusal, LeakageSuspected):
            raise
        except Exception as exc:  # noqa: BLE001 - every problem before step 1 is a refusal
            said = (str(exc).strip().splitlines() or [""])[0][:300]
            detail = f"{what}: {type(exc).__name__}: {said}"
            self.ranks = ranks
            self.verdict = Verdict(None, None, [], [CheckResult(check, False, detail, {
                "error": type(exc).__name__, "message": str(exc)[:2000]})], [(check, detail)])
            written = write_evidence(self.verdict, out_dir) if ranks.is_main else None
            where = f"; the evidence is in {written}" if written else ""
            raise GateRefusal(check, detail + where, None) from exc

    # ---- while training ----------------------------------------------------------------------
    def after_step(self, step: int, loss: float) -> None:
        """LeakageSuspected with the figures when this step's loss (averaged over the ranks,
        so every rank stops together) is below the declared floor or, within the first
        watch_steps, near zero."""
        loss = _mean_over_ranks(self.ranks, loss)
        low = self._low_loss(loss, step=step, what="training loss")
        if low is not None:
            raise LeakageSuspected(low[0] + "; the run stopped", step=step, loss=loss,
                                   floor=low[1])

    def watching(self, step: int) -> bool:
        """Whether a step's loss is still held against anything."""
        return self.loss_floor is not None or (self.near_zero is not None and
                                               step <= self.watch_steps)

    # ---- the evidence ------------------------------------------------------------------------



@dataclass
class AdapterGate:
    """What a trainer's gate adds for a PEFT model beside its live audit, labelled apart: the
    merged base's audit (failures named "merged:<check>") and adapter_merge."""

    state: str
    """How the adapters were found: "active", "merged" or "disabled" (peft.adapter_state)."""
    merged: AuditReport | None
    """The merged base's audit (None when the adapter checks raised: `checks` says what)."""
    checks: list[CheckResult]
    notes: list[str]

    def refused(self, paths: tuple[str, ...]) -> list[tuple[str, str]]:
        """(label, detail) of each failure on one of the trainer's `paths`."""
        found = [(f"merged:{c.name}", f"the merged base model: {c.detail}")
                 for c in (self.merged.failures if self.merged is not None else [])
                 if any(path in c.paths for path in paths)]
        return found + [(c.name, c.detail) for c in self.checks if not c.passed]

    def summary(self, paths: tuple[str, ...]) -> str:
        failed = [name for name, _ in self.refused(paths)]
        merged = "not audited" if self.merged is None else self.merged.summary()
        return (f"gate: the adapters ({self.state}): merged base {merged}; "
                + ", ".join(f"{c.name} " + ("skipped" if c.skipped else "passed" if c.passed
                                            else "FAILED") for c in self.checks)
                + (f" (refused: {', '.join(failed)})" if failed else ""))

    def to_dict(self) -> dict[str, Any]:
        merged = None if self.merged is None else {"passed": self.merged.passed,
                                                    "summary": self.merged.summary()}
        return {"state": self.state, "merged": merged,
                "checks": [c.to_dict() for c in self.checks], "notes": list(self.notes)}


def adapters_of(model: nn.Module) -> Any:
    """integrations.peft when `model` is a PEFT model (peft imported already, since the model is
    one), else None."""
    if "peft" not in sys.modules:
        return None
    from . import peft

    return peft if peft.is_adapted(model) else None


def facts_of(model: nn.Module, **options: Any) -> Any:
    """The gate's facts of the model a trainer trains (`model_facts`; a PEFT model's read
    through its base model: peft.adapted_facts)."""
    adapters = adapters_of(model)
    return (model_facts if adapters is None else adapters.adapted_facts)(model, **options)


def _mean_over_ranks(ranks: RankInfo, value: float) -> float:
    """`value` averaged over every rank (one scalar all_reduce; on this rank's GPU under NCCL)."""
    if not ranks.distributed or not dist.is_initialized():
        return value
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total) / ranks.world_size


def _agreed(ranks: RankInfo, failures: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every rank's failures (each audits its own batches), on every rank."""
    if not ranks.distributed or not dist.is_initialized():
        return failures
    gathered: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(gathered, failures)
    return [(name, f"rank {rank}: {detail}" if rank else detail)
            for rank, found in enumerate(gathered) for name, detail in found]
