"""What a decider sees: one consistent picture of the lease table and the worker metrics, taken by the leader.

Everything here is pure (no I/O, no clock reads): the leader loop reads the tables and the clocks and passes the
results in. Two small pieces of leader-side state live here too because they are pure and tested with the
deciders: :class:`ExpiryTracker` (lease expiry by counter observation) and the worker validity /
activity rules, as KCL 3.x (docs/kcl-compatibility.md, "Assignment loop" and "Worker-metrics table").

Worker rules (KCL 3.x):

* **valid** — a default-metric worker (no ``sts`` and no ``opr``) is valid; otherwise every metric in ``sts``
  needs an ``opr`` entry whose first value (the maximum utilisation) is present and non-zero. Invalid entries
  are ignored entirely.
* **active** — ``now − lut ≤ 2 × report interval`` (60 s with the default 30 s interval).
* **excluded** — any metric list ends in −1 (the worker could not read that metric in its last window). An
  excluded worker keeps the leases it holds (they stay until they expire) but receives and gives none.

Only workers that are valid, active and not excluded are *assignable*: they are the fleet the deciders balance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from worker_lib.core.models import Lease, WorkerMetricStats

DEFAULT_REPORT_INTERVAL_S = 30.0
"""Workers write their metrics every 30 s (as KCL); the leader treats 2 missed reports as inactive."""

INACTIVE_AFTER_REPORTS = 2
"""KCL's DEFAULT_NO_OF_SKIP_STAT_FOR_DEAD_WORKER_THRESHOLD."""

THROUGHPUT_METRIC = "T"
"""The synthetic metric the leader gives default-metric workers: their throughput ÷ the target average × 100."""

NEVER = -math.inf
"""The 'last counter increment' of a lease first seen without an owner: it sorts before every real time."""


def is_default_metric_worker(worker: WorkerMetricStats) -> bool:
    """KCL: no metrics at all, or a (synthetic) throughput metric, means "balance this worker by throughput"."""
    return worker.is_default_metric_worker or THROUGHPUT_METRIC in worker.stats


def is_valid_worker(worker: WorkerMetricStats) -> bool:
    """KCL's ``isValidWorkerMetric``: every reported metric needs an operating range with a non-zero maximum."""
    if is_default_metric_worker(worker):
        return True
    for name in worker.stats:
        if name not in worker.operating_range:
            return False
    return all(values and values[0] != 0 for values in worker.operating_range.values())


def is_active_worker(
    worker: WorkerMetricStats, now_epoch_s: float, report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
) -> bool:
    """Whether the worker reported recently: ``now − lut ≤ 2 × report interval``."""
    return now_epoch_s - worker.last_update_epoch_s <= INACTIVE_AFTER_REPORTS * report_interval_s


def is_excluded_worker(worker: WorkerMetricStats) -> bool:
    """A metric list ending in −1 excludes the worker from assignment (its last window had no samples)."""
    if worker.is_default_metric_worker:
        return False
    return worker.has_failed_metric()


def is_assignable_worker(
    worker: WorkerMetricStats, now_epoch_s: float, report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
) -> bool:
    """Valid, active and not excluded: the worker may receive and give leases."""
    return (
        is_valid_worker(worker)
        and is_active_worker(worker, now_epoch_s, report_interval_s)
        and not is_excluded_worker(worker)
    )


def owners_lags(live: Iterable[Lease], workers: Iterable[WorkerMetricStats]) -> list[tuple[str, str, int]]:
    """``(lease key, owner, MillisBehindLatest)`` for every live lease whose actual owner reported a lag for it in
    its worker-metrics row (``lag``): a lag a former owner still reports is stale and left out."""
    owner_of = {lease.lease_key: lease.actual_owner for lease in live}
    return [(key, w.worker_id, ms) for w in workers for key, ms in w.lag_ms.items() if owner_of.get(key) == w.worker_id]


def ema(values: Iterable[float], alpha: float) -> float:
    """KCL's exponential moving average over a metric list (oldest first), skipping −1; 0 when nothing is left."""
    average: float | None = None
    for value in values:
        if value == -1:
            continue
        average = float(value) if average is None else alpha * float(value) + (1.0 - alpha) * average
    return 0.0 if average is None else average


@dataclass(frozen=True, kw_only=True)
class AssignmentSnapshot:
    """The decider's whole input.

    leases: every lease the leader scanned (items of other entity types already skipped).
    workers: every worker-metrics entry scanned; the decider applies the validity / activity rules itself.
    now_epoch_s: the leader's wall clock at the scan (compared with ``lut``).
    expired_lease_keys: leases the leader judged expired by counter observation (see :class:`ExpiryTracker`).
      A lease without an owner is always treated as needing assignment, whether listed here or not.
    last_counter_increment: lease key → monotonic time its counter last grew (from the tracker); orders the
      expired leases oldest first, as KCL does. Missing keys sort as :data:`NEVER` (first).
    shard_count: live shards for the dynamic cap (docs/assignment.md); ``None`` = the number of unfinished leases.
    run_number: 1 for the first run after this leader took over, then 2, 3, … (variance balancing runs on
      runs 1, 1 + f, 1 + 2f, … for balancing frequency f, as KCL's run counter).
    balance: force balancing on (True) or off (False) regardless of ``run_number``; the leader's fast passes
      (docs/failover.md) only place leases that need an owner and never rebalance.
    draining: workers the fleet has been asked to remove (DesiredWorkers, docs/autoscaling.md, with
      ``drain_least_loaded`` on): our deciders give them nothing and neither take from nor balance around them, as
      for suspects; their leases stay until they stop, then move at once.
    """

    leases: tuple[Lease, ...]
    workers: tuple[WorkerMetricStats, ...]
    now_epoch_s: float
    expired_lease_keys: frozenset[str] = frozenset()
    last_counter_increment: Mapping[str, float] = field(default_factory=dict)
    shard_count: int | None = None
    run_number: int = 1
    balance: bool | None = None
    draining: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.run_number < 1:
            raise ValueError("run_number starts at 1")
        if self.shard_count is not None and self.shard_count < 0:
            raise ValueError("shard_count must not be negative")

    @property
    def live_shard_count(self) -> int:
        """Shards that need an owner: ``shard_count`` if given, else the unfinished leases."""
        if self.shard_count is not None:
            return self.shard_count
        return sum(1 for lease in self.leases if not lease.is_finished)

    def assignable_workers(self, report_interval_s: float = DEFAULT_REPORT_INTERVAL_S) -> tuple[WorkerMetricStats, ...]:
        """Valid, active, non-excluded workers, sorted by id (deterministic order for every decider)."""
        chosen = [w for w in self.workers if is_assignable_worker(w, self.now_epoch_s, report_interval_s)]
        return tuple(sorted(chosen, key=lambda w: w.worker_id))

    def is_balancing_run(self, balancing_frequency: int) -> bool:
        """KCL's run counter (runs 1, 1 + f, 1 + 2f, …) unless :attr:`balance` says otherwise."""
        if self.balance is not None:
            return self.balance
        return (self.run_number - 1) % balancing_frequency == 0

    def needs_owner(self, lease: Lease) -> bool:
        """Unassigned (no actual owner) or expired."""
        return lease.actual_owner is None or lease.lease_key in self.expired_lease_keys


class ExpiryTracker:
    """Lease expiry by counter observation on the leader's monotonic clock (as KCL 3.x).

    Lease items carry no timestamp: the leader remembers, per lease, the monotonic time at which it last saw the
    ``leaseCounter`` change. On first sight that is *now* for an owned lease (it gets a full lease duration to
    prove it is alive) and :data:`NEVER` for an unowned one. A lease is expired when ``now − last > failover``
    or it has no owner. Leases that vanish from the scan are forgotten. Call :meth:`reset` when leadership is
    (re)gained: a new leader must not judge with another term's observations.

    Any change of the counter counts as growth (a lease deleted and re-created starts again at 0).

    Observations can outlive a leader (docs/failover.md): :meth:`export` dates each one on the wall clock, and a
    new leader restores them (:meth:`restore`) before its first scan, shifted later by the clock-skew bound — a restored
    observation counts only if the lease still shows the same counter.
    """

    def __init__(self, failover_s: float) -> None:
        if failover_s <= 0:
            raise ValueError("failover_s must be positive")
        self._failover_s = failover_s
        self._seen: dict[str, tuple[int, float]] = {}
        self._restored: dict[str, tuple[int, float]] = {}

    @property
    def failover_s(self) -> float:
        return self._failover_s

    def reset(self) -> None:
        """Forget every observation (call on leadership takeover)."""
        self._seen.clear()
        self._restored.clear()

    def export(self, now_monotonic: float, now_wall: float) -> list[tuple[str, int, float]]:
        """``(lease key, counter, wall time since which the counter stood still)`` for every owned lease seen."""
        return [
            (key, counter, now_wall - (now_monotonic - last))
            for key, (counter, last) in sorted(self._seen.items())
            if last != NEVER
        ]

    def restore(
        self, entries: Iterable[tuple[str, int, float]], now_monotonic: float, now_wall: float, skew_s: float
    ) -> None:
        """Seed the next :meth:`observe` with another leader's exported observations (wall-dated, trusted up to the
        skew bound ``skew_s``: each is taken as made ``skew_s`` later than its date, never later than now)."""
        self._restored = {
            key: (counter, now_monotonic - max(0.0, now_wall - (since_wall + skew_s)))
            for key, counter, since_wall in entries
        }

    def observe(self, leases: Iterable[Lease], now_monotonic: float) -> frozenset[str]:
        """Record one scan taken at ``now_monotonic``; return the keys of expired or unowned leases."""
        seen: dict[str, tuple[int, float]] = {}
        expired: list[str] = []
        restored, self._restored = self._restored, {}
        for lease in leases:
            previous = self._seen.get(lease.lease_key) or restored.get(lease.lease_key)
            if previous is None:
                last = now_monotonic if lease.actual_owner is not None else NEVER
            elif lease.lease_counter != previous[0]:
                last = now_monotonic
            else:
                last = previous[1]
            seen[lease.lease_key] = (lease.lease_counter, last)
            if lease.actual_owner is None or now_monotonic - last > self._failover_s:
                expired.append(lease.lease_key)
        self._seen = seen
        return frozenset(expired)

    def last_increment(self, lease_key: str) -> float:
        """Monotonic time the lease's counter last grew (:data:`NEVER` if unknown or first seen unowned)."""
        entry = self._seen.get(lease_key)
        return NEVER if entry is None else entry[1]

    def last_increments(self) -> dict[str, float]:
        """A copy of every remembered last-increment time (for :attr:`AssignmentSnapshot.last_counter_increment`)."""
        return {key: last for key, (_, last) in self._seen.items()}

    def __len__(self) -> int:
        return len(self._seen)
