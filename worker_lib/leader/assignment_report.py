"""What one assignment run reports (:class:`~worker_lib.leader.assigner.LeaseAssigner` returns it; the leader's
metrics, cycle logs and ``shardlease leader --json`` read it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class AssignmentReport:
    """One assignment run, as metrics: counts, per-worker load, balance, timings."""

    run_number: int
    strategy: str
    leases: int
    finished_leases: int
    workers_total: int
    workers_assignable: int
    expired: int
    assigned: int
    reassigned_expired: int
    moved: int
    handoffs_forced: int
    unassigned: int
    write_conflicts: int
    balancing_ran: bool
    effective_cap: int | None
    metric: str | None
    max_over_mean: float
    leases_per_worker: Mapping[str, int] = field(default_factory=dict)
    load_per_worker: Mapping[str, float] = field(default_factory=dict)
    throughput_per_worker_kbps: Mapping[str, float] = field(default_factory=dict)
    decide_ms: float = 0.0
    duration_ms: float = 0.0
    fast: bool = False
    workers_gone: tuple[str, ...] = ()
    workers_departing: tuple[str, ...] = ()
    notices: int = 0
    liveness_mode: str = "lease"
    max_millis_behind: int | None = None
    """The worst MillisBehindLatest the owners of live leases reported (``lag`` in their rows); None if none did."""
    stopped_shards: tuple[str, ...] = ()
    """Leases stopped by the stop-shard failure policy: assigned to nobody until ``shardlease resume-shard``."""
    blocked_shards: int = 0
    """Leases whose processor keeps failing (a failure marker: retrying or stopped; docs/failures.md)."""
    desired_workers: int | None = None
    """DesiredWorkers after a full run (docs/autoscaling.md); None in fast passes or without a sizer."""
    desired_reason: str = ""
    workers_to_remove: tuple[str, ...] = ()
    """When the fleet is larger than DesiredWorkers: the least loaded workers, the ones a scaler should stop."""
    foreign_owners: tuple[str, ...] = ()
    """In ``worker`` liveness mode: owners of leases that do not heartbeat (a KCL worker, or one of ours with the
    heartbeat off) — judged by lease counter, and unable to judge ``worker``-mode leases themselves."""

    def summary(self) -> str:
        kind = "fast pass" if self.fast else f"assignment run {self.run_number}"
        return (
            f"{kind} ({self.strategy}): {self.leases} leases, "
            f"{self.workers_assignable}/{self.workers_total} workers, assigned {self.assigned}, "
            f"reassigned {self.reassigned_expired} expired, moved {self.moved}, forced {self.handoffs_forced} "
            f"handoffs, {self.unassigned} unassigned, max/mean {self.max_over_mean:.2f}"
            + (f", desired workers {self.desired_workers}" if self.desired_workers is not None else "")
        )
