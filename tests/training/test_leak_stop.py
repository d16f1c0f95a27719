"""The leak stop of `--text` and `--data` training (training/leakstop.py): a model that reads its
targets in a training step, where no probe of the gate reaches, is stopped with the figures; a
causal model is never stopped, even on text it learns to nearly 0 nats."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from zoo_training import T, ReadsTargetsWhenTraining

from decoder_audit import train
from decoder_audit.errors import LeakageSuspected
from decoder_audit.training.leakstop import FALSE_ALARM, CausalBound

LETTERS = "abcdefghijklmnop"


@pytest.fixture
def random_text(tmp_path):
    """Letters drawn uniformly from 16: no causal model predicts one better than ln 16."""
    path = tmp_path / "letters.txt"
    path.write_text("".join(random.Random(0).choices(LETTERS, k=6000)))
    return path


def test_a_model_reading_its_targets_in_training_is_stopped_with_the_figures(random_text):
    model = ReadsTargetsWhenTraining()
    with pytest.raises(LeakageSuspected) as stopped:
        train(model, vocab_size=256, max_seq_len=T, text=str(random_text), batch_size=16,
              steps=300, lr=1e-2, warmup=0, progress=False, verbose=False)
    leak = stopped.value
    assert leak.step <= 40, leak.step  # long before the run's end
    # the causal predictor's figure: each letter given the one or two before it, in the text's
    # own counts (below ln 16 = 2.77: 6000 letters are a small sample of the 16^3 triples)
    assert leak.floor == pytest.approx(_conditional_entropy(random_text.read_text()), abs=0.2)
    threshold = math.log(300 / FALSE_ALARM)
    assert f"{threshold:.1f}" in str(leak) and f"{leak.loss:.4g}" in str(leak)


def _conditional_entropy(text: str) -> float:
    """Mean of H(x1 | x0) and H(x2 | x0 x1) over the training part's windows (90%), counted."""
    train_part = text[:int(len(text) * 0.9)]
    starts = len(train_part) - T
    total = 0.0
    for order in (1, 2):
        grams = Counter(train_part[s:s + order + 1] for s in range(starts))
        contexts = Counter(train_part[s:s + order] for s in range(starts))
        total += -sum(n / starts * math.log(n / contexts[g[:-1]]) for g, n in grams.items())
    return total / 2


def test_the_same_model_without_the_leak_trains_to_the_end(random_text):
    result = train(ReadsTargetsWhenTraining(leak=False), vocab_size=256, max_seq_len=T,
                   text=str(random_text), batch_size=16, steps=60, lr=1e-2, warmup=0,
                   progress=False, verbose=False)
    assert result.step == 60


def test_the_bound_of_a_causal_predictor_holds_on_fresh_batches():
    """The data's own conditionals (the best causal predictor at positions 0 and 1) score
    ln E = 0 exactly; the uniform predictor scores below it; a predictor handed the target
    scores ln(1/q*) a prediction above it."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, size=500)
    bound = CausalBound(ids, starts=len(ids) - 8, vocab=4, steps=10)
    starts = torch.as_tensor(rng.integers(0, len(ids) - 8, size=32))
    windows = torch.as_tensor(ids)[starts[:, None] + torch.arange(9)]  # (B, T + 1)
    inputs, targets = windows[:, :-1], windows[:, 1:]
    uniform = torch.zeros(32, 8, 4)
    gain, best, terms = bound.gain(uniform, inputs, targets)
    assert terms == 64 and gain == pytest.approx(64 * -math.log(4) + best)
    told = torch.full((32, 8, 4), -30.0).scatter(-1, targets[..., None], 30.0)
    gain, best, _ = bound.gain(told, inputs, targets)
    assert gain == pytest.approx(best, abs=1e-6) and gain > bound.threshold


def test_the_bound_of_a_prepared_dataset_counts_every_window_the_sampler_draws(tmp_path):
    """--data: the tables are counted over the offsets the sampler draws (lo .. hi - T - 1 of
    the training split); a drawn batch's q* equals the counts taken here from the tokens."""
    from decoder_audit.text.datasets import TokenDataset, prepare_dataset
    from decoder_audit.training.leakstop import causal_bound

    source = tmp_path / "letters.txt"
    source.write_text("".join(random.Random(1).choices(LETTERS[:6], k=3000)))
    prepare_dataset([source], "bytes", tmp_path / "data", val_fraction=0.1)
    task = TokenDataset(tmp_path / "data", T)
    bound, unarmed = causal_bound(task, steps=50)
    assert bound is not None and unarmed == ""
    inputs, targets = task.batch(torch.Generator().manual_seed(3), 16)
    _, best, terms = bound.gain(torch.zeros(16, T, 256), inputs, targets)
    lo, hi = task.train_range
    ids = np.asarray(task.tokens[lo:hi]).tolist()
    starts = hi - lo - T
    pairs = Counter((ids[s], ids[s + 1]) for s in range(starts))
    singles = Counter(ids[s] for s in range(starts))
    triples = Counter(tuple(ids[s:s + 3]) for s in range(starts))
    expected = 0.0
    for x, y in zip(inputs.tolist(), targets.tolist()):
        expected -= math.log(pairs[x[0], y[0]] / singles[x[0]])
        expected -= math.log(triples[x[0], x[1], y[1]] / pairs[x[0], x[1]])
    assert terms == 32 and best == pytest.approx(expected)
