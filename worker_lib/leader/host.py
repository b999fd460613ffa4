"""Composition of the leader from configuration, and the CLI host (``shardlease leader``).

The Lambda handler and the embedded worker thread use :func:`build_leader` too, so all three hosts run the same
:class:`~worker_lib.leader.leader.Leader`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import boto3

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, validate_app_name
from worker_lib.core.env import environ
from worker_lib.core.errors import ConfigError
from worker_lib.leader.assigner import LeaseAssigner
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.leader import CycleReport, Leader
from worker_lib.leader.liveness import FastPath, LivenessWatch
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leader.state_store import CoordinatorStateStore, ExpiryObservationStore, LeaseCapRecorder
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.shardsync.syncer import ShardSyncer
from worker_lib.tables.schema import all_specs
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


def default_owner() -> str:
    """host:pid — unique per process, readable in the lock item and in logs."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, kw_only=True)
class LeaderParts:
    leader: Leader
    lease_store: DynamoDBLeaseStore
    lock: DynamoDBLeaderLock
    syncer: ShardSyncer
    assigner: LeaseAssigner | None
    dynamodb: Any
    kinesis: Any


def build_leader(
    *,
    app: str,
    stream: str,
    aws_config: AwsConfig,
    shard_sync: ShardSyncConfig,
    owner: str | None = None,
    leader_config: LeaderConfig | None = None,
    lock_config: LeaderLockConfig | None = None,
    assignment: AssignmentConfig | None = None,
    lease_config: LeaseConfig | None = None,
    with_assignment: bool = True,
    boto3_session: boto3.Session | None = None,
    dynamodb: Any = None,
    kinesis: Any = None,
    clock: Clock = SYSTEM_CLOCK,
) -> LeaderParts:
    """Wire the leader. ``dynamodb`` / ``kinesis`` clients may be passed (tests, the demo's two emulators)."""
    validate_app_name(app)
    dynamodb = dynamodb or aws.client("dynamodb", aws_config, boto3_session)
    kinesis = kinesis or aws.client("kinesis", aws_config, boto3_session)
    lock_config = lock_config or LeaderLockConfig()
    store = DynamoDBLeaseStore(app, client=dynamodb, clock=clock)
    lock = DynamoDBLeaderLock(app, owner or default_owner(), config=lock_config, client=dynamodb, clock=clock)
    detector = KinesisShardDetector(stream, client=kinesis, clock=clock, page_size=shard_sync.list_shards_page_size)
    syncer = ShardSyncer(store, detector, config=shard_sync, clock=clock)
    assigner = None
    watch = None
    if with_assignment:
        assignment = assignment or AssignmentConfig()
        worker_rows = WorkerMetricsStore(app, client=dynamodb, clock=clock)
        watch = LivenessWatch(
            worker_rows,
            failover_ms=assignment.failover_ms,
            max_clock_skew_ms=lock_config.max_clock_skew_ms,
            clock=clock,
        )
        state_store = CoordinatorStateStore(app, client=dynamodb, clock=clock)
        assigner = LeaseAssigner(
            store,
            worker_rows,
            cap_recorder=LeaseCapRecorder(state_store),
            config=assignment,
            lease_config=lease_config or LeaseConfig(failover_time_ms=assignment.failover_ms),
            liveness=watch,
            notifier=worker_rows,
            observations=ExpiryObservationStore(state_store, max_clock_skew_ms=lock_config.max_clock_skew_ms),
            clock=clock,
        )
    leader_config = leader_config or LeaderConfig()
    fast_path = None
    if assigner is not None and watch is not None and leader_config.fast_tick_ms > 0:
        fast_path = FastPath(
            watch,
            assigner,
            max_backoff_s=leader_config.cycle_interval_ms / 1000,
            read_timeout_s=lock_config.heartbeat_interval_ms / 2000,  # never holds the loop past a lock heartbeat
            clock=clock,
        )
    leader = Leader(
        lock=lock,
        shard_sync=syncer,
        assignment=assigner,
        config=leader_config,
        lock_config=lock_config,
        shard_sync_interval_ms=shard_sync.interval_ms,
        fast_tick=fast_path,
        clock=clock,
    )
    return LeaderParts(
        leader=leader,
        lease_store=store,
        lock=lock,
        syncer=syncer,
        assigner=assigner,
        dynamodb=dynamodb,
        kinesis=kinesis,
    )


def build_leader_from_env(
    env: Mapping[str, str] | None = None,
    *,
    owner: str | None = None,
    boto3_session: boto3.Session | None = None,
    dynamodb: Any = None,
    kinesis: Any = None,
    clock: Clock = SYSTEM_CLOCK,
) -> LeaderParts:
    """The leader as the Lambda handler and the embedded host build it: everything from ``SHARDLEASE_*``."""
    e = environ(env)
    app, stream = e.get("SHARDLEASE_APP", ""), e.get("SHARDLEASE_STREAM", "")
    if not app or not stream:
        raise ConfigError("SHARDLEASE_APP and SHARDLEASE_STREAM must be set")
    return build_leader(
        app=app,
        stream=stream,
        aws_config=AwsConfig.from_env(e),
        shard_sync=ShardSyncConfig.from_env(e),
        owner=owner or e.get("SHARDLEASE_LEADER_ID") or None,
        leader_config=LeaderConfig.from_env(e),
        lock_config=LeaderLockConfig.from_env(e),
        assignment=AssignmentConfig.from_env(e),
        lease_config=LeaseConfig.from_env(e),
        boto3_session=boto3_session,
        dynamodb=dynamodb,
        kinesis=kinesis,
        clock=clock,
    )


def preflight(parts: LeaderParts, *, app: str, stream: str) -> None:
    """Fail with one clear error (TableMissingError, StreamMissingError, EndpointUnreachableError, ...) before the
    loop starts, rather than counting the same failure three times inside it."""
    for spec in all_specs():
        name = spec.table_name(app)
        with aws.translated("dynamodb DescribeTable", name):
            parts.dynamodb.describe_table(TableName=name)
    with aws.translated("kinesis DescribeStreamSummary", stream):
        parts.kinesis.describe_stream_summary(StreamName=stream)


def summarize(report: CycleReport) -> str:
    """One human line per cycle."""
    if not report.leader:
        holder = report.current_leader or "nobody (lock contended)"
        return f"cycle {report.cycle}: not leader; lock held by {holder}"
    if report.error:
        return f"cycle {report.cycle}: failed: {report.error}"
    parts = [f"cycle {report.cycle}: leader {report.owner}"]
    sync = report.shard_sync
    if sync is not None:
        created = list(getattr(sync, "created", ()))
        deleted = list(getattr(sync, "deleted", ()))
        parts.append(
            f"shard sync: {getattr(sync, 'shards_seen', '?')} shards, "
            f"created {len(created)} lease(s){' ' + ','.join(created) if created else ''}, "
            f"deleted {len(deleted)}{' ' + ','.join(deleted) if deleted else ''}"
        )
    if report.assignment is not None and hasattr(report.assignment, "summary"):
        parts.append(str(report.assignment.summary()))
    parts.append(f"{report.duration_ms} ms")
    return "; ".join(parts)


def run_leader_cli(
    *,
    app: str,
    stream: str,
    aws_config: AwsConfig,
    shard_sync: ShardSyncConfig,
    once: bool,
    owner: str | None,
    as_json: bool,
) -> int:
    parts = build_leader(
        app=app,
        stream=stream,
        aws_config=aws_config,
        shard_sync=shard_sync,
        owner=owner,
        leader_config=LeaderConfig.from_env(),
        lock_config=LeaderLockConfig.from_env(),
        assignment=AssignmentConfig.from_env(),
        lease_config=LeaseConfig.from_env(),
    )
    preflight(parts, app=app, stream=stream)

    def emit(report: CycleReport) -> None:
        line = json.dumps(report.to_dict(), default=str, sort_keys=True) if as_json else summarize(report)
        print(line, flush=True)

    if once:
        report = parts.leader.run_once()
        emit(report)
        return 1 if report.error else 0
    # SIGTERM (systemd, ECS, Kubernetes) stops the loop like Ctrl-C: the lock is released, so the next leader takes
    # over at once instead of after the lock's expiry.
    stop = threading.Event()
    with contextlib.suppress(ValueError):  # not the main thread: the host handles signals
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        parts.leader.run(on_cycle=emit, stop=stop)
    print("leader stopped; lock released", file=sys.stderr)
    return 0
