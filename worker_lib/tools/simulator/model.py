"""The model behind ``shardlease simulate``: an offline fleet that runs the real lease-assignment deciders cycle by
cycle.

Nothing here talks to AWS. A simulated leader runs one assignment cycle per ``interval_s`` (20 s, KCL's
``leaseAssignmentIntervalMillis``) over a simulated lease table and worker-metrics table:

* **Shards** have true rates (KBps): ``uniform`` (100 each), ``zipf[:S]`` (1000 / rank^S, shuffled) or
  ``hot[:K[:F]]`` (100 each, K shards F× hotter).
* **Workers** process the leases they actually own. Each cycle a live worker renews its leases (counter + 1,
  ``throughputKBps`` = the shard's rate) and reports one CPU value:
  ``base + Σ assigned throughput × cost × its cost factor + N(0, noise)``, clipped to 0..100, appended to its
  ``sts["C"]`` list (last 10 kept), ``opr = {"C": [100]}``, ``lut`` = simulated wall time. ``cost`` is
  calibrated so that the initial fleet averages ``target_cpu``; cost factors (cycled over the workers) model
  heterogeneous hosts.
* **The leader** observes the leases with an :class:`ExpiryTracker` on the simulated monotonic clock, builds an
  :class:`AssignmentSnapshot` (run number = cycle, shard count = open shards), calls the real decider with
  ``random.Random(seed + cycle)`` and applies the plan with :func:`apply_plan` (rebalance moves complete within
  the cycle).
* **Events**: ``join`` (new workers report from that cycle on), ``kill`` (the most loaded live workers stop
  before that cycle's renewals: their leases expire after the failover time, their metrics go stale and they
  become inactive after two report intervals), ``split`` (the hottest open shards end — checkpoint SHARD_END, rate
  0 — and two child leases with half the rate each appear, unassigned; a finished parent is deleted once both
  children are owned by live workers, as lease cleanup does).

Everything is deterministic for a seed (only the decision time, which is measured, varies). The state is
measured after each cycle's plan: the load of a live worker is the true throughput of the leases it owns; the
imbalance figures are over live workers. The inputs (strategies, skews, events, the fleet) are parsed in
:mod:`worker_lib.tools.simulator.inputs`. The LPT reference and the bounds on moves that ``bench/assignment.py``
judges the deciders against are in :mod:`worker_lib.tools.simulator.measures`; text tables in
:mod:`~worker_lib.tools.simulator.render`, plots in :mod:`~worker_lib.tools.simulator.plot`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.plan import apply_plan
from worker_lib.assignment.snapshot import AssignmentSnapshot, ExpiryTracker
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import SHARD_END, Lease, WorkerMetricStats
from worker_lib.leases.config import LeaseConfig
from worker_lib.tools.simulator.inputs import (
    EVENT_KINDS,
    STRATEGIES,
    STRATEGY_FACTORIES,
    STRATEGY_LABELS,
    Event,
    EventKind,
    FleetSpec,
    Skew,
    make_strategy,
    parse_event,
    parse_skew,
    shard_rates,
)
from worker_lib.tools.simulator.measures import lpt_loads, max_over_mean, min_over_mean, p95_over_mean

__all__ = [
    "CPU_METRIC",
    "EPOCH0",
    "EVENT_KINDS",
    "MAX_STS",
    "STRATEGIES",
    "STRATEGY_FACTORIES",
    "STRATEGY_LABELS",
    "CycleStats",
    "Event",
    "EventKind",
    "FleetSpec",
    "SimResult",
    "Simulation",
    "Skew",
    "WorkerRow",
    "make_strategy",
    "parse_event",
    "parse_skew",
    "shard_rates",
    "simulate",
]

EPOCH0 = 1_700_000_000
"""Simulated wall clock (epoch seconds) at cycle 0."""

MAX_STS = 10
CPU_METRIC = "C"


# --------------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, kw_only=True)
class CycleStats:
    """The fleet after one cycle's plan was applied (live workers only in the per-worker maps)."""

    cycle: int
    time_s: float
    events: tuple[str, ...]
    balancing_ran: bool
    assigned: int
    reassigned_expired: int
    moved: int
    unassigned: int
    """Open leases not owned by a live worker after the plan (unassigned, or still held by a dead worker)."""
    throughput: Mapping[str, float]
    cpu: Mapping[str, float]
    """Noise-free CPU a live worker will run at with this assignment."""
    leases: Mapping[str, int]
    decide_ms: float = field(default=0.0, compare=False)

    @property
    def live_workers(self) -> int:
        return len(self.throughput)

    @property
    def tp_max_over_mean(self) -> float:
        return max_over_mean(self.throughput.values())

    @property
    def tp_p95_over_mean(self) -> float:
        return p95_over_mean(self.throughput.values())

    @property
    def tp_min_over_mean(self) -> float:
        return min_over_mean(self.throughput.values())

    @property
    def cpu_max_over_mean(self) -> float:
        return max_over_mean(self.cpu.values())


@dataclass(frozen=True, kw_only=True)
class WorkerRow:
    worker_id: str
    status: str
    leases: int
    throughput_kbps: float
    cpu_pct: float
    cost_factor: float


@dataclass(frozen=True, kw_only=True)
class SimResult:
    spec: FleetSpec
    strategy: str
    events: tuple[Event, ...]
    cycles: tuple[CycleStats, ...]
    workers: tuple[WorkerRow, ...]
    final_rates: tuple[float, ...]
    """True rates of the open shards at the end (what the LPT reference places)."""
    total_rate_kbps: float
    cost_per_kbps: float

    @property
    def final(self) -> CycleStats:
        return self.cycles[-1]

    def reference_loads(self) -> list[float]:
        """The LPT reference's per-worker loads over the final live workers, knowing the true rates."""
        return lpt_loads(self.final_rates, max(1, self.final.live_workers))

    def reference_ratio(self) -> float:
        """LPT's max/mean over the final live workers."""
        return max_over_mean(self.reference_loads())

    @property
    def decide_times_ms(self) -> list[float]:
        return [c.decide_ms for c in self.cycles]

    def totals(self) -> dict[str, int]:
        return {
            "assigned": sum(c.assigned for c in self.cycles),
            "reassigned_expired": sum(c.reassigned_expired for c in self.cycles),
            "moved": sum(c.moved for c in self.cycles),
        }


# --------------------------------------------------------------------------------------------------- the fleet


@dataclass
class _Worker:
    worker_id: str
    cost_factor: float
    joined_cycle: int
    died_cycle: int | None = None
    sts: list[float] = field(default_factory=list)
    lut: int = EPOCH0

    @property
    def alive(self) -> bool:
        return self.died_cycle is None

    def status(self) -> str:
        if self.died_cycle is not None:
            return f"dead@{self.died_cycle}"
        return f"joined@{self.joined_cycle}" if self.joined_cycle > 1 else "live"

    def metrics(self) -> WorkerMetricStats:
        return WorkerMetricStats(
            worker_id=self.worker_id,
            last_update_epoch_s=self.lut,
            stats={CPU_METRIC: tuple(self.sts)},
            operating_range={CPU_METRIC: (100.0,)},
        )


class Simulation:
    """One fleet under one strategy; :meth:`step` runs one leader cycle, :meth:`run` runs many."""

    def __init__(
        self,
        spec: FleetSpec,
        *,
        strategy: str = "variance",
        events: Iterable[Event] = (),
        config: AssignmentConfig | None = None,
    ) -> None:
        self.spec = spec
        self.strategy = strategy
        self.config = config or AssignmentConfig()
        self.decider = make_strategy(strategy, self.config)
        self.events = tuple(sorted(events, key=lambda e: (e.cycle, EVENT_KINDS.index(e.kind))))
        rng = random.Random(spec.seed)
        self._noise = random.Random(spec.seed * 1_000_003 + 17)
        rates = shard_rates(spec.shards, spec.skew, rng)
        total = sum(rates)
        self.total_rate_kbps = total
        self.cost_per_kbps = (spec.target_cpu - spec.base_cpu) * spec.workers / total if total > 0 else 0.0
        joins = sum(e.count for e in self.events if e.kind == "join")
        self._width = max(3, len(str(spec.workers + joins - 1)))
        splits = sum(e.count for e in self.events if e.kind == "split")
        self._shard_width = max(6, len(str(spec.shards + 2 * splits)))
        self.rates: dict[str, float] = {}
        self.leases: list[Lease] = []
        for i, rate in enumerate(rates):
            key = self._shard_key(i)
            self.rates[key] = rate
            self.leases.append(Lease(lease_key=key))
        self._next_shard = spec.shards
        self.workers: dict[str, _Worker] = {}
        for _ in range(spec.workers):
            self._add_worker(joined_cycle=1)
        self.tracker = ExpiryTracker(LeaseConfig().failover_s)  # KCL's lease duration: a cycle is two of them
        self.cycle = 0
        self.history: list[CycleStats] = []

    # ---- helpers

    def _shard_key(self, index: int) -> str:
        return f"shardId-{index:0{self._shard_width}d}"

    def _add_worker(self, *, joined_cycle: int) -> _Worker:
        index = len(self.workers)
        factors = self.spec.cost_factors or (1.0,)
        worker = _Worker(
            worker_id=f"w{index:0{self._width}d}",
            cost_factor=factors[index % len(factors)],
            joined_cycle=joined_cycle,
        )
        self.workers[worker.worker_id] = worker
        return worker

    def _live(self, worker_id: str | None) -> bool:
        return worker_id is not None and worker_id in self.workers and self.workers[worker_id].alive

    def _cpu(self, worker: _Worker, throughput: float) -> float:
        value = self.spec.base_cpu + throughput * self.cost_per_kbps * worker.cost_factor
        return min(100.0, max(0.0, value))

    def throughput_by_worker(self) -> dict[str, float]:
        """True throughput processed by each live worker under the current lease table."""
        load = {w: 0.0 for w, worker in self.workers.items() if worker.alive}
        for lease in self.leases:
            owner = lease.actual_owner
            if owner in load:
                load[owner] += self.rates[lease.lease_key]
        return load

    def held_rates(self) -> dict[str, list[float]]:
        """Per worker (live or dead), the true rates of the open leases it owns now."""
        held: dict[str, list[float]] = {w: [] for w in self.workers}
        for lease in self.leases:
            owner = lease.actual_owner
            if owner in held and not lease.is_finished:
                held[owner].append(self.rates[lease.lease_key])
        return held

    # ---- events

    def _apply_events(self, cycle: int) -> list[str]:
        notes: list[str] = []
        for event in self.events:
            if event.cycle != cycle:
                continue
            if event.kind == "join":
                added = [self._add_worker(joined_cycle=cycle).worker_id for _ in range(event.count)]
                notes.append(f"+{','.join(added)}" if len(added) <= 3 else f"+{len(added)} workers")
            elif event.kind == "kill":
                load = self.throughput_by_worker()
                if event.count > len(load):
                    raise ConfigError(
                        f"kill at cycle {cycle}: {event.count} worker(s) requested but only {len(load)} alive"
                    )
                victims = sorted(load, key=lambda w: (-load[w], w))[: event.count]
                for w in victims:
                    self.workers[w].died_cycle = cycle
                notes.append(f"-{','.join(victims)}" if len(victims) <= 3 else f"-{len(victims)} workers")
            else:
                notes.extend(self._split(event.count))
        return notes

    def _split(self, count: int) -> list[str]:
        open_leases = [lease for lease in self.leases if not lease.is_finished]
        hottest = sorted(open_leases, key=lambda lease: (-self.rates[lease.lease_key], lease.lease_key))[:count]
        notes: list[str] = []
        for parent in hottest:
            children: list[str] = []
            for _ in range(2):
                key = self._shard_key(self._next_shard)
                self._next_shard += 1
                self.rates[key] = self.rates[parent.lease_key] / 2.0
                children.append(key)
                self.leases.append(Lease(lease_key=key, parent_shard_ids=frozenset({parent.lease_key})))
            self.rates[parent.lease_key] = 0.0
            index = self.leases.index(parent)
            self.leases[index] = parent.with_(
                checkpoint=SHARD_END, child_shard_ids=frozenset(children), throughput_kbps=0.0
            )
            notes.append(f"split {parent.lease_key.rsplit('-', 1)[-1]}")
        return notes

    def _cleanup(self) -> None:
        """Delete finished leases whose children are all owned by live workers (KCL's lease cleanup)."""
        owner_of = {lease.lease_key: lease.actual_owner for lease in self.leases}
        keep: list[Lease] = []
        for lease in self.leases:
            children = lease.child_shard_ids
            if lease.is_finished and children and all(self._live(owner_of.get(c)) for c in children):
                self.rates.pop(lease.lease_key, None)
                continue
            keep.append(lease)
        self.leases = keep

    # ---- one cycle

    def step(self) -> CycleStats:
        self.cycle += 1
        cycle = self.cycle
        now = cycle * self.spec.interval_s
        notes = self._apply_events(cycle)
        self._cleanup()

        # Live workers renew what they hold and report the CPU of the interval that just ended.
        load = self.throughput_by_worker()
        renewed: list[Lease] = []
        for lease in self.leases:
            if self._live(lease.actual_owner):
                rate = self.rates[lease.lease_key]
                renewed.append(lease.with_(lease_counter=lease.lease_counter + 1, throughput_kbps=round(rate, 6)))
            else:
                renewed.append(lease)
        self.leases = renewed
        for worker_id in sorted(self.workers):
            worker = self.workers[worker_id]
            if not worker.alive:
                continue
            noise = self._noise.gauss(0.0, self.spec.noise_pct) if self.spec.noise_pct > 0 else 0.0
            value = min(100.0, max(0.0, self._cpu(worker, load[worker_id]) + noise))
            worker.sts = [*worker.sts, round(value, 3)][-MAX_STS:]
            worker.lut = int(EPOCH0 + now)

        # The leader's cycle.
        expired = self.tracker.observe(self.leases, now)
        snapshot = AssignmentSnapshot(
            leases=tuple(self.leases),
            workers=tuple(w.metrics() for w in self.workers.values() if w.sts),
            now_epoch_s=EPOCH0 + now,
            expired_lease_keys=expired,
            last_counter_increment=self.tracker.last_increments(),
            shard_count=sum(1 for lease in self.leases if not lease.is_finished),
            run_number=cycle,
        )
        started = time.perf_counter()
        plan = self.decider.decide(snapshot, rng=random.Random(self.spec.seed + cycle))
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        self.leases = list(apply_plan(self.leases, plan))

        throughput = self.throughput_by_worker()
        counts = dict.fromkeys(throughput, 0)
        unowned = 0
        for lease in self.leases:
            owner = lease.actual_owner
            if owner in counts:
                counts[owner] += 1
            elif not lease.is_finished:
                unowned += 1
        stats = CycleStats(
            cycle=cycle,
            time_s=now,
            events=tuple(notes),
            balancing_ran=plan.balancing_ran,
            assigned=plan.assigned,
            reassigned_expired=plan.reassigned_expired,
            moved=plan.moved,
            unassigned=unowned,
            throughput=throughput,
            cpu={w: round(self._cpu(self.workers[w], tp), 6) for w, tp in throughput.items()},
            leases=counts,
            decide_ms=elapsed_ms,
        )
        self.history.append(stats)
        return stats

    def run(self, cycles: int) -> SimResult:
        if cycles < 1:
            raise ConfigError(f"cycles={cycles} must be at least 1")
        for event in self.events:
            if event.cycle > self.cycle + cycles:
                raise ConfigError(f"{event.kind} at cycle {event.cycle} is after the last cycle ({cycles})")
        for _ in range(cycles):
            self.step()
        return self.result()

    def result(self) -> SimResult:
        last = self.history[-1] if self.history else None
        rows: list[WorkerRow] = []
        for worker_id in sorted(self.workers):
            worker = self.workers[worker_id]
            tp = last.throughput.get(worker_id, 0.0) if last else 0.0
            rows.append(
                WorkerRow(
                    worker_id=worker_id,
                    status=worker.status(),
                    leases=last.leases.get(worker_id, 0) if last else 0,
                    throughput_kbps=tp,
                    cpu_pct=self._cpu(worker, tp) if worker.alive else 0.0,
                    cost_factor=worker.cost_factor,
                )
            )
        return SimResult(
            spec=self.spec,
            strategy=self.strategy,
            events=self.events,
            cycles=tuple(self.history),
            workers=tuple(rows),
            final_rates=tuple(self.rates[lease.lease_key] for lease in self.leases if not lease.is_finished),
            total_rate_kbps=self.total_rate_kbps,
            cost_per_kbps=self.cost_per_kbps,
        )


def simulate(
    spec: FleetSpec,
    *,
    strategy: str = "variance",
    cycles: int = 12,
    events: Iterable[Event] = (),
    config: AssignmentConfig | None = None,
) -> SimResult:
    """Run ``cycles`` leader cycles of ``spec`` under ``strategy`` and return the history."""
    return Simulation(spec, strategy=strategy, events=events, config=config).run(cycles)
