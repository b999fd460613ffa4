"""The leader Lambda, invoked by an EventBridge rule once a minute (DESIGN.md §3).

Thin by design: every decision lives in :mod:`worker_lib.leader`. One invocation

1. builds a :class:`~worker_lib.leader.leader.Leader` from the environment (``SHARDLEASE_APP``,
   ``SHARDLEASE_STREAM`` and the ``from_env()`` of each config area), reusing boto3 clients cached at module level
   across warm invocations (created on first use, never at import);
2. runs leader cycles (and fast ticks between them) for ``LeaderConfig.term_ms`` (65 s: the 1-minute schedule
   plus 5 s of overlap) or until ``deadline_margin_ms`` before the invocation's deadline, whichever is first,
   heartbeating the lock and announcing in it when it will release; ``Leader.run`` releases the lock when it
   returns;
3. if the lock is held by someone else: waits for it when the holder will release it (or its lock will expire)
   within ``takeover_wait_ms`` — the next scheduled invocation, started while the previous one still leads, takes
   over the moment it lets go, so there is no leaderless gap (docs/failover.md) — and otherwise (a duplicate
   delivery, an embedded leader) returns ``{"leader": false, ...}`` after one lock read;
4. publishes per-cycle metrics as CloudWatch EMF through Powertools (names in :mod:`worker_lib.telemetry.names`);
5. returns a JSON-able summary (``cycles`` holds each cycle's ``CycleReport.to_dict()``).

Environment: ``POWERTOOLS_METRICS_NAMESPACE`` (default :data:`~worker_lib.telemetry.names.DEFAULT_NAMESPACE`),
``SHARDLEASE_PER_WORKER_METRICS`` (``true``; per-worker lease and throughput gauges, one EMF line per worker),
``SHARDLEASE_LEADER_ID`` (lock owner; default ``<function name>:<request id>``), plus every ``SHARDLEASE_*``
variable of the config classes (docs/api.md) and :class:`~worker_lib.assignment.config.AssignmentConfig`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK
from worker_lib.core.config import AwsConfig
from worker_lib.core.env import env_bool
from worker_lib.core.errors import ConfigError
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.host import build_leader
from worker_lib.leader.leader import CycleReport
from worker_lib.leases.config import LeaseConfig
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.telemetry.names import (
    APPLICATION_DIMENSION,
    DEFAULT_NAMESPACE,
    LEADER_SERVICE,
    WORKER_DIMENSION,
    LeaderMetric,
    WorkerMetric,
)

logger = Logger(service=LEADER_SERVICE)
tracer = Tracer(service=LEADER_SERVICE)


# --- clients cached across warm invocations ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Clients:
    aws_config: AwsConfig
    dynamodb: Any
    kinesis: Any


_clients: _Clients | None = None
_clients_lock = threading.Lock()


def _get_clients(aws_config: AwsConfig) -> _Clients:
    """boto3 clients for this container, created on first use (not at import) and rebuilt if the config changed."""
    global _clients  # noqa: PLW0603 - the warm-container cache is module state by design
    with _clients_lock:
        if _clients is None or _clients.aws_config != aws_config:
            _clients = _Clients(
                aws_config=aws_config,
                dynamodb=aws.client("dynamodb", aws_config),
                kinesis=aws.client("kinesis", aws_config),
            )
        return _clients


# --- metrics ---------------------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: Any) -> float | None:
    """A count from a number or from a collection (shard sync reports lists of lease keys)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return float(len(value))
    return _num(value)


def _section(cycle: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = cycle.get(key)
    return value if isinstance(value, Mapping) else {}


def cycle_metrics(cycle: Mapping[str, Any]) -> list[tuple[str, MetricUnit, float]]:
    """(name, unit, value) for one cycle's ``CycleReport.to_dict()``; absent or odd fields are skipped."""
    out: list[tuple[str, MetricUnit, float]] = []

    def put(name: str, unit: MetricUnit, value: float | None) -> None:
        if value is not None:
            out.append((name, unit, value))

    if not cycle.get("leader"):
        put(LeaderMetric.NOT_LEADER, MetricUnit.Count, 1.0)
        return out
    failed = bool(cycle.get("error"))
    put(LeaderMetric.CYCLES, MetricUnit.Count, 0.0 if failed else 1.0)
    put(LeaderMetric.CYCLE_FAILURES, MetricUnit.Count, 1.0 if failed else 0.0)
    put(LeaderMetric.CYCLE_TIME, MetricUnit.Milliseconds, _num(cycle.get("duration_ms")))
    sync = _section(cycle, "shard_sync")
    if sync:
        put(LeaderMetric.SHARDS, MetricUnit.Count, _count(sync.get("shards_seen")))
        put(LeaderMetric.LEASES_CREATED, MetricUnit.Count, _count(sync.get("created")))
        put(LeaderMetric.LEASES_DELETED, MetricUnit.Count, _count(sync.get("deleted")))
    assignment = _section(cycle, "assignment")
    if assignment:
        for name, key in (
            (LeaderMetric.LEASES, "leases"),
            (LeaderMetric.EXPIRED_LEASES, "expired"),
            (LeaderMetric.UNASSIGNED_LEASES, "unassigned"),
            (LeaderMetric.LEASES_ASSIGNED, "assigned"),
            (LeaderMetric.LEASE_MOVES, "moved"),
            (LeaderMetric.HANDOFFS_FORCED, "handoffs_forced"),
            (LeaderMetric.WRITE_CONFLICTS, "write_conflicts"),
            (LeaderMetric.WORKERS, "workers_assignable"),
        ):
            put(name, MetricUnit.Count, _count(assignment.get(key)))
        put(LeaderMetric.LOAD_MAX_OVER_MEAN, MetricUnit.NoUnit, _num(assignment.get("max_over_mean")))
    return out


def worker_metrics(cycle: Mapping[str, Any]) -> list[tuple[str, str, MetricUnit, float]]:
    """(worker id, name, unit, value): the per-worker lease count and throughput the leader assigned."""
    assignment = _section(cycle, "assignment")
    out: list[tuple[str, str, MetricUnit, float]] = []
    for key, name, unit in (
        ("leases_per_worker", WorkerMetric.LEASES, MetricUnit.Count),
        ("throughput_per_worker_kbps", WorkerMetric.THROUGHPUT_KBPS, MetricUnit.KilobytesPerSecond),
    ):
        per_worker = assignment.get(key)
        if isinstance(per_worker, Mapping):
            for worker, raw in per_worker.items():
                value = _num(raw)
                if value is not None:
                    out.append((str(worker), name, unit, value))
    return out


def _publish(metrics: Metrics, namespace: str, app: str, cycle: Mapping[str, Any], *, per_worker: bool) -> None:
    if metrics.dimension_set.get(APPLICATION_DIMENSION) != app:  # a flush clears it; Powertools warns on re-adding
        metrics.add_dimension(name=APPLICATION_DIMENSION, value=app)
    for name, unit, value in cycle_metrics(cycle):
        metrics.add_metric(name=name, unit=unit, value=value)
    metrics.flush_metrics()  # one EMF document per cycle, time-stamped when the cycle ended
    if not per_worker:
        return
    for worker, name, unit, value in worker_metrics(cycle):
        with single_metric(
            name=name, unit=unit, value=value, namespace=namespace, default_dimensions={APPLICATION_DIMENSION: app}
        ) as metric:
            metric.add_dimension(name=WORKER_DIMENSION, value=worker)


# --- the handler -----------------------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def summarize(reports: list[CycleReport], *, owner: str) -> dict[str, Any]:
    """The invocation's return value: JSON-able, small (a Lambda invocation runs a handful of cycles)."""
    cycles = [_json_safe(report.to_dict()) for report in reports]
    led = [c for c in cycles if c.get("leader")]
    created = deleted = 0.0
    for c in led:
        sync = _section(c, "shard_sync")
        created += _count(sync.get("created")) or 0.0
        deleted += _count(sync.get("deleted")) or 0.0
    last = cycles[-1] if cycles else {}
    return {
        "leader": bool(led),
        "owner": owner,
        "current_leader": last.get("current_leader"),
        "cycles_run": len(cycles),
        "leader_cycles": len(led),
        "failed_cycles": sum(1 for c in led if c.get("error")),
        "leases_created": int(created),
        "leases_deleted": int(deleted),
        "cycles": cycles,
    }


@tracer.capture_lambda_handler
def handler(event: Mapping[str, Any] | None, context: Any) -> dict[str, Any]:
    env = os.environ
    app, stream = env.get("SHARDLEASE_APP", ""), env.get("SHARDLEASE_STREAM", "")
    if not app or not stream:
        raise ConfigError("SHARDLEASE_APP and SHARDLEASE_STREAM must be set")
    namespace = env.get("POWERTOOLS_METRICS_NAMESPACE") or DEFAULT_NAMESPACE
    per_worker = env_bool(env, "SHARDLEASE_PER_WORKER_METRICS", True)
    owner = env.get("SHARDLEASE_LEADER_ID") or f"{context.function_name}:{context.aws_request_id}"
    logger.append_keys(application=app, stream=stream, owner=owner)

    # The deadline is taken first, so that building the leader counts against the invocation's time.
    started = SYSTEM_CLOCK.monotonic()
    deadline = started + context.get_remaining_time_in_millis() / 1000
    leader_config = LeaderConfig.from_env(env)
    deadline = min(deadline, started + (leader_config.term_ms + leader_config.deadline_margin_ms) / 1000)
    clients = _get_clients(AwsConfig.from_env(env))
    parts = build_leader(
        app=app,
        stream=stream,
        aws_config=clients.aws_config,
        shard_sync=ShardSyncConfig.from_env(env),
        owner=owner,
        leader_config=leader_config,
        lock_config=LeaderLockConfig.from_env(env),
        assignment=AssignmentConfig.from_env(env),
        lease_config=LeaseConfig.from_env(env),
        dynamodb=clients.dynamodb,
        kinesis=clients.kinesis,
    )
    metrics = Metrics(namespace=namespace)

    def on_cycle(report: CycleReport) -> None:
        cycle = _json_safe(report.to_dict())
        logger.info("leader cycle", extra={"cycle": cycle})
        _publish(metrics, namespace, app, cycle, per_worker=per_worker)

    reports = parts.leader.run(deadline_monotonic=deadline, on_cycle=on_cycle, exit_when_held=True)
    summary = summarize(reports, owner=owner)
    logger.info(
        "leader invocation done",
        extra={k: v for k, v in summary.items() if k != "cycles"},
    )
    return summary
