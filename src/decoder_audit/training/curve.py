"""A training run's loss curve as a PNG (matplotlib, imported only when it is drawn; the Agg
backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def loss_curve_png(rows: list[dict[str, Any]], path: Path, *, floor: float | None,
                   uniform: float) -> Path:
    """A training run's metrics rows as a PNG: training loss per step, evaluation loss, the
    entropy floor (when the task has one) and ln V (a uniform predictor's loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    train_rows = [r for r in rows if "loss" in r]
    ax.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], lw=1,
            label="train loss")
    evals = [r for r in rows if "eval_loss" in r]
    held_out = any("val_loss" in r for r in evals)  # text and token runs: a held-out split
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", ms=3,
                label="validation loss (right: perplexity)" if held_out else "eval loss")
    if held_out:  # the same curve read as perplexity = exp(loss) on the right-hand axis
        # clipped: matplotlib also maps tick positions outside the data (0, or far above it)
        right = ax.secondary_yaxis("right", functions=(lambda x: np.exp(np.minimum(x, 700.0)),
                                                       lambda p: np.log(np.maximum(p, 1e-300))))
        right.set_ylabel("validation perplexity")
    ax.axhline(uniform, color="grey", ls=":", label=f"ln V = {uniform:.3f} (uniform)")
    if floor is not None:
        ax.axhline(floor, color="green", ls="--", label=f"entropy floor = {floor:.4f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("training loss")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
