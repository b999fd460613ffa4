"""CloudWatch metric names, dimensions and the default namespace: the one place they are defined.

The leader (Lambda handler, EMF through Powertools), the worker-side publishers and the CDK dashboard and alarms
(``worker_lib/cdk``) all import these, so a renamed metric cannot silently leave a graph or an alarm empty.

Dimensions:

* leader metrics: ``{Application}``;
* per-worker metrics: ``{Application, WorkerId}`` (the leader publishes the per-worker lease count and
  throughput it assigned; workers publish their own CPU and processing figures).

Pure constants: no imports beyond the standard library, safe in any host.
"""

from __future__ import annotations

from typing import Final

DEFAULT_NAMESPACE: Final = "Shardlease"
"""Default CloudWatch namespace (CDK construct ``metrics_namespace``; Lambda ``POWERTOOLS_METRICS_NAMESPACE``)."""

NAMESPACE_ENV: Final = "SHARDLEASE_METRICS_NAMESPACE"
"""Workers read their namespace from this variable (the Lambda uses Powertools' ``POWERTOOLS_METRICS_NAMESPACE``)."""

APPLICATION_DIMENSION: Final = "Application"
WORKER_DIMENSION: Final = "WorkerId"

LEADER_SERVICE: Final = "shardlease-leader"
"""Powertools service name of the leader Lambda (logs and traces; metrics carry ``Application`` only)."""


class LeaderMetric:
    """Published by the leader once per cycle; dimensions ``{Application}``."""

    CYCLES: Final = "LeaderCycles"  # Count: cycles run while holding the lock (0 cycles for N min → alarm)
    CYCLE_TIME: Final = "LeaderCycleTime"  # Milliseconds
    CYCLE_FAILURES: Final = "LeaderCycleFailures"  # Count: cycles that ended in an infrastructure error
    NOT_LEADER: Final = "LeaderLockContended"  # Count: invocations that found the lock held by someone else
    SHARDS: Final = "Shards"  # Count: shards seen by the last shard sync
    LEASES: Final = "Leases"  # Count: unfinished leases in the table
    LEASES_CREATED: Final = "LeasesCreated"  # Count: by shard sync
    LEASES_DELETED: Final = "LeasesDeleted"  # Count: by shard sync (finished / unknown shards)
    EXPIRED_LEASES: Final = "ExpiredLeases"  # Count: leases whose counter did not move for a lease duration
    UNASSIGNED_LEASES: Final = "UnassignedLeases"  # Count: leases that needed an owner and got none
    LEASES_ASSIGNED: Final = "LeasesAssigned"  # Count: assignments of unowned or expired leases
    LEASE_MOVES: Final = "LeaseMoves"  # Count: rebalancing moves (graceful handoffs initiated)
    HANDOFFS_FORCED: Final = "HandoffsForced"  # Count: overdue graceful handoffs completed by the leader
    WRITE_CONFLICTS: Final = "LeaseWriteConflicts"  # Count: conditional writes lost to a concurrent update
    WORKERS: Final = "Workers"  # Count: workers able to take leases
    DESIRED_WORKERS: Final = "DesiredWorkers"  # Count: the fleet size the load needs (full cycles; autoscaling.md)
    LOAD_MAX_OVER_MEAN: Final = "LoadMaxOverMean"  # None: balance of the acted-on metric after the plan
    FOREIGN_OWNERS: Final = "ForeignLeaseOwners"  # Count: worker liveness mode, lease owners without a heartbeat
    FOREIGN_LOCK_HOLDER: Final = "LeaderLockForeignHolder"  # Count: 1 when the lock is held in another client's format
    MILLIS_BEHIND_MAX: Final = "MillisBehindLatestMax"  # Milliseconds: the worst lease's lag the workers reported
    SHARDS_STOPPED: Final = "ShardsStopped"  # Count: shards stopped by the stop-shard failure policy (alarm ≥ 1)
    SHARDS_BLOCKED: Final = "ShardsBlockedByFailures"  # Count: shards whose processor keeps failing (retrying/stopped)


class WorkerMetric:
    """Per worker; dimensions ``{Application, WorkerId}``."""

    LEASES: Final = "WorkerLeases"  # Count: leases assigned to the worker (leader)
    THROUGHPUT_KBPS: Final = "WorkerThroughputKBps"  # Kilobytes/Second: assigned throughput (leader)
    CPU_UTILIZATION: Final = "WorkerCpuUtilization"  # Percent: the worker's own CPU sample (worker)
    RECORDS_PROCESSED: Final = "RecordsProcessed"  # Count (worker)
    BYTES_PROCESSED: Final = "BytesProcessed"  # Bytes (worker)
    LEASES_HELD: Final = "LeasesHeld"  # Count: leases the worker holds and processes (worker)
    RENEWAL_FAILURES: Final = "LeaseRenewalFailures"  # Count (worker)
    CHECKPOINT_FAILURES: Final = "CheckpointFailures"  # Count (worker)
    LEASES_LOST: Final = "LeasesLost"  # Count: leases taken away or expired under the worker (worker)
    MILLIS_BEHIND_LATEST: Final = "MillisBehindLatest"  # Milliseconds, maximum over the worker's shards (worker)
    # Lanes (parallelism > 1 or an async processor; docs/worker.md), maximum over the worker's shards:
    RECORDS_IN_FLIGHT: Final = "RecordsInFlight"  # Count: records read and not yet done on a shard
    WATERMARK_LAG: Final = "WatermarkLag"  # Milliseconds: how long a shard's first record not yet done has waited
    # The failure policy (docs/failures.md), per worker:
    PROCESSOR_FAILURES: Final = "ProcessorFailures"  # Count: deliveries that raised or reported a failed record
    BATCH_RETRIES: Final = "BatchRetries"  # Count: deliveries again after a backoff
    BATCH_BISECTIONS: Final = "BatchBisections"  # Count: failing batches split in two
    RECORDS_TO_DESTINATION: Final = "FailedRecordsToDestination"  # Count: records sent to the failure destination
    RECORDS_SKIPPED: Final = "FailedRecordsSkipped"  # Count: records skipped without a destination (policy skip)
    DESTINATION_FAILURES: Final = "FailureDestinationErrors"  # Count: sends to the destination that failed
    # Exactly-once effects (docs/exactly-once.md), per worker:
    FENCED_TRANSACTIONS: Final = "FencedTransactions"  # Count: output commits refused because the lease had moved


ALL_LEADER_METRICS: Final = tuple(v for k, v in vars(LeaderMetric).items() if k.isupper())
ALL_WORKER_METRICS: Final = tuple(v for k, v in vars(WorkerMetric).items() if k.isupper())


UNITS: Final[dict[str, str]] = {
    **{name: "Count" for name in ALL_LEADER_METRICS},
    LeaderMetric.CYCLE_TIME: "Milliseconds",
    LeaderMetric.LOAD_MAX_OVER_MEAN: "None",
    LeaderMetric.MILLIS_BEHIND_MAX: "Milliseconds",
    **{name: "Count" for name in ALL_WORKER_METRICS},
    WorkerMetric.THROUGHPUT_KBPS: "Kilobytes/Second",
    WorkerMetric.CPU_UTILIZATION: "Percent",
    WorkerMetric.BYTES_PROCESSED: "Bytes",
    WorkerMetric.MILLIS_BEHIND_LATEST: "Milliseconds",
}
"""The CloudWatch unit of every metric: what the publishers send and what the metrics contract test checks."""
