"""The training shape: the causal and batch-independence interventions once more at the (B, T)
a training run calls the model with (`facts.training`), not at the audit's own short probes.

A kernel that changes with the batch size (a leak only at B >= 16) or with the length (a leak
only past 64 tokens, where the audit's own probes stop) is in reach only there. The probe runs:

  the copies        row 0 at every one of the B rows: the reference every row is compared with
                    at its own batch index, and the noise floor of identical rows;
  the interventions batches of the training shape whose rows are row 0 changed from a cut on
                    (rows before the cut must not move) beside row 0 itself (which must not move
                    when the other rows change). A training batch of few rows (one flattened row
                    of packed documents) gets several such batches, so that at least
                    MIN_SHAPE_CUTS cuts spread over its whole length.

The length is the run's, bounded only by a hard limit of the model (a longer row is rejected
in training as well) and by memory: the rows are cut first, then the length, to what the memory
available holds (`fit`), and the evidence says which (B, T) was audited, which the run trains
at, and why they differ. A shorter probe is never called the training shape.

`causal` runs the probe in eval mode and keeps its verdict, noise floor and the bits of its
logits on the Subject; `train_mode` runs it again through its train-mode call and carries the
eval-mode verdict where its logits are the same bits (training.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import tolerances
from ..measure import index_noise, sample_positions, value_scale
from ..peak import PREDICTION_MARGIN, memory_available
from ..subject import Subject

MIN_SHAPE_CUTS = 4
"""Cuts of the training-shape probe at the least: with fewer rows than cuts + 1 (one flattened
row of packed documents is common), the cuts go into several batches of the training shape."""

SHAPE_LOGITS_ALIVE = 3
"""(B, T, V) logits the probe holds at once: the copies, one intervention batch, and the
forward's own output before it is subtracted in place."""


@dataclass(frozen=True)
class Shape:
    """The (B, T) the probe runs at, the (B, T) the run trains at, and why they differ ("" when
    they do not)."""

    batch: int
    seq_len: int
    training_batch: int
    training_len: int
    why: str = ""

    @property
    def whole(self) -> bool:
        return (self.batch, self.seq_len) == (self.training_batch, self.training_len)

    def named(self) -> str:
        """"the training shape (B=8, T=110)", or what was audited instead and why."""
        if self.whole:
            return f"the training shape (B={self.batch}, T={self.seq_len})"
        return (f"B={self.batch}, T={self.seq_len}, short of the training shape "
                f"(B={self.training_batch}, T={self.training_len}: {self.why})")


def fit(s: Subject) -> Shape:
    """The (B, T) the probe runs at: the training path's, within the model's hard length limit
    (a longer row would be rejected in training too) and the memory available (rows cut first,
    then the length)."""
    training = s.facts.training
    batch, seq_len, why = training.batch_size, training.seq_len, []
    bound = s.facts.length_bound
    if bound is not None and seq_len > bound:
        seq_len = bound
        why.append(f"the model rejects inputs longer than {bound} tokens (its hard limit), "
                   f"so a row of {training.seq_len} would fail in training too")
    batch, seq_len, short = _within_memory(s, batch, seq_len)
    why += [short] if short else []
    return Shape(batch, seq_len, training.batch_size, training.seq_len, "; ".join(why))


def _within_memory(s: Subject, batch: int, seq_len: int) -> tuple[int, int, str]:
    """(B, T) cut to what the memory available on the model's device holds: the probe's logits
    (SHAPE_LOGITS_ALIVE x B x T x V) and one block's activations where the widths are known
    (accounting's `row_bytes`), within the prediction's margin. "" or why it was cut."""
    have, where = memory_available(s.device)
    if have is None:
        return batch, seq_len, ""
    per_token = _bytes_per_token(s, seq_len)
    budget = have / PREDICTION_MARGIN
    if batch * seq_len * per_token <= budget:
        return batch, seq_len, ""
    need = batch * seq_len * per_token
    rows = int(budget // (seq_len * per_token))
    said = (f"{batch} rows of {seq_len} tokens would take about {need / 1e9:.2f} GB, "
            f"{have / 1e9:.2f} GB is available on {s.device.type}{where}")
    if rows >= 1:
        return rows, seq_len, f"{said}: {rows} rows fit"
    length = max(1, int(budget // per_token))
    return 1, length, f"{said}: one row of {length} tokens fits"


def _bytes_per_token(s: Subject, seq_len: int) -> float:
    """The probe's bytes per token of the batch: its logits, and where the widths are declared
    (our DecoderConfig, a spec) one block's activations with an eager attention row of T."""
    e = s.dtype.itemsize
    logits = SHAPE_LOGITS_ALIVE * s.vocab_size * e
    cfg = s.facts.config or s.facts.spec
    if cfg is None:
        return logits
    qkv = (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim
    return logits + (3 * cfg.d_ff + 4 * cfg.d_model + qkv + cfg.n_heads * seq_len) * e


def batches(s: Subject) -> tuple[Shape, torch.Tensor, list[tuple[torch.Tensor, list[int | None]]]]:
    """(the shape, copies (B, T) of one row, the intervention batches: (ids (B, T), each row's
    cut or None)). With B >= 2 row 0 of every batch is the base row; each other row is the base
    changed from its cut on. The cuts spread over the whole length T."""
    shape = fit(s)
    batch, seq_len = shape.batch, shape.seq_len
    gen = s.generator(40)
    base = s.random_ids(1, seq_len, gen)  # (1, T)
    changed = s.other_ids(base, gen)
    first = 1 if batch > 1 else 0  # rows 1.. take the cuts; row 0 stays the base
    per_batch = batch - first
    cuts = sample_positions(seq_len, max(MIN_SHAPE_CUTS, per_batch, 2))  # spread needs two ends
    out = []
    for start in range(0, len(cuts), per_batch):
        ids = base.repeat(batch, 1)  # (B, T); rows past the last cut: the base
        row_cuts: list[int | None] = [None] * batch
        for row, cut in enumerate(cuts[start:start + per_batch], start=first):
            ids[row, cut:] = changed[0, cut:]
            row_cuts[row] = cut
        out.append((ids, row_cuts))
    return shape, base.repeat(batch, 1), out


def noise(s: Subject) -> float:
    """The noise floor of identical rows at the training shape, in eval mode (the floor a
    train-mode probe of that shape is judged by: there, identical rows at two batch indices
    get two dropout masks): the eval-mode probe's, where `causal` ran it."""
    if s.training_shape_eval is not None:
        return s.training_shape_eval["noise"]
    _, copies, _ = batches(s)
    return index_noise(s.logits(copies))


def probe(s: Subject, call: Callable[[torch.Tensor], torch.Tensor] | None = None,
          floor: float | None = None, done: dict[int, torch.Tensor] | None = None
          ) -> dict | None:
    """The probe of the module docstring, through `call` (default: eval mode; train mode in
    training.py), judged exactly up to the noise floor of the copies (or `floor`). `done`:
    logits of intervention batches the caller ran already, by index. None without a training
    path. The eval-mode probe is kept on the Subject (`training_shape_eval`: its verdict,
    noise floor and the bits of each intervention batch's logits) for train_mode to reuse."""
    if s.facts.training is None:
        return None
    run = s.logits if call is None else call
    shape, copies_ids, interventions = batches(s)
    s.progress(f"the training shape: B={shape.batch}, T={shape.seq_len}")
    copies = run(copies_ids)  # (B, T, V)
    floor = index_noise(copies) if floor is None else floor
    allowed = tolerances.same_shape(floor) * value_scale(copies[0])
    leaks, row0, prints = [], 0.0, []
    for k, (ids, row_cuts) in enumerate(interventions):
        moved = (done or {}).get(k)
        moved = run(ids) if moved is None else moved  # (B, T, V)
        prints.append(fingerprint(moved) if call is None else None)
        moved -= copies
        change = moved.abs_().amax(-1)  # (B, T)
        del moved
        leaks += [{"row": b, "cut": cut, "max_change": float(change[b, :cut].max())}
                  for b, cut in enumerate(row_cuts)
                  if cut and not change[b, :cut].max() <= allowed]
        if row_cuts[0] is None:  # row 0 is the base: it must not move
            row0 = max(row0, float(change[0].max()))
    found = {"batch": shape.batch, "seq_len": shape.seq_len,
             "training": {"batch": shape.training_batch, "seq_len": shape.training_len},
             "whole": shape.whole, "why": shape.why, "named": shape.named(),
             "cuts": sum(1 for _, cuts in interventions for c in cuts if c is not None),
             "allowed": allowed, "leaks": leaks, "row0_moved": row0,
             "passed": not leaks and row0 <= allowed}
    if call is None:  # the eval-mode probe, which train_mode may carry (training.py)
        s.training_shape_eval = {"shape": found, "noise": floor, "fingerprints": prints}
    return found


def fingerprint(tensor: torch.Tensor) -> str:
    """A digest of a tensor's bits: two runs compared bitwise without keeping the first (the
    training shape's (B, T, V) logits are hundreds of MB at a real vocabulary)."""
    data = tensor.detach().contiguous().cpu().flatten()
    return hashlib.blake2b(data.view(torch.uint8).numpy(), digest_size=16).hexdigest()


def said(shape: dict) -> str:
    """What a failed training-shape probe found, with its figures."""
    where = (f"row {shape['leaks'][0]['row']} moved before its cut c={shape['leaks'][0]['cut']}"
             f" by up to {shape['leaks'][0]['max_change']:.3g}: the model reads future tokens"
             if shape["leaks"] else
             f"row 0 moved by {shape['row0_moved']:.3g} when the other rows changed: rows leak "
             "across the batch")
    return f"at {shape['named']}, {where} (allowed {shape['allowed']:.1e})"
