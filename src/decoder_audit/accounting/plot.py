"""The context-sweep picture: each group's forward FLOPs as T doubles (matplotlib, Agg)."""

from __future__ import annotations

from ..config import DecoderConfig
from .analytic import context_sweep
from .results import GROUP_SCALING, GROUPS


def plot_context_sweep(cfg: DecoderConfig, path, batch_size: int = 1, *, title: str = "",
                       seq_len: int | None = None) -> None:
    """Log-log PNG of each group's forward FLOPs as T doubles: linear groups solid, the
    quadratic group dashed; the model's max_seq_len is marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = 1 if cfg.max_seq_len <= 64 else 16
    points = context_sweep(cfg, batch_size, start=start)
    ts = [t for t, _ in points]
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    # Distinct markers and widths, so groups with equal FLOPs (e.g. projections and a 4D MLP
    # when F = 2D) still show as two lines.
    for name, marker, width in zip(GROUPS, "osD^", (4.0, 2.0, 2.0, 2.0)):
        quadratic = GROUP_SCALING[name] == "quadratic in T"
        ax.plot(ts, [flops[name] for _, flops in points], marker=marker, markersize=4,
                linestyle="--" if quadratic else "-", linewidth=width, alpha=0.9,
                label=f"{name} ({GROUP_SCALING[name]})")
    ax.plot(ts, [sum(flops.values()) for _, flops in points], color="black", linewidth=1,
            label="total forward matmul FLOPs")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ts, [f"{t:,}" for t in ts], rotation=45, fontsize=8)
    ax.minorticks_off()
    # Vertical markers, labelled in axes coordinates so they sit at the bottom of any y range.
    ax.axvline(cfg.max_seq_len, color="grey", linestyle=":", linewidth=1.5)
    ax.text(cfg.max_seq_len, 0.02, f" max_seq_len={cfg.max_seq_len:,}\n (right of it: formulas "
            "extrapolated)", transform=ax.get_xaxis_transform(), color="dimgrey", fontsize=8,
            va="bottom")
    if seq_len is not None and seq_len != cfg.max_seq_len:
        ax.axvline(seq_len, color="tab:red", linestyle=":", linewidth=1.5)
        ax.text(seq_len, 0.55, f" T={seq_len:,}", transform=ax.get_xaxis_transform(),
                color="tab:red", fontsize=8)
    ax.set_xlabel("context length T (doubling)")
    ax.set_ylabel(f"forward FLOPs (B={batch_size}, 2mnp per matmul)")
    ax.set_title(title or "forward matmul FLOPs per group as the context doubles")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
