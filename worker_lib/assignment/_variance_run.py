"""The working state and the shared algorithm of one variance decision (KCL's InMemoryStorageView plus the decider).

:class:`VarianceRun` is KCL 3.x's algorithm up to its balancing phase; the two variants in
:mod:`worker_lib.assignment.variance` — KCL-exact and ours — supply the receiver priority and the balancing, and
ours overrides the named hooks below (docs/assignment.md, "Where we differ", lists each difference and why):

* :meth:`~VarianceRun.find_suspects` — workers that receive nothing this run (KCL: none);
* :meth:`~VarianceRun.increment` — how one lease raises a worker's metric;
* :meth:`~VarianceRun.limit_avg` — the average a receiver may be filled up to;
* :meth:`~VarianceRun.project_handoffs` — leases in graceful handoff counted at their destination (KCL: no);
* :meth:`~VarianceRun.order_pending` — the order pending leases are placed in (KCL: oldest first);
* :meth:`~VarianceRun.receiver_for` — the worker an expired lease goes to, given the best one (KCL: the best);
* :attr:`~VarianceRun.project_donor_on_assign` — whether a reassigned lease lowers its old owner's projection.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod

from worker_lib.assignment.config import AssignmentConfig, effective_cap
from worker_lib.assignment.plan import AssignmentPlan, DecisionKind
from worker_lib.assignment.snapshot import THROUGHPUT_METRIC, AssignmentSnapshot, ema, is_default_metric_worker
from worker_lib.assignment.state import LazyHeap, Recorder, fmt, ordered_pending, pending_kind
from worker_lib.core.models import Lease


class VarianceRun(ABC):
    """One variance decision: per-worker projected metrics, the receiver queue, the recorded decisions."""

    project_donor_on_assign: bool = False
    """KCL projects only the receiver of an assigned or reassigned lease."""

    def __init__(self, config: AssignmentConfig, snapshot: AssignmentSnapshot, rng: random.Random) -> None:
        self.config = config
        self.snapshot = snapshot
        self.rng = rng
        self.recorder = Recorder()
        workers = snapshot.assignable_workers(config.worker_report_interval_s)
        self.worker_ids: list[str] = [w.worker_id for w in workers]
        self.reported_capacity: dict[str, float | None] = {w.worker_id: w.capacity for w in workers}
        self.assignable = set(self.worker_ids)
        leases = snapshot.leases
        known = [lease.throughput_kbps for lease in leases if lease.throughput_kbps is not None]
        self.avg_lease_tp = sum(known) / len(known) if known else 0.0
        self.tp: dict[str, float] = {
            lease.lease_key: (lease.throughput_kbps if lease.throughput_kbps is not None else self.avg_lease_tp)
            for lease in leases
        }
        n_workers = len(self.worker_ids)
        self.target_avg_tp = self.avg_lease_tp * len(leases) / max(1, n_workers)
        self.target_leases_per_worker = max(len(leases) // max(n_workers, 1), 1)
        self.cap = effective_cap(config, shard_count=snapshot.live_shard_count, worker_count=n_workers)
        self.max_tp = config.max_throughput_per_host_kbps if config.max_throughput_per_host_kbps else math.inf

        self.owner_of: dict[str, str | None] = {}
        self.owner_leases: dict[str | None, dict[str, Lease]] = {}
        self.owner_tp: dict[str | None, float] = {}
        for lease in leases:
            owner = lease.actual_owner
            self.owner_of[lease.lease_key] = owner
            self.owner_leases.setdefault(owner, {})[lease.lease_key] = lease
            self.owner_tp[owner] = self.owner_tp.get(owner, 0.0) + self.tp[lease.lease_key]

        alpha = config.ema_alpha
        self.values: dict[str, dict[str, float]] = {}
        self.opr: dict[str, dict[str, float]] = {}
        for w in workers:
            if is_default_metric_worker(w):
                total = self.owner_tp.get(w.worker_id, 0.0)
                ratio = total / self.target_avg_tp if self.target_avg_tp > 0 else 0.0
                self.values[w.worker_id] = {THROUGHPUT_METRIC: ratio * 100.0}
                self.opr[w.worker_id] = {THROUGHPUT_METRIC: 100.0}
            else:
                self.values[w.worker_id] = {m: ema(v, alpha) for m, v in sorted(w.stats.items())}
                self.opr[w.worker_id] = {m: float(r[0]) for m, r in w.operating_range.items() if r}
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for per_worker in self.values.values():
            for m, v in per_worker.items():
                sums[m] = sums.get(m, 0.0) + v
                counts[m] = counts.get(m, 0) + 1
        self.fleet_avg: dict[str, float] = {m: sums[m] / counts[m] for m in sorted(sums)}
        self.queue = LazyHeap()
        self.acted_metric: str | None = None
        self.suspects: frozenset[str] = self.find_suspects()
        self.decided: set[str] = self.recorder.decided
        self.band_avg: dict[str, float] = {}
        """Ours, on balancing runs: per metric, the average the band was centred on (empty for KCL)."""

    # ---- hooks (KCL's behaviour here; ours overrides them)

    def find_suspects(self) -> frozenset[str]:
        """Workers that receive nothing this run and that balancing neither takes from nor balances around."""
        return frozenset()

    def increment(self, metric: str, throughput: float) -> float:
        """How much one lease of ``throughput`` raises a worker's ``metric`` (KCL's extrapolation)."""
        avg = self.fleet_avg.get(metric, 0.0)
        if self.target_avg_tp > 0:
            return throughput * avg / self.target_avg_tp
        return avg / self.target_leases_per_worker

    def limit_avg(self, metric: str) -> float:
        """The average a receiver may be filled up to: the fleet's."""
        return self.fleet_avg[metric]

    def project_handoffs(self) -> None:
        """Before anything is decided: adjust the projection for leases in graceful handoff.

        KCL counts a lease in handoff on its old owner (the actual owner) until the handoff completes.
        """
        return

    def order_pending(self, pending: list[Lease]) -> list[Lease]:
        """The order unassigned and expired leases are placed in (given oldest first)."""
        return pending

    def receiver_for(self, lease: Lease, best: str) -> str | None:
        """The worker a pending ``lease`` goes to when ``best`` heads the queue; None: it stays (no write)."""
        return best

    @abstractmethod
    def priority(self, worker: str) -> tuple[float, ...]:
        """The receiver queue's key (smallest first)."""

    @abstractmethod
    def balance(self) -> None:
        """The balancing phase of a balancing run."""

    # ---- projections

    def count(self, worker: str | None) -> int:
        return len(self.owner_leases.get(worker, ()))

    def eligible(self, worker: str) -> bool:
        """KCL: under the throughput limit (≤) and under the lease cap (or holding none). Ours: not a suspect."""
        if worker in self.suspects:
            return False
        if self.owner_tp.get(worker, 0.0) > self.max_tp:
            return False
        n = self.count(worker)
        return n == 0 or self.cap is None or n < self.cap

    def push_if_eligible(self, worker: str) -> None:
        if self.eligible(worker):
            self.queue.push(worker, self.priority(worker))
        else:
            self.queue.discard(worker)

    def load_of(self, worker: str | None, metric: str) -> float | None:
        if worker is None or worker not in self.values:
            return None
        return self.values[worker].get(metric)

    def binding_metric(self, worker: str) -> str:
        """The receiver's metric that limits it most (used to label assignment decisions)."""
        values = self.values[worker]
        if not values:
            return THROUGHPUT_METRIC
        if self.acted_metric is not None and self.acted_metric in values:
            return self.acted_metric
        return max(values, key=lambda m: (values[m] / self.fleet_avg[m] if self.fleet_avg[m] > 0 else values[m], m))

    def will_go_above(self, worker: str, throughput: float) -> bool:
        for m, v in self.values[worker].items():
            new = v + self.increment(m, throughput)
            if new > self.limit_avg(m) or new > self.opr[worker].get(m, math.inf):
                return True
        return False

    def move(self, lease: Lease, to: str, *, project_donor: bool) -> None:
        """Move ``lease`` to ``to`` in memory: receiver's metrics extrapolated, throughput totals updated."""
        key = lease.lease_key
        tp = self.tp[key]
        old = self.owner_of[key]
        for m in self.values[to]:
            self.values[to][m] += self.increment(m, tp)
        if project_donor and old is not None and old in self.values:
            for m in self.values[old]:
                self.values[old][m] -= self.increment(m, tp)
        self.owner_leases[old].pop(key, None)
        self.owner_leases.setdefault(to, {})[key] = lease
        self.owner_tp[old] = self.owner_tp.get(old, 0.0) - tp
        self.owner_tp[to] = self.owner_tp.get(to, 0.0) + tp
        self.owner_of[key] = to

    def record(self, lease: Lease, to: str, kind: DecisionKind, reason: str, *, project_donor: bool) -> None:
        """Move ``lease`` to ``to`` (see :meth:`move`) and record the decision, labelled with the metric acted on
        (else the receiver's binding metric, as it was before the move)."""
        metric = self.acted_metric or self.binding_metric(to)
        self.recorder.record(
            lease,
            from_worker=self.owner_of[lease.lease_key],
            to_worker=to,
            kind=kind,
            reason=reason,
            metric=metric,
            throughput_kbps=self.tp[lease.lease_key],
            load_of=lambda worker: self.load_of(worker, metric),
            move=lambda: self.move(lease, to, project_donor=project_donor),
        )

    def balance_reason(self, donor: str, amount: float, metric: str) -> str:
        """A balancing decision's reason."""
        avg = self.limit_avg(metric)
        v = self.values[donor][metric]
        return (
            f"rebalance: {donor} {metric} {fmt(v)} vs fleet avg {fmt(avg)} "
            f"(threshold {self.config.rebalance_threshold_pct:g}%), taking {amount:.1f} KBps "
            f"(dampening {self.config.dampening_pct:g}%)"
        )

    # ---- phases

    def start(self) -> None:
        self.project_handoffs()
        for worker in self.worker_ids:
            if self.eligible(worker):
                self.queue.push(worker, self.priority(worker))

    def assign_pending(self) -> list[str]:
        """Place unassigned and expired leases, each on the queue's head; returns the leases left without one."""
        pending = self.order_pending(ordered_pending(self.snapshot))
        left: list[str] = []
        for i, lease in enumerate(pending):
            best = self.queue.pop()
            if best is None:
                left.extend(p.lease_key for p in pending[i:])
                break
            current = self.owner_of[lease.lease_key]
            worker = self.receiver_for(lease, best)
            if worker is None:
                continue
            expired_handoff = lease.checkpoint_owner is not None
            if current == worker and not expired_handoff:
                self.queue.push(worker, self.priority(worker))
                continue
            kind = pending_kind(lease)
            what = "unassigned" if kind == "assign" else f"expired (owner {current})"
            metric = self.binding_metric(worker)
            reason = (
                f"{what} lease to the worker with most spare capacity ({metric} {fmt(self.values[worker][metric])}, "
                f"fleet avg {fmt(self.fleet_avg.get(metric, 0.0))})"
            )
            self.record(lease, worker, kind, reason, project_donor=self.project_donor_on_assign)
            self.push_if_eligible(worker)
        return left

    def plan(self, *, balancing_ran: bool, unassigned: list[str]) -> AssignmentPlan:
        metric = self.acted_metric
        if metric is None and self.fleet_avg:
            counts: dict[str, int] = {}
            for values in self.values.values():
                for m in values:
                    counts[m] = counts.get(m, 0) + 1
            metric = max(sorted(counts), key=lambda m: counts[m])
        projected_load: dict[str, float] = {}
        for worker in self.worker_ids:
            values = self.values[worker]
            if metric is not None and metric in values:
                projected_load[worker] = values[metric]
            elif values:
                projected_load[worker] = max(values.values())
            else:
                projected_load[worker] = 0.0
        return AssignmentPlan(
            strategy="variance",
            decisions=self.recorder.decisions(),
            metric=metric,
            projected_load=projected_load,
            projected_metrics={w: dict(self.values[w]) for w in self.worker_ids},
            projected_throughput_kbps={w: self.owner_tp.get(w, 0.0) for w in self.worker_ids},
            projected_leases={w: self.count(w) for w in self.worker_ids},
            effective_cap=self.cap,
            balancing_ran=balancing_ran,
            unassigned_lease_keys=tuple(unassigned),
            fleet_average=dict(self.fleet_avg),
            band_average=dict(self.band_avg),
        )
