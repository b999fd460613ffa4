"""``shardlease simulate``: run a simulated fleet (``worker_lib/tools/simulator/``) and print its tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from worker_lib.core.errors import ConfigError
from worker_lib.tools.simulator.model import STRATEGIES, Event, FleetSpec, Skew, parse_event, parse_skew, simulate
from worker_lib.tools.simulator.plot import check_png_path, plot_result, require_matplotlib
from worker_lib.tools.simulator.render import format_report


def _parse_cost_factors(value: str | Sequence[float] | None) -> tuple[float, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            return tuple(float(part) for part in value.split(","))
        except ValueError:
            raise ConfigError(f"--cost-factors {value!r}: expected comma-separated numbers, e.g. 1,1,2") from None
    return tuple(float(v) for v in value)


def run_simulate_cli(
    *,
    workers: int = 8,
    shards: int = 64,
    skew: str | Skew = "zipf:1.2",
    strategy: str = "variance",
    cycles: int = 12,
    seed: int = 1,
    plot: str | Path | None = None,
    join: Sequence[str | Event] = (),
    kill: Sequence[str | Event] = (),
    split: Sequence[str | Event] = (),
    noise: float = 1.0,
    base_cpu: float = 5.0,
    target_cpu: float = 40.0,
    cost_factors: str | Sequence[float] | None = None,
    max_rows: int = 40,
    out: TextIO | None = None,
) -> int:
    """``shardlease simulate``: run the fleet, print a per-cycle table and a final per-worker table, optionally
    plot; returns the exit code (0). Bad values raise :class:`ConfigError` (one line) before anything runs."""
    stream = out if out is not None else sys.stdout
    if cycles < 1:
        raise ConfigError(f"--cycles {cycles} must be at least 1")
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    events = (
        [parse_event("join", e) for e in join]
        + [parse_event("kill", e) for e in kill]
        + [parse_event("split", e) for e in split]
    )
    for event in events:
        if event.cycle > cycles:
            raise ConfigError(f"--{event.kind} at cycle {event.cycle} is after the last cycle ({cycles})")
    spec = FleetSpec(
        workers=workers,
        shards=shards,
        skew=skew if isinstance(skew, Skew) else parse_skew(skew),
        seed=seed,
        base_cpu=base_cpu,
        target_cpu=target_cpu,
        noise_pct=noise,
        cost_factors=_parse_cost_factors(cost_factors),
    )
    if plot is not None:
        check_png_path(plot)
        require_matplotlib()  # before the run: a missing extra fails at once, with one line naming it
    result = simulate(spec, strategy=strategy, cycles=cycles, events=events)
    lines = format_report(result, cycles, max_rows=max_rows)
    if plot is not None:
        written = plot_result(result, plot)
        lines.append(f"plot: {written}")
    print("\n".join(lines), file=stream)
    return 0


def run_autoscale_cli(
    *,
    curve: str = "diurnal",
    shards: int = 200,
    skew: str = "zipf:0.5",
    peak_workers: int = 12,
    start_delay_s: float = 180.0,
    noise: float = 10.0,
    seed: int = 1,
    plot: str | Path | None = None,
    out: TextIO | None = None,
) -> int:
    """``shardlease simulate --autoscale``: the fleet under DesiredWorkers through a load curve; prints the worker
    count, cost against a fleet sized for the peak, over-target time, scale actions and lag, optionally plots load,
    workers and lag over time. Bad values raise :class:`ConfigError` before anything runs."""
    from worker_lib.tools.simulator.autoscale import (
        AutoscaleSpec,
        parse_curve,
        plot_autoscale,
        run_autoscale,
        summary_lines,
    )

    stream = out if out is not None else sys.stdout
    if noise < 0:
        raise ConfigError(f"--noise {noise} must not be negative")
    load_curve = parse_curve(curve)
    spec = AutoscaleSpec(
        shards=shards,
        skew=parse_skew(skew),
        peak_workers=peak_workers,
        start_delay_s=start_delay_s,
        noise_pct=noise,
        seed=seed,
    )
    if plot is not None:
        check_png_path(plot)
        require_matplotlib(what="simulate --autoscale --plot")
    result = run_autoscale(spec, load_curve)
    lines = summary_lines(result)
    if plot is not None:
        lines.append(f"plot: {plot_autoscale(result, plot)}")
    print("\n".join(lines), file=stream)
    return 0
