"""Working state the deciders share: the decision recorder, a lazy worker heap, the order of pending leases, and
the liveness rules every decider of ours applies (suspects, the worker that let a lease expire).

Internal to :mod:`worker_lib.assignment` (and the KCL 2.x baseline in ``worker_lib/tools/kcl2_baseline.py``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import replace

from worker_lib.assignment.plan import Decision, DecisionKind
from worker_lib.assignment.snapshot import NEVER, AssignmentSnapshot
from worker_lib.core.models import Lease


class Recorder:
    """The decisions of one run: one per lease (the last destination, the first origin and kind).

    decided: the leases assigned or reassigned in this run (ours does not move them again when balancing).
    """

    def __init__(self) -> None:
        self._by_key: dict[str, Decision] = {}
        self.decided: set[str] = set()

    def record(
        self,
        lease: Lease,
        *,
        from_worker: str | None,
        to_worker: str,
        kind: DecisionKind,
        reason: str,
        metric: str,
        throughput_kbps: float,
        load_of: Callable[[str], float | None],
        move: Callable[[], None],
    ) -> None:
        """Make one move and keep its decision.

        ``move`` applies it to the caller's in-memory view; ``load_of`` reads a worker's value of ``metric`` in that
        view (None: not tracked), just before and just after, for both workers involved. A rebalance of a lease
        already in graceful handoff is made in memory only: a live lease in handoff cannot be written again.
        """
        involved = [w for w in (from_worker, to_worker) if w is not None]
        before = {w: v for w in involved if (v := load_of(w)) is not None}
        emit = not (kind == "rebalance" and lease.checkpoint_owner is not None)
        move()
        if kind != "rebalance":
            self.decided.add(lease.lease_key)
        after = {w: v for w in involved if (v := load_of(w)) is not None}
        self._keep(
            Decision(
                lease_key=lease.lease_key,
                from_worker=from_worker,
                to_worker=to_worker,
                kind=kind,
                reason=reason,
                metric=metric,
                throughput_kbps=throughput_kbps,
                load_before=before,
                load_after=after,
            ),
            emit=emit,
        )

    def _keep(self, decision: Decision, *, emit: bool) -> None:
        """Merge ``decision`` with an earlier one for the same lease; a lease moved back to where a rebalance took
        it from has no decision at all. ``emit=False``: a move made in memory only."""
        previous = self._by_key.get(decision.lease_key)
        if previous is None and not emit:
            return
        if previous is not None:
            if decision.to_worker == previous.from_worker and previous.kind == "rebalance":
                del self._by_key[decision.lease_key]
                return
            decision = replace(  # the first origin, kind and loads before; the last destination
                decision,
                from_worker=previous.from_worker,
                kind=previous.kind,
                reason=f"{previous.reason}; then {decision.reason}",
                load_before=previous.load_before,
            )
            del self._by_key[decision.lease_key]
        self._by_key[decision.lease_key] = decision

    def decisions(self) -> tuple[Decision, ...]:
        return tuple(self._by_key.values())


class LazyHeap:
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


def ordered_pending(snapshot: AssignmentSnapshot) -> list[Lease]:
    """Leases that need an owner, oldest counter increment first (unassigned first), then snapshot order."""
    pending = [lease for lease in snapshot.leases if snapshot.needs_owner(lease)]
    last = snapshot.last_counter_increment
    pending.sort(key=lambda lease: NEVER if lease.actual_owner is None else last.get(lease.lease_key, NEVER))
    return pending


def suspect_workers(snapshot: AssignmentSnapshot, assignable: Iterable[str]) -> frozenset[str]:
    """Assignable workers that own at least one unfinished lease and *all* of whose leases are expired, and those the
    snapshot says are draining.

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
    # Workers the fleet is about to lose (snapshot.draining) are treated the same way: nothing new goes to a worker
    # that will be stopped, so its leases are the fewest possible when it hands them over.
    return frozenset(held - renewing) | (snapshot.draining & candidates)


def let_expire(lease: Lease, snapshot: AssignmentSnapshot) -> str | None:
    """The worker that let ``lease`` expire and must not get it back (ours): its owner, for an expired lease that
    is not in a graceful handoff. An expired lease still in handoff may go back to its checkpoint owner: that
    write (``assignLease``) is a real change — it clears the stuck handoff."""
    if lease.lease_key in snapshot.expired_lease_keys and lease.checkpoint_owner is None:
        return lease.actual_owner
    return None


def pending_kind(lease: Lease) -> DecisionKind:
    """The kind of decision that gives ``lease`` (one that needs an owner) a new owner."""
    return "assign" if lease.actual_owner is None else "reassign_expired"


def fmt(value: float) -> str:
    """A load figure in a decision's reason."""
    return f"{value:.1f}" if math.isfinite(value) else str(value)
