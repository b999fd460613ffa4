"""The dashboard's graphs of our own metrics, as data: the one definition the CDK dashboard
(:mod:`worker_lib.cdk.observability`) builds its widgets from and the demo's picture of the dashboard
(:mod:`worker_lib.tools.dashboard_png`) draws. Graphs of AWS's namespaces (the stream, the leader Lambda, the tables)
are named by ``aws_left``; only the CDK dashboard can fill them, from AWS.

Pure constants: no imports beyond the standard library and the metric names.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker_lib.telemetry.names import LeaderMetric, WorkerMetric


@dataclass(frozen=True)
class Series:
    """One line: a metric and its statistic; ``per_worker``: one line per ``WorkerId`` (a SEARCH in CloudWatch)."""

    metric: str
    statistic: str
    per_worker: bool = False


@dataclass(frozen=True)
class Graph:
    title: str
    left: tuple[Series, ...] = ()
    right: tuple[Series, ...] = ()
    aws_left: str | None = None  # "stream-bytes", "iterator-age", "lambda", "table-reads", "table-writes"
    width: int = 8


def _per_worker(title: str, metric: str, statistic: str) -> Graph:
    return Graph(title=title, left=(Series(metric, statistic, per_worker=True),))


def _each(statistic: str, *metrics: str) -> tuple[Series, ...]:
    """One fleet-wide line per metric, all with ``statistic``."""
    return tuple(Series(metric, statistic) for metric in metrics)


ROWS: tuple[tuple[Graph, ...], ...] = (
    (
        _per_worker("Leases per worker", WorkerMetric.LEASES, "Maximum"),
        _per_worker("CPU per worker (%)", WorkerMetric.CPU_UTILIZATION, "Average"),
        _per_worker("Assigned throughput per worker (KB/s)", WorkerMetric.THROUGHPUT_KBPS, "Average"),
    ),
    (
        _per_worker("Records processed per worker (per minute)", WorkerMetric.RECORDS_PROCESSED, "Sum"),
        _per_worker("Bytes processed per worker (per minute)", WorkerMetric.BYTES_PROCESSED, "Sum"),
        _per_worker("Leases held per worker (the worker's count)", WorkerMetric.LEASES_HELD, "Maximum"),
    ),
    (
        Graph(title="Stream throughput (bytes/min)", aws_left="stream-bytes"),
        Graph(
            title="Iterator age (ms)",
            aws_left="iterator-age",
            right=(
                Series(WorkerMetric.MILLIS_BEHIND_LATEST, "Maximum", per_worker=True),
                Series(LeaderMetric.MILLIS_BEHIND_MAX, "Maximum"),
            ),
        ),
        Graph(
            title="Assignment moves",
            left=_each(
                "Sum",
                LeaderMetric.LEASE_MOVES,
                LeaderMetric.LEASES_ASSIGNED,
                LeaderMetric.HANDOFFS_FORCED,
                LeaderMetric.WRITE_CONFLICTS,
            ),
            right=(Series(LeaderMetric.LOAD_MAX_OVER_MEAN, "Average"),),
        ),
    ),
    (
        Graph(
            title="Leader cycle time (ms)",
            left=(Series(LeaderMetric.CYCLE_TIME, "Average"), Series(LeaderMetric.CYCLE_TIME, "Maximum")),
            right=(
                *_each("Sum", LeaderMetric.CYCLES, LeaderMetric.CYCLE_FAILURES, LeaderMetric.NOT_LEADER),
                Series(LeaderMetric.FOREIGN_LOCK_HOLDER, "Maximum"),
            ),
        ),
        Graph(
            title="Leases: total, expired, unassigned",
            left=(
                *_each("Maximum", LeaderMetric.EXPIRED_LEASES, LeaderMetric.UNASSIGNED_LEASES),
                *_each("Sum", LeaderMetric.LEASES_CREATED, LeaderMetric.LEASES_DELETED),
            ),
            right=_each(
                "Maximum", LeaderMetric.LEASES, LeaderMetric.SHARDS, LeaderMetric.WORKERS, LeaderMetric.DESIRED_WORKERS
            ),
        ),
        Graph(title="Leader Lambda", aws_left="lambda"),
    ),
    (
        _per_worker("Processor failures per worker (per minute)", WorkerMetric.PROCESSOR_FAILURES, "Sum"),
        Graph(
            title="Retries and bisections per worker",
            left=(
                Series(WorkerMetric.BATCH_RETRIES, "Sum", per_worker=True),
                Series(WorkerMetric.BATCH_BISECTIONS, "Sum", per_worker=True),
            ),
        ),
        Graph(
            title="Records sent to the failure destination; shards blocked",
            left=(Series(WorkerMetric.RECORDS_TO_DESTINATION, "Sum", per_worker=True),),
            right=_each("Maximum", LeaderMetric.SHARDS_BLOCKED, LeaderMetric.SHARDS_STOPPED),
        ),
    ),
    (
        Graph(title="DynamoDB consumed read capacity", aws_left="table-reads", width=12),
        Graph(title="DynamoDB consumed write capacity", aws_left="table-writes", width=12),
    ),
)
"""The dashboard below its alarm-status row, row by row."""
