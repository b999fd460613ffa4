"""The simulator learns time: a fleet driven by ``DesiredWorkers`` through a load curve (``shardlease simulate
--autoscale``, ``bench/autoscale.py``).

Nothing here talks to AWS. Every ``interval_s`` (20 s, KCL's lease assignment interval) of simulated time:

1. **Load.** Each shard's rate is its base rate (``zipf[:S]``, ``uniform``, ``hot``, as in the cycle simulator)
   × the curve's multiplier at that time: ``diurnal`` (0.6 + 0.4 sin(2πt / 24 h), the ideal fleet 0.6× the peak
   fleet on average), ``spike`` (a constant 0.6, × 3 for 30 minutes from hour 2) or a CSV file of
   ``minute,multiplier`` rows (linear in between).
2. **Work.** A worker's CPU is ``base_cpu`` + its shards' arrivals (and any backlog) × the cost per KBps, with
   uniform noise of ± ``noise_pct`` % on the work, at most 100 %. Work a worker cannot do stays as a per-shard
   backlog; a shard's lag is its backlog ÷ its rate (seconds behind). An unowned shard's arrivals all back up.
   The cost per KBps is calibrated so that, at the curve's peak, the demand is ``peak_workers`` × the sizing
   point: a fleet sized for the peak by the same rule is ``peak_workers`` strong.
3. **Leader.** The workers report (CPU, lag); the real decider (``variance``) assigns and balances the leases;
   :func:`~worker_lib.scaling.desired.decide_desired` computes the signal from the same picture.
4. **Scaler.** Asks for ``desired − (running + starting)`` new workers, each ready ``start_delay_s`` later (it
   costs from the moment it is asked for); or removes the surplus: starting ones first, then the least loaded
   running ones (:func:`~worker_lib.scaling.desired.removal_candidates`) the way a SIGTERM does: their leases are
   given up and assigned by this same cycle's leader.

Deterministic for a seed. :func:`run_autoscale` returns the timeline and the figures ``bench/autoscale.py`` prints.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.plan import apply_plan
from worker_lib.assignment.snapshot import AssignmentSnapshot
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Lease, WorkerMetricStats
from worker_lib.scaling.config import ScalingConfig
from worker_lib.scaling.desired import DesiredWorkers, FleetLoad, decide_desired, removal_candidates
from worker_lib.tools.simulator.inputs import Skew, make_strategy, parse_skew, shard_rates
from worker_lib.tools.simulator.model import EPOCH0, MAX_STS

DAY_S = 86_400
CPU = "C"


# --------------------------------------------------------------------------------------------------- load curves


@dataclass(frozen=True)
class LoadCurve:
    """A multiplier of the shards' base rates over simulated time; ``peak`` is its largest value."""

    name: str
    at: Callable[[float], float]
    peak: float
    duration_s: float


def diurnal(duration_s: float = DAY_S) -> LoadCurve:
    return LoadCurve("diurnal", lambda t: 0.6 + 0.4 * math.sin(2 * math.pi * t / DAY_S), 1.0, duration_s)


SPIKE_START_S = 2 * 3600
SPIKE_LENGTH_S = 30 * 60


def spike(duration_s: float = 6 * 3600, *, base: float = 0.6, factor: float = 3.0) -> LoadCurve:
    def at(t: float) -> float:
        return base * factor if SPIKE_START_S <= t < SPIKE_START_S + SPIKE_LENGTH_S else base

    return LoadCurve("spike", at, base, duration_s)  # the fleet is sized for the base: the spike is the surprise


def curve_from_file(path: str | Path) -> LoadCurve:
    """``minute,multiplier`` rows (a header row is allowed), linear in between, flat after the last."""
    points: list[tuple[float, float]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for row in csv.reader(handle):
                if not row or row[0].strip().startswith("#"):
                    continue
                try:
                    points.append((float(row[0]) * 60, float(row[1])))
                except (ValueError, IndexError):
                    if points:
                        raise ConfigError(
                            f"--load-curve {path}: bad row {row!r} (expected minute,multiplier)"
                        ) from None
    except OSError as exc:
        raise ConfigError(f"--load-curve {path}: {exc.strerror or exc}") from None
    if len(points) < 2 or any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        raise ConfigError(f"--load-curve {path}: needs at least two rows with increasing minutes")
    if any(m < 0 for _, m in points):
        raise ConfigError(f"--load-curve {path}: multipliers must not be negative")

    def at(t: float) -> float:
        if t <= points[0][0]:
            return points[0][1]
        for (t0, m0), (t1, m1) in itertools.pairwise(points):
            if t <= t1:
                return m0 + (m1 - m0) * (t - t0) / (t1 - t0)
        return points[-1][1]

    return LoadCurve(Path(path).name, at, max(m for _, m in points), points[-1][0])


def parse_curve(text: str) -> LoadCurve:
    if text == "diurnal":
        return diurnal()
    if text == "spike":
        return spike()
    return curve_from_file(text)


# --------------------------------------------------------------------------------------------------- the model


@dataclass(frozen=True, kw_only=True)
class AutoscaleSpec:
    shards: int = 200
    skew: Skew = field(default_factory=lambda: parse_skew("zipf:0.5"))
    peak_workers: int = 12
    start_delay_s: float = 180.0
    interval_s: float = 20.0
    base_cpu: float = 5.0
    noise_pct: float = 10.0
    seed: int = 1
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

    def __post_init__(self) -> None:
        if self.shards < 1 or self.peak_workers < 1:
            raise ConfigError("autoscale: shards and peak_workers must be at least 1")
        if self.interval_s <= 0 or self.start_delay_s < 0:
            raise ConfigError("autoscale: interval_s must be positive and start_delay_s not negative")


@dataclass(frozen=True)
class Tick:
    """The fleet after one cycle."""

    time_s: float
    multiplier: float
    desired: int
    running: int
    starting: int
    max_lag_s: float
    cpu: tuple[float, ...]
    reason: str


@dataclass(frozen=True)
class AutoscaleResult:
    spec: AutoscaleSpec
    curve: LoadCurve
    ticks: tuple[Tick, ...]
    peak_fleet: int
    over_target_share: dict[str, float]  # per worker: share of its running time above the target
    actions: int  # changes of the DesiredWorkers signal

    @property
    def worker_minutes(self) -> float:
        return sum(t.running + t.starting for t in self.ticks) * self.spec.interval_s / 60

    @property
    def peak_worker_minutes(self) -> float:
        return self.peak_fleet * len(self.ticks) * self.spec.interval_s / 60

    @property
    def ratio(self) -> float:
        return self.worker_minutes / self.peak_worker_minutes

    def over_target_p99(self) -> float:
        shares = sorted(self.over_target_share.values())
        if not shares:
            return 0.0
        return shares[min(len(shares) - 1, math.ceil(0.99 * len(shares)) - 1)]

    def fleet_over_target(self) -> float:
        over = sum(1 for t in self.ticks for c in t.cpu if c > self.spec.scaling.target_utilization_pct)
        total = sum(len(t.cpu) for t in self.ticks)
        return over / total if total else 0.0

    def actions_per_day(self) -> float:
        return self.actions * DAY_S / (len(self.ticks) * self.spec.interval_s)

    def lag_episode(self, threshold_s: float) -> tuple[float, float] | None:
        """(first time above the threshold, first time back under it after that), seconds; None if never above."""
        above = next((t.time_s for t in self.ticks if t.max_lag_s > threshold_s), None)
        if above is None:
            return None
        back = next((t.time_s for t in self.ticks if t.time_s > above and t.max_lag_s <= threshold_s), math.inf)
        return above, back


@dataclass
class _Worker:
    worker_id: str
    ready_at: float
    sts: list[float] = field(default_factory=list)
    cycles: int = 0
    over: int = 0


class AutoscaleSimulation:
    def __init__(self, spec: AutoscaleSpec, curve: LoadCurve) -> None:
        self.spec, self.curve = spec, curve
        rng = random.Random(spec.seed)
        self._noise = random.Random(spec.seed * 7_919 + 3)
        self.base_rates = dict(
            (f"shardId-{i:06d}", rate) for i, rate in enumerate(shard_rates(spec.shards, spec.skew, rng))
        )
        sizing = spec.scaling.sizing_point_pct
        peak_total = sum(self.base_rates.values()) * curve.peak
        # at the peak the fleet's work (base CPU apart) is peak_workers × the sizing point, less their base
        self.cost_per_kbps = spec.peak_workers * (sizing - spec.base_cpu) / peak_total
        self.peak_fleet = spec.peak_workers
        self.decider = make_strategy("variance", AssignmentConfig())
        self.leases = {key: Lease(lease_key=key) for key in self.base_rates}
        self.backlog_kb = dict.fromkeys(self.base_rates, 0.0)
        self.workers: dict[str, _Worker] = {}
        self.retired: list[_Worker] = []
        self._next_id = 0
        self.actions = 0
        self.time_s = 0.0
        self.run_number = 0
        # The fleet at time 0: sized by the same rule for the load then, its leases assigned, the signal at its size.
        initial = max(1, math.ceil(spec.peak_workers * curve.at(0.0) / curve.peak))
        for _ in range(initial):
            self._add(ready_at=0.0)
        self.desired = DesiredWorkers(
            desired=initial, reason="initial fleet", basis="cpu", demand=0.0, changed_at_epoch_s=EPOCH0
        )
        self._assign(EPOCH0)

    def _add(self, *, ready_at: float) -> None:
        worker = _Worker(f"w{self._next_id:04d}", ready_at)
        self._next_id += 1
        self.workers[worker.worker_id] = worker

    def _running(self) -> list[str]:
        return sorted(w for w, worker in self.workers.items() if worker.ready_at <= self.time_s)

    def _remove(self, worker_id: str) -> None:
        """A SIGTERM: the worker gives its leases up and leaves."""
        for key, lease in self.leases.items():
            if lease.actual_owner == worker_id:
                self.leases[key] = lease.with_(lease_owner=None, checkpoint_owner=None)
        self.retired.append(self.workers.pop(worker_id))

    def _work(self, rates: dict[str, float]) -> dict[str, tuple[float, float]]:
        """Process one interval: per running worker (CPU %, worst lag s); backlogs move."""
        dt = self.spec.interval_s
        owned: dict[str, list[str]] = {w: [] for w in self._running()}
        for key, lease in self.leases.items():
            owner = lease.actual_owner
            if owner in owned:
                owned[owner].append(key)
            else:
                self.backlog_kb[key] += rates[key] * dt
        capacity_kb = (100.0 - self.spec.base_cpu) / self.cost_per_kbps * dt if self.cost_per_kbps else math.inf
        out: dict[str, tuple[float, float]] = {}
        for worker_id, keys in owned.items():
            wanted = sum(rates[k] * dt + self.backlog_kb[k] for k in keys)
            noise = 1 + self._noise.uniform(-self.spec.noise_pct, self.spec.noise_pct) / 100
            done = min(wanted, capacity_kb)
            left = 1 - done / wanted if wanted > 0 else 0.0
            lag = 0.0
            for k in keys:
                self.backlog_kb[k] = (rates[k] * dt + self.backlog_kb[k]) * left
                if rates[k] > 0:
                    lag = max(lag, self.backlog_kb[k] / rates[k])
            work_pct = done / dt * self.cost_per_kbps * noise
            out[worker_id] = (min(100.0, self.spec.base_cpu + work_pct), lag)
        return out

    def step(self) -> Tick:
        spec = self.spec
        self.time_s += spec.interval_s
        self.run_number += 1
        multiplier = self.curve.at(self.time_s)
        rates = {k: r * multiplier for k, r in self.base_rates.items()}
        measured = self._work(rates)
        now = EPOCH0 + self.time_s
        for worker_id, (cpu, _) in measured.items():
            worker = self.workers[worker_id]
            worker.sts = [*worker.sts, round(cpu, 3)][-MAX_STS:]
            worker.cycles += 1
            worker.over += cpu > spec.scaling.target_utilization_pct
        for key, lease in self.leases.items():
            if lease.actual_owner in measured:
                self.leases[key] = lease.with_(lease_counter=lease.lease_counter + 1, throughput_kbps=rates[key])
        # The leader's full cycle: the signal from what it saw, then the scaler, then the assignment.
        lag_ms = max((int(lag * 1000) for _, lag in measured.values()), default=0)
        load = FleetLoad(
            workers=len(measured),
            leases=len(self.leases),
            utilization_pct=[cpu for cpu, _ in measured.values()],
            throughput_kbps=sum(rates.values()),
            max_lag_ms=lag_ms,
            now_epoch_s=now,
        )
        self.desired = decide_desired(spec.scaling, load, self.desired)
        if self.desired.changed:
            self.actions += 1
        self._scale(self.desired.desired, {w: cpu for w, (cpu, _) in measured.items()})
        self._assign(now)
        running = self._running()
        return Tick(
            time_s=self.time_s,
            multiplier=multiplier,
            desired=self.desired.desired,
            running=len(running),
            starting=len(self.workers) - len(running),
            max_lag_s=max((self.backlog_kb[k] / r for k, r in rates.items() if r > 0), default=0.0),
            cpu=tuple(cpu for cpu, _ in measured.values()),
            reason=self.desired.reason,
        )

    def _assign(self, now: float) -> None:
        """The leader's assignment run over the running workers' reports."""
        snapshot = AssignmentSnapshot(
            leases=tuple(self.leases.values()),
            workers=tuple(
                WorkerMetricStats(
                    worker_id=w,
                    last_update_epoch_s=int(now),
                    stats={CPU: tuple(self.workers[w].sts or [self.spec.base_cpu])},
                    operating_range={CPU: (100.0,)},
                )
                for w in self._running()
            ),
            now_epoch_s=now,
            shard_count=len(self.leases),
            run_number=self.run_number + 1,
        )
        plan = self.decider.decide(snapshot, rng=random.Random(self.spec.seed + self.run_number))
        self.leases = {lease.lease_key: lease for lease in apply_plan(list(self.leases.values()), plan)}

    def _scale(self, desired: int, cpu: dict[str, float]) -> None:
        running = self._running()
        starting = [w for w in self.workers if w not in running]
        if desired > len(self.workers):
            for _ in range(desired - len(self.workers)):
                self._add(ready_at=self.time_s + self.spec.start_delay_s)
            return
        surplus = len(self.workers) - desired
        for worker_id in sorted(starting, key=lambda w: -self.workers[w].ready_at)[:surplus]:
            del self.workers[worker_id]
            surplus -= 1
        if surplus > 0:
            for worker_id in removal_candidates(cpu, len(running) - surplus):
                self._remove(worker_id)

    def run(self) -> AutoscaleResult:
        ticks = [self.step() for _ in range(int(self.curve.duration_s // self.spec.interval_s))]
        everyone = [*self.workers.values(), *self.retired]
        return AutoscaleResult(
            spec=self.spec,
            curve=self.curve,
            ticks=tuple(ticks),
            peak_fleet=self.peak_fleet,
            over_target_share={w.worker_id: w.over / w.cycles for w in everyone if w.cycles},
            actions=self.actions,
        )


def run_autoscale(spec: AutoscaleSpec, curve: LoadCurve) -> AutoscaleResult:
    return AutoscaleSimulation(spec, curve).run()


def plot_autoscale(result: AutoscaleResult, path: str | Path) -> Path:
    """Load, workers (desired, running, starting) and the worst lag over time, in one PNG."""
    from worker_lib.tools.simulator.plot import require_matplotlib

    require_matplotlib(what="simulate --autoscale --plot")
    import matplotlib.pyplot as plt

    hours = [t.time_s / 3600 for t in result.ticks]
    fig, (load_ax, workers_ax, lag_ax) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    load_ax.plot(hours, [t.multiplier for t in result.ticks], color="tab:blue")
    load_ax.set_ylabel("load (× base rates)")
    workers_ax.step(hours, [t.desired for t in result.ticks], where="post", label="DesiredWorkers", color="tab:red")
    workers_ax.step(hours, [t.running for t in result.ticks], where="post", label="running", color="tab:green")
    workers_ax.step(
        hours, [t.running + t.starting for t in result.ticks], where="post", label="running + starting",
        color="tab:green", linestyle=":",
    )  # fmt: skip
    workers_ax.axhline(result.peak_fleet, color="0.6", linestyle="--", label="fleet sized for the peak")
    workers_ax.set_ylabel("workers")
    workers_ax.legend(loc="upper right", fontsize=8)
    lag_ax.plot(hours, [t.max_lag_s for t in result.ticks], color="tab:purple")
    lag_ax.axhline(result.spec.scaling.lag_threshold_ms / 1000, color="0.6", linestyle="--", label="lag threshold")
    lag_ax.set_ylabel("worst lag (s)")
    lag_ax.set_xlabel("hours")
    lag_ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(
        f"autoscale ({result.curve.name}, {result.spec.shards} shards): worker-minutes {result.ratio:.2f}× of a "
        f"fleet sized for the peak"
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def summary_lines(result: AutoscaleResult, *, lag_threshold_s: float | None = None) -> list[str]:
    threshold = lag_threshold_s if lag_threshold_s is not None else result.spec.scaling.lag_threshold_ms / 1000
    lines = [
        f"{result.curve.name}: {len(result.ticks)} cycles of {result.spec.interval_s:.0f} s; peak fleet "
        f"{result.peak_fleet}; workers min {min(t.running for t in result.ticks)}, max "
        f"{max(t.running for t in result.ticks)}",
        f"worker-minutes {result.worker_minutes:,.0f} against {result.peak_worker_minutes:,.0f} for the peak fleet "
        f"({result.ratio:.3f}×); over-target worker time {100 * result.fleet_over_target():.2f} % of all, p99 over "
        f"workers {100 * result.over_target_p99():.2f} %; {result.actions} scale actions "
        f"({result.actions_per_day():.1f} per day)",
    ]
    episode = result.lag_episode(threshold)
    if episode is None:
        lines.append(f"lag never above {threshold:.0f} s")
    else:
        above, back = episode
        lines.append(
            f"lag above {threshold:.0f} s from minute {above / 60:.1f}, back under at minute {back / 60:.1f} "
            f"({(back - above) / 60:.1f} min above)"
        )
    return lines


__all__: Sequence[str] = (
    "AutoscaleResult",
    "AutoscaleSpec",
    "LoadCurve",
    "diurnal",
    "parse_curve",
    "plot_autoscale",
    "run_autoscale",
    "spike",
    "summary_lines",
)
