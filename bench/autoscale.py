"""The fleet under DesiredWorkers through a day, against a fleet sized for the peak (simulated; no AWS).

    .venv/bin/python bench/autoscale.py [--shards 200] [--peak-workers 12] [--start-delay-s 180] [--seeds 3]
                                        [--plot-dir docs/img]

worker_lib/tools/simulator/autoscale.py runs the leader's real variance decider and the real
:func:`~worker_lib.scaling.desired.decide_desired` every 20 s of simulated time over 200 shards with Zipf-skewed rates
(``zipf:0.5``: the hottest shard 14× the coldest, and at the peak a third of a worker), the total following
``peak × (0.6 + 0.4 sin(2πt / 24 h))``; workers' CPU has ±10 % noise; a new worker reads 3 minutes after it is
asked for (and costs from then). The baseline, side by side: the same fleet with no scaler, sized for the peak by
the same rule (``--peak-workers``), all day.

1. **Diurnal (the bar)**: worker-minutes ÷ the peak fleet's (R), the p99 over workers of the share of each
   worker's time above the target utilisation (P), and changes of DesiredWorkers per day (A), medians over
   ``--seeds`` seeds. Bar: R ≤ 0.7, P ≤ 5, A ≤ 48.
2. **Spike (stated)**: a constant load (0.6 of the peak) tripled for 30 minutes: when the worst lag crossed the
   lag threshold (60 s) and when it was back under.

The last line (one line)::

    autoscale (diurnal, 200 shards): worker-minutes R× of a fleet sized for the peak, p99 over-target time P %,
    scale actions A per day
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from worker_lib.scaling.config import ScalingConfig  # noqa: E402
from worker_lib.tools.simulator.autoscale import (  # noqa: E402
    AutoscaleResult,
    AutoscaleSpec,
    LoadCurve,
    diurnal,
    plot_autoscale,
    run_autoscale,
    spike,
    summary_lines,
)
from worker_lib.tools.simulator.model import parse_skew  # noqa: E402


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def static_fleet(spec: AutoscaleSpec, curve: LoadCurve) -> AutoscaleResult:
    """The baseline: the peak fleet all day (DesiredWorkers pinned at it by min = max)."""
    pinned = ScalingConfig(min_workers=spec.peak_workers, max_workers=spec.peak_workers)
    return run_autoscale(dataclasses.replace(spec, scaling=pinned), curve)


def main() -> int:
    parser = argparse.ArgumentParser(description="DesiredWorkers through a day, simulated")
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--skew", default="zipf:0.5")
    parser.add_argument("--peak-workers", type=int, default=12)
    parser.add_argument("--start-delay-s", type=float, default=180.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--plot-dir", type=Path, default=None)
    args = parser.parse_args()
    say(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs (the simulation is one thread)")
    started = time.monotonic()
    ratios, p99s, actions = [], [], []
    for seed in range(1, args.seeds + 1):
        spec = AutoscaleSpec(
            shards=args.shards,
            skew=parse_skew(args.skew),
            peak_workers=args.peak_workers,
            start_delay_s=args.start_delay_s,
            seed=seed,
        )
        result = run_autoscale(spec, diurnal())
        baseline = static_fleet(spec, diurnal())
        say(f"seed {seed}, autoscaled: " + " | ".join(summary_lines(result)))
        say(f"seed {seed}, peak fleet all day: " + " | ".join(summary_lines(baseline)[1:]))
        ratios.append(result.ratio)
        p99s.append(100 * result.over_target_p99())
        actions.append(result.actions_per_day())
        if seed == 1:
            surge = run_autoscale(spec, spike())
            say("spike (×3 for 30 min from hour 2): " + " | ".join(summary_lines(surge)))
            episode = surge.lag_episode(spec.scaling.lag_threshold_ms / 1000)
            if episode is not None:
                above, back = episode
                say(
                    f"spike: lag back under {spec.scaling.lag_threshold_ms / 1000:.0f} s "
                    f"{(back - 2 * 3600) / 60:.1f} min after the spike began ({(back - above) / 60:.1f} min above); "
                    f"workers {min(t.running for t in surge.ticks)} → {max(t.running for t in surge.ticks)}"
                )
            if args.plot_dir is not None:
                args.plot_dir.mkdir(parents=True, exist_ok=True)
                say(f"plot: {plot_autoscale(result, args.plot_dir / 'autoscale_diurnal.png')}")
                say(f"plot: {plot_autoscale(surge, args.plot_dir / 'autoscale_spike.png')}")
    say(f"simulated {args.seeds} days (+ a spike) in {time.monotonic() - started:.0f} s")
    say(
        f"autoscale (diurnal, {args.shards} shards): worker-minutes {statistics.median(ratios):.2f}× of a fleet sized "
        f"for the peak, p99 over-target time {statistics.median(p99s):.1f} %, scale actions "
        f"{statistics.median(actions):.0f} per day"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
