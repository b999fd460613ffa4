"""Configuration: frozen, keyword-only dataclasses, one per area.

Defaults follow KCL 3.x (reference/kcl3x-facts.md §9) unless a comment says why not. The environment is read
only in the ``from_env()`` class methods; everything else receives configuration explicitly. Every dataclass
validates itself on construction and raises :class:`~worker_lib.core.errors.ConfigError` with one clear line.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from worker_lib.core.errors import ConfigError

_APP_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,200}$")


class InitialPosition(enum.Enum):
    """Where a lease for a newly discovered shard starts reading."""

    LATEST = "LATEST"
    TRIM_HORIZON = "TRIM_HORIZON"
    AT_TIMESTAMP = "AT_TIMESTAMP"

    @classmethod
    def parse(cls, value: str) -> InitialPosition:
        try:
            return cls(value.strip().upper())
        except ValueError:
            raise ConfigError(
                f"invalid initial position {value!r}: expected LATEST, TRIM_HORIZON or AT_TIMESTAMP"
            ) from None


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid {name} {raw!r}: expected true or false")


def validate_app_name(app: str) -> str:
    """Application names become DynamoDB table names (3–255 chars of [A-Za-z0-9_.-]); suffixes need room."""
    if not _APP_NAME.match(app):
        raise ConfigError(
            f"invalid application name {app!r}: use 3-200 characters of letters, digits, '_', '-' and '.'"
        )
    return app


def parse_timestamp(value: str) -> datetime:
    """An ISO-8601 timestamp (``Z`` accepted); naive values are taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"invalid timestamp {value!r}: expected ISO-8601, e.g. 2026-01-31T12:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


@dataclass(frozen=True, kw_only=True)
class AwsConfig:
    """How to reach AWS (or an emulator).

    region: AWS region; ``AWS_REGION`` / ``AWS_DEFAULT_REGION``; default ``us-east-1``.
    endpoint_url: one endpoint for every service (local emulators); ``SHARDLEASE_ENDPOINT_URL``.
    service_endpoints: per-service overrides, e.g. ``{"kinesis": "http://127.0.0.1:4567"}`` when Kinesis runs on
      kinesalite and DynamoDB on moto; ``SHARDLEASE_KINESIS_ENDPOINT_URL``, ``SHARDLEASE_DYNAMODB_ENDPOINT_URL``,
      ``SHARDLEASE_CLOUDWATCH_ENDPOINT_URL``.
    connect_timeout_s / read_timeout_s: botocore timeouts (5 s / 10 s) — short, so that a dead endpoint is
      reported within seconds rather than a minute.
    max_attempts: botocore attempts including the first (standard retry mode, 5).
    """

    region: str = "us-east-1"
    endpoint_url: str | None = None
    service_endpoints: Mapping[str, str] = field(default_factory=dict)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_attempts: int = 5
    retry_mode: str = "standard"
    max_pool_connections: int = 32

    def __post_init__(self) -> None:
        if not self.region:
            raise ConfigError("region must not be empty")
        for url in (self.endpoint_url, *self.service_endpoints.values()):
            if url is not None and not re.match(r"^https?://[^\s/]+", url):
                raise ConfigError(f"invalid endpoint URL {url!r}: expected http(s)://host:port")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            raise ConfigError(f"invalid retry mode {self.retry_mode!r}")

    def endpoint_for(self, service: str) -> str | None:
        """The endpoint for one service: its override, else the common endpoint, else AWS's."""
        return self.service_endpoints.get(service) or self.endpoint_url

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> AwsConfig:
        e = _env(env)
        values: dict[str, object] = {
            "region": e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or "us-east-1",
            "endpoint_url": e.get("SHARDLEASE_ENDPOINT_URL") or None,
            "max_attempts": _env_int(e, "SHARDLEASE_AWS_MAX_ATTEMPTS", 5),
            "service_endpoints": {
                service: url
                for service in ("kinesis", "dynamodb", "cloudwatch")
                if (url := e.get(f"SHARDLEASE_{service.upper()}_ENDPOINT_URL"))
            },
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    """Lease timing (KCL: failoverTimeMillis and what derives from it).

    failover_time_ms: lease duration; a lease whose counter has not moved for this long is expired (10 000).
    epsilon_ms: safety margin subtracted from the renewal interval (25).
    max_leases_for_worker: hard cap per worker (None = unlimited, as KCL).
    heartbeat_interval_ms: the worker heartbeat (docs/failover.md): one write per worker per interval that lets
      the leader see a departed or dead worker within about a second and brings back its notices of new leases
      (default 1000, or a third of the failover time if that is shorter; ``SHARDLEASE_HEARTBEAT_INTERVAL_MS``;
      0 = off: KCL's pace, liveness judged per lease only). Between 100 and a third of the failover time.
    """

    failover_time_ms: int = 10_000
    epsilon_ms: int = 25
    max_leases_for_worker: int | None = None
    graceful_handoff_timeout_ms: int = 30_000
    graceful_handoff_enabled: bool = True
    heartbeat_interval_ms: int = -1  # -1: the default, min(1000, failover / 3)

    def __post_init__(self) -> None:
        if self.failover_time_ms < 1_000:
            raise ConfigError(f"failover_time_ms={self.failover_time_ms} is too short (minimum 1000)")
        if self.heartbeat_interval_ms == -1:
            object.__setattr__(self, "heartbeat_interval_ms", min(1_000, self.failover_time_ms // 3))
        if self.heartbeat_interval_ms != 0 and not 100 <= self.heartbeat_interval_ms <= self.failover_time_ms // 3:
            raise ConfigError(
                f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be 0 (off) or between 100 and a third of "
                f"failover_time_ms ({self.failover_time_ms // 3})"
            )
        if not 0 <= self.epsilon_ms < self.failover_time_ms // 3:
            raise ConfigError("epsilon_ms must be between 0 and a third of failover_time_ms")
        if self.max_leases_for_worker is not None and self.max_leases_for_worker < 1:
            raise ConfigError("max_leases_for_worker must be at least 1")
        if self.graceful_handoff_timeout_ms < 0:
            raise ConfigError("graceful_handoff_timeout_ms must not be negative")

    @property
    def renewer_interval_ms(self) -> int:
        """KCL: failover / 3 − epsilon (3308 ms by default)."""
        return self.failover_time_ms // 3 - self.epsilon_ms

    @property
    def assignment_interval_ms(self) -> int:
        """KCL: leaseAssignmentIntervalMillis = 2 × failover time (20 s)."""
        return 2 * self.failover_time_ms

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaseConfig:
        e = _env(env)
        cap = _env_int(e, "SHARDLEASE_MAX_LEASES_FOR_WORKER", 0)
        return cls(
            failover_time_ms=_env_int(e, "SHARDLEASE_FAILOVER_TIME_MS", 10_000),
            max_leases_for_worker=cap or None,
            graceful_handoff_timeout_ms=_env_int(e, "SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS", 30_000),
            heartbeat_interval_ms=_env_int(e, "SHARDLEASE_HEARTBEAT_INTERVAL_MS", -1),
        )

    @property
    def heartbeat_enabled(self) -> bool:
        return self.heartbeat_interval_ms > 0


@dataclass(frozen=True, kw_only=True)
class LeaderLockConfig:
    """The leader lock in ``<app>-CoordinatorState``.

    lease_duration_ms: how long a lock holder is leader after its last successful heartbeat (10 s). KCL uses
      120 s with observation-based expiry; ours is time-based so that a Lambda living < 1 min can take over
      from a dead leader at its first invocation (docs/leader-lock.md); 10 s bounds the leaderless time after a
      crash to about 12 s (docs/failover.md).
    heartbeat_interval_ms: how often the holder extends the lock (3 s; must be ≤ a third of the duration).
    max_clock_skew_ms: the bound we assume on wall-clock disagreement between hosts (1 s). A holder stops
      treating itself as leader this long before the expiry others will see.
    poll_interval_ms: how often a contender re-reads the lock while waiting (1 s).
    """

    lease_duration_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_clock_skew_ms: int = 1_000
    poll_interval_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.lease_duration_ms < 1_000:
            raise ConfigError("lease_duration_ms must be at least 1000")
        if not 0 < self.heartbeat_interval_ms * 3 <= self.lease_duration_ms:
            raise ConfigError("heartbeat_interval_ms must be positive and at most a third of lease_duration_ms")
        if not 0 <= self.max_clock_skew_ms < self.lease_duration_ms // 3:
            raise ConfigError("max_clock_skew_ms must be below a third of lease_duration_ms")
        if self.poll_interval_ms <= 0:
            raise ConfigError("poll_interval_ms must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaderLockConfig:
        e = _env(env)
        return cls(
            lease_duration_ms=_env_int(e, "SHARDLEASE_LEADER_LOCK_DURATION_MS", 10_000),
            heartbeat_interval_ms=_env_int(e, "SHARDLEASE_LEADER_HEARTBEAT_MS", 3_000),
            max_clock_skew_ms=_env_int(e, "SHARDLEASE_MAX_CLOCK_SKEW_MS", 1_000),
        )


@dataclass(frozen=True, kw_only=True)
class LeaderConfig:
    """The leader loop (the same in the Lambda, an embedded thread and the CLI).

    cycle_interval_ms: time between assignment cycles (KCL leaseAssignmentIntervalMillis = 2 × failover, 20 s).
    max_consecutive_failures: leadership is released after this many failed cycles in a row (KCL: 3).
    deadline_margin_ms: a host with a time limit (Lambda) stops starting cycles this long before its deadline,
      so that it can finish the cycle in flight and release the lock for the next invocation (10 s).
    fast_tick_ms: between full cycles the leader reads the worker-metrics table this often and acts at once on a
      departed, silent or changed worker (docs/failover.md); 1000, or the cycle interval if that is shorter;
      ``SHARDLEASE_LEADER_FAST_TICK_MS``; 0 = off (KCL's pace: everything waits for the next full cycle).
    term_ms: how long one Lambda invocation leads before it releases the lock to the next one (65 000: the 1-minute
      schedule plus 5 s of overlap, so the next invocation is already waiting); ``SHARDLEASE_LEADER_TERM_MS``.
    takeover_wait_ms: an invocation that finds the lock held waits up to this long when the holder will release
      it (or its lock will expire) within that time, and takes over at once; otherwise it exits after one read
      (20 000); ``SHARDLEASE_LEADER_TAKEOVER_WAIT_MS``; 0 = always exit at once.
    """

    cycle_interval_ms: int = 20_000
    max_consecutive_failures: int = 3
    deadline_margin_ms: int = 10_000
    fast_tick_ms: int = -1  # -1: the default, min(1000, cycle_interval_ms)
    term_ms: int = 65_000
    takeover_wait_ms: int = 20_000

    def __post_init__(self) -> None:
        if self.cycle_interval_ms < 100:
            raise ConfigError("leader cycle_interval_ms must be at least 100")
        if self.max_consecutive_failures < 1:
            raise ConfigError("max_consecutive_failures must be at least 1")
        if self.deadline_margin_ms < 0:
            raise ConfigError("deadline_margin_ms must not be negative")
        if self.fast_tick_ms == -1:
            object.__setattr__(self, "fast_tick_ms", min(1_000, self.cycle_interval_ms))
        if self.fast_tick_ms != 0 and not 100 <= self.fast_tick_ms <= self.cycle_interval_ms:
            raise ConfigError(
                f"fast_tick_ms={self.fast_tick_ms} must be 0 (off) or between 100 and cycle_interval_ms "
                f"({self.cycle_interval_ms})"
            )
        if self.term_ms < 1_000:
            raise ConfigError(f"term_ms={self.term_ms} must be at least 1000")
        if self.takeover_wait_ms < 0:
            raise ConfigError(f"takeover_wait_ms={self.takeover_wait_ms} must not be negative")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaderConfig:
        e = _env(env)
        return cls(
            cycle_interval_ms=_env_int(e, "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS", 20_000),
            max_consecutive_failures=_env_int(e, "SHARDLEASE_LEADER_MAX_FAILURES", 3),
            deadline_margin_ms=_env_int(e, "SHARDLEASE_LEADER_DEADLINE_MARGIN_MS", 10_000),
            fast_tick_ms=_env_int(e, "SHARDLEASE_LEADER_FAST_TICK_MS", -1),
            term_ms=_env_int(e, "SHARDLEASE_LEADER_TERM_MS", 65_000),
            takeover_wait_ms=_env_int(e, "SHARDLEASE_LEADER_TAKEOVER_WAIT_MS", 20_000),
        )


@dataclass(frozen=True, kw_only=True)
class ShardSyncConfig:
    """Shard sync on the leader.

    initial_position / initial_timestamp: where leases for newly discovered, non-descendant shards start.
    interval_ms: how often the leader syncs (KCL shardSyncIntervalMillis, 60 s).
    cleanup_enabled: delete finished leases once their children have started (KCL default on).
    delete_unknown_shard_leases: delete leases of shards that ListShards no longer returns (trimmed).
    """

    initial_position: InitialPosition = InitialPosition.LATEST
    initial_timestamp: datetime | None = None
    interval_ms: int = 60_000
    cleanup_enabled: bool = True
    delete_unknown_shard_leases: bool = True
    list_shards_page_size: int = 1000

    def __post_init__(self) -> None:
        if self.initial_position is InitialPosition.AT_TIMESTAMP and self.initial_timestamp is None:
            raise ConfigError("initial position AT_TIMESTAMP needs a timestamp (--timestamp ISO)")
        if self.initial_position is not InitialPosition.AT_TIMESTAMP and self.initial_timestamp is not None:
            raise ConfigError("a timestamp is only valid with initial position AT_TIMESTAMP")
        if self.interval_ms < 1_000:
            raise ConfigError("shard sync interval_ms must be at least 1000")
        if not 1 <= self.list_shards_page_size <= 10_000:
            raise ConfigError("list_shards_page_size must be within 1..10000")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ShardSyncConfig:
        e = _env(env)
        position = InitialPosition.parse(e.get("SHARDLEASE_INITIAL_POSITION", "LATEST"))
        raw_ts = e.get("SHARDLEASE_INITIAL_TIMESTAMP")
        return cls(
            initial_position=position,
            initial_timestamp=parse_timestamp(raw_ts) if raw_ts else None,
            interval_ms=_env_int(e, "SHARDLEASE_SHARD_SYNC_INTERVAL_MS", 60_000),
            cleanup_enabled=_env_flag(e, "SHARDLEASE_LEASE_CLEANUP", True),
            delete_unknown_shard_leases=_env_flag(e, "SHARDLEASE_DELETE_UNKNOWN_SHARD_LEASES", True),
        )


class ProcessorFailurePolicy(enum.Enum):
    """What a shard consumer does when the record processor keeps raising on one batch.

    STOP (default): give the lease up without checkpointing, so the batch is read again from the last
      checkpoint (by this or another worker): nothing is lost, a poison batch is retried, never skipped.
    SKIP: log the batch's sequence range and move on (KCL's behaviour): at-most-once for that batch.
    """

    STOP = "stop"
    SKIP = "skip"


@dataclass(frozen=True, kw_only=True)
class ConsumerConfig:
    """One shard consumer (one per held lease).

    processor_retries: attempts after the first when ``process_records`` raises (3), with
      ``processor_retry_backoff_ms`` (1000) doubling between them; then ``failure_policy`` applies.
    parent_poll_interval_ms: how often a child shard re-checks whether its parents have ended (KCL
      parentShardPollIntervalMillis, 10 000).
    shard_end_retry_interval_ms: how often SHARD_END handling is retried when a merge partner's lease is missing
      or the processor did not checkpoint SHARD_END (5000).
    error_backoff_ms: wait after an infrastructure error while reading (1000).
    """

    processor_retries: int = 3
    processor_retry_backoff_ms: int = 1_000
    failure_policy: ProcessorFailurePolicy = ProcessorFailurePolicy.STOP
    parent_poll_interval_ms: int = 10_000
    shard_end_retry_interval_ms: int = 5_000
    error_backoff_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.processor_retries < 0:
            raise ConfigError("processor_retries must not be negative")
        for name in ("processor_retry_backoff_ms", "parent_poll_interval_ms", "shard_end_retry_interval_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.error_backoff_ms < 0:
            raise ConfigError("error_backoff_ms must not be negative")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConsumerConfig:
        e = _env(env)
        raw_policy = e.get("SHARDLEASE_PROCESSOR_FAILURE_POLICY", "stop").strip().lower()
        try:
            policy = ProcessorFailurePolicy(raw_policy)
        except ValueError:
            raise ConfigError(
                f"invalid SHARDLEASE_PROCESSOR_FAILURE_POLICY {raw_policy!r}: expected stop or skip"
            ) from None
        return cls(
            processor_retries=_env_int(e, "SHARDLEASE_PROCESSOR_RETRIES", 3),
            failure_policy=policy,
            parent_poll_interval_ms=_env_int(e, "SHARDLEASE_PARENT_POLL_INTERVAL_MS", 10_000),
        )


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """What names an application: its name (= lease table name) and its stream."""

    app: str
    stream: str = ""
    aws: AwsConfig = field(default_factory=AwsConfig)

    def __post_init__(self) -> None:
        validate_app_name(self.app)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AppConfig:
        e = _env(env)
        app = e.get("SHARDLEASE_APP", "")
        if not app:
            raise ConfigError("SHARDLEASE_APP is not set")
        return cls(app=app, stream=e.get("SHARDLEASE_STREAM", ""), aws=AwsConfig.from_env(e))
