"""`audit()`: run every check of the gate on a model and collect an `AuditReport`.

    import decoder_audit as da
    report = da.audit(da.Decoder(da.preset("tiny-368")))          # white-box
    report = da.audit(hf_model, vocab_size=V, max_seq_len=T)        # black-box
    report.passed, report.first_failure, report.checks

The runner orders results by the seeds' diagnosis order (registry.py) and names the first
contract that broke. A check that raises, because the model raised inside it, fails with the
exception as its evidence; the gate itself does not crash. The user's model is never modified.

What a black box is told (`audit(model, vocab_size=V, ...)`):
- `max_seq_len` is a hard limit the model must enforce: max_seq_len + 1 tokens must be rejected.
  A model without one (RoPE, ALiBi, relative or recurrent positions) is audited with
  max_seq_len=None (overlength is listed as skipped), and every behavioural check then covers
  positions 0..intervention_len-1 (default 64; with a max_seq_len, min(max_seq_len, 64)).
- `input_vocab_size` declares the ids the model reads when that differs from V (an extra start
  token past the output vocabulary): input_vocab_size - 1 must run, input_vocab_size must be
  rejected.
- `pad_token_id` names an id the model reads as padding, not content (RoBERTa's positions skip
  it): the probes never draw it.

Memory: the checks run on the model itself, in its own dtype and on its own device (cast or move
the model first to audit it in another: `decoder-audit verify --dtype --device` does). No check
copies the model; what a check allocates (logits, a trace, a share of the gradients, one layer
of the float64 oracle) is freed before the next one starts. The peak stays near twice the
weights (measured in benchmarks/gate_scale.py: GPT-2 XL in float32 needs its 6.2 GB of weights
plus a few GB).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from ..config import DecoderConfig
from ..errors import ConfigError
from ..references.weights_map import WeightsMap
from . import tolerances
from .checks import attention, generation, inputs, model_loss, training
from .facts import ModelFacts, TrainingPath, model_facts
from .measure import return_freed_memory
from .peak import check_probes_fit
from .registry import CHECK_ORDER, CHECKS
from .report import AuditReport
from .result import CheckResult, crashed, skipped
from .sharding import RankFailed, RanksDisagree, agree_on_failure
from .state import host_rngs_kept
from .oom import Exhausted, GateOutOfMemory, out_of_memory
from .subject import Subject

# Collect cyclic garbage between checks only for models at least this big: it matters only
# when a leftover cycle could hold weight-sized tensors. The objects that existed before the
# audit are frozen first (gc.freeze), so each collection walks only what the checks made: a full
# one walks every Python object (0.15 s with torch alone, 0.6 s with transformers imported,
# once per check: 10% of GPT-2 small's gate).
GC_MIN_BYTES = 64 * 2**20


def audit(model: nn.Module, *, vocab_size: int | None = None, max_seq_len: int | None = None,
          progress: bool | Callable[[str, str], None] = False, seed: int = 0,
          checks: Iterable[str] | None = None,
          intervention_len: int | None = None,
          input_vocab_size: int | None = None, pad_token_id: int | None = None,
          training: TrainingPath | None = None, spec: DecoderConfig | None = None,
          weights_map: WeightsMap | None = None,
          facts: ModelFacts | None = None) -> AuditReport:
    """Run the acceptance gate on `model` and return its `AuditReport`.

    The facts that describe the model (V, max_seq_len as a hard limit, intervention_len,
    input_vocab_size, pad_token_id; see the module docstring) are read from its DecoderConfig or
    Hugging Face config and from these arguments (facts.py says which wins), or given whole as
    `facts` (from `model_facts`; then none of the others). `spec` declares the architecture of
    a module that is not ours (a DecoderConfig): its ledger, tie and float64 oracle are checked
    against it, its weights found by their names (`references.layouts`) or placed by
    `weights_map` (state dict -> canonical names). `training` says how a training run
    will call the model (batch size, length, precision): its paths are audited too. A black box that declares none needs
    `vocab_size`. `checks=[names]` runs only those checks (the rest are listed as skipped).
    `progress=True` draws a progress bar on stderr (which check, and how far a long one has
    got); `progress=fn` calls fn(check, step) instead, e.g. fn("oracle", "oracle backward:
    layer 3/12").
    """
    wanted = set(CHECK_ORDER if checks is None else _validate_names(checks))
    given = {"vocab_size": vocab_size, "max_seq_len": max_seq_len,
             "intervention_len": intervention_len, "input_vocab_size": input_vocab_size,
             "pad_token_id": pad_token_id, "training": training, "spec": spec,
             "weights_map": weights_map}
    if facts is None:
        facts = model_facts(model, **given)
    elif any(value is not None for value in given.values()):
        named = sorted(name for name, value in given.items() if value is not None)
        raise ConfigError(f"audit() takes facts= or the facts one by one, not both (also given: "
                          f"{named})")
    subject = Subject(model, facts, seed=seed)
    _bound_lengths(subject)
    if subject.dtype in tolerances.LOW_PRECISION:
        subject.notes.append(f"checks ran in {str(subject.dtype).removeprefix('torch.')}: effects "
                             "smaller than its rounding (a few parts in 10^3 of the logit scale) "
                             "are out of reach; audit in float32 to see them")
    if subject.sharded:
        subject.notes.append(f"sharded with FSDP2 over {dist.get_world_size()} ranks: every rank "
                             "ran these checks on the same probes; a whole weight or gradient "
                             "was gathered only where a check reads it")
    started = time.perf_counter()
    try:
        results = _run_checks(subject, wanted, progress, seed)
    except RankFailed as failed:
        raise RanksDisagree(str(failed)) from failed.__cause__
    return _report(facts.model, subject, results, time.perf_counter() - started)


def _bound_lengths(subject: Subject) -> None:
    """ConfigError before any call when the probe length cannot run: an intervention_len given
    past the model's max_seq_len (no probe may be longer than its limit), or one whose logits
    alone cannot fit in memory (peak.check_probes_fit)."""
    facts = subject.facts
    given = facts.origin.get("intervention_len") == "argument"
    if given and facts.max_seq_len is not None and facts.intervention_len > facts.max_seq_len:
        raise ConfigError(f"intervention_len={facts.intervention_len} exceeds max_seq_len="
                          f"{facts.max_seq_len}: no probe may be longer than the model's hard "
                          f"limit; give at most {facts.max_seq_len}")
    length = subject.probe_max
    what = (f"intervention_len={facts.intervention_len}" if facts.max_seq_len is None
            else f"max_seq_len={facts.max_seq_len}")
    check_probes_fit(facts.vocab_size, length, subject.dtype, subject.device, what=what)


def _probed(subject: Subject, wanted: set[str]) -> ModelFacts:
    """The facts found by calling the model, each probed once, and only when a wanted check
    needs it: where attention patterns can be read, whether the cache can be stepped, whether
    d loss / d input can be taken."""
    facts = subject.facts
    needed = {need for name in wanted for need in CHECKS[name].needs}
    changes: dict = {"probed": True}
    probes = [("length", ("length_limit", "length_error"), inputs.probe_length_limit),
              ("runs_in_train_mode", ("train_mode_reason",), training.probe_train_mode),
              ("loss_callable", ("loss_reason",), model_loss.probe_loss),
              ("has_attention", ("attention", "attention_reason"), attention.probe_attention),
              ("has_cache", ("convention", "cache_reason"), generation.probe_convention),
              ("has_input_gradient", ("input_gradient_reason", "backward_reason"),
               generation.probe_input_gradient)]
    needed.add("length")  # every behavioural check probes up to the longest length
    if "has_backward" in needed:  # found by the input gradient's probe (one backward)
        needed.add("has_input_gradient")
    for need, fields, probe in probes:
        if need not in needed and not (need == "has_cache" and "takes_mask" in needed):
            continue
        if need == "has_input_gradient" and not facts.has_input_embedding:
            continue
        try:
            found = probe(subject)
        except Exhausted as exc:
            raise GateOutOfMemory(f"the {need} probe", exc.cause) from exc.cause
        except Exception as exc:  # noqa: BLE001 - the gate never crashes on a broken model
            if out_of_memory(exc):
                raise GateOutOfMemory(f"the {need} probe", exc) from exc
            if subject.ranks_agree:
                agree_on_failure(subject.audit_key, f"probe {need}", exc)
            said = f"probing {need} raised {type(exc).__name__}: {exc}"
            subject.notes.append(said)
            if need == "has_attention":  # no pattern was read: attention_rows says why
                changes["attention_reason"] = said
            continue
        finally:
            subject.put_back(f"the {need} probe")  # a probe's calls leave the model as found
        changes.update(zip(fields, found if len(fields) > 1 else (found,)))
        subject.facts = replace(subject.facts, **changes)  # a later probe reads the earlier ones
    if changes.get("length_limit"):
        limit = changes["length_limit"]
        subject.notes.append(
            f"the model runs up to T={limit} and raises {changes['length_error']} at "
            f"T={limit + 1}: an undeclared hard limit, so every check stayed within {limit} "
            f"positions; declare it (max_seq_len={limit}, --max-seq-len {limit}) and `overlength` "
            f"checks that {limit + 1} tokens are rejected")
    return replace(facts, **changes)


def _run_checks(subject: Subject, wanted: set[str],
                progress: bool | Callable[[str, str], None], seed: int) -> dict[str, CheckResult]:
    """Every check in the diagnosis order (skipped unless wanted), with the model borrowed for
    the whole run and given back however the run ends."""
    results: dict[str, CheckResult] = {}
    subject.results = results  # checks may cite the verdicts before them
    collect = sum(p.numel() * p.element_size() for p in subject.parameters()) >= GC_MIN_BYTES
    rng_devices = [subject.device] if subject.device.type == "cuda" else []
    # the user's RNG streams (torch's, Python's, numpy's) are left untouched
    with torch.random.fork_rng(devices=rng_devices), host_rngs_kept():
        torch.manual_seed(seed)  # for models that draw random numbers themselves
        subject.prepare()
        try:
            if not subject.facts.probed:
                subject.facts = _probed(subject, wanted)
            with _progress(progress, len(wanted), subject) as advance, _frozen_before(collect):
                for name in CHECK_ORDER:
                    if name not in wanted:
                        results[name] = skipped(name, "not requested")
                        continue
                    advance(name)
                    if not CHECKS[name].shares_clean:
                        subject.forget_clean()
                    torch.manual_seed(seed)  # each check draws as if it ran alone
                    subject.running = f"the check {name!r}"
                    try:
                        results[name] = _run_one(name, subject)
                    finally:
                        subject.put_back(name)
                    if collect:  # whatever the check allocated goes before the next one
                        gc.collect()
                        return_freed_memory()
                advance(None)
        finally:
            subject.release()
            subject.notes += _state_notes(subject)
    return results


def _state_notes(subject: Subject) -> list[str]:
    """What the model's own forward changed in itself and in the process's settings during the
    audit, put back each time, and what could not be put back (a tensor too large to copy,
    written in place)."""
    notes = []
    if subject.state_moved:
        where = "; ".join(f"{after}: {', '.join(moved[:3])}"
                          + (f" (+{len(moved) - 3} more)" if len(moved) > 3 else "")
                          for after, moved in list(subject.state_moved.items())[:4])
        notes.append(f"the model changes its own state when called ({where}); the gate put it "
                     "back before every fresh call and after every probe and check, so the model "
                     "was given back as it was found")
    if subject.state_lost:
        notes.append("not put back as found: " + "; ".join(subject.state_lost[:4]))
    if subject.settings_moved:  # determinism fails on it where it runs (invariance.py)
        where = "; ".join(f"{after}: {', '.join(moved[:3])}"
                          for after, moved in list(subject.settings_moved.items())[:3])
        notes.append(f"the model's forward changes process-wide settings ({where}); the gate "
                     "put them back after every call and when the audit ended, so the process "
                     "was given back as it was found")
    return notes


@contextmanager
def _frozen_before(enabled: bool) -> Iterator[None]:
    """Within the block, the objects alive at its start are left out of gc's collections; they
    are given back to it at the end. Nothing is frozen when the caller froze objects already
    (their freeze is theirs to end)."""
    freeze = enabled and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


def _report(model_name: str, subject: Subject, results: dict[str, CheckResult],
            seconds: float) -> AuditReport:
    cfg = subject.cfg
    return AuditReport(
        checks=[results[name] for name in CHECK_ORDER],
        model=model_name,
        mode="white-box" if subject.whitebox else "black-box",
        dtype=str(subject.dtype).removeprefix("torch."),
        device=str(subject.device),
        vocab_size=subject.vocab_size,
        max_seq_len=subject.max_seq_len,
        seed=subject.seed,
        seconds=seconds,
        tokens=subject.tokens,
        calls=subject.calls,
        longest=subject.longest,
        notes=subject.notes,
        config=None if cfg is None else cfg.to_dict(),
        input_vocab_size=(None if subject.input_vocab_size == subject.vocab_size
                          else subject.input_vocab_size),
        facts=subject.facts,
    )


def _run_one(name: str, subject: Subject) -> CheckResult:
    check = CHECKS[name]
    missing = check.missing(subject.facts)
    if missing is not None:
        return skipped(name, missing)
    started = time.perf_counter()
    try:
        result = check.run(subject)
    except Exhausted as exc:  # the machine's limit, not the model's: the audit ends
        raise GateOutOfMemory(f"the check {name!r}", exc.cause) from exc.cause
    except Exception as exc:  # the model raised inside the check: that is evidence
        if out_of_memory(exc):
            raise GateOutOfMemory(f"the check {name!r}", exc) from exc
        if subject.ranks_agree:  # evidence only when every rank raised it
            agree_on_failure(subject.audit_key, f"check {name}", exc)
        result = crashed(name, exc)
    if not isinstance(result, CheckResult) or result.name != name:
        raise AssertionError(f"check {name} returned {result!r}")
    result.seconds = time.perf_counter() - started
    result.paths = result.paths or check.paths
    return result


def _validate_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; checks are {list(CHECK_ORDER)}")
    return names


class _progress:
    """Progress over the checks: which check runs, and how far a long one has got (checks report
    their steps through `Subject.progress`). `enabled=True`: a rich bar on stderr, shown once
    the gate has run for a second (a fast gate prints nothing extra; the command line asks for
    it only when stderr is a terminal); a callable: called as fn(check, step); False: nothing."""

    DELAY_S = 1.0

    def __init__(self, enabled: bool | Callable[[str, str], None], total: int,
                 subject: Subject) -> None:
        self.enabled, self.total, self.subject = bool(enabled), total, subject
        self.callback = enabled if callable(enabled) else None
        self.bar = None
        self.started = time.perf_counter()
        self.done = -1  # checks finished before the current one
        self.name = ""

    def __enter__(self):
        if not self.enabled:
            return lambda name: None
        self.subject.progress = self.step
        return self.advance

    def advance(self, name: str | None) -> None:
        self.done += 1
        self.name = name or "done"
        self.step("")

    def step(self, detail: str) -> None:
        if self.callback is not None:
            self.callback(self.name, detail)
            return
        if self.bar is None and time.perf_counter() - self.started >= self.DELAY_S:
            self._start()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, description=self.name, detail=detail)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("gate: {task.description:<18}"), BarColumn(bar_width=20),
                            TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                            TextColumn("{task.fields[detail]}"),
                            console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task(self.name, total=self.total, completed=self.done, detail="")

    def __exit__(self, *exc) -> None:
        self.subject.progress = lambda what: None
        if self.bar is not None:
            self.bar.__exit__(*exc)


__all__ = ["audit"]
