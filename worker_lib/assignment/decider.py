"""Lease-assignment deciders: pure functions of an :class:`AssignmentSnapshot` (no I/O, no clock reads).

Three deciders share one output type, :class:`AssignmentPlan`:

* :class:`VarianceDecider` — KCL 3.x's worker-utilisation-aware decider (reference §4–§5). With
  ``kcl_compatible=True`` it reproduces KCL's decisions, quirks included (every §10 scenario); by default it
  uses the refinements described in docs/assignment.md ("Where we differ").
* :class:`CountDecider` — the lease-count strategy (KCL 3.4.3+). By default it balances to per-worker quotas
  (floor or ceil of leases ÷ workers, the ceil slots spread evenly over the id-sorted fleet) so that seed 001's
  500 shards over 100 + 100 workers end 250 / 250 per cluster; ``kcl_compatible=True`` is KCL's two-pointer
  version.
* :class:`KCL2StealingDecider` — a baseline: one KCL 2.x lease-taker round of every worker (take expired leases,
  else steal one lease from the most loaded worker), for benchmarks and for documenting seed 001.

All three honour ``max_leases_for_worker`` and seed 004's dynamic cap (``AssignmentConfig.dynamic_cap``):
the cap is ``min(dynamic_cap, ceil(shards / assignable workers))``, recomputed on every call from the
snapshot, so it follows resharding and fleet changes with no restart and no stored value to go stale.

Determinism: every tie is broken by worker id or lease order, and the only randomness (KCL's shuffle of donor
leases, the stealing order) comes from the ``rng`` argument — the same snapshot and seed give the same plan.
Performance: heaps keyed by worker, no worker × lease loops (10 000 leases × 1 000 workers in well under 1 s).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from worker_lib.assignment.config import AssignmentConfig, effective_cap
from worker_lib.assignment.snapshot import NEVER, THROUGHPUT_METRIC, AssignmentSnapshot, ema, is_default_metric_worker
from worker_lib.core.models import Lease

DecisionKind = Literal["assign", "reassign_expired", "rebalance"]
COUNT_METRIC = "leases"
"""The 'metric' of the count-based deciders: leases held."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One lease to (re)assign.

    kind: ``assign`` (the lease had no owner), ``reassign_expired`` (its owner stopped renewing — write with
      ``assignLease``), ``rebalance`` (a live lease moved for balance — start a graceful handoff).
    from_worker: the actual owner when decided (the checkpoint owner during a handoff); None if unassigned.
    metric / load_before / load_after: the metric acted on and its projected value for the workers involved
      (from and to, where known) just before and just after this decision.
    """

    lease_key: str
    from_worker: str | None
    to_worker: str
    kind: DecisionKind
    reason: str
    metric: str
    throughput_kbps: float = 0.0
    load_before: Mapping[str, float] = field(default_factory=dict)
    load_after: Mapping[str, float] = field(default_factory=dict)

    def to_log(self) -> dict[str, Any]:
        """One structured log line's fields."""
        return {
            "lease": self.lease_key,
            "from": self.from_worker,
            "to": self.to_worker,
            "kind": self.kind,
            "reason": self.reason,
            "metric": self.metric,
            "throughput_kbps": round(self.throughput_kbps, 6),
            "load_before": {k: round(v, 4) for k, v in self.load_before.items()},
            "load_after": {k: round(v, 4) for k, v in self.load_after.items()},
        }


@dataclass(frozen=True, kw_only=True)
class AssignmentPlan:
    """What a decider wants written, plus its projection of the result.

    decisions: at most one per lease (the final destination), in decision order.
    metric: the metric balancing acted on (or the fleet's main metric when it did not run; ``leases`` for the
      count-based deciders).
    projected_load: per assignable worker, that metric's projected value after the plan.
    projected_metrics / projected_throughput_kbps / projected_leases: the full projection per assignable worker.
    effective_cap: the per-worker lease cap this decision used (None = unlimited).
    balancing_ran: whether this was a balancing run.
    unassigned_lease_keys: leases that needed an owner and got none (no capacity: caps, throughput limit, or no
      assignable worker — ours: no assignable worker that is not a suspect). An expired lease whose owner is the
      only live candidate stays with it and is not listed.
    """

    strategy: str
    decisions: tuple[Decision, ...]
    metric: str | None
    projected_load: Mapping[str, float]
    projected_metrics: Mapping[str, Mapping[str, float]]
    projected_throughput_kbps: Mapping[str, float]
    projected_leases: Mapping[str, int]
    effective_cap: int | None
    balancing_ran: bool
    unassigned_lease_keys: tuple[str, ...] = ()
    fleet_average: Mapping[str, float] = field(default_factory=dict)
    band_average: Mapping[str, float] = field(default_factory=dict)
    """Ours, on balancing runs: per metric, the average the band was centred on (projected values of the live
    workers, without suspects and without workers that cannot give anything); receivers are filled up to it."""

    @property
    def assigned(self) -> int:
        return sum(1 for d in self.decisions if d.kind == "assign")

    @property
    def reassigned_expired(self) -> int:
        return sum(1 for d in self.decisions if d.kind == "reassign_expired")

    @property
    def moved(self) -> int:
        return sum(1 for d in self.decisions if d.kind == "rebalance")

    def load_ratio(self) -> float:
        """max / mean of the projected load (1.0 for an empty or idle fleet)."""
        values = list(self.projected_load.values())
        if not values:
            return 1.0
        mean = sum(values) / len(values)
        return max(values) / mean if mean > 0 else 1.0

    def summary(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "assigned": self.assigned,
            "reassigned_expired": self.reassigned_expired,
            "moved": self.moved,
            "unassigned": len(self.unassigned_lease_keys),
            "balancing_ran": self.balancing_ran,
            "effective_cap": self.effective_cap,
            "metric": self.metric,
            "max_over_mean": round(self.load_ratio(), 4),
        }


class Decider(Protocol):
    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        """Decide assignments for one leader run. Pure: same snapshot and rng state → same plan."""
        ...


def apply_plan(leases: Iterable[Lease], plan: AssignmentPlan, *, graceful: bool = False) -> tuple[Lease, ...]:
    """The lease table after ``plan`` is written (for simulation and tests).

    Assignments and expired reassignments are ``assignLease`` (owner set, checkpoint owner cleared, counter + 1);
    rebalance moves are completed handoffs unless ``graceful`` is set, in which case they are left in progress
    (``checkpointOwner`` = old owner, counter untouched) as ``initiateGracefulHandoff`` writes them.
    """
    by_key = {d.lease_key: d for d in plan.decisions}
    out: list[Lease] = []
    for lease in leases:
        decision = by_key.get(lease.lease_key)
        if decision is None:
            out.append(lease)
        elif graceful and decision.kind == "rebalance" and lease.checkpoint_owner is None:
            out.append(lease.with_(lease_owner=decision.to_worker, checkpoint_owner=lease.lease_owner))
        else:
            switched = lease.actual_owner != decision.to_worker
            out.append(
                lease.with_(
                    lease_owner=decision.to_worker,
                    checkpoint_owner=None,
                    lease_counter=lease.lease_counter + 1,
                    owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint + int(switched),
                )
            )
    return tuple(out)


def make_decider(config: AssignmentConfig) -> Decider:
    """The decider ``config.strategy`` names."""
    if config.strategy == "count":
        return CountDecider(config)
    return VarianceDecider(config)


# --------------------------------------------------------------------------------------------------- helpers


class _Recorder:
    """Keeps one decision per lease (the last destination, the first origin and kind)."""

    def __init__(self) -> None:
        self._by_key: dict[str, Decision] = {}

    def record(self, decision: Decision, *, emit: bool = True) -> None:
        """``emit=False``: a move made in memory only (a live lease already in handoff cannot be written)."""
        previous = self._by_key.get(decision.lease_key)
        if previous is None and not emit:
            return
        if previous is not None:
            if decision.to_worker == previous.from_worker and previous.kind == "rebalance":
                del self._by_key[decision.lease_key]
                return
            decision = Decision(
                lease_key=decision.lease_key,
                from_worker=previous.from_worker,
                to_worker=decision.to_worker,
                kind=previous.kind,
                reason=f"{previous.reason}; then {decision.reason}",
                metric=decision.metric,
                throughput_kbps=decision.throughput_kbps,
                load_before=previous.load_before,
                load_after=decision.load_after,
            )
            del self._by_key[decision.lease_key]
        self._by_key[decision.lease_key] = decision

    def decisions(self) -> tuple[Decision, ...]:
        return tuple(self._by_key.values())


class _LazyHeap:
    """A min-heap of workers keyed by a priority tuple; re-pushing a worker invalidates its older entries."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[float, ...], str, int]] = []
        self._version: dict[str, int] = {}
        self._present: set[str] = set()

    def push(self, worker: str, key: tuple[float, ...]) -> None:
        version = self._version.get(worker, 0) + 1
        self._version[worker] = version
        self._present.add(worker)
        heapq.heappush(self._heap, (key, worker, version))

    def discard(self, worker: str) -> None:
        if worker in self._present:
            self._present.discard(worker)
            self._version[worker] = self._version.get(worker, 0) + 1

    def __contains__(self, worker: str) -> bool:
        return worker in self._present

    def pop(self) -> str | None:
        while self._heap:
            _, worker, version = heapq.heappop(self._heap)
            if self._version.get(worker) == version and worker in self._present:
                self._present.discard(worker)
                return worker
        return None

    def peek(self) -> str | None:
        while self._heap:
            _, worker, version = self._heap[0]
            if self._version.get(worker) == version and worker in self._present:
                return worker
            heapq.heappop(self._heap)
        return None


def _ordered_pending(snapshot: AssignmentSnapshot) -> list[Lease]:
    """Leases that need an owner, oldest counter increment first (unassigned first), then snapshot order."""
    pending = [lease for lease in snapshot.leases if snapshot.needs_owner(lease)]
    last = snapshot.last_counter_increment
    pending.sort(key=lambda lease: NEVER if lease.actual_owner is None else last.get(lease.lease_key, NEVER))
    return pending


def suspect_workers(snapshot: AssignmentSnapshot, assignable: Iterable[str]) -> frozenset[str]:
    """Assignable workers that own at least one unfinished lease and *all* of whose leases are expired.

    Such a worker has most likely died: its metrics can still look fresh for up to two report intervals (60 s)
    after it stopped, but it renews nothing. Our deciders give it nothing this run (neither unassigned nor
    expired leases, nor rebalanced ones) and do not take from or balance around it. A worker that holds nothing
    (e.g. one that just joined) is never a suspect. Finished (SHARD_END) leases say nothing about liveness.
    """
    candidates = set(assignable)
    held: set[str] = set()
    renewing: set[str] = set()
    for lease in snapshot.leases:
        owner = lease.actual_owner
        if owner is None or owner not in candidates or lease.is_finished:
            continue
        held.add(owner)
        if lease.lease_key not in snapshot.expired_lease_keys:
            renewing.add(owner)
    return frozenset(held - renewing)


def _let_expire(lease: Lease, snapshot: AssignmentSnapshot) -> str | None:
    """The worker that let ``lease`` expire and must not get it back (ours): its owner, for an expired lease that
    is not in a graceful handoff. An expired lease still in handoff may go back to its checkpoint owner: that
    write (``assignLease``) is a real change — it clears the stuck handoff."""
    if lease.lease_key in snapshot.expired_lease_keys and lease.checkpoint_owner is None:
        return lease.actual_owner
    return None


def _kind(lease: Lease) -> DecisionKind:
    return "assign" if lease.actual_owner is None else "reassign_expired"


def _fmt(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else str(value)


# --------------------------------------------------------------------------------------------------- variance


_FILL_TRIES = 16
"""Donors (most loaded first) tried per under-loaded receiver before giving up on it in one run."""


@dataclass(frozen=True, kw_only=True)
class _Band:
    """Ours: one metric's balancing band, computed without suspects and without workers that cannot give."""

    metric: str
    avg: float
    upper: float
    lower: float
    members: tuple[str, ...]
    pinned: frozenset[str]
    triggered: bool
    amounts: Mapping[str, float]
    """Over-band donors (≥ upper or above their operating range) → KBps to take (KCL's dampened formula)."""
    fill_kbps: float
    """Dampened KBps the workers below the band lack (what the fill phase may move)."""


class _VarianceRun:
    """The working state of one variance decision (KCL's InMemoryStorageView plus the decider)."""

    def __init__(self, config: AssignmentConfig, snapshot: AssignmentSnapshot, rng: random.Random) -> None:
        self.config = config
        self.snapshot = snapshot
        self.rng = rng
        self.kcl = config.kcl_compatible
        self.recorder = _Recorder()
        workers = snapshot.assignable_workers(config.worker_report_interval_s)
        self.worker_ids: list[str] = [w.worker_id for w in workers]
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
        self.queue = _LazyHeap()
        self.acted_metric: str | None = None
        # Ours only: workers that look dead (every lease expired) receive nothing; leases decided in the
        # assignment phase are not moved again by balancing; band averages exclude workers that cannot give.
        self.suspects: frozenset[str] = frozenset() if self.kcl else suspect_workers(snapshot, self.worker_ids)
        self.decided: set[str] = set()
        self.band_avg: dict[str, float] = {}

    # ---- projections

    def increment(self, metric: str, throughput: float) -> float:
        """How much one lease of ``throughput`` raises a worker's ``metric`` (KCL's extrapolation)."""
        avg = self.fleet_avg.get(metric, 0.0)
        if not self.kcl and metric == THROUGHPUT_METRIC and self.target_avg_tp > 0:
            return 100.0 * throughput / self.target_avg_tp
        if self.target_avg_tp > 0:
            return throughput * avg / self.target_avg_tp
        return avg / self.target_leases_per_worker

    def capacity(self, worker: str) -> float:
        """KCL: min over metrics of (fleet avg − value) / value (1 when the value is 0); larger = more room."""
        best = math.inf
        for m, v in self.values[worker].items():
            ratio = 1.0 if v == 0 else (self.fleet_avg[m] - v) / v
            best = min(best, ratio)
        return best

    def utilisation(self, worker: str) -> float:
        """Ours: max over metrics of value ÷ fleet average (lower = more room); consistent across metrics."""
        worst = 0.0
        for m, v in self.values[worker].items():
            avg = self.fleet_avg[m]
            worst = max(worst, v / avg if avg > 0 else v)
        return worst

    def priority(self, worker: str) -> tuple[float, ...]:
        if self.kcl:
            return (-self.capacity(worker),)
        # Ties on utilisation (an idle fleet: every value and the average 0, so assigning raises nothing) go to
        # the worker with the least projected throughput, then the fewest leases — never the same id forever.
        return (self.utilisation(worker), self.owner_tp.get(worker, 0.0), float(self.count(worker)))

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

    def limit_avg(self, metric: str) -> float:
        """The average a receiver may be filled up to: the fleet's (KCL), or ours' band average (which leaves out
        workers that cannot give anything) once balancing computed it."""
        if self.kcl:
            return self.fleet_avg[metric]
        return self.band_avg.get(metric, self.fleet_avg[metric])

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
        old = self.owner_of[lease.lease_key]
        metric = self.acted_metric or self.binding_metric(to)
        involved = [w for w in (old, to) if w is not None]
        before = {w: v for w in involved if (v := self.load_of(w, metric)) is not None}
        emit = not (kind == "rebalance" and lease.checkpoint_owner is not None)
        self.move(lease, to, project_donor=project_donor)
        if kind != "rebalance":
            self.decided.add(lease.lease_key)
        after = {w: v for w in involved if (v := self.load_of(w, metric)) is not None}
        self.recorder.record(
            Decision(
                lease_key=lease.lease_key,
                from_worker=old,
                to_worker=to,
                kind=kind,
                reason=reason,
                metric=metric,
                throughput_kbps=self.tp[lease.lease_key],
                load_before=before,
                load_after=after,
            ),
            emit=emit,
        )

    # ---- phases

    def start(self) -> None:
        if not self.kcl:
            # A lease in graceful handoff is already on its way to leaseOwner: project it there.
            for lease in self.snapshot.leases:
                if lease.checkpoint_owner is not None and lease.lease_owner in self.assignable:
                    if lease.lease_key in self.snapshot.expired_lease_keys:
                        continue
                    old = self.owner_of[lease.lease_key]
                    if lease.lease_owner is not None and old != lease.lease_owner:
                        self.move(lease, lease.lease_owner, project_donor=True)
        for worker in self.worker_ids:
            if self.eligible(worker):
                self.queue.push(worker, self.priority(worker))

    def assign_pending(self) -> list[str]:
        pending = _ordered_pending(self.snapshot)
        if not self.kcl:
            # LPT: hottest first (ties keep the oldest-first order) gives the greedy placement a better balance.
            pending.sort(key=lambda lease: -self.tp[lease.lease_key])
        left: list[str] = []
        for i, lease in enumerate(pending):
            worker = self.queue.pop()
            if worker is None:
                left.extend(p.lease_key for p in pending[i:])
                break
            current = self.owner_of[lease.lease_key]
            if not self.kcl and worker == _let_expire(lease, self.snapshot):
                # Ours: never hand an expired lease back to the worker that let it expire; take the next best.
                second = self.queue.pop()
                self.queue.push(worker, self.priority(worker))
                if second is None:
                    continue  # nobody else can take it: it stays where it is (no write)
                worker = second
            expired_handoff = lease.checkpoint_owner is not None
            if current == worker and not expired_handoff:
                self.queue.push(worker, self.priority(worker))
                continue
            kind = _kind(lease)
            what = "unassigned" if kind == "assign" else f"expired (owner {current})"
            metric = self.binding_metric(worker)
            reason = (
                f"{what} lease to the worker with most spare capacity ({metric} {_fmt(self.values[worker][metric])}, "
                f"fleet avg {_fmt(self.fleet_avg.get(metric, 0.0))})"
            )
            self.record(lease, worker, kind, reason, project_donor=not self.kcl)
            self.push_if_eligible(worker)
        return left

    def donors_for(self, metric: str) -> dict[str, float]:
        """KCL: workers to take from for ``metric`` and the throughput to take from each (empty: no trigger)."""
        avg = self.fleet_avg[metric]
        threshold = self.config.rebalance_threshold_pct / 100.0
        upper = avg * (1.0 + threshold)
        lower = avg * (1.0 - threshold)
        trigger = False
        donors: list[str] = []
        most: str | None = None
        for worker in self.worker_ids:
            values = self.values[worker]
            if metric not in values:
                continue
            v = values[metric]
            above_range = v > self.opr[worker].get(metric, math.inf)
            if v > upper or v < lower or above_range:
                trigger = True
            if v >= upper or above_range:
                donors.append(worker)
            if most is None or self.values[most][metric] < v:
                most = worker
        if not trigger:
            return {}
        if not donors and most is not None:
            donors.append(most)
        damp = self.config.dampening_pct / 100.0
        amounts: dict[str, float] = {}
        for worker in donors:
            v = self.values[worker][metric]
            share = (v - avg) / v if v != 0 else 0.0
            amounts[worker] = self.owner_tp.get(worker, 0.0) * share * damp
        return amounts

    def balance(self) -> None:
        if not self.kcl:
            self._balance_ours()
            return
        best_metric: str | None = None
        best_total = -1.0
        best: dict[str, float] = {}
        for metric in self.fleet_avg:
            amounts = self.donors_for(metric)
            total = sum(amounts.values())
            if best_total < total:
                best_metric, best_total, best = metric, total, amounts
        if best_metric is None or not best:
            return
        self.acted_metric = best_metric
        order = sorted(best.items(), key=lambda item: (-item[1], item[0]))
        for donor, amount in order:
            self._balance_donor_kcl(donor, amount, best_metric)

    # ---- ours: band without stuck workers, over-band donors, then filling the workers below the band

    def per_kbps(self, metric: str) -> float:
        """How much one KBps raises ``metric`` (0 when no lease throughput is known)."""
        return self.increment(metric, 1.0) if self.target_avg_tp > 0 else 0.0

    def cannot_give(self, worker: str, value: float, lowest: float, per_kbps: float) -> bool:
        """Whether ``worker`` has nothing it may give for this metric: it holds a single lease (moving it only moves
        the problem), nothing movable, or its smallest movable lease would leave even the least loaded receiver
        (at ``lowest``) at or above the worker's own value — no move improves the pair."""
        if len(self.owner_leases.get(worker, {})) <= 1:
            return True
        movable = self.movable(worker)
        if not movable:
            return True
        if per_kbps <= 0:
            return False  # throughput unknown: one lease may still move (KCL's fallback)
        smallest = min(self.tp[lease.lease_key] for lease in movable)
        return lowest + per_kbps * smallest >= value

    def band(self, metric: str) -> _Band | None:
        """The balancing band for ``metric`` over the non-suspect workers, leaving out (iteratively) the workers
        above it that cannot give anything — e.g. one holding a single shard hotter than the band: they would
        trigger every run, and they pull the average up so that everyone else looks under-loaded."""
        threshold = self.config.rebalance_threshold_pct / 100.0
        candidates = [w for w in self.worker_ids if w not in self.suspects and metric in self.values[w]]
        if not candidates:
            return None
        k = self.per_kbps(metric)
        pinned: set[str] = set()
        while True:
            members = [w for w in candidates if w not in pinned]
            avg = sum(self.values[w][metric] for w in members) / len(members)
            upper = avg * (1.0 + threshold)
            lowest = min((self.values[w][metric] for w in members if self.eligible(w)), default=math.inf)
            newly = [
                w
                for w in members
                if (self.values[w][metric] > upper or self.values[w][metric] > self.opr[w].get(metric, math.inf))
                and self.cannot_give(w, self.values[w][metric], lowest, k)
            ]
            if not newly or len(newly) == len(members):
                break
            pinned.update(newly)
        lower = avg * (1.0 - threshold)
        damp = self.config.dampening_pct / 100.0
        triggered = False
        amounts: dict[str, float] = {}
        deficit = 0.0
        for w in members:
            v = self.values[w][metric]
            above_range = v > self.opr[w].get(metric, math.inf)
            if v > upper or v < lower or above_range:
                triggered = True
            if v >= upper or above_range:
                share = max(0.0, (v - avg) / v) if v != 0 else 0.0
                amounts[w] = self.owner_tp.get(w, 0.0) * share * damp
            elif v < lower:
                deficit += avg - v
        fill_kbps = damp * deficit / k if k > 0 else 0.0
        return _Band(
            metric=metric,
            avg=avg,
            upper=upper,
            lower=lower,
            members=tuple(members),
            pinned=frozenset(pinned),
            triggered=triggered,
            amounts=amounts,
            fill_kbps=fill_kbps,
        )

    def _balance_ours(self) -> None:
        bands = [b for metric in self.fleet_avg if (b := self.band(metric)) is not None]
        for b in bands:
            self.band_avg[b.metric] = b.avg
        chosen: _Band | None = None
        best_total = -1.0
        for b in bands:
            total = sum(b.amounts.values()) + b.fill_kbps
            if b.triggered and best_total < total:
                chosen, best_total = b, total
        if chosen is None:
            return
        metric = chosen.metric
        self.acted_metric = metric
        amounts = dict(chosen.amounts)
        if self.per_kbps(metric) <= 0 and not amounts:
            # No lease throughput known: KCL's fallback, one lease from the most loaded worker that can give.
            most = max(chosen.members, key=lambda w: (self.values[w][metric], w))
            amounts[most] = 0.0
        for donor, amount in sorted(amounts.items(), key=lambda item: (-item[1], item[0])):
            self._balance_donor(donor, amount, metric)
        if self.per_kbps(metric) > 0:
            # Workers still below the band (e.g. workers joined): KCL takes from the over-band donors or, if there
            # are none, from the single most loaded worker — one or two leases per run; ours fills them from every
            # worker above the average.
            self._fill(chosen)

    def _fill(self, band: _Band) -> None:
        """Bring each worker below the band a dampened share of its gap to the band average, taking from the
        workers above the average — always the most loaded one first (so each gives in proportion to its excess,
        water-filling from the top), the largest lease that fits both the receiver's remaining need and what the
        donor can spare without leaving the band: the fewest moves."""
        metric = band.metric
        k = self.per_kbps(metric)
        damp = self.config.dampening_pct / 100.0
        receivers = sorted(
            (w for w in band.members if self.values[w][metric] < band.lower),
            key=lambda w: (self.values[w][metric], w),
        )
        if not receivers:
            return
        heap = [(-self.values[w][metric], w) for w in band.members if self.values[w][metric] > band.avg]
        heapq.heapify(heap)
        stock: dict[str, tuple[list[Lease], list[float]]] = {}

        def leases_of(donor: str) -> tuple[list[Lease], list[float]]:
            if donor not in stock:
                movable = self.movable(donor)
                self.rng.shuffle(movable)  # equal throughputs: the seeded rng chooses
                movable.sort(key=lambda lease: self.tp[lease.lease_key])
                stock[donor] = (movable, [self.tp[lease.lease_key] for lease in movable])
            return stock[donor]

        for receiver in receivers:
            if not self.eligible(receiver):
                continue
            gap = band.avg - self.values[receiver][metric]
            need = min(damp * gap / k, self._headroom_tp(receiver))
            aside: list[tuple[float, str]] = []
            misses = 0
            while need > 0 and heap and misses < _FILL_TRIES:
                key, donor = heapq.heappop(heap)
                value = self.values[donor][metric]
                if -key != value:  # stale entry
                    if value > band.avg:
                        heapq.heappush(heap, (-value, donor))
                    continue
                movable, tps = leases_of(donor)
                spare = (value - band.lower) / k
                index = bisect.bisect_right(tps, min(need, spare)) - 1
                if index < 0:
                    aside.append((key, donor))
                    misses += 1
                    continue
                lease = movable.pop(index)
                tp = tps.pop(index)
                reason = (
                    f"rebalance: {receiver} {metric} {_fmt(self.values[receiver][metric])} below the band "
                    f"{_fmt(band.lower)}..{_fmt(band.upper)} (avg {_fmt(band.avg)}); filling "
                    f"{self.config.dampening_pct:g}% of its gap from the most loaded worker above the average, "
                    f"{donor} {metric} {_fmt(value)}"
                )
                self.record(lease, receiver, "rebalance", reason, project_donor=True)
                need -= tp
                self.push_if_eligible(receiver)
                self.push_if_eligible(donor)
                if not self.eligible(receiver):
                    need = 0.0
                after = self.values[donor][metric]
                if after > band.avg and movable:
                    heapq.heappush(heap, (-after, donor))
            for item in aside:
                heapq.heappush(heap, item)

    def _reason(self, donor: str, amount: float, metric: str) -> str:
        avg = self.limit_avg(metric)
        v = self.values[donor][metric]
        return (
            f"rebalance: {donor} {metric} {_fmt(v)} vs fleet avg {_fmt(avg)} "
            f"(threshold {self.config.rebalance_threshold_pct:g}%), taking {amount:.1f} KBps "
            f"(dampening {self.config.dampening_pct:g}%)"
        )

    def _balance_donor_kcl(self, donor: str, amount: float, metric: str) -> None:
        existing = list(self.owner_leases.get(donor, {}).values())
        if not existing:
            return
        reason = self._reason(donor, amount, metric)
        chosen: list[Lease]
        if self.owner_tp.get(donor, 0.0) == 0.0:
            chosen = [existing[0]]
        else:
            self.rng.shuffle(existing)
            chosen = []
            remaining = amount
            for lease in existing:
                tp = self.tp[lease.lease_key]
                if remaining - tp <= 0:
                    continue
                remaining -= tp
                chosen.append(lease)
            if not chosen and self.config.allow_throughput_overshoot:
                chosen = [min(existing, key=lambda lease: self.tp[lease.lease_key])]
        for lease in chosen:
            receiver = self.queue.pop()
            if receiver is not None and self.will_go_above(receiver, self.tp[lease.lease_key]):
                break  # KCL: the polled receiver is not put back for the rest of this run
            if receiver is None:
                continue
            if self.owner_of[lease.lease_key] == receiver:
                self.queue.push(receiver, self.priority(receiver))
                continue
            self.record(lease, receiver, "rebalance", reason, project_donor=False)
            self.push_if_eligible(receiver)

    def _headroom_tp(self, worker: str) -> float:
        """Throughput ``worker`` can take before any metric passes the fleet average or its operating range."""
        room = math.inf
        for m, v in self.values[worker].items():
            per_kbps = self.increment(m, 1.0) if self.target_avg_tp > 0 else 0.0
            limit = min(self.limit_avg(m), self.opr[worker].get(m, math.inf))
            if per_kbps > 0:
                room = min(room, (limit - v) / per_kbps)
            elif v > limit:
                room = 0.0
        return room

    def movable(self, worker: str) -> list[Lease]:
        """Ours: the leases ``worker`` may give in balancing — not in handoff, not decided earlier in this run."""
        return [
            lease
            for lease in self.owner_leases.get(worker, {}).values()
            if lease.checkpoint_owner is None and lease.lease_key not in self.decided
        ]

    def _balance_donor(self, donor: str, amount: float, metric: str) -> None:
        movable = self.movable(donor)
        if not movable:
            return
        reason = self._reason(donor, amount, metric)
        if self.target_avg_tp <= 0 or self.owner_tp.get(donor, 0.0) <= 0:
            # Nothing is known about throughput: move one lease, as KCL does.
            receiver = self._best_receiver(exclude=donor)
            lease = movable[self.rng.randrange(len(movable))]
            if receiver is not None and not self.will_go_above(receiver, self.tp[lease.lease_key]):
                self.record(lease, receiver, "rebalance", reason, project_donor=True)
                self.push_if_eligible(receiver)
            self.push_if_eligible(donor)
            return
        self.rng.shuffle(movable)  # equal-throughput leases: which one moves is the seeded rng's choice
        movable.sort(key=lambda lease: self.tp[lease.lease_key])
        tps = [self.tp[lease.lease_key] for lease in movable]
        remaining = amount
        moved_any = False
        while movable and remaining > 0:
            receiver = self._best_receiver(exclude=donor)
            if receiver is None:
                break
            budget = min(remaining, self._headroom_tp(receiver))
            index = bisect.bisect_right(tps, budget) - 1
            if index < 0:
                if moved_any or not self.config.allow_throughput_overshoot:
                    break
                index = 0
                gain = self.increment(metric, tps[0])
                r_value = self.values[receiver].get(metric, 0.0)
                d_value = self.values[donor][metric]
                if r_value + gain >= d_value:
                    break  # overshooting would not even improve the pair
            lease = movable.pop(index)
            tps.pop(index)
            self.queue.discard(receiver)
            self.record(lease, receiver, "rebalance", reason, project_donor=True)
            remaining -= self.tp[lease.lease_key]
            moved_any = True
            self.push_if_eligible(receiver)
            if index == 0 and budget < self.tp[lease.lease_key]:
                break  # that was the one permitted overshoot
        self.push_if_eligible(donor)

    def _best_receiver(self, *, exclude: str) -> str | None:
        """The eligible worker with the most room, other than ``exclude`` (left in the queue)."""
        head = self.queue.pop()
        if head is None:
            return None
        if head != exclude:
            self.queue.push(head, self.priority(head))
            return head
        second = self.queue.peek()
        self.queue.push(head, self.priority(head))
        return second

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


class VarianceDecider:
    """KCL 3.x's variance-based decider (reference §5), with ``kcl_compatible`` for exact KCL decisions.

    Per run: fleet average per metric (mean of each assignable worker's EMA of ``sts``); expired and unassigned
    leases go, oldest first, to the worker with the most spare capacity, whose projected metrics rise by
    ``lease throughput × fleet avg / target average throughput``; on balancing runs, the metric with the largest
    amount to move picks the donors (outside avg × (1 ± threshold) or above their operating range; else the
    single most loaded), each giving ``(v − avg) / v × dampening × its throughput``.

    Ours (default) also: breaks receiver ties by projected throughput then lease count (idle fleets); never hands
    an expired lease back to the worker that let it expire and gives suspects (every lease expired) nothing;
    centres the band on the live workers that can give, leaving out one holding a single too-hot shard; and fills
    workers below the band from every worker above the average (docs/assignment.md, "Where we differ").

    The dynamic cap (seed 004), when configured, is a strict count cap here: a worker at the cap receives
    nothing, even if it is the least loaded. It is opt-in because balancing by load deliberately gives a
    worker with hot shards fewer leases and one with cold shards more — see docs/assignment.md.
    """

    def __init__(self, config: AssignmentConfig | None = None, *, kcl_compatible: bool | None = None) -> None:
        config = config or AssignmentConfig()
        if kcl_compatible is not None and kcl_compatible != config.kcl_compatible:
            config = _replace(config, kcl_compatible=kcl_compatible)
        self.config = config

    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        run = _VarianceRun(self.config, snapshot, rng)
        run.start()
        unassigned = run.assign_pending()
        balancing = snapshot.is_balancing_run(self.config.balancing_frequency)
        if balancing and run.worker_ids:
            run.balance()
        return run.plan(balancing_ran=balancing, unassigned=unassigned)


def _replace(config: AssignmentConfig, **changes: Any) -> AssignmentConfig:
    from dataclasses import replace

    return replace(config, **changes)


# --------------------------------------------------------------------------------------------------- counts


class _CountState:
    """Lease counts per worker for the count-based deciders."""

    def __init__(self, config: AssignmentConfig, snapshot: AssignmentSnapshot, *, drop_suspects: bool) -> None:
        self.snapshot = snapshot
        self.worker_ids = [w.worker_id for w in snapshot.assignable_workers(config.worker_report_interval_s)]
        # Ours and the KCL 2.x model: a worker all of whose leases expired has most likely died — it takes part in
        # nothing (it holds no valid lease, so only its quota / its taker's turn is dropped).
        self.suspects = suspect_workers(snapshot, self.worker_ids) if drop_suspects else frozenset()
        self.worker_ids = [w for w in self.worker_ids if w not in self.suspects]
        self.decided: set[str] = set()
        """Leases assigned or reassigned in this run (ours does not move them again when balancing)."""
        self.assignable = set(self.worker_ids)
        self.cap = effective_cap(config, shard_count=snapshot.live_shard_count, worker_count=len(self.worker_ids))
        self.recorder = _Recorder()
        self.owner_of: dict[str, str | None] = {}
        self.held: dict[str, dict[str, Lease]] = {w: {} for w in self.worker_ids}
        self.tp: dict[str, float] = {}
        for lease in snapshot.leases:
            owner = lease.actual_owner
            self.owner_of[lease.lease_key] = owner
            self.tp[lease.lease_key] = lease.throughput_kbps or 0.0
            if owner in self.held and not snapshot.needs_owner(lease):
                self.held[owner][lease.lease_key] = lease

    def count(self, worker: str) -> int:
        return len(self.held[worker])

    def record(self, lease: Lease, to: str, kind: DecisionKind, reason: str) -> None:
        old = self.owner_of[lease.lease_key]
        before = {w: float(self.count(w)) for w in (old, to) if w is not None and w in self.held}
        if old is not None and old in self.held:
            self.held[old].pop(lease.lease_key, None)
        self.held[to][lease.lease_key] = lease
        self.owner_of[lease.lease_key] = to
        if kind != "rebalance":
            self.decided.add(lease.lease_key)
        after = {w: float(self.count(w)) for w in (old, to) if w is not None and w in self.held}
        emit = not (kind == "rebalance" and lease.checkpoint_owner is not None)
        self.recorder.record(
            Decision(
                lease_key=lease.lease_key,
                from_worker=old,
                to_worker=to,
                kind=kind,
                reason=reason,
                metric=COUNT_METRIC,
                throughput_kbps=self.tp[lease.lease_key],
                load_before=before,
                load_after=after,
            ),
            emit=emit,
        )

    def plan(self, strategy: str, *, balancing_ran: bool, unassigned: list[str]) -> AssignmentPlan:
        tp: dict[str, float] = {w: 0.0 for w in self.worker_ids}
        for worker, leases in self.held.items():
            tp[worker] = sum(self.tp[key] for key in leases)
        counts = {w: self.count(w) for w in self.worker_ids}
        return AssignmentPlan(
            strategy=strategy,
            decisions=self.recorder.decisions(),
            metric=COUNT_METRIC,
            projected_load={w: float(c) for w, c in counts.items()},
            projected_metrics={w: {COUNT_METRIC: float(c)} for w, c in counts.items()},
            projected_throughput_kbps=tp,
            projected_leases=counts,
            effective_cap=self.cap,
            balancing_ran=balancing_ran,
            unassigned_lease_keys=tuple(unassigned),
        )


def spread_quotas(worker_ids: list[str], total: int, cap: int | None) -> dict[str, int]:
    """Per-worker lease quotas summing to ``total`` (before the cap): floor or ceil of total ÷ workers.

    The ceil slots go to evenly spaced positions of the id-sorted fleet (Bresenham), so any group of workers
    whose ids sort together (a cluster's name prefix, an AZ, a host) gets its proportional share ± 1 —
    seed 001's 500 leases over clusters of 100 + 100 workers give each cluster exactly 250.
    """
    ordered = sorted(worker_ids)
    n = len(ordered)
    if n == 0:
        return {}
    base, extra = divmod(total, n)
    quotas: dict[str, int] = {}
    for i, worker in enumerate(ordered):
        q = base + ((i + 1) * extra // n - i * extra // n)
        quotas[worker] = q if cap is None else min(q, cap)
    return quotas


class CountDecider:
    """The lease-count strategy.

    Target: ``ceil(leases / workers)`` capped by ``max_leases_for_worker`` and the dynamic cap. Unassigned and
    expired leases go to the worker furthest below its quota (then the fewest leases). On balancing runs, if any
    worker is outside [floor, ceil] of leases ÷ workers (or above the cap), the workers outside take part in a
    rebalance to their quotas (see :func:`spread_quotas`): a worker outside the band moves all the way to its
    quota, trading with the workers furthest from theirs. Workers already inside the band are moved only as the
    other side of such a move, so one worker joining costs only its own share of moves.

    ``kcl_compatible=True``: KCL 3.4.3's LeaseCountBasedLeaseAssignmentDecider (target = ceil, workers filled
    in ascending count order; balancing by two pointers from above target to below target).
    """

    def __init__(self, config: AssignmentConfig | None = None, *, kcl_compatible: bool | None = None) -> None:
        config = config or AssignmentConfig(strategy="count")
        if kcl_compatible is not None and kcl_compatible != config.kcl_compatible:
            config = _replace(config, kcl_compatible=kcl_compatible)
        self.config = config

    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        state = _CountState(self.config, snapshot, drop_suspects=not self.config.kcl_compatible)
        balancing = snapshot.is_balancing_run(self.config.balancing_frequency)
        if self.config.kcl_compatible:
            unassigned = self._assign_kcl(state)
            if balancing:
                self._balance_kcl(state)
        else:
            unassigned = self._assign(state)
            if balancing:
                self._balance(state, rng)
        return state.plan("count", balancing_ran=balancing, unassigned=unassigned)

    # ---- KCL 3.4.3

    def _kcl_target(self, state: _CountState) -> int:
        leases = len(state.snapshot.leases)
        workers = len(state.worker_ids)
        target = 1 if workers >= leases else -(-leases // workers)
        return target if state.cap is None else min(target, state.cap)

    def _assign_kcl(self, state: _CountState) -> list[str]:
        pending = _ordered_pending(state.snapshot)
        if not state.worker_ids:
            return [lease.lease_key for lease in pending]
        target = self._kcl_target(state)
        queue = sorted(state.worker_ids, key=lambda w: (state.count(w), w))
        index = 0
        left: list[str] = []
        for i, lease in enumerate(pending):
            # KCL would still give one lease to a worker already at the target; a cap is a cap, so skip it.
            while index < len(queue) and state.count(queue[index]) >= target:
                index += 1
            if index >= len(queue):
                left.extend(p.lease_key for p in pending[i:])
                break
            worker = queue[index]
            state.record(lease, worker, _kind(lease), f"lease count: {worker} below target {target}")
            if state.count(worker) >= target:
                index += 1
        return left

    def _balance_kcl(self, state: _CountState) -> None:
        if not state.worker_ids:
            return
        target = self._kcl_target(state)
        ordered = sorted(state.worker_ids, key=lambda w: (state.count(w), w))
        counts = {w: state.count(w) for w in ordered}
        available = {w: [lease for lease in state.held[w].values() if lease.checkpoint_owner is None] for w in ordered}
        left, right = 0, len(ordered) - 1
        while left < right:
            under, over = ordered[left], ordered[right]
            if target - counts[under] <= 0:
                left += 1
                continue
            if counts[over] - target <= 0:
                right -= 1
                continue
            if not available[over]:
                right -= 1
                continue
            lease = available[over].pop(0)
            state.record(lease, under, "rebalance", f"lease count: {over} above target {target}, {under} below")
            counts[under] += 1
            counts[over] -= 1

    # ---- ours

    def _quotas(self, state: _CountState) -> dict[str, int]:
        return spread_quotas(state.worker_ids, len(state.snapshot.leases), state.cap)

    def _assign(self, state: _CountState) -> list[str]:
        pending = _ordered_pending(state.snapshot)
        if not state.worker_ids:
            return [lease.lease_key for lease in pending]
        quotas = self._quotas(state)
        cap = state.cap if state.cap is not None else math.inf
        heap: list[tuple[int, int, str]] = []
        for w in state.worker_ids:
            if state.count(w) < cap:
                heap.append((state.count(w) - quotas[w], state.count(w), w))
        heapq.heapify(heap)
        left: list[str] = []
        for i, lease in enumerate(pending):
            if not heap:
                left.extend(p.lease_key for p in pending[i:])
                break
            _, _, worker = heapq.heappop(heap)
            if worker == _let_expire(lease, state.snapshot) and heap:
                # Never hand an expired lease back to the worker that let it expire: take the next one.
                first = worker
                _, _, worker = heapq.heappop(heap)
                heapq.heappush(heap, (state.count(first) - quotas[first], state.count(first), first))
            reason = f"lease count: {worker} holds {state.count(worker)} of its quota {quotas[worker]}"
            if state.owner_of[lease.lease_key] == worker and lease.checkpoint_owner is None:
                state.held[worker][lease.lease_key] = lease  # expired but its owner is the best choice: keep
            else:
                state.record(lease, worker, _kind(lease), reason)
            n = state.count(worker)
            if n < cap:
                heapq.heappush(heap, (n - quotas[worker], n, worker))
        return left

    def _balance(self, state: _CountState, rng: random.Random) -> None:
        workers = state.worker_ids
        if len(workers) < 2:
            return
        quotas = self._quotas(state)
        total = len(state.snapshot.leases)
        floor = total // len(workers)
        ceil = -(-total // len(workers))
        if state.cap is not None:
            floor, ceil = min(floor, state.cap), min(ceil, state.cap)
        outside = {w for w in workers if not floor <= state.count(w) <= ceil}
        if not outside:
            return
        movable: dict[str, list[Lease]] = {}
        for w in workers:
            leases = [
                lease
                for lease in state.held[w].values()
                if lease.checkpoint_owner is None and lease.lease_key not in state.decided
            ]
            rng.shuffle(leases)
            movable[w] = leases

        def surplus(w: str) -> int:
            return state.count(w) - quotas[w]

        # Max-heaps (negated) of donors (surplus > 0) and receivers (deficit > 0): all, and outside-band only.
        donors_all = [(-surplus(w), w) for w in workers if surplus(w) > 0]
        donors_out = [(-surplus(w), w) for w in outside if surplus(w) > 0]
        receivers_all = [(surplus(w), w) for w in workers if surplus(w) < 0]
        receivers_out = [(surplus(w), w) for w in outside if surplus(w) < 0]
        for h in (donors_all, donors_out, receivers_all, receivers_out):
            heapq.heapify(h)

        def top(heap: list[tuple[int, str]], want: Callable[[str], bool]) -> str | None:
            while heap:
                key, w = heap[0]
                if want(w) and abs(key) == abs(surplus(w)):
                    return w
                heapq.heappop(heap)
                if want(w):
                    heapq.heappush(heap, ((-surplus(w), w) if surplus(w) > 0 else (surplus(w), w)))
            return None

        def is_donor(w: str) -> bool:
            return surplus(w) > 0 and bool(movable[w])

        def is_receiver(w: str) -> bool:
            return surplus(w) < 0

        while True:
            receiver = top(receivers_out, is_receiver)
            donor = top(donors_all, is_donor) if receiver is not None else None
            if receiver is None or donor is None:
                donor = top(donors_out, is_donor)
                receiver = top(receivers_all, is_receiver) if donor is not None else None
            if receiver is None or donor is None:
                break
            lease = movable[donor].pop()
            reason = (
                f"lease count: {donor} holds {state.count(donor)} (quota {quotas[donor]}), "
                f"{receiver} holds {state.count(receiver)} (quota {quotas[receiver]}); band [{floor}, {ceil}]"
            )
            state.record(lease, receiver, "rebalance", reason)
            for w in (donor, receiver):
                s = surplus(w)
                if s > 0:
                    heapq.heappush(donors_all, (-s, w))
                    if w in outside:
                        heapq.heappush(donors_out, (-s, w))
                elif s < 0:
                    heapq.heappush(receivers_all, (s, w))
                    if w in outside:
                        heapq.heappush(receivers_out, (s, w))


# --------------------------------------------------------------------------------------------------- KCL 2.x


class KCL2StealingDecider:
    """A baseline: one round of KCL 2.x lease takers, one per assignable worker (seed 001).

    Each worker, in an order shuffled by ``rng``, computes ``target = min(ceil(leases / workers), cap)``; if it
    holds fewer, it takes expired or unassigned leases up to the target, and only when there are none it steals
    from the most loaded worker: ``min(needed, most − target)`` leases, at least 1 when it needs more than one,
    at most ``max_leases_to_steal`` (1) per round. Workers see each other's effects within the round (the real
    takers race through conditional writes; the winner is what this models).

    Seed 001's 500 shards over 100 then 200 workers settle with every old worker at 3 and every new one at 2:
    a worker holding 2 that needs 1 may not steal from one holding exactly the target.

    A worker all of whose leases are expired (:func:`suspect_workers`) has no taker turn and does not count
    towards the target: a dead KCL 2.x worker runs no taker, even while its metrics still look fresh.
    """

    def __init__(self, config: AssignmentConfig | None = None, *, max_leases_to_steal: int = 1) -> None:
        self.config = config or AssignmentConfig(strategy="count")
        if max_leases_to_steal < 1:
            raise ValueError("max_leases_to_steal must be at least 1")
        self.max_leases_to_steal = max_leases_to_steal

    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        state = _CountState(self.config, snapshot, drop_suspects=True)
        workers = list(state.worker_ids)
        pool = _ordered_pending(snapshot)
        rng.shuffle(pool)
        if not workers:
            return state.plan("kcl2", balancing_ran=True, unassigned=[lease.lease_key for lease in pool])
        total = len(snapshot.leases)
        target = -(-total // len(workers))
        if state.cap is not None:
            target = min(target, state.cap)
        most = _LazyHeap()
        for w in workers:
            most.push(w, (-state.count(w), 0.0))
        rng.shuffle(workers)
        for worker in workers:
            needed = target - state.count(worker)
            if needed <= 0:
                continue
            if pool:
                for _ in range(min(needed, len(pool))):
                    lease = pool.pop()
                    if state.owner_of[lease.lease_key] == worker and lease.checkpoint_owner is None:
                        state.held[worker][lease.lease_key] = lease
                    else:
                        state.record(lease, worker, _kind(lease), f"KCL 2.x taker: {worker} below target {target}")
                most.push(worker, (-state.count(worker), 0.0))
                continue
            victim = most.pop()
            if victim == worker:
                second = most.pop()
                most.push(worker, (-state.count(worker), 0.0))
                victim = second
            if victim is None:
                continue
            victim_count = state.count(victim)
            steal = 0
            if victim_count >= target:
                steal = min(needed, victim_count - target)
                if needed > 1 and steal == 0:
                    steal = 1
                steal = min(steal, self.max_leases_to_steal)
            candidates = [lease for lease in state.held[victim].values() if lease.checkpoint_owner is None]
            for _ in range(min(steal, len(candidates))):
                lease = candidates.pop(rng.randrange(len(candidates)))
                state.record(
                    lease,
                    worker,
                    "rebalance",
                    f"KCL 2.x steal: {worker} holds {state.count(worker)} < target {target}; "
                    f"{victim} is the most loaded with {state.count(victim)}",
                )
            most.push(victim, (-state.count(victim), 0.0))
            most.push(worker, (-state.count(worker), 0.0))
        return state.plan("kcl2", balancing_ran=True, unassigned=[lease.lease_key for lease in pool])
