"""Plots of simulated runs (PNG). matplotlib is the optional ``plot`` extra: it is imported only when a plot is
drawn, and a missing one is a :class:`~worker_lib.core.errors.MissingExtraError` naming the extra."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from worker_lib.core.errors import ConfigError
from worker_lib.core.extras import require
from worker_lib.tools.simulator.measures import max_over_mean, p95_over_mean
from worker_lib.tools.simulator.model import STRATEGY_LABELS, CycleStats, SimResult


def require_matplotlib(*, what: str = "simulate --plot") -> None:
    """Import matplotlib with its file-only backend, or raise MissingExtraError naming the ``plot`` extra."""
    matplotlib = require("matplotlib", extra="plot", what=what)
    matplotlib.use("Agg")


def _plot_loads(ax: object, result: SimResult, *, title: str, reference: float | None) -> None:
    """Per-worker throughput ÷ fleet mean over cycles (envelope instead of lines beyond 40 workers)."""
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    xs = [c.cycle for c in result.cycles]
    ids = sorted({w for c in result.cycles for w in c.throughput})

    def ratio(c: CycleStats, w: str) -> float:
        mean = sum(c.throughput.values()) / len(c.throughput) if c.throughput else 0.0
        return c.throughput[w] / mean if mean > 0 and w in c.throughput else math.nan

    if len(ids) <= 40:
        for w in ids:
            ax.plot(xs, [ratio(c, w) for c in result.cycles], linewidth=1.0, alpha=0.8)
    else:
        for label, fn, style in (
            ("max", max_over_mean, "-"),
            ("p95", p95_over_mean, "--"),
        ):
            ax.plot(xs, [fn(c.throughput.values()) for c in result.cycles], style, label=label, color="tab:red")
        ax.plot(
            xs,
            [
                (min(c.throughput.values()) / (sum(c.throughput.values()) / len(c.throughput)))
                if c.throughput and sum(c.throughput.values()) > 0
                else 1.0
                for c in result.cycles
            ],
            ":",
            label="min",
            color="tab:blue",
        )
        ax.legend(loc="upper right", fontsize=7)
    for c in result.cycles:
        if c.balancing_ran:
            ax.axvline(c.cycle, color="0.85", linewidth=0.6, zorder=0)
        if c.events:
            ax.annotate(" ".join(c.events), (c.cycle, 0.02), xycoords=("data", "axes fraction"), fontsize=6)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", linewidth=1.0, label="LPT reference max/mean")
        ax.axhline(reference * 1.10, color="black", linestyle=":", linewidth=0.8)
    ax.axhline(1.0, color="0.5", linewidth=0.6)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("cycle", fontsize=8)
    ax.set_ylabel("worker throughput ÷ mean", fontsize=8)
    ax.tick_params(labelsize=7)


def plot_result(result: SimResult, path: str | Path) -> Path:
    """Per-worker load over cycles (top) and imbalance (bottom) of one simulation, written as PNG."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    target = check_png_path(path)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(2, 1))
    reference = result.reference_ratio()
    _plot_loads(
        top,
        result,
        title=(
            f"{STRATEGY_LABELS[result.strategy]}: {result.spec.shards} shards ({result.spec.skew.label()}) / "
            f"{result.spec.workers} workers, seed {result.spec.seed}"
        ),
        reference=reference,
    )
    xs = [c.cycle for c in result.cycles]
    bottom.plot(xs, [c.tp_max_over_mean for c in result.cycles], label="throughput max/mean")
    bottom.plot(xs, [c.cpu_max_over_mean for c in result.cycles], label="CPU max/mean")
    bottom.axhline(reference, color="black", linestyle="--", linewidth=1.0, label="LPT reference")
    moves = [c.moved + c.reassigned_expired for c in result.cycles]
    twin = bottom.twinx()
    twin.bar(xs, moves, alpha=0.25, color="tab:gray", label="moves")
    twin.set_ylabel("moves", fontsize=8)
    bottom.set_xlabel("cycle", fontsize=8)
    bottom.set_ylabel("max/mean", fontsize=8)
    bottom.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def plot_comparison(results: Sequence[SimResult], path: str | Path, *, title: str = "") -> Path:
    """One panel per strategy (same fleet): per-worker load over cycles, with the LPT reference."""
    require_matplotlib(what="plot_comparison")
    import matplotlib.pyplot as plt

    target = check_png_path(path)
    n = len(results)
    cols = 2 if n > 1 else 1
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), sharey=True, squeeze=False)
    for i, result in enumerate(results):
        ax = axes[i // cols][i % cols]
        totals = result.totals()
        _plot_loads(
            ax,
            result,
            title=(
                f"{STRATEGY_LABELS[result.strategy]} — final max/mean {result.final.tp_max_over_mean:.2f}, "
                f"{totals['moved'] + totals['reassigned_expired']} moves"
            ),
            reference=result.reference_ratio(),
        )
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def check_png_path(path: str | Path) -> Path:
    """``path`` as a PNG file name in an existing directory, or :class:`ConfigError`."""
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise ConfigError(f"--plot {str(path)!r}: expected a .png file name")
    if not target.parent.is_dir():
        raise ConfigError(f"--plot {str(path)!r}: directory {str(target.parent)!r} does not exist")
    return target
