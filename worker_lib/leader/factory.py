"""The one place a leader is built: lock, stores, shard syncer, assigner, liveness watch and fast path.

Every host runs the :class:`~worker_lib.leader.leader.Leader` this module wires — the Lambda handler
(:mod:`worker_lib.leader.lambda_handler`), the embedded thread of a worker with ``leader_mode="embedded"`` and
``shardlease leader`` (:mod:`worker_lib.cli.leader`) — so a fix to the wiring reaches all three at once.
:func:`build_leader` takes the settings as objects (the embedded leader gives its worker's configuration);
:func:`build_leader_from_env` reads them from ``SHARDLEASE_*`` at the edge of the Lambda and of the CLI (docs/api.md
lists the variables).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, default_owner, validate_app_name
from worker_lib.core.env import env_str, environ
from worker_lib.core.errors import ConfigError, StreamMissingError
from worker_lib.core.streams import StreamSelection, parse_stream_entry
from worker_lib.leader.assigner import LeaseAssigner
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.fast_path import FastPath, LivenessWatch
from worker_lib.leader.leader import Leader
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leader.mode_keeper import LeaderModeKeeper
from worker_lib.leader.sizing import FleetSizer
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.mode import check_start
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.scaling.config import ScalingConfig
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.shardsync.multistream import MultiStreamShardSyncer
from worker_lib.shardsync.syncer import ShardSyncer
from worker_lib.tables.admin import check_layout, check_schema
from worker_lib.tables.schema import TableLayout
from worker_lib.tables.state_store import (
    CoordinatorStateStore,
    DecisionRecorder,
    ExpiryObservationStore,
    LeaseCapRecorder,
)
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LeaderParts:
    """The built leader and the parts a host or a test may want to look at."""

    leader: Leader
    config: LeaderConfig
    lease_store: DynamoDBLeaseStore
    lock: DynamoDBLeaderLock
    syncer: ShardSyncer | MultiStreamShardSyncer
    assigner: LeaseAssigner | None
    dynamodb: Any
    kinesis: Any
    liveness_modes: LivenessModeStore | None = None
    liveness_setting: str = "lease"
    layout: TableLayout = TableLayout.THREE_TABLES


@dataclass(frozen=True)
class LeaderClients:
    aws_config: AwsConfig
    dynamodb: Any
    kinesis: Any


def _new_clients(aws_config: AwsConfig) -> LeaderClients:
    return LeaderClients(
        aws_config=aws_config, dynamodb=aws.client("dynamodb", aws_config), kinesis=aws.client("kinesis", aws_config)
    )


class ClientCache:
    """boto3 clients kept across warm Lambda invocations: created on first use (never at import, so a cold start
    that fails on configuration fails fast) and rebuilt when the AWS settings change. ``make`` replaces how they
    are created (a benchmark counting the leader's calls)."""

    def __init__(self, make: Callable[[AwsConfig], LeaderClients] = _new_clients) -> None:
        self._lock = threading.Lock()
        self._make = make
        self.current: LeaderClients | None = None

    def get(self, aws_config: AwsConfig) -> LeaderClients:
        with self._lock:
            if self.current is None or self.current.aws_config != aws_config:
                self.current = self._make(aws_config)
            return self.current


def app_and_stream(env: Mapping[str, str] | None = None) -> tuple[str, StreamSelection]:
    """``SHARDLEASE_APP`` and the streams (:meth:`StreamSelection.from_env`); one clear error when either is
    missing."""
    e = environ(env)
    app = e.get("SHARDLEASE_APP", "")
    if not app:
        raise ConfigError("SHARDLEASE_APP and SHARDLEASE_STREAM must be set")
    return app, StreamSelection.from_env(e)


def build_leader(
    *,
    app: str,
    stream: str | Sequence[str] | StreamSelection,
    aws_config: AwsConfig | None = None,
    shard_sync: ShardSyncConfig | None = None,
    owner: str | None = None,
    leader_config: LeaderConfig | None = None,
    lock_config: LeaderLockConfig | None = None,
    assignment: AssignmentConfig | None = None,
    lease_config: LeaseConfig | None = None,
    scaling: ScalingConfig | None = None,
    with_assignment: bool = True,
    layout: TableLayout | None = None,
    boto3_session: boto3.Session | None = None,
    dynamodb: Any = None,
    kinesis: Any = None,
    clock: Clock = SYSTEM_CLOCK,
) -> LeaderParts:
    """Wire the leader. ``stream``: one stream name, several (a multi-stream application; a comma-separated string
    too), or a :class:`StreamSelection` with a tracker. ``dynamodb`` / ``kinesis`` clients may be passed (tests,
    the demo's two emulators, a warm Lambda container, a worker's embedded leader); otherwise they are made from
    ``aws_config``.

    Settings left out: the loop, lock, assignment and lease settings take their defaults; the AWS settings (when a
    client is to be made), the table layout, shard sync and scaling come from the process environment, read once.
    A host that gives every setting (:func:`build_leader_from_env`, the embedded leader) reads nothing here."""
    validate_app_name(app)
    try:
        streams = StreamSelection.of(stream)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    e = environ()  # for the settings left out
    if dynamodb is None or kinesis is None:
        aws_config = aws_config or AwsConfig.from_env(e)
        dynamodb = dynamodb or aws.client("dynamodb", aws_config, boto3_session)
        kinesis = kinesis or aws.client("kinesis", aws_config, boto3_session)
    layout = layout or TableLayout.from_env(e)
    shard_sync = shard_sync or ShardSyncConfig.from_env(e)
    lock_config = lock_config or LeaderLockConfig()
    leader_config = leader_config or LeaderConfig()
    store = DynamoDBLeaseStore(app, client=dynamodb, clock=clock)
    owner = owner or default_owner()
    lock = DynamoDBLeaderLock(app, owner, config=lock_config, client=dynamodb, clock=clock, layout=layout)
    state_store = CoordinatorStateStore(app, client=dynamodb, clock=clock, layout=layout)  # stateless: shared
    syncer: ShardSyncer | MultiStreamShardSyncer
    if streams.multi_stream:
        syncer = MultiStreamShardSyncer(store, kinesis, streams, state=state_store, config=shard_sync, clock=clock)
    else:
        detector = KinesisShardDetector(
            streams.single, client=kinesis, clock=clock, page_size=shard_sync.list_shards_page_size
        )
        syncer = ShardSyncer(store, detector, config=shard_sync, clock=clock)
    assigner = None
    fast_path = None
    lease_config = lease_config or LeaseConfig()
    modes = LivenessModeStore(state_store, clock=clock)
    if with_assignment:
        assignment = assignment or AssignmentConfig()
        worker_rows = WorkerMetricsStore(app, client=dynamodb, clock=clock, layout=layout)
        watch = LivenessWatch(
            worker_rows,
            failover_ms=lease_config.failover_time_ms,
            max_clock_skew_ms=lock_config.max_clock_skew_ms,
            clock=clock,
        )
        assigner = LeaseAssigner(
            store,
            worker_rows,
            cap_recorder=LeaseCapRecorder(state_store),
            decision_recorder=DecisionRecorder(state_store, clock=clock),
            config=assignment,
            lease_config=lease_config,
            liveness=watch,
            notifier=worker_rows,
            observations=ExpiryObservationStore(state_store, max_clock_skew_ms=lock_config.max_clock_skew_ms),
            modes=LeaderModeKeeper(modes, setting=lease_config.liveness_mode, owner=owner),
            sizer=FleetSizer(
                state_store,
                scaling or ScalingConfig.from_env(e),
                max_throughput_per_host_kbps=assignment.max_throughput_per_host_kbps,
            ),
            clock=clock,
        )
        if leader_config.fast_tick_ms > 0:
            fast_path = FastPath(
                watch,
                assigner,
                max_backoff_s=leader_config.cycle_interval_ms / 1000,
                read_timeout_s=lock_config.heartbeat_interval_ms / 2000,  # never holds the loop past a heartbeat
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
        config=leader_config,
        lease_store=store,
        lock=lock,
        syncer=syncer,
        assigner=assigner,
        dynamodb=dynamodb,
        kinesis=kinesis,
        liveness_modes=modes,
        liveness_setting=lease_config.liveness_mode,
        layout=layout,
    )


def build_leader_from_env(
    env: Mapping[str, str] | None = None,
    *,
    app: str | None = None,
    stream: str | Sequence[str] | StreamSelection | None = None,
    aws_config: AwsConfig | None = None,
    shard_sync: ShardSyncConfig | None = None,
    owner: str | None = None,
    layout: TableLayout | None = None,
    boto3_session: boto3.Session | None = None,
    dynamodb: Any = None,
    kinesis: Any = None,
    clock: Clock = SYSTEM_CLOCK,
) -> LeaderParts:
    """The leader as the Lambda and ``shardlease leader`` build it: everything from ``env`` (default: the process
    environment, read once) except what the host gives (``shardlease leader`` gives app, stream, AWS and shard-sync
    settings from its flags; ``SHARDLEASE_LEADER_ID`` names the lock owner unless ``owner`` is given). A worker's
    embedded leader is built by :func:`build_leader` from the worker's configuration instead."""
    e = environ(env)
    if app is None or stream is None:
        env_app, env_stream = app_and_stream(e)
        app, stream = app or env_app, env_stream if stream is None else stream
    return build_leader(
        app=app,
        stream=stream,
        aws_config=aws_config or AwsConfig.from_env(e),
        shard_sync=shard_sync or ShardSyncConfig.from_env(e),
        owner=owner or env_str(e, "SHARDLEASE_LEADER_ID") or None,
        leader_config=LeaderConfig.from_env(e),
        lock_config=LeaderLockConfig.from_env(e),
        assignment=AssignmentConfig.from_env(e),
        lease_config=LeaseConfig.from_env(e),
        scaling=ScalingConfig.from_env(e),
        layout=layout or TableLayout.from_env(e),
        boto3_session=boto3_session,
        dynamodb=dynamodb,
        kinesis=kinesis,
        clock=clock,
    )


def preflight(parts: LeaderParts, *, app: str, stream: str | Sequence[str] | StreamSelection) -> None:
    """Fail with one clear error (TableMissingError, StreamMissingError, EndpointUnreachableError, ...) before the
    loop starts, rather than counting the same failure three times inside it. In a multi-stream application a
    missing stream is one warning: the others are consumed (a tracker's streams are checked at every sync)."""
    for spec in parts.layout.specs():
        name = spec.table_name(app)
        with aws.translated("dynamodb DescribeTable", name):
            description = parts.dynamodb.describe_table(TableName=name)
        check_schema(spec, app, description.get("Table", {}))
    check_layout(app, parts.dynamodb, parts.layout)
    streams = StreamSelection.of(stream)
    for entry in streams.names:
        name = parse_stream_entry(entry)[0]
        try:
            with aws.translated("kinesis DescribeStreamSummary", name):
                parts.kinesis.describe_stream_summary(StreamName=name)
        except StreamMissingError as exc:
            if not streams.multi_stream:
                raise
            log.warning("%s; the other streams are consumed", exc)
    if parts.liveness_modes is not None:  # a leader configured for the other liveness mode refuses to start
        check_start(parts.liveness_setting, parts.liveness_modes.read(), who="the leader")
