"""The gate in front of training, and the evidence shown before step 1.

The full gate (`decoder_audit.audit`) runs on the model exactly as it will be trained. Any failed
check of the path training takes raises `GateRefusal` naming the first: nothing is trained and no
file is written. There is no switch to skip it. A check that failed on generation's path alone
(the KV cache, left-padded prompts) is said and does not refuse training: a training step runs
neither, and `decoder-audit verify` still fails on it. Under torchrun rank 0 audits and every rank learns the
verdict from it; a sharded model (`train --shard`, FSDP2) is audited by every rank alike, sharded
as it will train, and rank 0 says the verdict.

The callbacks that gate the trainers people use (`decoder_audit.integrations`: transformers'
Trainer and TRL, Lightning) run the same `run_gate`, naming the paths their trainer takes (the
model's own labels= loss, "model loss", besides "training"): one way to gate a training run.

Which model this is, white-box or not, its V and max_seq_len and whether it is tied, are decided
once, by the gate's `model_facts` (in `prepare`), and handed to the gate as they are.

Before step 1, the evidence: one decoded input/target pair of the first batch (the loss
alignment) and, for a fresh model, the initial loss, which must lie within 10% of ln V (a model
that already "knows" the targets before training is leaking them; one far above ln V is broken,
unless the spread of its logits, weights drawn at a large scale, accounts for it: that is said,
not refused). A fresh model failing it is refused like a gate failure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.markup import escape
from torch import nn

from ..gate import AuditReport, ModelFacts, audit, input_embedding
from .distributed import RankInfo, share_from_main

# A fresh model is close to uniform over V: its loss must lie within this fraction of ln V.
INITIAL_LOSS_TOLERANCE = 0.10

Say = Callable[..., None]


class GateRefusal(RuntimeError):
    """Training refused: a gate check (or the initial-loss check) failed. Nothing was trained.
    `check` and `detail` are the first failure's; `failed` names every failing check."""

    def __init__(self, check: str, detail: str, report: Any = None, *,
                 failed: tuple[str, ...] = ()) -> None:
        self.failed = tuple(failed) or (check,)
        also = [name for name in self.failed if name != check]
        super().__init__(f"training refused: check {check!r} failed: {detail}"
                         + (f" (also failed: {', '.join(also)})" if also else ""))
        self.check, self.detail, self.report = check, detail, report


# The paths of the gate (gate.result.PATHS) decoder-audit's train takes: it computes the loss
# itself, so never the model's own ("model loss").
TRAIN_PATHS: tuple[str, ...] = ("training",)


def failures_on(report: AuditReport, paths: tuple[str, ...]) -> list[Any]:
    """The report's failed checks that affect any of `paths`, in diagnosis order."""
    return [c for c in report.failures if any(path in c.paths for path in paths)]


def run_gate(model: nn.Module, ranks: RankInfo, facts: ModelFacts, *, seed: int,
             say: Say, paths: tuple[str, ...] = TRAIN_PATHS) -> AuditReport | None:
    """Rank 0 audits the model with its facts (every rank decided the same facts before, from
    the same model: `prepare`); every rank learns the verdict; a failure of a check on one of
    `paths` (the ones the trainer takes) raises GateRefusal everywhere. A sharded model (FSDP2)
    is audited by every rank alike (each forward needs them all: gate/sharding.py), and rank 0
    says the summary. The report is rank 0's (None elsewhere)."""
    report, verdict, failed = None, [True, "", ""], ()
    if ranks.is_main or ranks.sharded:
        say("[bold]gate[/bold]: running the full audit before any training ...")
        start = time.perf_counter()
        try:
            report = audit(model, facts=facts, progress=False, seed=seed)
        except Exception as exc:  # the gate should never crash; if it does, nothing trains
            # sharded, a peer may be inside a collective: no verdict shared, the error raised
            if not ranks.distributed or ranks.sharded:
                raise
            verdict = [False, "gate", f"the gate itself raised {exc!r}"]
    if report is not None:
        # Training refuses a failure of a path it takes; a failure of generation's alone (the
        # KV cache, left padding) is said, and `decoder-audit verify` still fails on it.
        failures = failures_on(report, paths)
        failure = next(iter(failures), None)
        failed = tuple(c.name for c in failures)
        verdict = [failure is None, getattr(failure, "name", ""), getattr(failure, "detail", "")]
        _say_summary(report, time.perf_counter() - start, say, paths)
    passed, check, detail = share_from_main(ranks, verdict)
    report = report if ranks.is_main else None
    if not passed:
        raise GateRefusal(check, detail, report, failed=failed)
    return report


def _say_summary(report: AuditReport, seconds: float, say: Say,
                 paths: tuple[str, ...] = TRAIN_PATHS) -> None:
    ran = [c for c in report.checks if not c.skipped]
    passed = sum(1 for c in ran if c.passed)
    skipped = len(report.checks) - len(ran)
    say(f"gate: {passed}/{len(ran)} checks passed"
        + (f" ({skipped} skipped)" if skipped else "")
        + f" in {seconds:.2f} s")
    say("  " + ", ".join(c.name + ("" if c.passed else " [red]FAILED[/red]") for c in ran))
    for check in report.failures:
        if not any(path in check.paths for path in paths):
            say(f"  note: {check.name} failed on the {'/'.join(check.paths)} path only, which "
                f"training does not take: {escape(check.detail)}")


def check_tied(model: nn.Module, facts: ModelFacts, when: str) -> None:
    """A tied model's readout must be the embedding Parameter itself, not a copy (docs/defects.md
    A); the gate's facts say whether the model is tied and which module its readout is."""
    if not facts.tied or facts.readout is None:
        return
    readout = getattr(model.get_submodule(facts.readout), "weight", None)
    embedding = getattr(input_embedding(model), "weight", None)
    if readout is not embedding:
        raise RuntimeError(f"weight tying broken {when}: {facts.readout}.weight is no longer the "
                           "input embedding's Parameter")


def show_alignment(task: Any, generator: torch.Generator, say: Say) -> None:
    """One aligned input/target pair of the next batch, drawn from a copy of the sampler, so
    looking does not move it."""
    peek_in, peek_tgt = task.batch(torch.Generator().set_state(generator.get_state()), 1)
    say("loss alignment (first sequence of the next batch):")
    for line in task.describe_pair(peek_in[0], peek_tgt[0]):
        say("  " + line)


def check_initial_loss(loss: float, vocab_size: int, *, fresh: bool, report: Any,
                       say: Say, logit_std: float | None = None) -> None:
    """A fresh model's loss lies within INITIAL_LOSS_TOLERANCE of ln V, else GateRefusal naming
    the measured cause, unless the cause is the scale it was initialised at: then it is said
    and the run goes on. Any other model's loss is shown, not judged."""
    uniform = math.log(vocab_size)
    ok = abs(loss - uniform) <= INITIAL_LOSS_TOLERANCE * uniform
    # Far above ln V with logits spread widely enough to account for it (see below): a model
    # initialised at a large scale (PyTorch's nn.Embedding draws N(0, 1)) predicts confidently
    # and wrongly, and training brings it down. That is a choice of initialisation, not a
    # defect: such a model passes every check of the gate, so refusing it here refused correct
    # models (the running mean of tests/cli_support, with no length limit, initialised at N(0, 1)).
    scaled = (fresh and not ok and loss > uniform and logit_std is not None
              and logit_std ** 2 / 2 >= 0.5 * (loss - uniform))
    verdict = ("ok" if ok else "not a fresh model: not checked" if not fresh
               else "above ln V by the scale of its initialisation: not refused" if scaled
               else "[red]FAILED[/red]")
    say(f"initial loss {loss:.4f} vs ln V = {uniform:.4f} (tolerance "
        f"+/-{INITIAL_LOSS_TOLERANCE:.0%} = {INITIAL_LOSS_TOLERANCE * uniform:.3f}): {verdict}")
    if scaled:
        say(f"note: the logits have standard deviation {logit_std:.3g} at initialisation, "
            "enough to put a fresh model's loss this far above ln V: its weights were drawn at "
            "a large scale (PyTorch's default nn.Embedding draws N(0, 1)); initialised as GPT-2 "
            "does, N(0, 0.02), it would start near ln V")
    if not fresh or ok or scaled:
        return
    if loss < uniform:
        why = ("far below ln V before any training: the targets leak into the inputs, or the "
               "model was trained already (pass expect_fresh=False / train --checkpoint)")
    else:
        why = "far above ln V: the model is broken or not freshly initialised"
    raise GateRefusal("initial loss near ln V", f"a fresh model's loss is {loss:.4f}, more than "
                      f"{INITIAL_LOSS_TOLERANCE:.0%} away from ln V = {uniform:.4f}: {why}",
                      report)


# Why the spread of the logits explains the excess: logits drawn independently with standard
# deviation s give an expected loss of about ln V + s^2 / 2 (the log-sum-exp of V Gaussians less
# the target's), so when s^2 / 2 accounts for at least half of the excess, the scale of the
# initialisation is the measured cause.
