"""The paths training takes that the eval-mode checks do not: train mode, autocast, the shape of
a training batch.

  train_mode  the causal interventions and batch independence again with the model in train
              mode: dropout on, its masks made identical across the calls compared (the torch RNG
              is forked and reset to one seed before each call, and the calls compared have one
              shape), so a correct model's earlier rows still come out of identical arithmetic.
              A model that declares no dropout must give the same logits in train and eval mode;
              one with dropout modules must not (dropout left at 0 after an eval forward).
  checkpointing  (checkpointing.py) the checkpointed path as the run configured it.
  autocast    the same interventions under torch.autocast in the dtype training uses (bfloat16
              or float16),
              with the noise floor measured under autocast; the logits finite, also with the
              attention scores scaled up (white-box).
  the shape   (in `causal` and again in `train_mode`: trainshape.py, when the facts carry the
              training path) batches at the batch size and length training uses: a kernel
              that changes with the batch size (a leak only at B >= 16) or with the length (a
              leak only past the audit's own 64 tokens) is in reach.

The user's train/eval flags come back as they were (`Subject.in_train_mode`, and the runner's
release), and the user's RNG streams are untouched (the runner forks them for the whole audit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ...objective import logits_of
from .. import tolerances
from . import trainshape
from .invariance import clean_batch, confirm_in_float64, copies_noise, cut_changes, leaks_at
from ..measure import all_finite, sample_positions, value_scale
from ..result import CheckResult
from ..sharding import on_every_rank
from ..state import host_rngs_kept, seed_host_rngs
from ..subject import Subject

# Cuts of the train-mode and autocast interventions (the eval-mode `causal` samples 16).
PATH_CUTS = 8
# The seed every train-mode call starts from: the same dropout masks for every call compared.
DROPOUT_SEED = 1234
# Config fields that declare randomness in train mode in a Hugging Face (or similar) config:
# dropout, and the jitter noise routed-expert layers multiply their inputs by (PhiMoE).
_DROPOUT_FIELDS = ("dropout", "pdrop", "drop_rate", "jitter", "noise")


@contextmanager
def in_train_mode(s: Subject) -> Iterator[None]:
    """The model in train mode within the block; every module's flag as it was afterwards."""
    flags = [(module, module.training) for module in s.work.modules()]
    s.forget_clean()  # the shared clean runs were made in eval mode
    s.work.train()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


@contextmanager
def _train_mode_twin(twin: Subject) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """The float64 twin in train mode, called as the probe calls the model (`_seeded`)."""
    with in_train_mode(twin):
        yield _seeded(twin)


def _seeded(s: Subject) -> Callable[[torch.Tensor], torch.Tensor]:
    """s.logits with the RNGs reset to DROPOUT_SEED first (torch's, and Python's and numpy's,
    which some models draw their own dropout or layer drop from): two calls of one shape draw
    the same dropout masks, so only the inputs differ between them. `call.reseeded` becomes
    True when a call left torch's initial seed other than DROPOUT_SEED: the model reseeds the
    RNG itself (`torch.seed()` in its forward, as Reformer does), and no seed set before the
    call fixes its masks."""
    devices = [s.device] if s.device.type == "cuda" else []

    def call(ids: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=devices), host_rngs_kept():
            seed_host_rngs(DROPOUT_SEED)
            logits = s.logits(ids)
            call.reseeded = call.reseeded or torch.initial_seed() != DROPOUT_SEED
            return logits
    call.reseeded = False
    return call


def _unsteady(s: Subject, call, ids: torch.Tensor, first: torch.Tensor) -> dict | None:
    """None when one more seeded call of `ids` gives `first` bitwise; else how far identical
    calls spread over TRAIN_REPEATS more (the largest difference, and relative to the logit
    scale) and whether the model reseeds the RNG itself."""
    spread = float((call(ids) - first).abs().max())
    if spread == 0.0:  # one repeat shows any difference; the rest measure its spread
        return None
    for _ in range(tolerances.TRAIN_REPEATS - 1):
        spread = max(spread, float((call(ids) - first).abs().max()))
    scale = value_scale(first)
    return {"max_abs_diff": spread, "relative": spread / scale if scale else float("inf"),
            "reseeds": bool(call.reseeded)}


@contextmanager
def _dropout_off(s: Subject) -> Iterator[list[str]]:
    """Within the block (the model in train mode) its dropout modules are in eval mode, every
    other module still in train mode; yields their names. The flags come back after."""
    modules = [(name, m) for name, m in s.work.named_modules()
               if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
    for _, module in modules:
        module.training = False
    try:
        yield [name for name, _ in modules]
    finally:
        for _, module in modules:
            module.training = True


def declared_dropout(model: nn.Module) -> list[str]:
    """What declares dropout or other train-mode noise: Dropout modules with p > 0, a
    trainer's NEFTune noise on the input embedding, config fields (dropout, pdrop) > 0."""
    found = [f"{name or type(model).__name__}: {type(m).__name__}(p={m.p})"
             for name, m in model.named_modules()
             if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    # noise a trainer switches on in train mode: transformers' NEFTune (neftune_noise_alpha)
    # hooks the input embedding and marks it with its alpha
    found += [f"{name}: NEFTune embedding noise (alpha={m.neftune_noise_alpha})"
              for name, m in model.named_modules()
              if isinstance(getattr(m, "neftune_noise_alpha", None), (int, float))
              and m.neftune_noise_alpha > 0]
    config = getattr(model, "config", None)
    fields = vars(config) if config is not None and hasattr(config, "__dict__") else {}
    found += [f"config.{key}={value}" for key, value in sorted(fields.items())
              if any(word in key for word in _DROPOUT_FIELDS)
              and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0]
    return found


def _changes_mode(model: nn.Module) -> list[str]:
    """Modules other than dropout whose forward depends on the train flag (batch norm)."""
    return [type(m).__name__ for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _path_probe(s: Subject, call: Callable[[torch.Tensor], torch.Tensor], how: str,
                evidence: dict, noise: float | None = None,
                clean: torch.Tensor | None = None, twin_mode=None) -> list[str]:
    """Causal cuts and batch independence through `call`, judged exactly (up to the noise floor
    of identical rows measured through `call` itself, or `noise` when that floor is not
    rounding: in train mode identical rows at two batch indices get two dropout masks).
    `clean`: `call`'s logits of clean_batch where the caller has them. `twin_mode`: how the
    float64 twin runs `call`'s way (`_train_mode_twin`), where earlier rows that moved by a
    rounding-sized amount are confirmed as `causal` confirms them (identical rows can agree to
    the bit while rows beside other tokens round otherwise: routed experts' loops group the
    tokens each expert receives); None: not confirmed. Problems found, each naming `how`."""
    seq_len = s.intervention_len()
    cuts = sample_positions(seq_len, PATH_CUTS)
    # copies: row 0 beside copies of itself, the cuts' reference run once for both comparisons
    change, measured, scale, copies = cut_changes(s, cuts, call)  # (cuts, T), (T, V)
    noise = measured if noise is None else noise
    allowed = tolerances.same_shape(noise) * scale
    leaks = leaks_at(change, cuts, allowed)
    if leaks and twin_mode is not None:
        worst = max(leak["max_change"] for leak in leaks)
        evidence["float64"] = confirmed = confirm_in_float64(s, cuts, worst, scale, twin_mode)
        if confirmed is not None and confirmed["passed"]:
            leaks = []  # rounding, confirmed in float64
    # row 0 beside rows that differ at every position
    base = (call(clean_batch(s)) if clean is None else clean)[0]  # (T, V)
    moved = float((base - copies).abs().max())
    evidence.update(seq_len=seq_len, cuts=cuts, allowed=allowed, index_noise=noise,
                    leaks=leaks, batch_moved=moved, finite=all_finite(base))
    problems = []
    if leaks:
        first = leaks[0]
        problems.append(f"{how}: cut c={first['cut']}: earlier rows {first['moved_rows'][:8]} "
                        f"moved by up to {first['max_change']:.3g} (allowed {allowed:.1e}); the "
                        f"model reads future tokens {how} ({len(leaks)} of {len(cuts)} cuts)")
    if not moved <= allowed:
        problems.append(f"{how}: row 0 moved by {moved:.3g} when the other rows changed "
                        f"(allowed {allowed:.1e}): rows leak across the batch {how}")
    if not evidence["finite"]:
        problems.append(f"{how}: non-finite logits")
    return problems


def probe_train_mode(s: Subject) -> str:
    """Why the model cannot run in train mode at the probes' length (a fact, found by one call),
    or "": some models accept only the lengths they train at in train mode (Reformer: the
    product of its axial position shape). With a declared training path the check runs anyway,
    and such a refusal fails it: training would meet it."""
    if s.facts.training is not None:
        return ""
    ids = s.random_ids(1, s.intervention_len(), s.generator(42))
    with in_train_mode(s):
        try:
            _seeded(s)(ids)
        except Exception as exc:  # noqa: BLE001 - the model's refusal, in its own words
            said = (str(exc).strip().splitlines() or [""])[0][:200]
            return (f"the model refuses to run in train mode at T={ids.shape[1]} "
                    f"({type(exc).__name__}: {said})")
    return ""


def check_train_mode(s: Subject) -> CheckResult:
    evidence: dict = {"dtype": str(s.dtype), "dropout": declared_dropout(s.work)}
    ids = clean_batch(s)
    in_eval = s.logits(ids)
    # The kernels' own rounding noise, in eval mode: every comparison below is at one batch
    # index under one dropout mask, so that noise is all a correct model can show.
    noise = copies_noise(s)
    shape_noise = trainshape.noise(s) if s.facts.training is not None else 0.0
    with in_train_mode(s):
        call = _seeded(s)
        in_train = call(ids)
        unsteady = _unsteady(s, call, ids, in_train)  # identical calls, compared first
        with _dropout_off(s) if unsteady is not None else contextlib.nullcontext([]) as off:
            how, floor = _steadied(s, call, ids, unsteady, off, noise, evidence)
            # a steady call of the clean batch gives in_train again: the probe reuses it
            problems = _path_probe(s, call, how, evidence, floor,
                                   clean=in_train if unsteady is None else None,
                                   twin_mode=_train_mode_twin if unsteady is None else None)
            spread = (unsteady or {}).get("spread_checked", 0.0)  # a bounded check's floor
            problems += _at_training_shape(s, call, how, max(shape_noise, spread), evidence,
                                           steady=unsteady is None)
    differs = float((in_train - in_eval).abs().max())
    allowed = s.shape_tolerance() * value_scale(in_eval)
    evidence.update(train_vs_eval_max_abs=differs, train_vs_eval_allowed=allowed)
    other = _changes_mode(s.work)
    if not problems and not evidence["dropout"] and not other and unsteady is None \
            and not differs <= allowed:
        problems.append(f"train mode changes the logits by {differs:.3g} (allowed {allowed:.1e}) "
                        "but the model declares no dropout: its forward branches on "
                        "self.training")
    modules = [d for d in evidence["dropout"] if not d.startswith("config.")]
    if not problems and modules and differs == 0.0:
        problems.append(f"dropout modules ({modules[0]}, ...) but train mode gives the eval-mode "
                        "logits exactly: dropout is never applied in training")
    if problems:
        return CheckResult("train_mode", False, problems[0], evidence)
    how = (_unsteady_said(evidence["nondeterministic"]) if unsteady is not None
           else "dropout masks held fixed per call" if evidence["dropout"]
           else "no dropout: train mode = eval mode")
    bounded = unsteady is not None and "spread_checked" in unsteady
    moved = "move no more than identical calls do" if bounded else "unchanged"
    shape = evidence["training_shape"]
    at_shape = "" if shape is None else (
        f"; so do {shape['cuts']} cuts at {shape['named']}"
        + (", whose train-mode logits are the eval-mode ones `causal` probed, bit for bit"
           if shape.get("as_in_eval_mode") else ""))
    return CheckResult("train_mode", True, f"in train mode ({how}): {len(evidence['cuts'])} cuts "
                       f"of T={evidence['seq_len']} leave earlier rows {moved}, and row 0 is "
                       f"{moved} when the other rows change{at_shape}", evidence,
                       tolerances.same_shape(evidence["index_noise"]))


def _at_training_shape(s: Subject, call, how: str, noise: float, evidence: dict,
                       steady: bool) -> list[str]:
    """The training-shape probe (trainshape.py) through the train-mode `call`, when a training
    path is declared: a leak only `if self.training and B >= 16` is caught here, at the batch
    size training uses.

    Where `causal` probed that shape in eval mode and passed, and a `steady` train mode gives
    the eval-mode logits bit for bit on each of the probe's intervention batches (no dropout,
    no branch on self.training there), that verdict is train mode's too: one call per batch
    replaces the probe's copies and batches. Any other outcome runs the probe, the batch that
    differed reused."""
    kept, done = s.training_shape_eval, {}  # kept only where a training shape is declared
    if steady and kept is not None and kept["shape"]["passed"]:
        _, _, interventions = trainshape.batches(s)
        like = next(iter(s.parameters()), None)
        for k, (ids, _) in enumerate(interventions):
            logits = call(ids)  # (B, T, V)
            same = trainshape.fingerprint(logits) == kept["fingerprints"][k]
            if not (on_every_rank(same, logits if like is None else like)):
                done = {k: logits}
                break
        else:
            evidence["training_shape"] = {**kept["shape"], "as_in_eval_mode": True}
            return []
    shape = trainshape.probe(s, call, noise, done)
    evidence["training_shape"] = shape
    if shape is None or shape["passed"]:
        return []
    return [f"{how}: {trainshape.said(shape)}; the eval-mode probe of that shape and the "
            f"train-mode cuts at T={evidence['seq_len']} did not show it"]


def _steadied(s: Subject, call, ids: torch.Tensor, unsteady: dict | None, off: list[str],
              noise: float, evidence: dict) -> tuple[str, float]:
    """(how the interventions are run, their noise floor). A model whose identical train-mode
    calls differ (`unsteady`) cannot have its earlier rows compared exactly: with its dropout
    modules off (`off`, everything else in train mode) it may be steady again, and is then
    judged exactly; if not, only a movement beyond NOISE_MARGIN x the spread of identical
    calls is a leak (a difference must follow the changed tokens), and a smaller leak is out
    of reach, which the verdict and the notes say."""
    if unsteady is None:
        return "in train mode", noise
    evidence["nondeterministic"] = unsteady
    again = _unsteady(s, call, ids, call(ids)) if off else unsteady
    if again is None:
        unsteady["checked"] = f"with its {len(off)} dropout modules off"
        return "in train mode (dropout modules off)", noise
    unsteady["checked"] = "beyond the spread of identical calls"
    unsteady["spread_checked"] = again["relative"]
    s.notes.append(f"train_mode: {_unsteady_said(unsteady)}; exact train-mode causality was out "
                   "of reach")
    return "in train mode", max(noise, again["relative"])


def _unsteady_said(unsteady: dict) -> str:
    why = ("it reseeds torch's RNG in its forward (torch.seed())" if unsteady["reseeds"]
           else "it draws from an RNG no seed set before the call fixes")
    if unsteady["checked"].startswith("with"):
        return (f"nondeterministic: {why}, so identical calls differ by up to "
                f"{unsteady['max_abs_diff']:.3g}; judged exactly {unsteady['checked']}, every "
                "other module in train mode")
    bound = tolerances.same_shape(unsteady["spread_checked"])
    return (f"nondeterministic: {why}, so identical calls differ by up to "
            f"{unsteady['max_abs_diff']:.3g}; a leak is judged only beyond {bound:.2g} of the "
            f"logit scale ({tolerances.NOISE_MARGIN:g}x that spread): smaller ones are out of reach")


# The training path's precision -> the dtype its forward runs under autocast.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_autocast(s: Subject) -> CheckResult:
    device_type = s.device.type
    dtype = AUTOCAST_DTYPES[s.facts.training.precision]
    name = str(dtype).removeprefix("torch.")
    evidence: dict = {"autocast": f"torch.autocast({device_type!r}, {name})"}

    def call(ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, dtype=dtype):
            return s.logits(ids)

    s.forget_clean()  # the shared clean runs were made without autocast
    problems = _path_probe(s, call, "under autocast", evidence)
    if not problems and s.has_trace:
        problems += _stressed_finite(s, call, evidence, name)
    if problems:
        return CheckResult("autocast", False, problems[0], evidence)
    return CheckResult("autocast", True, f"under {evidence['autocast']}: {len(evidence['cuts'])} "
                       f"cuts of T={evidence['seq_len']} leave earlier rows unchanged, row 0 is "
                       "unchanged when the other rows change, logits finite"
                       + (" (also with attention scores scaled up)" if s.has_trace else ""),
                       evidence, tolerances.same_shape(evidence["index_noise"]))


def _stressed_finite(s: Subject, call, evidence: dict, dtype: str) -> list[str]:
    """With every layer's largest attention score brought to ~1e4, the autocast logits must be
    finite (a softmax or a mask constant that overflows in the 16-bit dtype gives inf or NaN)."""
    ids = clean_batch(s)
    _, trace = s.trace(ids)
    score_max = [float(trace[n].abs().max()) for n in trace if n.endswith(".attn.scores")]
    del trace
    with s.scaled_scores(score_max, STRESSED_SCORE) as stressed:
        if not stressed:
            return []
        finite = all_finite(call(ids))
    evidence["stressed_finite"] = finite
    return [] if finite else [f"under autocast with attention scores scaled to ~{STRESSED_SCORE:g}: "
                              f"non-finite logits (an overflow in {dtype})"]


STRESSED_SCORE = 1e4
"""Largest attention score of the autocast stress probe: far above a trained model's (tens), well
inside bfloat16's range (3e38) and float16's (65504), so only an overflowing formulation gives
inf or NaN."""
