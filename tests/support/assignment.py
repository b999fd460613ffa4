"""Snapshots for the assignment deciders' tests: one clock reading, one way to build an AssignmentSnapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from worker_lib.assignment.snapshot import AssignmentSnapshot
from worker_lib.core.models import Lease, WorkerMetricStats

NOW = 1_700_000_000.0


def snap(
    leases: Iterable[Lease],
    workers: Iterable[WorkerMetricStats],
    *,
    run: int = 1,
    expired: Iterable[str] = (),
    shard_count: int | None = None,
    last_increments: Mapping[str, float] | None = None,
) -> AssignmentSnapshot:
    """What a leader run at :data:`NOW` gives the decider: ``leases``, ``workers``, the expired lease keys and the
    counter observations of its tracker."""
    return AssignmentSnapshot(
        leases=tuple(leases),
        workers=tuple(workers),
        now_epoch_s=NOW,
        expired_lease_keys=frozenset(expired),
        last_counter_increment=dict(last_increments or {}),
        shard_count=shard_count,
        run_number=run,
    )
