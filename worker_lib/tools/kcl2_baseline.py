"""A baseline for benchmarks and the simulator: one round of KCL 2.x lease takers (:class:`KCL2StealingDecider`).

The leader never uses it; ``shardlease simulate --strategy kcl2`` and ``bench/assignment.py`` register it under
:data:`KCL2` next to :data:`worker_lib.assignment.deciders.DECIDERS`. docs/assignment.md, "500 shards over
100 + 100 workers", shows where its stealing stops.
"""

from __future__ import annotations

import random
from dataclasses import replace

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.count import CountState
from worker_lib.assignment.plan import AssignmentPlan, Decider
from worker_lib.assignment.snapshot import AssignmentSnapshot
from worker_lib.assignment.state import LazyHeap, ordered_pending, pending_kind

KCL2 = "kcl2"
"""The baseline's strategy name in the simulator."""


class KCL2StealingDecider:
    """One round of KCL 2.x lease takers, one per assignable worker.

    Each worker, in an order shuffled by ``rng``, computes ``target = min(ceil(leases / workers), cap)``; if it
    holds fewer, it takes expired or unassigned leases up to the target, and only when there are none it steals
    from the most loaded worker: ``min(needed, most − target)`` leases, at least 1 when it needs more than one,
    at most ``max_leases_to_steal`` (1) per round. Workers see each other's effects within the round (the real
    takers race through conditional writes; the winner is what this models).

    500 shards over 100 then 200 workers settle with every old worker at 3 and every new one at 2: a worker
    holding 2 that needs 1 may not steal from one holding exactly the target.

    A worker all of whose leases are expired (:func:`worker_lib.assignment.state.suspect_workers`) has no taker turn
    and does not count towards the target: a dead KCL 2.x worker runs no taker, even while its metrics still look
    fresh.
    """

    def __init__(self, config: AssignmentConfig | None = None, *, max_leases_to_steal: int = 1) -> None:
        self.config = config or AssignmentConfig(strategy="count")
        if max_leases_to_steal < 1:
            raise ValueError("max_leases_to_steal must be at least 1")
        self.max_leases_to_steal = max_leases_to_steal

    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        state = CountState(self.config, snapshot, drop_suspects=True)
        workers = list(state.worker_ids)
        pool = ordered_pending(snapshot)
        rng.shuffle(pool)
        if not workers:
            return state.plan(KCL2, balancing_ran=True, unassigned=[lease.lease_key for lease in pool])
        total = len(snapshot.leases)
        target = -(-total // len(workers))
        if state.cap is not None:
            target = min(target, state.cap)
        most = LazyHeap()
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
                        state.record(
                            lease, worker, pending_kind(lease), f"KCL 2.x taker: {worker} below target {target}"
                        )
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
        return state.plan(KCL2, balancing_ran=True, unassigned=[lease.lease_key for lease in pool])


def kcl2_decider(config: AssignmentConfig) -> Decider:
    """The baseline under ``config`` (as a count strategy: it balances lease counts)."""
    return KCL2StealingDecider(replace(config, strategy="count"))
