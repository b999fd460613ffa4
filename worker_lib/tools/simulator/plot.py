"""Plots of simulated runs (PNG). matplotlib is the optional ``plot`` extra: it is imported only when a plot is
drawn, and a missing one is a :class:`~worker_lib.core.errors.MissingExtraError` naming the extra."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worker_lib.core.errors import ConfigError
from worker_lib.core.extras import require
from worker_lib.tools.simulator.inputs import STRATEGY_LABELS
from worker_lib.tools.simulator.model import CycleStats, SimResult


def require_matplotlib(*, what: str = "simulate --plot") -> None:
    """Import matplotlib with its file-only backend, or raise MissingExtraError naming the ``plot`` extra."""
    matplotlib = require("matplotlib", extra="plot", what=what)
    matplotlib.use("Agg")


LEGEND_WORKERS_MAX = 10
"""Up to this many workers each get a line and a legend entry; a larger fleet is drawn as a band (min to max) with
its p95 and median, which stays readable at 100 workers and more."""


def _ratios(c: CycleStats) -> dict[str, float]:
    mean = sum(c.throughput.values()) / len(c.throughput) if c.throughput else 0.0
    return {w: v / mean for w, v in c.throughput.items()} if mean > 0 else {}


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def event_text(note: str) -> str:
    """A cycle's event note as words: ``+w004`` (joined), ``-w002`` (killed), ``split 000007`` as it is."""
    if note.startswith("+"):
        return f"joined {note[1:]}"
    if note.startswith("-"):
        return f"killed {note[1:]}"
    return note


def _mark_cycles(ax: Any, result: SimResult) -> None:
    """Rebalancing passes as faint lines, scripted events as labelled red lines (one legend entry each kind)."""
    balancing = [c.cycle for c in result.cycles if c.balancing_ran]
    for n, cycle in enumerate(balancing):
        ax.axvline(cycle, color="0.88", linewidth=0.6, zorder=0, label="rebalancing pass" if n == 0 else None)
    events = [c for c in result.cycles if c.events]
    for n, c in enumerate(events):
        ax.axvline(c.cycle, color="tab:red", linestyle=":", linewidth=1.0, label="scripted event" if n == 0 else None)
        ax.annotate(
            "; ".join(event_text(note) for note in c.events),
            (c.cycle, 0.98),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=6,
            color="tab:red",
        )


def _plot_loads(ax: Any, result: SimResult, *, title: str, reference: float | None) -> None:
    """Per-worker throughput ÷ fleet mean over cycles: one labelled line per worker up to
    :data:`LEGEND_WORKERS_MAX` workers, else a min–max band with p95 and median."""
    xs = [c.cycle for c in result.cycles]
    ids = sorted({w for c in result.cycles for w in c.throughput})
    per_cycle = [_ratios(c) for c in result.cycles]
    if len(ids) <= LEGEND_WORKERS_MAX:
        for w in ids:
            ax.plot(xs, [r.get(w, math.nan) for r in per_cycle], linewidth=1.2, alpha=0.85, label=w)
    else:
        lows = [min(r.values(), default=math.nan) for r in per_cycle]
        highs = [max(r.values(), default=math.nan) for r in per_cycle]
        ax.fill_between(xs, lows, highs, color="tab:blue", alpha=0.18, label=f"{len(ids)} workers: min to max")
        ax.plot(xs, [_quantile(list(r.values()), 0.95) for r in per_cycle], "-", color="tab:red", label="p95 worker")
        ax.plot(xs, [_quantile(list(r.values()), 0.5) for r in per_cycle], "-", color="tab:blue", label="median worker")
    _mark_cycles(ax, result)
    ax.axhline(1.0, color="0.5", linewidth=0.8, label="fleet mean (1.0)")
    if reference is not None:
        ax.axhline(
            reference, color="black", linestyle="--", linewidth=1.0, label=f"LPT reference max/mean {reference:.2f}"
        )
        ax.axhline(
            reference * 1.10,
            color="black",
            linestyle=":",
            linewidth=0.8,
            label=f"reference + 10 % ({reference * 1.1:.2f})",
        )
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("cycle", fontsize=8)
    ax.set_ylabel("worker throughput ÷ fleet mean", fontsize=8)
    ax.xaxis.set_major_locator(_integer_locator())
    ax.tick_params(labelsize=7)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def result_figure(result: SimResult) -> Any:
    """The figure :func:`plot_result` writes: per-worker load over cycles (top) and imbalance with the moves of each
    cycle (bottom)."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(2, 1))
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
    moves = [c.moved + c.reassigned_expired for c in result.cycles]
    twin = bottom.twinx()
    twin.bar(xs, moves, alpha=0.25, color="tab:gray", label="leases moved or reassigned")
    twin.set_ylabel("leases moved", fontsize=8)
    twin.yaxis.set_major_locator(_integer_locator())
    twin.tick_params(labelsize=7)
    bottom.plot(xs, [c.tp_max_over_mean for c in result.cycles], label="throughput max/mean")
    bottom.plot(xs, [c.cpu_max_over_mean for c in result.cycles], label="CPU max/mean")
    bottom.axhline(reference, color="black", linestyle="--", linewidth=1.0, label=f"LPT reference {reference:.2f}")
    bottom.set_zorder(twin.get_zorder() + 1)  # lines above the bars
    bottom.patch.set_visible(False)
    bottom.set_xlabel("cycle", fontsize=8)
    bottom.set_ylabel("max ÷ mean", fontsize=8)
    bottom.xaxis.set_major_locator(_integer_locator())
    bottom.tick_params(labelsize=7)
    handles, labels = bottom.get_legend_handles_labels()
    bar_handles, bar_labels = twin.get_legend_handles_labels()
    bottom.legend(
        handles + bar_handles,
        labels + bar_labels,
        loc="upper left",
        bbox_to_anchor=(1.06, 1.0),
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout()
    return fig


def plot_result(result: SimResult, path: str | Path) -> Path:
    """Per-worker load over cycles (top) and imbalance (bottom) of one simulation, written as PNG."""
    target = check_png_path(path)
    fig = result_figure(result)
    import matplotlib.pyplot as plt

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
