"""``DesiredWorkers``: how many workers the fleet needs, decided from one full leader cycle's picture.

Pure: :func:`decide_desired` takes the fleet's load (:class:`FleetLoad`) and the previous decision and returns the
next; :func:`removal_candidates` names the workers a shrinking fleet should lose. No I/O, no clock of its own.

The rule (docs/autoscaling.md):

1. **Demand**, in workers' worth of work: the workers' latest CPU utilisation summed (workers that report none
   counted at the others' mean) ÷ 100; without CPU reports, the leases' throughput ÷ ``maxThroughputPerHostKBps``.
2. **Need** = ⌈demand × 100 ÷ sizing point⌉, the sizing point being the target less the headroom (59.5 % at the
   defaults). A need above the current signal raises it, a scale-out cool-down after the last change (the workers
   asked for then are not in the measurement yet).
3. **Scale-in** only to ⌈demand × 100 ÷ (sizing point − band)⌉, only when that is smaller than the signal, only a
   cool-down after the last change (a leader with no decision before starts the cool-down), and never while a lag
   is above the threshold.
4. **Lag** above the threshold and growing since the last cycle, in a fleet whose average CPU is at or above the
   target, adds ``lag_step_pct`` of the fleet (at least one), once per scale-out cool-down: a fleet pinned at 100 %
   CPU under-reports its demand, and lag is what shows it. (Lag in a fleet with CPU to spare is a hot or stuck
   shard: more workers would not help.)
5. **Bounds**: at least ``min_workers``, at most ``max_workers`` and never more than there are leases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker_lib.scaling.config import ScalingConfig


@dataclass(frozen=True, kw_only=True)
class FleetLoad:
    """What one full cycle saw.

    workers: the workers able to take leases. leases: unfinished leases. utilization_pct: the latest CPU
    utilisation of each worker that reports one (percent of its operating range). throughput_kbps: the leases'
    total throughput. max_throughput_per_host_kbps: the assignment setting (None: not set). max_lag_ms: the worst
    MillisBehindLatest the owners reported (None: none did). now_epoch_s: the leader's wall clock.
    """

    workers: int
    leases: int
    utilization_pct: Sequence[float] = ()
    throughput_kbps: float = 0.0
    max_throughput_per_host_kbps: float | None = None
    max_lag_ms: int | None = None
    now_epoch_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DesiredWorkers:
    """One decision: the number, why, and what it was computed from (kept in CoordinatorState between cycles)."""

    desired: int
    reason: str
    basis: str  # "cpu", "throughput" or "none"
    demand: float  # workers' worth of work (unrounded)
    changed_at_epoch_s: float
    lag_ms: int | None = None
    changed: bool = False

    def to_attrs(self) -> dict[str, Any]:
        return {
            "desired": self.desired,
            "reason": self.reason,
            "basis": self.basis,
            "demand": round(self.demand, 3),
            "changedAt": self.changed_at_epoch_s,
            "lagMs": self.lag_ms,
        }

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> DesiredWorkers | None:
        """The stored decision, or None for an item that is not one (written by something else, or corrupt)."""
        try:
            lag = attrs.get("lagMs")
            return cls(
                desired=int(attrs["desired"]),
                reason=str(attrs.get("reason", "")),
                basis=str(attrs.get("basis", "none")),
                demand=float(attrs.get("demand", 0.0)),
                changed_at_epoch_s=float(attrs.get("changedAt", 0.0)),
                lag_ms=None if lag is None else int(lag),
            )
        except (KeyError, TypeError, ValueError):
            return None


def fleet_demand(load: FleetLoad) -> tuple[float, str]:
    """(demand in workers' worth of work, basis): CPU where at least half the workers report it, else throughput
    against the per-host maximum, else (0, "none")."""
    reported = [max(0.0, u) for u in load.utilization_pct]
    if load.workers > 0 and reported and len(reported) * 2 >= load.workers:
        mean = sum(reported) / len(reported)
        return mean * max(load.workers, len(reported)) / 100, "cpu"
    if load.max_throughput_per_host_kbps:
        return load.throughput_kbps / load.max_throughput_per_host_kbps, "throughput"
    return 0.0, "none"


def decide_desired(config: ScalingConfig, load: FleetLoad, previous: DesiredWorkers | None) -> DesiredWorkers:
    """The next ``DesiredWorkers`` (see the module for the rule)."""
    upper = max(1, load.leases)
    if config.max_workers is not None:
        upper = min(upper, config.max_workers)
    lower = min(config.min_workers, upper)
    current = previous.desired if previous is not None else max(load.workers, lower)
    # A leader with no decision before (a new deployment, a lost item) starts the cool-down now: a fleet that is
    # just starting does not show its load yet, and shrinking it on that would be a guess.
    since_change = load.now_epoch_s - previous.changed_at_epoch_s if previous is not None else 0.0
    demand, basis = fleet_demand(load)
    sizing = config.sizing_point_pct
    lagging = load.max_lag_ms is not None and load.max_lag_ms > config.lag_threshold_ms
    if basis == "none":
        desired, reason = current, "no load signal (no CPU reports, no maxThroughputPerHostKBps): holding"
    else:
        need = max(1, math.ceil(demand * 100 / sizing - 1e-9)) if demand > 0 else lower
        what = f"{basis} demand {demand:.2f} workers at {sizing:.1f} % each"
        if need > current and since_change < config.scale_out_cooldown_s and previous is not None:
            desired, reason = current, f"holding: {what} needs {need}, scale-out cool-down (workers still starting)"
        elif need > current:
            desired, reason = need, f"scale out: {what} needs {need}"
        elif need < current:
            shrink_to = max(1, math.ceil(demand * 100 / (sizing - config.scale_in_band_pct) - 1e-9))
            if lagging:
                desired, reason = current, f"holding: {what} needs {need}, but the lag is above the threshold"
            elif shrink_to >= current:
                desired, reason = current, f"holding: {what} needs {need}, inside the scale-in band"
            elif since_change < config.scale_in_cooldown_s:
                desired, reason = current, f"holding: {what} needs {need}, scale-in cool-down"
            else:
                desired, reason = shrink_to, f"scale in: {what} fits {shrink_to} with the band"
        else:
            desired, reason = current, f"steady: {what} needs {need}"
    grown = previous is None or previous.lag_ms is None or (load.max_lag_ms or 0) > previous.lag_ms
    # Lag asks for more workers only from a busy fleet: with workers to spare it is a hot shard, a slow processor or
    # a stuck shard, which more workers do not cure (and would be asked for again every cool-down).
    busy = basis != "cpu" or demand * 100 >= config.target_utilization_pct * max(1, load.workers)
    if lagging and grown and busy and (previous is None or since_change >= config.scale_out_cooldown_s):
        step = max(1, math.ceil(max(current, load.workers) * config.lag_step_pct / 100))
        lag_desired = max(current, load.workers) + step
        if lag_desired > desired:
            desired = lag_desired
            reason = f"scale out: lag {load.max_lag_ms} ms above {config.lag_threshold_ms} ms and growing, +{step}"
    bounded = min(upper, max(lower, desired))
    if bounded != desired:
        reason += f" (bounded to {bounded}: min {lower}, max {upper})"
    changed = previous is None or bounded != previous.desired
    return DesiredWorkers(
        desired=bounded,
        reason=reason,
        basis=basis,
        demand=demand,
        changed_at_epoch_s=load.now_epoch_s if changed else previous.changed_at_epoch_s if previous else 0.0,
        lag_ms=load.max_lag_ms,
        changed=changed,
    )


def removal_candidates(loads: Mapping[str, float], desired: int) -> tuple[str, ...]:
    """The workers a fleet larger than ``desired`` should lose: the least loaded (ties by id), so the fewest leases
    move. Empty when the fleet is not larger."""
    excess = len(loads) - desired
    if excess <= 0:
        return ()
    return tuple(sorted(loads, key=lambda worker: (loads[worker], worker))[:excess])
