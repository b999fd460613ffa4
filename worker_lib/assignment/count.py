"""The lease-count decider (KCL 3.4.3+ ``LeaseAssignmentStrategy.LEASE_COUNT``): ours (per-worker quotas) and
KCL's two-pointer version, chosen by ``config.kcl_compatible``; and :class:`CountState`, the lease counts per
worker that the count-based deciders (and the KCL 2.x baseline in ``worker_lib/tools/kcl2_baseline.py``) work on.

docs/assignment.md, "The count decider" and "500 shards over 100 + 100 workers", explains the quotas.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar, Protocol

from worker_lib.assignment.config import AssignmentConfig, effective_cap
from worker_lib.assignment.plan import AssignmentPlan, DecisionKind
from worker_lib.assignment.snapshot import AssignmentSnapshot
from worker_lib.assignment.state import Recorder, let_expire, ordered_pending, pending_kind, suspect_workers
from worker_lib.core.models import Lease

COUNT_METRIC = "leases"
"""The 'metric' of the count-based deciders: leases held."""


class CountState:
    """Lease counts per worker for the count-based deciders."""

    def __init__(self, config: AssignmentConfig, snapshot: AssignmentSnapshot, *, drop_suspects: bool) -> None:
        self.snapshot = snapshot
        self.worker_ids = [w.worker_id for w in snapshot.assignable_workers(config.worker_report_interval_s)]
        # Ours and the KCL 2.x model: a worker all of whose leases expired has most likely died — it takes part in
        # nothing (it holds no valid lease, so only its quota / its taker's turn is dropped).
        self.suspects = suspect_workers(snapshot, self.worker_ids) if drop_suspects else frozenset()
        self.worker_ids = [w for w in self.worker_ids if w not in self.suspects]
        self.recorder = Recorder()
        self.decided: set[str] = self.recorder.decided
        """Leases assigned or reassigned in this run (ours does not move them again when balancing)."""
        self.assignable = set(self.worker_ids)
        self.cap = effective_cap(config, shard_count=snapshot.live_shard_count, worker_count=len(self.worker_ids))
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

    def _count_of(self, worker: str) -> float | None:
        return float(self.count(worker)) if worker in self.held else None

    def _move(self, lease: Lease, old: str | None, to: str) -> None:
        if old is not None and old in self.held:
            self.held[old].pop(lease.lease_key, None)
        self.held[to][lease.lease_key] = lease
        self.owner_of[lease.lease_key] = to

    def record(self, lease: Lease, to: str, kind: DecisionKind, reason: str) -> None:
        """Move ``lease`` to ``to`` and record the decision (load = lease count)."""
        old = self.owner_of[lease.lease_key]
        self.recorder.record(
            lease,
            from_worker=old,
            to_worker=to,
            kind=kind,
            reason=reason,
            metric=COUNT_METRIC,
            throughput_kbps=self.tp[lease.lease_key],
            load_of=self._count_of,
            move=lambda: self._move(lease, old, to),
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
    500 leases over clusters of 100 + 100 workers give each cluster exactly 250.
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


class CountRules(Protocol):
    """One version of the count strategy's two phases."""

    drop_suspects: ClassVar[bool]

    def assign(self, state: CountState) -> list[str]:
        """Give pending leases an owner; returns the leases left without one."""
        ...

    def balance(self, state: CountState, rng: random.Random) -> None:
        """The balancing phase of a balancing run."""
        ...


class KCLCountRules:
    """KCL 3.4.3's LeaseCountBasedLeaseAssignmentDecider: target = ceil(leases ÷ workers), capped; workers filled in
    ascending count order; balancing by two pointers from above the target to below it."""

    drop_suspects: ClassVar[bool] = False

    def _target(self, state: CountState) -> int:
        leases = len(state.snapshot.leases)
        workers = len(state.worker_ids)
        target = 1 if workers >= leases else -(-leases // workers)
        return target if state.cap is None else min(target, state.cap)

    def assign(self, state: CountState) -> list[str]:
        pending = ordered_pending(state.snapshot)
        if not state.worker_ids:
            return [lease.lease_key for lease in pending]
        target = self._target(state)
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
            state.record(lease, worker, pending_kind(lease), f"lease count: {worker} below target {target}")
            if state.count(worker) >= target:
                index += 1
        return left

    def balance(self, state: CountState, rng: random.Random) -> None:
        if not state.worker_ids:
            return
        target = self._target(state)
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


class QuotaCountRules:
    """Ours: per-worker quotas (:func:`spread_quotas`); suspects take part in nothing; an expired lease never goes
    back to the worker that let it expire; only the workers outside [floor, ceil] start a rebalance."""

    drop_suspects: ClassVar[bool] = True

    def _quotas(self, state: CountState) -> dict[str, int]:
        return spread_quotas(state.worker_ids, len(state.snapshot.leases), state.cap)

    def assign(self, state: CountState) -> list[str]:
        pending = ordered_pending(state.snapshot)
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
            if worker == let_expire(lease, state.snapshot) and heap:
                # Never hand an expired lease back to the worker that let it expire: take the next one.
                first = worker
                _, _, worker = heapq.heappop(heap)
                heapq.heappush(heap, (state.count(first) - quotas[first], state.count(first), first))
            reason = f"lease count: {worker} holds {state.count(worker)} of its quota {quotas[worker]}"
            if state.owner_of[lease.lease_key] == worker and lease.checkpoint_owner is None:
                state.held[worker][lease.lease_key] = lease  # expired but its owner is the best choice: keep
            else:
                state.record(lease, worker, pending_kind(lease), reason)
            n = state.count(worker)
            if n < cap:
                heapq.heappush(heap, (n - quotas[worker], n, worker))
        return left

    def balance(self, state: CountState, rng: random.Random) -> None:
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


class CountDecider:
    """The lease-count strategy.

    Target: ``ceil(leases / workers)`` capped by ``max_leases_for_worker`` and the dynamic cap. Unassigned and
    expired leases go to the worker furthest below its quota (then the fewest leases). On balancing runs, if any
    worker is outside [floor, ceil] of leases ÷ workers (or above the cap), the workers outside take part in a
    rebalance to their quotas (see :func:`spread_quotas`): a worker outside the band moves all the way to its
    quota, trading with the workers furthest from theirs. Workers already inside the band are moved only as the
    other side of such a move, so one worker joining costs only its own share of moves.

    ``kcl_compatible=True``: KCL 3.4.3's version (:class:`KCLCountRules`).
    """

    def __init__(self, config: AssignmentConfig | None = None, *, kcl_compatible: bool | None = None) -> None:
        config = config or AssignmentConfig(strategy="count")
        if kcl_compatible is not None and kcl_compatible != config.kcl_compatible:
            config = replace(config, kcl_compatible=kcl_compatible)
        self.config = config

    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        rules: CountRules = KCLCountRules() if self.config.kcl_compatible else QuotaCountRules()
        state = CountState(self.config, snapshot, drop_suspects=rules.drop_suspects)
        balancing = snapshot.is_balancing_run(self.config.balancing_frequency)
        unassigned = rules.assign(state)
        if balancing:
            rules.balance(state, rng)
        return state.plan("count", balancing_ran=balancing, unassigned=unassigned)
