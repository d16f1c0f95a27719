"""A sound stop for a model that reads its targets while it trains on text or data (`--text`,
`--data`), where no entropy floor is known.

No loss figure bounds a causal model on natural text: a file of one repeated line is learnt to
nearly 0 nats, and the unigram entropy bounds only a model that reads no context. What does hold
is a bound on the first positions of a window. The sampler draws each row's window at a uniform
offset of the training split, so the best any predictor that reads only x_0..x_t can do at
position t is the data's own conditional q*(x_{t+1} | x_0..x_t), counted exactly over every
offset the sampler can draw (a bigram table for t = 0, a trigram table for t = 1). For any such
predictor p (any weights, trained on anything before this batch, with dropout or not) the
likelihood ratio of a fresh batch,

    E = prod over rows b and positions t < K of  p(x_{t+1} | x_<=t) / q*(x_{t+1} | x_<=t),

has expectation at most 1 (each factor sums to 1 over x_{t+1} under q*: the chain rule, with the
rows drawn independently), so by Markov's inequality a causal model makes ln E >= ln(1/delta) with
probability at most delta. Over a run of S steps delta = FALSE_ALARM / S per step, so a causal
model is stopped with probability at most FALSE_ALARM in the whole run. A model that reads the
target x_{t+1} at position t gains ln(1/q*) nats per row and position, which a batch of 16 rows of
text (q* of a byte given the previous one: ~e^-2) turns into ~60 nats at step 1, against ~21.

The statistic is read from the training step's own logits (no extra forward): the path, the
batch size, the precision and the packing are training's. The tables are counted once, for a
training split of at most MAX_TOKENS tokens (above it the stop is not armed, and the run says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# Positions of each row judged: 0 (bigram table) and 1 (trigram table).
POSITIONS = 2
# A causal model is stopped with at most this probability over a whole run.
FALSE_ALARM = 1e-6
# The tables are counted for training splits up to this many tokens (int64 codes: 128 MiB).
MAX_TOKENS = 2**24


@dataclass(frozen=True)
class _Table:
    """Sorted codes of (context, next) and of contexts over every offset, with their counts."""

    pairs: np.ndarray
    pair_counts: np.ndarray
    contexts: np.ndarray
    context_counts: np.ndarray


class CausalBound:
    """The tables of q* over a training split (`ids`, the offsets 0..starts-1 the sampler draws)
    and the stop's threshold for a run of `steps` steps."""

    def __init__(self, ids: np.ndarray, starts: int, vocab: int, steps: int) -> None:
        self.vocab, self.steps = vocab, steps
        self.threshold = math.log(max(steps, 1) / FALSE_ALARM)
        ids = ids.astype(np.int64)
        self.tables = []
        context = ids[:starts].copy()  # x_0 at every offset
        for t in range(POSITIONS):
            pair = context * vocab + ids[t + 1:t + 1 + starts]  # (context, x_{t+1})
            self.tables.append(_Table(*np.unique(pair, return_counts=True),
                                      *np.unique(context, return_counts=True)))
            context = pair  # x_0..x_{t+1}: the next position's context

    def gain(self, logits: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
             ) -> tuple[float, float, int]:
        """(ln E of these rows, their summed -ln q*, the terms counted) from the logits (B, T, V)
        of inputs (B, T) against targets (B, T) (targets = inputs shifted by one). A row whose
        context is not in the tables (not drawn from this split) adds nothing."""
        positions = min(POSITIONS, inputs.shape[1])
        logp = F.log_softmax(logits[:, :positions].detach().float(), -1)  # (B, K, V)
        taken = logp.gather(-1, targets[:, :positions, None].to(logp.device))[..., 0].cpu()
        x = inputs[:, :positions].cpu().numpy().astype(np.int64)  # (B, K)
        y = targets[:, :positions].cpu().numpy().astype(np.int64)
        gain, best, terms = 0.0, 0.0, 0
        context = x[:, 0]
        for t in range(positions):
            if t:
                context = context * self.vocab + x[:, t]
            q = self._conditional(self.tables[t], context, context * self.vocab + y[:, t])
            known = q > 0
            gain += float((taken[:, t].double().numpy()[known] - np.log(q[known])).sum())
            best -= float(np.log(q[known]).sum())
            terms += int(known.sum())
        return gain, best, terms

    @staticmethod
    def _conditional(table: _Table, context: np.ndarray, pair: np.ndarray) -> np.ndarray:
        """q*(next | context) per row; 0 where the context or the pair was never drawn."""
        def count(codes, counts, wanted):
            at = np.clip(np.searchsorted(codes, wanted), 0, len(codes) - 1)
            return np.where(codes[at] == wanted, counts[at], 0)
        pairs = count(table.pairs, table.pair_counts, pair)
        contexts = count(table.contexts, table.context_counts, context)
        return np.where(contexts > 0, pairs / np.maximum(contexts, 1), 0.0)


def causal_bound(task, steps: int) -> tuple[CausalBound | None, str]:
    """The bound for a --text or --data task (its training split and sampler), or (None, why
    not): the counting task has its entropy floor instead; a split past MAX_TOKENS is not
    counted."""
    if task.entropy_floor() is not None:
        return None, ""
    if hasattr(task, "train_range"):  # --data: offsets lo + [0, hi - lo - T)
        lo, hi = task.train_range
        size, starts = hi - lo, hi - lo - task.seq_len
        read = lambda: np.asarray(task.tokens[lo:hi])  # noqa: E731
    elif hasattr(task, "train"):  # --text: offsets [0, N - T]
        size, starts = len(task.train), len(task.train) - task.seq_len
        read = lambda: task.train.numpy()  # noqa: E731
    else:
        return None, ""
    if size > MAX_TOKENS:
        return None, (f"no leak stop: the training split has {size:,} tokens, more than the "
                      f"{MAX_TOKENS:,} whose bigram and trigram tables are counted")
    if starts < 1 or task.seq_len < 1:
        return None, ""
    return CausalBound(read(), starts, task.vocab_size, steps), ""


def leak_message(step: int, gain: float, best: float, terms: int, bound: CausalBound,
                 loss: float, vocab_size: int) -> str:
    return (f"the model reads the targets it predicts: at step {step} the training batch's first "
            f"{POSITIONS} positions ({terms} predictions) had a log-likelihood {gain:.1f} nats "
            f"above the best causal predictor of this data (its exact conditionals over every "
            f"training window: {best / max(terms, 1):.3f} nats a prediction), and a causal model "
            f"gets {bound.threshold:.1f} nats above it with probability below {FALSE_ALARM:g} in "
            f"{bound.steps} steps; training loss {loss:.4g} (ln V = {math.log(vocab_size):.2f}). "
            "No probe of the gate reached this leak; the run stopped")
