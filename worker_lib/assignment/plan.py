"""What every decider returns: :class:`Decision`, :class:`AssignmentPlan`, the :class:`Decider` protocol, and
:func:`apply_plan` (the lease table after a plan is written, for simulation and tests).

The deciders themselves are in :mod:`worker_lib.assignment.variance` and :mod:`worker_lib.assignment.count`; the
name → decider table is :data:`worker_lib.assignment.deciders.DECIDERS`. docs/assignment.md describes them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from worker_lib.assignment.snapshot import AssignmentSnapshot
from worker_lib.core.models import Lease

DecisionKind = Literal["assign", "reassign_expired", "rebalance"]


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
