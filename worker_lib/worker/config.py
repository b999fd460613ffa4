"""The worker's configuration: :class:`WorkerConfig`, every setting of a worker and of its embedded leader.

The environment is read in one place: :meth:`WorkerConfig.__post_init__` fills every field the caller left out from
one mapping (the process environment, or the one :meth:`WorkerConfig.from_env` was given), through each area's
``from_env(env)``. Nothing the worker builds reads the environment again: the embedded leader is built from these
objects (``lease`` included), as the Lambda's is built from its own environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, fields, replace
from datetime import datetime
from typing import Any

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core.config import AwsConfig, InitialPosition, default_owner, validate_app_name
from worker_lib.core.env import env_bool, env_int, env_lower, env_str, environ
from worker_lib.core.errors import ConfigError
from worker_lib.core.streams import StreamSelection, StreamTracker, load_stream_tracker
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.scaling.config import ScalingConfig
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.tables.schema import TableLayout
from worker_lib.telemetry.publisher import MetricsConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.cpu.detect import CPU_METRIC_CHOICES

KCL_DISCOVERY_INTERVAL_MS = 9_975
"""KCL's lease discovery interval: the GSI query is the only way a worker learns of new leases there."""

DISCOVERY_SAFETY_NET_MS = 60_000
"""With the heartbeat on, new leases arrive by notice; the GSI query only catches a lost notice."""


class _LeftOut:
    """The default of every setting the environment may give: replaced in ``__post_init__``."""

    def __repr__(self) -> str:
        return "<from the environment>"


LEFT_OUT: Any = _LeftOut()

_Values = dict[str, Any]


def _shard_sync(env: Mapping[str, str], values: _Values) -> ShardSyncConfig:
    """The environment's shard sync, with the worker's own position in place when the caller gave one (the CLI's
    ``--initial-position``): where this worker's embedded leader starts new leases."""
    config = ShardSyncConfig.from_env(env)
    position, timestamp = values["initial_position"], values["initial_timestamp"]
    if position is LEFT_OUT and timestamp is LEFT_OUT:
        return config
    if position is LEFT_OUT:
        position = config.initial_position
    if timestamp is LEFT_OUT:
        timestamp = config.initial_timestamp if position is InitialPosition.AT_TIMESTAMP else None
    return replace(config, initial_position=position, initial_timestamp=timestamp)


def _assignment(env: Mapping[str, str], values: _Values) -> AssignmentConfig:
    # The embedded leader judges this worker's reports by the interval it reports at.
    return AssignmentConfig.from_env(env, worker_report_interval_s=values["worker_metrics"].report_interval_ms / 1000)


# Every setting the environment may give, in order (a reader may use the settings before it), and how it is read.
# The worker's own defaults are written here; each area's are on its config class.
_FROM_ENVIRONMENT: tuple[tuple[str, Callable[[Mapping[str, str], _Values], Any]], ...] = (
    ("multi_stream", lambda e, _: env_bool(e, "SHARDLEASE_MULTI_STREAM", False)),
    ("table_layout", lambda e, _: TableLayout.from_env(e)),
    ("aws", lambda e, _: AwsConfig.from_env(e)),
    ("worker_id", lambda e, _: env_str(e, "SHARDLEASE_WORKER_ID")),  # blank: host:pid (__post_init__)
    ("shard_sync", _shard_sync),
    # Where new leases start is the leader's setting; a worker needs the timestamp of AT_TIMESTAMP checkpoints.
    ("initial_position", lambda _, v: v["shard_sync"].initial_position),
    ("initial_timestamp", lambda _, v: v["shard_sync"].initial_timestamp),
    ("lease", lambda e, _: LeaseConfig.from_env(e)),
    ("consumer", lambda e, _: ConsumerConfig.from_env(e)),
    ("retrieval", lambda e, _: RetrievalConfig.from_env(e)),
    ("failures", lambda e, _: FailureConfig.from_env(e)),
    ("discovery_interval_ms", lambda e, _: env_int(e, "SHARDLEASE_DISCOVERY_INTERVAL_MS", 0) or None),
    ("shutdown_timeout_ms", lambda e, _: env_int(e, "SHARDLEASE_SHUTDOWN_TIMEOUT_MS", 30_000)),
    ("metrics", lambda e, _: MetricsConfig.from_env(e)),
    ("worker_metrics", lambda e, _: WorkerMetricsConfig.from_env(e)),
    ("leader_mode", lambda e, _: env_lower(e, "SHARDLEASE_LEADER_MODE", "none")),
    ("startup_timeout_ms", lambda e, _: env_int(e, "SHARDLEASE_STARTUP_TIMEOUT_MS", 15_000)),
    ("leader", lambda e, _: LeaderConfig.from_env(e)),
    ("leader_lock", lambda e, _: LeaderLockConfig.from_env(e)),
    ("assignment", _assignment),
    ("scaling", lambda e, _: ScalingConfig.from_env(e)),
    ("cpu_metric", lambda e, _: env_lower(e, "SHARDLEASE_CPU_METRIC", "auto")),
)


def _needs_environment(values: _Values) -> bool:
    streams_left_out = not values["stream"] and not values["streams"] and values["stream_tracker"] is None
    return streams_left_out or isinstance(values["retrieval"], str) or any(v is LEFT_OUT for v in values.values())


def _from_environment(env: Mapping[str, str], values: _Values) -> _Values:
    """``values`` with every setting left out read from ``env``."""
    values = dict(values)
    if not values["stream"] and not values["streams"] and values["stream_tracker"] is None:  # all left out
        values["stream"] = env_str(env, "SHARDLEASE_STREAM")
        values["stream_tracker"] = load_stream_tracker(env_str(env, "SHARDLEASE_STREAM_TRACKER"))
    if isinstance(values["retrieval"], str):  # retrieval="fanout": the environment's settings, in that mode
        values["retrieval"] = replace(RetrievalConfig.from_env(env), mode=values["retrieval"])
    for name, read in _FROM_ENVIRONMENT:
        if values[name] is LEFT_OUT:
            values[name] = read(env, values)
    return values


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything a worker needs besides its processor, its embedded leader's settings included.

    Every field the caller leaves out comes from the environment, else its documented default — as boto3 and
    Powertools do — so ``WorkerConfig(app="orders", stream="orders-stream")`` deployed in eu-west-1 talks to
    eu-west-1 (``AWS_REGION``), and the same image runs against local emulators with only variables changed.
    An explicit argument always wins. The environment is read once, at construction (``environment``: the
    mapping to read instead of the process environment). docs/api.md lists every variable.

    app / stream: the application (= lease table name) and the Kinesis stream (``SHARDLEASE_STREAM``).
    streams / stream_tracker / multi_stream: a multi-stream application (KCL's ``MultiStreamTracker``; docs/
      multi-stream.md): several streams in one lease table, lease keys ``account:stream:epoch:shardId``. Give
      ``streams`` (or ``SHARDLEASE_STREAM=a,b``) instead of ``stream``; ``stream_tracker`` is a callable the embedded
      leader asks for the current streams at every shard sync (``SHARDLEASE_STREAM_TRACKER=module:attr``);
      ``multi_stream=True`` (``SHARDLEASE_MULTI_STREAM``) keeps multi-stream keys with a single stream. A worker
      reads each lease from the stream its key names, so workers need the list only to lead or to preflight.
    aws: region, endpoints, timeouts, retries (``AwsConfig.from_env()``: ``AWS_REGION``/``AWS_DEFAULT_REGION``,
      ``SHARDLEASE_ENDPOINT_URL``, ``SHARDLEASE_{KINESIS,DYNAMODB,CLOUDWATCH}_ENDPOINT_URL``,
      ``SHARDLEASE_AWS_MAX_ATTEMPTS``).
    worker_id: this worker's name in ``leaseOwner`` (``SHARDLEASE_WORKER_ID``, default ``host:pid``); a prefix such
      as ``cluster-a/`` groups workers into clusters in ``shardlease status``.
    initial_position / initial_timestamp: only used for a lease whose checkpoint is ``AT_TIMESTAMP`` (the
      timestamp) — the leader decides the initial checkpoint of every lease it creates; by default ``shard_sync``'s
      (``SHARDLEASE_INITIAL_POSITION``, ``SHARDLEASE_INITIAL_TIMESTAMP``), and when given, the embedded leader's too.
    discovery_interval_ms: how often the GSI is queried for leases assigned to us. By default: KCL's 9975 ms until
      the worker has seen a notice from the leader; from then on new leases arrive by notice within a beat and the
      query is only the safety net (60 000 ms) — so a worker beside an older leader that sends no notices keeps
      KCL's pace. ``SHARDLEASE_DISCOVERY_INTERVAL_MS`` fixes it.
    shutdown_timeout_ms: how long a graceful shutdown waits for consumers before forcing exit (30 s); their leases
      are renewed meanwhile, and what is left at the end is fenced and handed over at once;
      ``SHARDLEASE_SHUTDOWN_TIMEOUT_MS``.
    leader_mode: ``none`` (a Lambda or ``shardlease leader`` leads) or ``embedded`` (this process also contends
      for the leader lock and runs the leader loop: fleets without Lambda); ``SHARDLEASE_LEADER_MODE``.
    startup_timeout_ms: how long :meth:`Worker.preflight` keeps retrying an unreachable or throttling endpoint
      before it gives up with one clear error (15 000, at most 20 000); ``SHARDLEASE_STARTUP_TIMEOUT_MS``.
    table_layout: ``TableLayout.THREE_TABLES`` (KCL 3.0–3.4's tables) or ``SINGLE_TABLE`` (KCL 3.5's single-table
      mode: worker metrics and coordinator state in the lease table); ``SHARDLEASE_TABLE_LAYOUT``.
    lease / consumer / retrieval / failures / metrics / worker_metrics: each area's settings, each from its
      ``from_env()``; ``retrieval="fanout"`` (or ``"polling"``) is short for the environment's retrieval settings in
      that mode (``SHARDLEASE_RETRIEVAL``; docs/fanout.md); ``failures`` is the failure policy: retries,
      bisection, record age, the failure destination (docs/failures.md).
    shard_sync / leader / leader_lock / assignment / scaling: the embedded leader's settings (``leader_mode=
      "embedded"``), each from its ``from_env()`` as the Lambda reads them; it also takes ``lease`` (lease
      duration, liveness mode, hand-off timeout) and ``table_layout`` from here. Left out, ``assignment`` judges
      the workers' reports by this worker's ``worker_metrics.report_interval_ms``.
    parallelism: short for ``consumer``'s lanes per shard (1–256; docs/worker.md, "Parallelism: key-ordered lanes"):
      when given, it wins over ``consumer.parallelism`` (``SHARDLEASE_PARALLELISM``); left out (None), the consumer's
      setting stands.
    """

    app: str
    stream: str = ""
    streams: tuple[str, ...] = ()
    stream_tracker: StreamTracker | None = None
    multi_stream: bool = LEFT_OUT
    table_layout: TableLayout = LEFT_OUT
    aws: AwsConfig = LEFT_OUT
    worker_id: str = LEFT_OUT
    initial_position: InitialPosition = LEFT_OUT
    initial_timestamp: datetime | None = LEFT_OUT
    lease: LeaseConfig = LEFT_OUT
    consumer: ConsumerConfig = LEFT_OUT
    retrieval: RetrievalConfig = LEFT_OUT
    failures: FailureConfig = LEFT_OUT
    discovery_interval_ms: int | None = LEFT_OUT
    shutdown_timeout_ms: int = LEFT_OUT
    metrics: MetricsConfig = LEFT_OUT
    worker_metrics: WorkerMetricsConfig = LEFT_OUT
    report_worker_metrics: bool = True
    leader_mode: str = LEFT_OUT
    startup_timeout_ms: int = LEFT_OUT
    cpu_metric: Any = LEFT_OUT  # "auto", "process", "none", or a WorkerMetric to report instead
    shard_sync: ShardSyncConfig = LEFT_OUT
    leader: LeaderConfig = LEFT_OUT
    leader_lock: LeaderLockConfig = LEFT_OUT
    assignment: AssignmentConfig = LEFT_OUT
    scaling: ScalingConfig = LEFT_OUT
    parallelism: int | None = None
    environment: InitVar[Mapping[str, str] | None] = None

    def __post_init__(self, environment: Mapping[str, str] | None) -> None:
        validate_app_name(self.app)
        named = tuple(n.strip() for n in self.stream.split(",") if n.strip())
        if named and self.streams and named != tuple(self.streams):  # equal: a copy made by dataclasses.replace
            raise ConfigError("give either stream or streams, not both")
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if _needs_environment(values):  # the one read of the environment
            for name, value in _from_environment(environ(environment), values).items():
                object.__setattr__(self, name, value)
        names = tuple(self.streams) or tuple(n for n in self.stream.split(",") if n.strip())
        if not names and self.stream_tracker is None:
            raise ConfigError("a worker needs a stream name")
        try:
            selection = StreamSelection(names=names, tracker=self.stream_tracker, multi_stream=self.multi_stream)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        object.__setattr__(self, "streams", selection.names)
        object.__setattr__(self, "multi_stream", selection.multi_stream)
        # The stream of leases whose key names none: the application's only stream.
        object.__setattr__(self, "stream", selection.names[0] if len(selection.names) == 1 else "")
        if not self.worker_id:
            object.__setattr__(self, "worker_id", default_owner())
        if self.parallelism is not None and self.parallelism != self.consumer.parallelism:
            # ConsumerConfig validates it (1..256), as it does the variable's value.
            object.__setattr__(self, "consumer", replace(self.consumer, parallelism=self.parallelism))
        self._validate()

    def _validate(self) -> None:
        if self.discovery_interval_ms is not None and self.discovery_interval_ms < 100:
            raise ConfigError("discovery_interval_ms must be at least 100")
        if self.shutdown_timeout_ms < 0:
            raise ConfigError("shutdown_timeout_ms must not be negative")
        if self.leader_mode not in ("none", "embedded"):
            raise ConfigError(f"invalid leader_mode {self.leader_mode!r}: expected none or embedded")
        if isinstance(self.cpu_metric, str) and self.cpu_metric not in CPU_METRIC_CHOICES:
            raise ConfigError(f"invalid SHARDLEASE_CPU_METRIC {self.cpu_metric!r}: expected auto, process or none")
        if not 0 <= self.startup_timeout_ms <= 20_000:
            # 20 s at most: with the probes' own timeouts a worker that cannot start says so within 30 s.
            raise ConfigError(f"startup_timeout_ms={self.startup_timeout_ms} must be within 0..20000")

    @property
    def stream_selection(self) -> StreamSelection:
        """The streams as the leader takes them."""
        return StreamSelection(names=self.streams, tracker=self.stream_tracker, multi_stream=self.multi_stream)

    @property
    def renewer_interval_s(self) -> float:
        return self.lease.renewer_interval_ms / 1000

    def discovery_interval_s(self, *, notices_seen: bool) -> float:
        """The configured interval, else the safety net once the leader's notices are known to arrive."""
        if self.discovery_interval_ms is not None:
            return self.discovery_interval_ms / 1000
        safety_net = notices_seen and self.lease.heartbeat_enabled
        return (DISCOVERY_SAFETY_NET_MS if safety_net else KCL_DISCOVERY_INTERVAL_MS) / 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerConfig:
        """Every setting from ``env`` (default: the process environment), ``SHARDLEASE_APP`` and
        ``SHARDLEASE_STREAM`` included; ``overrides`` that are not ``None`` win (``streams`` replaces the
        environment's stream)."""
        e = environ(env)
        values: dict[str, Any] = {"app": env_str(e, "SHARDLEASE_APP")}
        values.update({name: value for name, value in overrides.items() if value is not None})
        if values.get("streams"):  # the environment's tracker still serves
            values.setdefault("stream_tracker", load_stream_tracker(env_str(e, "SHARDLEASE_STREAM_TRACKER")))
        return cls(**values, environment=e)
