"""The leader's metrics and a run's outcome, as pure functions of its cycle reports.

Whichever host runs the leader (the Lambda handler, the embedded thread, ``shardlease leader``) publishes the same
values under the same names (:mod:`worker_lib.telemetry.names`); how they are published (EMF through Powertools,
log lines) is the host's business. Units are CloudWatch unit names, which Powertools accepts as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from worker_lib.leader.leader import CycleReport
from worker_lib.telemetry.names import LeaderMetric, WorkerMetric

COUNT = "Count"
MILLISECONDS = "Milliseconds"
NO_UNIT = "None"
KILOBYTES_PER_SECOND = "Kilobytes/Second"


@dataclass(frozen=True)
class MetricValue:
    """One value to publish; ``worker`` is set for the per-worker gauges (the ``WorkerId`` dimension)."""

    name: str
    unit: str
    value: float
    worker: str | None = None


def cycle_metrics(report: CycleReport) -> list[MetricValue]:
    """The application-level values of one cycle (a full cycle or a fast pass).

    A host that did not hold the lock reports only that; a failed cycle reports the failure and its time.
    """
    if not report.leader:
        return [
            MetricValue(LeaderMetric.NOT_LEADER, COUNT, 1.0),
            MetricValue(LeaderMetric.FOREIGN_LOCK_HOLDER, COUNT, 1.0 if report.foreign_leader else 0.0),
        ]
    failed = bool(report.error)
    out = [
        MetricValue(LeaderMetric.CYCLES, COUNT, 0.0 if failed else 1.0),
        MetricValue(LeaderMetric.CYCLE_FAILURES, COUNT, 1.0 if failed else 0.0),
        MetricValue(LeaderMetric.CYCLE_TIME, MILLISECONDS, float(report.duration_ms)),
    ]
    sync = report.shard_sync
    if sync is not None:
        out += [
            MetricValue(LeaderMetric.SHARDS, COUNT, float(sync.shards_seen)),
            MetricValue(LeaderMetric.LEASES_CREATED, COUNT, float(len(sync.created))),
            MetricValue(LeaderMetric.LEASES_DELETED, COUNT, float(len(sync.deleted))),
        ]
    run = report.assignment
    if run is not None:
        for name, count in (
            (LeaderMetric.LEASES, run.leases),
            (LeaderMetric.EXPIRED_LEASES, run.expired),
            (LeaderMetric.UNASSIGNED_LEASES, run.unassigned),
            (LeaderMetric.LEASES_ASSIGNED, run.assigned),
            (LeaderMetric.LEASE_MOVES, run.moved),
            (LeaderMetric.HANDOFFS_FORCED, run.handoffs_forced),
            (LeaderMetric.WRITE_CONFLICTS, run.write_conflicts),
            (LeaderMetric.WORKERS, run.workers_assignable),
            (LeaderMetric.FOREIGN_OWNERS, len(run.foreign_owners)),
            (LeaderMetric.SHARDS_STOPPED, len(run.stopped_shards)),
            (LeaderMetric.SHARDS_BLOCKED, run.blocked_shards),
        ):
            out.append(MetricValue(name, COUNT, float(count)))
        out.append(MetricValue(LeaderMetric.LOAD_MAX_OVER_MEAN, NO_UNIT, float(run.max_over_mean)))
        if run.desired_workers is not None:
            out.append(MetricValue(LeaderMetric.DESIRED_WORKERS, COUNT, float(run.desired_workers)))
        if run.max_millis_behind is not None:
            out.append(MetricValue(LeaderMetric.MILLIS_BEHIND_MAX, MILLISECONDS, float(run.max_millis_behind)))
    return out


def worker_metrics(report: CycleReport) -> list[MetricValue]:
    """Per worker: the lease count and the throughput the leader's plan gives it (none for a non-leader)."""
    run = report.assignment
    if run is None:
        return []
    out = [MetricValue(WorkerMetric.LEASES, COUNT, float(n), worker) for worker, n in run.leases_per_worker.items()]
    out += [
        MetricValue(WorkerMetric.THROUGHPUT_KBPS, KILOBYTES_PER_SECOND, float(kbps), worker)
        for worker, kbps in run.throughput_per_worker_kbps.items()
    ]
    return out


def report_fields(report: CycleReport) -> dict[str, Any]:
    """A cycle report as JSON-able fields (what a log line or a Lambda's return value carries)."""
    fields: dict[str, Any] = json.loads(json.dumps(report.to_dict(), default=str))
    return fields


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """What a run of the leader loop (one Lambda invocation) did, in a few numbers."""

    leader: bool
    owner: str
    current_leader: str | None
    cycles_run: int
    leader_cycles: int
    failed_cycles: int
    leases_created: int
    leases_deleted: int
    cycles: tuple[CycleReport, ...] = field(default=(), repr=False)

    def headline(self) -> dict[str, Any]:
        """The numbers without the cycles: the one log line an invocation ends with."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cycles"}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (a Lambda's return value); ``cycles`` holds each cycle's :meth:`CycleReport.to_dict`."""
        return {**self.headline(), "cycles": [report_fields(report) for report in self.cycles]}


def run_outcome(reports: Sequence[CycleReport], *, owner: str) -> RunOutcome:
    led = [report for report in reports if report.leader]
    synced = [report.shard_sync for report in led if report.shard_sync is not None]
    return RunOutcome(
        owner=owner,
        leader=bool(led),
        current_leader=reports[-1].current_leader if reports else None,
        cycles_run=len(reports),
        leader_cycles=len(led),
        failed_cycles=sum(1 for report in led if report.error),
        leases_created=sum(len(sync.created) for sync in synced),
        leases_deleted=sum(len(sync.deleted) for sync in synced),
        cycles=tuple(reports),
    )
