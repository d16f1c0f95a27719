"""The gate's pictures: the dependency matrix of the causal check and the attention patterns.

The dependency matrix puts every cell where its positions are: a long context samples its cuts
(0, 1, ..., T-1 spread unevenly), so column c is drawn from c to the next sampled cut, on an axis
of input positions, and the diagonal row = cut is where it truly lies. Both pictures carry their
colour scale.

matplotlib is imported only when a picture is drawn (the Agg backend: no display needed).
"""

from __future__ import annotations

from pathlib import Path

from .result import CheckResult


def dependency_png(causal: CheckResult, path: Path) -> bool:
    """The causal check's dependency matrix: logit rows against the first changed position."""
    dep = causal.evidence.get("dependency")
    if not dep:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = np.array(dep["max_change"], dtype=float)  # (T rows, cuts)
    cols, rows = dep["cols"], dep["rows"]
    allowed = causal.evidence.get("allowed", 0.0)
    with np.errstate(divide="ignore"):
        shown = np.log10(np.where(matrix > 0, matrix, np.nan))
    fig, ax = plt.subplots(figsize=(max(6.5, min(3 + 0.45 * len(cols), 11)),
                                    max(4.5, min(2 + 0.3 * len(rows), 9))))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    # cell edges in positions: column j spans its cut to the next sampled one, row i its row
    x_edges, y_edges = _edges(cols), _edges(rows)
    image = ax.pcolormesh(x_edges, y_edges, np.ma.masked_invalid(shown), cmap=cmap,
                          shading="flat")
    ax.set_xlim(x_edges[0], x_edges[-1])
    ax.set_ylim(y_edges[-1], y_edges[0])  # row 0 on top, as a matrix is read
    # row = cut: every cell above this line (row < cut) must be white
    ax.plot([x_edges[0], x_edges[-1]], [x_edges[0], x_edges[-1]], color="0.5", lw=0.8, ls="--")
    # a red frame on every cell above the diagonal that moved: a causal leak
    for i, row in enumerate(rows):
        for j, cut in enumerate(cols):
            if row < cut and matrix[i, j] > allowed:
                ax.add_patch(plt.Rectangle((x_edges[j], y_edges[i]), x_edges[j + 1] - x_edges[j],
                                           y_edges[i + 1] - y_edges[i], fill=False, ec="red",
                                           lw=1.5))
    step_c = max(1, len(cols) // 16)
    step_r = max(1, len(rows) // 32)
    ax.set_xticks(cols[::step_c], [str(c) for c in cols[::step_c]])  # at the cuts' positions
    ax.set_yticks(rows[::step_r], [str(r) for r in rows[::step_r]])
    sampled = "" if len(cols) == len(rows) else f" ({len(cols)} sampled cuts)"
    ax.set_xlabel(f"first changed input position c (tokens c.. changed){sampled}")
    ax.set_ylabel("logit row t")
    verdict = "causal: lower-triangular" if causal.passed else "LEAK: red cells above the diagonal"
    ax.set_title(f"dependency matrix ({verdict})\ncolour = log10 largest logit change; white = exactly 0",
                 fontsize=10)
    fig.colorbar(image, ax=ax, label="log10 max |change in logits|")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _edges(positions: list[int]) -> list[float]:
    """Cell edges for sorted sampled positions: each cell from its position to the next one
    (the last one wide), centred on the integers as imshow draws them."""
    return [p - 0.5 for p in positions] + [positions[-1] + 0.5]


def attention_png(check: CheckResult, path: Path) -> bool:
    """The attention_rows check's patterns, one panel per layer and head."""
    patterns = check.arrays.get("patterns")
    if not patterns:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    # layers may differ in head count (hybrids) and in key count (extra or memory keys)
    n_layers, n_heads = len(patterns), max(p.shape[0] for p in patterns)
    n_layers_shown, n_heads_shown = min(n_layers, 12), min(n_heads, 16)
    size = 1.6 if n_layers_shown * n_heads_shown <= 64 else 1.0
    fig, axes = plt.subplots(n_layers_shown, n_heads_shown, squeeze=False,
                             # constrained: room for the shared colour bar beside the panels
                             layout="constrained",
                             # wide enough for the two-line title even with one or two heads
                             figsize=(max(5.5, 1.6 + size * n_heads_shown),
                                      1.0 + size * n_layers_shown))
    ids = check.arrays.get("ids", [])
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    image = None
    for layer in range(n_layers_shown):
        for head in range(n_heads_shown):
            ax = axes[layer][head]
            if head >= patterns[layer].shape[0]:
                ax.axis("off")
                continue
            pattern = np.asarray(patterns[layer][head], dtype=float)
            # exact zeros (masked keys) in grey, so a tiny nonzero leak still shows in colour
            image = ax.imshow(np.where(pattern == 0.0, np.nan, pattern), cmap=cmap, vmin=0,
                              vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    cut = "" if (n_layers_shown, n_heads_shown) == (n_layers, n_heads) else \
        f" (first {n_layers_shown} of {n_layers} layers, {n_heads_shown} of {n_heads} heads)"
    fig.suptitle(f"attention patterns, rows = queries, columns = keys, T={len(ids)}{cut}\n"
                 "grey = probability exactly 0 (future keys); colour 0..1 otherwise", fontsize=9)
    if image is not None:  # every panel shares vmin=0, vmax=1: one scale for all
        fig.colorbar(image, ax=axes, label="attention probability", shrink=0.8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
