"""Options of ``spark.readStream.format("shardlease")`` (all strings in Spark; parsed and validated here)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from worker_lib.core.config import AwsConfig, InitialPosition, parse_timestamp, validate_app_name
from worker_lib.core.env import parse_bool
from worker_lib.core.errors import ConfigError
from worker_lib.leases.config import LeaseConfig
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.schema import TableLayout
from worker_lib.telemetry.publisher import MetricsConfig

OPTION_NAMES = (
    "app",
    "stream",
    "table_layout",
    "region",
    "endpoint_url",
    "kinesis_endpoint_url",
    "dynamodb_endpoint_url",
    "initial_position",
    "initial_timestamp",
    "max_records_per_shard",
    "max_read_ms",
    "worker_id",
    "failover_time_ms",
    "liveness_mode",
    "heartbeat_interval_ms",
    "discovery_interval_ms",
    "idle_probe_interval_ms",
    "metrics",
    "executor_slots",
    "metrics_report_interval_ms",
    "metrics_first_report_delay_ms",
    "publish_metrics",
    "metrics_namespace",
    "metrics_flush_interval_ms",
    "retrieval",
    "fanout_consumer_name",
    "fanout_consumer_arn",
)


def _int(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"shardlease option {name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"shardlease option {name}={value} must be at least {minimum}")
    return value


def publishing_config(opts: Mapping[str, str], env: Mapping[str, str] | None) -> MetricsConfig:
    """The environment's CloudWatch publishing (``SHARDLEASE_METRICS``, ...) with the source's options over it."""
    base = MetricsConfig.from_env(env)
    mode = opts.get("publish_metrics", "").strip().lower() or base.mode
    if mode not in ("off", "emf", "cloudwatch"):
        raise ConfigError(f"shardlease option publish_metrics={mode!r}: expected off, emf or cloudwatch")
    return replace(
        base,
        mode=mode,
        namespace=opts.get("metrics_namespace", "").strip() or base.namespace,
        flush_interval_ms=_int(opts, "metrics_flush_interval_ms", base.flush_interval_ms, 1_000),
    )


def retrieval_config(opts: Mapping[str, str], env: Mapping[str, str] | None) -> RetrievalConfig:
    """The environment's retrieval settings (``SHARDLEASE_RETRIEVAL``, ...) with the source's options over them."""
    base = RetrievalConfig.from_env(env)
    return replace(
        base,
        mode=opts.get("retrieval", "").strip() or base.mode,
        consumer_name=opts.get("fanout_consumer_name", "").strip() or base.consumer_name,
        consumer_arn=opts.get("fanout_consumer_arn", "").strip() or base.consumer_arn,
    )


def lease_config(opts: Mapping[str, str], env: Mapping[str, str] | None) -> LeaseConfig:
    """The environment's lease settings (``SHARDLEASE_LIVENESS_MODE``, ``SHARDLEASE_FAILOVER_TIME_MS``, ...) with
    the source's options over them, as the AWS settings are: the driver's environment is often the cluster's,
    the options are the query's."""
    base = LeaseConfig.from_env(env)
    mode = opts.get("liveness_mode", "").strip()
    return replace(
        base,
        failover_time_ms=_int(opts, "failover_time_ms", base.failover_time_ms, 1_000),
        liveness_mode=mode or base.liveness_mode,
        heartbeat_interval_ms=_int(opts, "heartbeat_interval_ms", base.heartbeat_interval_ms, 0),
    )


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """app / stream: application (lease table) and Kinesis stream; in a multi-stream application
    (docs/multi-stream.md) the option names the streams comma-separated, ``streams`` holds them and ``stream`` is
    empty: the source reads each lease from the stream its key names (the leader decides which streams have leases).
    worker_id: this application's name in ``leaseOwner`` (default ``spark-<host>``; keep it stable across restarts).
    initial_position / initial_timestamp: the timestamp serves leases whose checkpoint is ``AT_TIMESTAMP`` (the
    leader decides every new lease's starting point). max_records_per_shard: user records per shard per micro-batch.
    max_read_ms: time budget of one shard read. failover_time_ms / discovery_interval_ms: lease timing (KCL defaults
    10 000 / 9 975). lease: the lease settings, from ``SHARDLEASE_*`` in the environment
    (:meth:`LeaseConfig.from_env`) with the options ``failover_time_ms``, ``liveness_mode`` (``lease``, ``worker``
    or ``auto``; docs/liveness-modes.md) and ``heartbeat_interval_ms`` (0 = off, ``lease`` mode only) over them.
    idle_probe_interval_ms: how often an idle shard is probed for new data. metrics: write the load metric to
    ``<app>-WorkerMetricStats`` (default true). executor_slots: the application's executor slots (cores) for the
    load metric (default: the most reads seen running at once). table_layout: ``three-tables`` or ``single-table``
    (KCL 3.5's single-table mode; default ``SHARDLEASE_TABLE_LAYOUT``, else three tables). retrieval: ``polling``
    or ``fanout`` (enhanced fan-out: each shard read is a SubscribeToShard of the application's stream consumer;
    default ``SHARDLEASE_RETRIEVAL``, else polling), with ``fanout_consumer_name`` / ``fanout_consumer_arn``
    (docs/fanout.md). publishing: the per-worker CloudWatch metrics a worker publishes (records and bytes
    processed, MillisBehindLatest, leases held, CPU; docs/operations.md), from ``SHARDLEASE_METRICS`` /
    ``SHARDLEASE_METRICS_NAMESPACE`` / ``SHARDLEASE_METRICS_FLUSH_INTERVAL_MS`` with the options ``publish_metrics``
    (``off``, ``emf`` or ``cloudwatch``; default off), ``metrics_namespace`` and ``metrics_flush_interval_ms`` over
    them."""

    app: str
    stream: str
    worker_id: str
    streams: tuple[str, ...] = ()
    aws: AwsConfig
    initial_position: InitialPosition = InitialPosition.LATEST
    initial_timestamp: datetime | None = None
    max_records_per_shard: int = 100_000
    max_read_ms: int = 2_000
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    discovery_interval_ms: int = 9_975
    idle_probe_interval_ms: int = 1_000
    metrics: bool = True
    metrics_report_interval_ms: int = 30_000
    metrics_first_report_delay_ms: int = 2_000
    executor_slots: int | None = None
    table_layout: TableLayout = TableLayout.THREE_TABLES
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    publishing: MetricsConfig = field(default_factory=MetricsConfig)

    @classmethod
    def parse(cls, options: Mapping[str, str], env: Mapping[str, str] | None = None) -> SourceOptions:
        """Validate Spark's option strings; AWS settings not given as options come from ``env`` (default: the
        process environment), see :meth:`AwsConfig.from_env`."""
        opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
        unknown = sorted(set(opts) - set(OPTION_NAMES) - {"path"})
        if unknown:
            raise ConfigError(f"unknown shardlease option(s): {', '.join(unknown)}")
        app = validate_app_name(opts.get("app", ""))
        streams = tuple(name.strip() for name in opts.get("stream", "").split(",") if name.strip())
        if not streams:
            raise ConfigError("shardlease option stream is required")
        # The options override the environment (AWS_REGION, SHARDLEASE_*_ENDPOINT_URL, ...) as every other
        # component's settings do: a job submitted in eu-west-1 with no region option reads eu-west-1's tables.
        env_aws = AwsConfig.from_env(env)
        services = {
            **env_aws.service_endpoints,
            **{name: url for name in ("kinesis", "dynamodb") if (url := opts.get(f"{name}_endpoint_url", "").strip())},
        }
        aws = replace(
            env_aws,
            region=opts.get("region", "").strip() or env_aws.region,
            endpoint_url=opts.get("endpoint_url", "").strip() or env_aws.endpoint_url,
            service_endpoints=services,
        )
        position = InitialPosition.parse(opts.get("initial_position", "LATEST"))
        raw_ts = opts.get("initial_timestamp", "").strip()
        timestamp = parse_timestamp(raw_ts) if raw_ts else None
        if position is InitialPosition.AT_TIMESTAMP and timestamp is None:
            raise ConfigError("initial_position AT_TIMESTAMP needs the initial_timestamp option")
        return cls(
            app=app,
            stream=streams[0] if len(streams) == 1 else "",
            streams=streams,
            worker_id=opts.get("worker_id", "").strip() or f"spark-{socket.gethostname()}",
            aws=aws,
            initial_position=position,
            initial_timestamp=timestamp,
            max_records_per_shard=_int(opts, "max_records_per_shard", cls.max_records_per_shard, 1),
            max_read_ms=_int(opts, "max_read_ms", cls.max_read_ms, 100),
            lease=lease_config(opts, env),
            discovery_interval_ms=_int(opts, "discovery_interval_ms", 9_975, 100),
            idle_probe_interval_ms=_int(opts, "idle_probe_interval_ms", 1_000, 200),
            metrics=parse_bool(opts.get("metrics"), name="shardlease option metrics", default=True),
            metrics_report_interval_ms=_int(opts, "metrics_report_interval_ms", 30_000, 1_000),
            metrics_first_report_delay_ms=_int(opts, "metrics_first_report_delay_ms", 2_000, 0),
            executor_slots=_int(opts, "executor_slots", 0, 1) or None,
            table_layout=TableLayout.parse(opts["table_layout"])
            if "table_layout" in opts
            else TableLayout.from_env(env),
            retrieval=retrieval_config(opts, env),
            publishing=publishing_config(opts, env),
        )
