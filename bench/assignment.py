"""Lease assignment: ours (variance) vs KCL 2.x stealing vs lease count (vs KCL 3.x variance), side by side.

Every strategy runs on the same simulated fleets (``worker_lib.tools.simulator``: same shard rates, same CPU model,
same noise, same events) in one process run; the real deciders decide every cycle.

    .venv/bin/python bench/assignment.py [--quick] [--seeds N] [--plot-dir docs/img] [--markdown FILE]

Fleets: 64 shards / 8 workers Zipf 1.2 (the target fleet); 1,000 / 100 and 10,000 / 1,000 Zipf 0.3; the
1,000 / 100 fleet losing its most loaded worker at cycle 13; the same fleet gaining two workers at cycle 13.

Per fleet and strategy: throughput max/mean, p95/mean and min/mean at the end; the LPT reference (hottest shard
first onto the least-loaded worker, knowing the true rates) and ours ÷ reference; cycles (and balancing runs) to
converge within ±10 % (relative to the reference where the raw band is infeasible); moves against a lower bound on
the minimum (worker_lib.tools.simulator.measures.min_moves_lower_bound, from the post-initial-assignment state — or
the state just before the event — to the final balance); the median and max time of one decide() call.

Targets (docs/benchmarks.md, "Targets"): ours reaches max/mean ≤ 1.10 (≤ 1.10 × the reference when the raw figure
is infeasible) on the Zipf fleet within 3 balancing cycles with ≤ 1.5× the minimum moves; one decision for
10,000 leases × 1,000 workers takes < 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from worker_lib.tools.simulator.measures import (
    convergence_band,
    cycles_to_converge,
    max_over_mean,
    min_moves_lower_bound,
    min_moves_upper_bound,
)
from worker_lib.tools.simulator.model import (
    STRATEGY_LABELS,
    CycleStats,
    Event,
    FleetSpec,
    SimResult,
    Simulation,
    parse_skew,
)
from worker_lib.tools.simulator.plot import plot_comparison

STRATEGIES = ("variance", "kcl2", "count", "variance-kcl")
"""Ours first; then the baselines: KCL 2.x stealing (worker_lib/tools/kcl2_baseline.py), the lease-count strategy,
KCL 3.x variance."""


@dataclass(frozen=True)
class Fleet:
    name: str
    workers: int
    shards: int
    skew: str
    cycles: int
    events: tuple[Event, ...] = ()

    @property
    def start_cycle(self) -> int:
        """Moves and convergence count from the end of this cycle: the post-initial-assignment state (cycle 1),
        or the state just before the first event."""
        return min((e.cycle for e in self.events), default=2) - 1

    def spec(self, seed: int) -> FleetSpec:
        return FleetSpec(workers=self.workers, shards=self.shards, skew=parse_skew(self.skew), seed=seed)


def fleets(quick: bool) -> list[Fleet]:
    return [
        Fleet("zipf 64/8", 8, 64, "zipf:1.2", 16),
        Fleet("1k/100", 100, 1_000, "zipf:0.3", 16),
        Fleet("10k/1000", 1_000, 10_000, "zipf:0.3", 7 if quick else 13),
        Fleet("1k/100 kill 1", 100, 1_000, "zipf:0.3", 19 if quick else 25, (Event(13, "kill", 1),)),
        Fleet("1k/100 join 2", 100, 1_000, "zipf:0.3", 19 if quick else 25, (Event(13, "join", 2),)),
    ]


@dataclass(frozen=True)
class Row:
    fleet: Fleet
    strategy: str
    seed: int
    result: SimResult
    reference_max: float
    basis: str
    max_target_cycle: int | None
    max_target_runs: int | None
    band_cycle: int | None
    band_runs: int | None
    moves: int
    lower_bound: int
    upper_bound: int | None
    moves_to_target: int | None
    target_bounds: tuple[int, int | None] | None
    decide_median_ms: float
    decide_max_ms: float

    @property
    def final(self) -> CycleStats:
        return self.result.final

    @property
    def vs_reference(self) -> float:
        return self.final.tp_max_over_mean / self.reference_max

    @property
    def moves_ratio(self) -> float | None:
        return self.moves / self.lower_bound if self.lower_bound else None


def run_one(fleet: Fleet, strategy: str, seed: int) -> Row:
    sim = Simulation(fleet.spec(seed), strategy=strategy, events=fleet.events)
    start = fleet.start_cycle
    for _ in range(start):
        sim.step()
    held_at_start = sim.held_rates()
    for _ in range(fleet.cycles - start):
        sim.step()
    result = sim.result()
    final = result.final
    reference = result.reference_loads()
    ceiling, floor = convergence_band(reference)
    reference_max = max_over_mean(reference)
    basis = "raw" if reference_max <= 1.10 else "×ref"
    max_cycle, max_runs = cycles_to_converge(result.cycles, after=start, limit=ceiling)
    band_cycle, band_runs = cycles_to_converge(result.cycles, after=start, limit=ceiling, floor=floor)
    after = [c for c in result.cycles if c.cycle > start]
    moves = sum(c.moved + c.reassigned_expired for c in after)
    lower, upper = _bounds(held_at_start, final)
    moves_to_target: int | None = None
    target_bounds: tuple[int, int | None] | None = None
    if max_cycle is not None:
        reached = next(c for c in result.cycles if c.cycle == max_cycle)
        moves_to_target = sum(c.moved + c.reassigned_expired for c in after if c.cycle <= max_cycle)
        target_bounds = _bounds(held_at_start, reached)
    times = [c.decide_ms for c in after]
    return Row(
        fleet=fleet,
        strategy=strategy,
        seed=seed,
        result=result,
        reference_max=reference_max,
        basis=basis,
        max_target_cycle=max_cycle,
        max_target_runs=max_runs,
        band_cycle=band_cycle,
        band_runs=band_runs,
        moves=moves,
        lower_bound=lower,
        upper_bound=upper,
        moves_to_target=moves_to_target,
        target_bounds=target_bounds,
        decide_median_ms=statistics.median(times),
        decide_max_ms=max(c.decide_ms for c in result.cycles),
    )


def _bounds(held_at_start: dict[str, list[float]], reached: CycleStats) -> tuple[int, int | None]:
    """(lower bound, greedy upper bound) on the moves from the starting state to ``reached``'s balance: every live
    worker's throughput within [its min, its max]."""
    live = set(reached.throughput)
    start_map = {w: held_at_start.get(w, []) for w in live}
    forced = [r for w, rates in held_at_start.items() if w not in live for r in rates]
    pool = [r for rates in held_at_start.values() for r in rates]
    hi, lo = max(reached.throughput.values()), min(reached.throughput.values())
    lower = min_moves_lower_bound(start_map, max_load=hi, min_load=lo, forced=len(forced), pool=pool)
    upper = min_moves_upper_bound(start_map, max_load=hi, min_load=lo, forced=forced)
    return lower, upper


def _cell(value: int | None, runs: int | None) -> str:
    return "never" if value is None else f"{value} ({runs})"


def _minimum(lower: int, upper: int | None) -> str:
    if upper is None:
        return f"≥ {lower}"
    return str(lower) if upper == lower else f"{lower}–{upper}"


def _vs_minimum(moves: int, lower: int, upper: int | None) -> str:
    """moves ÷ the minimum, as a range when the minimum is only bracketed."""
    if moves == 0:
        return "0"
    hi = f"{moves / lower:.2f}" if lower else "∞"
    if upper is None or upper == lower:
        return hi if upper is not None else f"≤ {hi}"
    lo = f"{moves / upper:.2f}" if upper else "∞"
    return f"{lo}–{hi}"


def table(rows: Sequence[Row]) -> list[str]:
    header = (
        "| fleet | strategy | tp max/mean | tp p95/mean | tp min/mean | CPU max/mean | LPT max/mean | ÷ LPT | basis | "
        "target at cycle (bal. runs) | ±10 % band at cycle (bal. runs) | moves | min. moves | moves ÷ min. | "
        "decide ms median / max |"
    )
    lines = [header, "|" + "|".join(["---"] * 15) + "|"]
    for r in rows:
        f = r.final
        lines.append(
            f"| {r.fleet.name} | {STRATEGY_LABELS[r.strategy]} | {f.tp_max_over_mean:.3f} | "
            f"{f.tp_p95_over_mean:.3f} | {f.tp_min_over_mean:.3f} | {f.cpu_max_over_mean:.3f} | "
            f"{r.reference_max:.3f} | {r.vs_reference:.3f} | {r.basis} | "
            f"{_cell(r.max_target_cycle, r.max_target_runs)} | {_cell(r.band_cycle, r.band_runs)} | {r.moves} | "
            f"{_minimum(r.lower_bound, r.upper_bound)} | {_vs_minimum(r.moves, r.lower_bound, r.upper_bound)} | "
            f"{r.decide_median_ms:.1f} / {r.decide_max_ms:.1f} |"
        )
    return lines


def targets(rows: Sequence[Row], seed_rows: Sequence[Row]) -> tuple[list[str], bool]:
    """The issue's targets, judged on ours (every seed for the Zipf fleet). Returns (lines, all met)."""
    lines: list[str] = []
    ok = True
    for r in seed_rows:
        limit = "1.10" if r.basis == "raw" else f"1.10 × LPT {r.reference_max:.3f} = {1.10 * r.reference_max:.3f}"
        reached = r.max_target_runs is not None and r.max_target_runs <= 3
        if r.target_bounds is None or r.moves_to_target is None:
            ok = False
            lines.append(f"- seed {r.seed}: max/mean ≤ {limit} never reached — MISSED")
            continue
        lower, upper = r.target_bounds
        moves = r.moves_to_target
        if moves <= 1.5 * lower:
            verdict = "met"
        elif upper is not None and moves > 1.5 * upper:
            verdict = "MISSED"
        else:
            verdict = "undetermined (the minimum is only bracketed)"
        ok = ok and reached and verdict == "met"
        lines.append(
            f"- seed {r.seed}: max/mean ≤ {limit} reached at cycle {r.max_target_cycle} after "
            f"{r.max_target_runs} balancing run(s) — {'met' if reached else 'MISSED'} (≤ 3); "
            f"{moves} moves to get there vs a minimum of {_minimum(lower, upper)} for that balance = "
            f"{_vs_minimum(moves, lower, upper)}× — {verdict} (≤ 1.5×); {r.moves} moves over all "
            f"{r.fleet.cycles} cycles"
        )
    for r in rows:
        if r.fleet.name == "10k/1000" and r.strategy == "variance":
            fast = r.decide_max_ms < 1000.0
            ok = ok and fast
            lines.append(
                f"- 10,000 leases × 1,000 workers: decide() median {r.decide_median_ms:.1f} ms, max "
                f"{r.decide_max_ms:.1f} ms (the max is the cold start, 10,000 unassigned leases) — "
                f"{'met' if fast else 'MISSED'} (< 1 s)"
            )
    return lines, ok


def ratios(rows: Sequence[Row]) -> list[str]:
    """Ours vs each baseline, per fleet: final max/mean ratio and moves."""
    lines: list[str] = []
    for fleet_name in dict.fromkeys(r.fleet.name for r in rows):
        ours = next(r for r in rows if r.fleet.name == fleet_name and r.strategy == "variance")
        parts = []
        for r in rows:
            if r.fleet.name != fleet_name or r.strategy == "variance":
                continue
            top = ours.final.tp_max_over_mean / r.final.tp_max_over_mean
            p95 = ours.final.tp_p95_over_mean / r.final.tp_p95_over_mean
            parts.append(
                f"vs {STRATEGY_LABELS[r.strategy]}: max/mean {top:.2f}×, p95/mean {p95:.2f}×, "
                f"moves {ours.moves} vs {r.moves}"
            )
        lines.append(f"- {fleet_name}: ours " + "; ".join(parts))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="CI-sized run (fewer cycles on the large fleets)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds for the Zipf target fleet (default 5; quick 2)")
    parser.add_argument("--plot-dir", type=Path, default=None, help="write assignment_zipf.png / _join.png / _kill.png")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    if seeds < 1:
        parser.error("--seeds must be at least 1")

    started = time.perf_counter()
    rows: list[Row] = []
    for fleet in fleets(args.quick):
        for strategy in STRATEGIES:
            rows.append(run_one(fleet, strategy, seed=1))
            print(f"  ran {fleet.name:<14} {strategy:<13} seed 1", file=sys.stderr, flush=True)
    zipf = fleets(args.quick)[0]
    seed_rows = [r for r in rows if r.fleet == zipf and r.strategy == "variance"]
    seed_rows += [run_one(zipf, "variance", seed) for seed in range(2, seeds + 1)]
    elapsed = time.perf_counter() - started

    out = [
        f"Lease assignment benchmark ({'quick' if args.quick else 'full'}; seed 1; {elapsed:.1f} s wall)",
        "",
        *table(rows),
        "",
        "Ratios (ours ÷ baseline, lower is better):",
        *ratios(rows),
        "",
        f"Targets (ours on the Zipf 64/8 fleet, seeds 1–{seeds}):",
    ]
    target_lines, ok = targets(rows, seed_rows)
    out += target_lines
    text = "\n".join(out)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.plot_dir is not None:
        by_fleet = {
            name: [r.result for r in rows if r.fleet.name == name] for name in dict.fromkeys(r.fleet.name for r in rows)
        }
        for file, name, title in (
            ("assignment_zipf.png", "zipf 64/8", "64 shards (Zipf 1.2) / 8 workers, seed 1: worker throughput ÷ mean"),
            ("assignment_join.png", "1k/100 join 2", "1,000 shards (Zipf 0.3) / 100 workers, 2 join at cycle 13"),
            ("assignment_kill.png", "1k/100 kill 1", "1,000 shards (Zipf 0.3) / 100 workers, most loaded dies at 13"),
        ):
            path = plot_comparison(by_fleet[name], args.plot_dir / file, title=title)
            print(f"plot: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
