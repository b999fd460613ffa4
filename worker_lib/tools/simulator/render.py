"""Text output of a simulated run, as lists of lines (the caller prints them: ``worker_lib/cli/simulate.py``)."""

from __future__ import annotations

import statistics

from worker_lib.tools.simulator.inputs import STRATEGY_LABELS
from worker_lib.tools.simulator.model import SimResult


def format_cycle_table(result: SimResult) -> list[str]:
    """One row per cycle: decisions, live workers, imbalance, events."""
    header = (
        f"{'cycle':>5} {'time':>6}  {'bal':>3} {'assign':>6} {'expired':>7} {'moved':>5} {'unassigned':>10} "
        f"{'workers':>7} {'cpu max/mean':>12} {'tp max/mean':>11} {'tp p95/mean':>11}  events"
    )
    lines = [header, "-" * len(header)]
    for c in result.cycles:
        lines.append(
            f"{c.cycle:>5} {c.time_s:>5.0f}s  {'*' if c.balancing_ran else '':>3} {c.assigned:>6} "
            f"{c.reassigned_expired:>7} {c.moved:>5} {c.unassigned:>10} {c.live_workers:>7} "
            f"{c.cpu_max_over_mean:>12.3f} {c.tp_max_over_mean:>11.3f} {c.tp_p95_over_mean:>11.3f}  "
            f"{' '.join(c.events)}".rstrip()
        )
    return lines


def format_worker_table(result: SimResult, *, max_rows: int = 40) -> list[str]:
    """One row per worker at the end (the most and least loaded when there are more than ``max_rows``)."""
    live = [r for r in result.workers if not r.status.startswith("dead")]
    mean = sum(r.throughput_kbps for r in live) / len(live) if live else 0.0
    header = f"{'worker':<10} {'status':<10} {'cost':>5} {'leases':>6} {'KBps':>10} {'cpu %':>7} {'load/mean':>9}"
    lines = [header, "-" * len(header)]
    rows = list(result.workers)
    hidden = 0
    if len(rows) > max_rows:
        ordered = sorted(rows, key=lambda r: (-r.throughput_kbps, r.worker_id))
        half = max_rows // 2
        kept = {r.worker_id for r in ordered[:half]} | {r.worker_id for r in ordered[-half:]}
        hidden = len(rows) - len(kept)
        rows = [r for r in rows if r.worker_id in kept]
    for r in rows:
        ratio = r.throughput_kbps / mean if mean > 0 and not r.status.startswith("dead") else 0.0
        lines.append(
            f"{r.worker_id:<10} {r.status:<10} {r.cost_factor:>5.2f} {r.leases:>6} {r.throughput_kbps:>10.1f} "
            f"{r.cpu_pct:>7.1f} {ratio:>9.3f}"
        )
    if hidden:
        lines.append(f"... {hidden} workers between the {max_rows // 2} most and least loaded not shown")
    return lines


def format_summary(result: SimResult) -> list[str]:
    """The final imbalance against the LPT reference, and the moves."""
    final = result.final
    reference = result.reference_ratio()
    ours = final.tp_max_over_mean
    totals = result.totals()
    basis = "raw 1.10 feasible" if reference <= 1.10 else "raw 1.10 infeasible: judge against the reference"
    return [
        f"final: throughput max/mean {ours:.3f}, p95/mean {final.tp_p95_over_mean:.3f}, "
        f"CPU max/mean {final.cpu_max_over_mean:.3f}, unassigned {final.unassigned}",
        f"LPT reference (true rates, {final.live_workers} live workers): max/mean {reference:.3f} ({basis}); "
        f"{STRATEGY_LABELS[result.strategy]} = {ours / reference:.3f} × reference",
        f"moves: {totals['moved']} rebalance, {totals['reassigned_expired']} expired reassigned, "
        f"{totals['assigned']} unassigned assigned",
    ]


def format_header(result: SimResult, cycles: int) -> list[str]:
    """What was simulated: the fleet, the strategy, the CPU model and the events."""
    spec = result.spec
    events = ", ".join(f"{e.label()} at {e.cycle}" for e in result.events) or "none"
    factors = ",".join(f"{f:g}" for f in spec.cost_factors) if spec.cost_factors else "1"
    return [
        f"shardlease simulate: {spec.shards} shards ({spec.skew.label()}, {result.total_rate_kbps:,.0f} KBps) over "
        f"{spec.workers} workers, strategy {result.strategy}, {cycles} cycles of {spec.interval_s:g} s, "
        f"seed {spec.seed}",
        f"CPU = {spec.base_cpu:g} % + {result.cost_per_kbps:.5f} %/KBps × cost factor ({factors}) "
        f"+ N(0, {spec.noise_pct:g}), capped at 100; events: {events}",
        "",
    ]


def format_decision_time(result: SimResult) -> str:
    """The median and max time of one ``decide()`` call: measured, so the one line that differs between runs."""
    times = result.decide_times_ms
    return (
        f"decision time: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms per decide() "
        "(measured; varies run to run)"
    )


def format_report(result: SimResult, cycles: int, *, max_rows: int = 40) -> list[str]:
    """Everything ``shardlease simulate`` prints for one run, before the plot line."""
    lines = format_header(result, cycles)
    lines += format_cycle_table(result)
    lines += ["", *format_worker_table(result, max_rows=max_rows), "", *format_summary(result)]
    lines.append(format_decision_time(result))
    return lines
