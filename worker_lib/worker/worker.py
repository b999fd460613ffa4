"""The worker: the composition root users embed (``from worker_lib import Worker, WorkerConfig``; docs/worker.md).

:class:`WorkerConfig` holds its settings (every one defaults to the environment, docs/api.md); :class:`Worker`
checks at start that its tables and stream can be reached (:meth:`Worker.preflight`), then composes the lease
coordinator (:mod:`worker_lib.worker.coordinator`: renewals, discovery, heartbeat, one consumer per lease), the
worker-metrics reporter (CPU, … for the leader), CloudWatch publishing and, in ``embedded`` leader mode, the leader
loop. ``shutdown()`` (or SIGTERM through :meth:`Worker.run`, :mod:`worker_lib.worker.signals`) announces the
departure (the leader assigns nothing more to it), lets every consumer finish its batch in flight, asks the
processor to checkpoint, gives the leases up at once and announces ``STOPPED``, so the leader reassigns them within
about a second.

Nothing starts at construction: threads start in :meth:`Worker.start`; AWS clients are created in ``__init__``
from the configuration (or passed in).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

import boto3

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, InitialPosition, default_owner, validate_app_name
from worker_lib.core.env import env_bool, env_int, env_str, environ
from worker_lib.core.errors import (
    ConfigError,
    EndpointUnreachableError,
    StreamMissingError,
    SupersededError,
    TableMissingError,
    ThrottledError,
)
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.core.streams import StreamSelection, StreamTracker, load_stream_tracker, parse_stream_entry
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.keeper import ThroughputTracker
from worker_lib.leases.mode import LivenessMode, check_start
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.processing.consumer import ConsumerOutcome, FailureHandling
from worker_lib.processing.destinations import FailureDestination, make_destination
from worker_lib.processing.processor import ProcessorFactory
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.retrieval.fanout import ShardSubscriber, StreamConsumers, subscription_config
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.tables.admin import check_layout, check_schema
from worker_lib.tables.schema import (
    TableLayout,
    coordinator_state_table_name,
    lease_table_name,
    worker_metrics_table_name,
)
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.telemetry.publisher import MetricsConfig, MetricsPublisher, make_publisher
from worker_lib.worker.coordinator import LeaseCoordinator
from worker_lib.worker.signals import install_shutdown_handlers
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.cpu import available_cpus, cpu_metric_from_env
from worker_lib.workermetrics.reporter import WorkerMetricsReporter
from worker_lib.workermetrics.stats_store import WorkerMetricsStore
from worker_lib.workermetrics.throughput import ThroughputRecorder

log = logging.getLogger(__name__)

_T = TypeVar("_T")

KCL_DISCOVERY_INTERVAL_MS = 9_975
"""KCL's lease discovery interval: the GSI query is the only way a worker learns of new leases there."""

DISCOVERY_SAFETY_NET_MS = 60_000
"""With the heartbeat on, new leases arrive by notice; the GSI query only catches a lost notice."""


def _worker_id(env: Mapping[str, str]) -> str:
    return env_str(env, "SHARDLEASE_WORKER_ID") or default_owner()


# The worker's own settings that the environment may give: one reader per field, used by ``WorkerConfig.from_env``
# and as the default of every field the caller leaves out (so both paths parse a variable the same way).
_ENV_READERS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    "worker_id": _worker_id,
    "multi_stream": lambda e: env_bool(e, "SHARDLEASE_MULTI_STREAM", False),
    "table_layout": TableLayout.from_env,
    # Where new leases start is the leader's setting (ShardSyncConfig reads it); a worker needs the timestamp of
    # AT_TIMESTAMP checkpoints.
    "initial_position": lambda e: ShardSyncConfig.from_env(e).initial_position,
    "initial_timestamp": lambda e: ShardSyncConfig.from_env(e).initial_timestamp,
    "discovery_interval_ms": lambda e: env_int(e, "SHARDLEASE_DISCOVERY_INTERVAL_MS", 0) or None,
    "shutdown_timeout_ms": lambda e: env_int(e, "SHARDLEASE_SHUTDOWN_TIMEOUT_MS", 30_000),
    "leader_mode": lambda e: env_str(e, "SHARDLEASE_LEADER_MODE", "none").lower(),
    "startup_timeout_ms": lambda e: env_int(e, "SHARDLEASE_STARTUP_TIMEOUT_MS", 15_000),
}


def _from_env(name: str) -> Callable[[], Any]:
    """A field default: the environment's value (see ``WorkerConfig.from_env``), else the documented default."""
    return lambda: _ENV_READERS[name](environ())


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything a worker needs besides its processor.

    Every field the caller leaves out comes from the environment, else its documented default — as boto3 and
    Powertools do — so ``WorkerConfig(app="orders", stream="orders-stream")`` deployed in eu-west-1 talks to
    eu-west-1 (``AWS_REGION``), and the same image runs against local emulators with only variables changed.
    An explicit argument always wins. docs/api.md lists every variable.

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
      timestamp) — the leader decides the initial checkpoint of every lease it creates
      (``SHARDLEASE_INITIAL_POSITION``, ``SHARDLEASE_INITIAL_TIMESTAMP``).
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
    """

    app: str
    stream: str = ""
    streams: tuple[str, ...] = ()
    stream_tracker: StreamTracker | None = None
    multi_stream: bool = field(default_factory=_from_env("multi_stream"))
    table_layout: TableLayout = field(default_factory=_from_env("table_layout"))
    aws: AwsConfig = field(default_factory=AwsConfig.from_env)
    worker_id: str = field(default_factory=_from_env("worker_id"))
    initial_position: InitialPosition = field(default_factory=_from_env("initial_position"))
    initial_timestamp: datetime | None = field(default_factory=_from_env("initial_timestamp"))
    lease: LeaseConfig = field(default_factory=LeaseConfig.from_env)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig.from_env)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig.from_env)
    failures: FailureConfig = field(default_factory=FailureConfig.from_env)
    discovery_interval_ms: int | None = field(default_factory=_from_env("discovery_interval_ms"))
    shutdown_timeout_ms: int = field(default_factory=_from_env("shutdown_timeout_ms"))
    metrics: MetricsConfig = field(default_factory=MetricsConfig.from_env)
    worker_metrics: WorkerMetricsConfig = field(default_factory=WorkerMetricsConfig.from_env)
    report_worker_metrics: bool = True
    leader_mode: str = field(default_factory=_from_env("leader_mode"))
    startup_timeout_ms: int = field(default_factory=_from_env("startup_timeout_ms"))
    cpu_metric: Any = None  # a WorkerMetric to report instead of the detected CPU provider

    def __post_init__(self) -> None:
        validate_app_name(self.app)
        if isinstance(self.retrieval, str):  # WorkerConfig(retrieval="fanout"): the environment's settings, that mode
            object.__setattr__(self, "retrieval", replace(RetrievalConfig.from_env(), mode=self.retrieval))
        named = tuple(n.strip() for n in self.stream.split(",") if n.strip())
        if named and self.streams and named != tuple(self.streams):  # equal: a copy made by dataclasses.replace
            raise ConfigError("give either stream or streams, not both")
        if not self.stream and not self.streams and self.stream_tracker is None:  # all left out: the environment's
            e = environ()
            object.__setattr__(self, "stream", env_str(e, "SHARDLEASE_STREAM"))
            object.__setattr__(self, "stream_tracker", load_stream_tracker(env_str(e, "SHARDLEASE_STREAM_TRACKER")))
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
        if self.discovery_interval_ms is not None and self.discovery_interval_ms < 100:
            raise ConfigError("discovery_interval_ms must be at least 100")
        if self.shutdown_timeout_ms < 0:
            raise ConfigError("shutdown_timeout_ms must not be negative")
        if self.leader_mode not in ("none", "embedded"):
            raise ConfigError(f"invalid leader_mode {self.leader_mode!r}: expected none or embedded")
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
        values: dict[str, Any] = {
            "app": e.get("SHARDLEASE_APP", ""),
            "stream": e.get("SHARDLEASE_STREAM", ""),
            "stream_tracker": load_stream_tracker(env_str(e, "SHARDLEASE_STREAM_TRACKER")),
            "aws": AwsConfig.from_env(e),
            **{name: read(e) for name, read in _ENV_READERS.items()},
            "lease": LeaseConfig.from_env(e),
            "consumer": ConsumerConfig.from_env(e),
            "retrieval": RetrievalConfig.from_env(e),
            "failures": FailureConfig.from_env(e),
            "metrics": MetricsConfig.from_env(e),
            "worker_metrics": WorkerMetricsConfig.from_env(e),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("streams"):
            values["stream"] = ""
        return cls(**values)


class _StoppedBeforeStart(Exception):
    """A shutdown signal came while :meth:`Worker.preflight` waited for an endpoint."""


class MetricsReporter(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class Worker:
    """A Kinesis consumer worker holding leases from the shared lease table."""

    def __init__(
        self,
        config: WorkerConfig,
        processor_factory: ProcessorFactory,
        *,
        aws_config: AwsConfig | None = None,
        boto3_session: boto3.Session | None = None,
        dynamodb: Any = None,
        kinesis: Any = None,
        lease_store: LeaseStore | None = None,
        throughput: ThroughputTracker | None = None,
        metrics_reporter: MetricsReporter | None = None,
        metrics_publisher: MetricsPublisher | None = None,
        on_records: Callable[[str, Sequence[KinesisRecord], int | None], None] | None = None,
        failure_destination: FailureDestination | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.worker_id = config.worker_id
        aws_config = aws_config or config.aws  # an explicit aws_config wins (tests, the CLI's --endpoint-url)
        self._aws_config = aws_config
        self._dynamodb = dynamodb or aws.client("dynamodb", aws_config, boto3_session)
        self._kinesis = kinesis or aws.client("kinesis", aws_config, boto3_session)
        # The start check probes with one attempt and short timeouts, so that a wrong endpoint fails within
        # seconds; injected clients are used as they are (their owner chose their retries).
        probe_config = replace(
            aws_config,
            max_attempts=1,
            connect_timeout_s=min(aws_config.connect_timeout_s, 5.0),
            read_timeout_s=min(aws_config.read_timeout_s, 5.0),
        )
        self._probe_dynamodb = dynamodb or aws.client("dynamodb", probe_config, boto3_session)
        self._probe_kinesis = kinesis or aws.client("kinesis", probe_config, boto3_session)
        self._fanout: StreamConsumers | None = None
        if config.retrieval.fanout:
            self._subscription_kinesis = kinesis or aws.client(
                "kinesis", subscription_config(aws_config), boto3_session
            )
            self._fanout = StreamConsumers(
                self._kinesis,
                consumer_name=config.retrieval.consumer_name_for(config.app),
                consumer_arn=config.retrieval.consumer_arn,
                clock=clock,
            )
        self._preflight_done = False
        self._store = lease_store or DynamoDBLeaseStore(config.app, client=self._dynamodb, clock=clock)
        self._worker_metrics = WorkerMetricsStore(
            config.app, client=self._dynamodb, clock=clock, layout=config.table_layout
        )
        self._reporter = metrics_reporter
        if self._reporter is None and config.report_worker_metrics:
            cpu = cpu_metric_from_env(clock=clock) if config.cpu_metric is None else config.cpu_metric
            self._reporter = WorkerMetricsReporter(
                config.worker_id,
                [cpu] if cpu is not None else [],
                self._worker_metrics,
                config=config.worker_metrics,
                clock=clock,
                capacity=functools.partial(available_cpus, cpu),
                lags=self._current_lags,  # the coordinator is made below; read at each report
            )
        self._metrics = metrics_publisher or make_publisher(
            config.metrics, app=config.app, worker_id=config.worker_id, aws_config=aws_config, clock=clock
        )
        spec = config.failures.destination_spec
        if failure_destination is None and spec is not None:
            failure_destination = make_destination(spec, aws_config, boto3_session)
        failures = FailureHandling(
            config=config.failures,
            destination=failure_destination,
            application=config.app,
            worker_id=config.worker_id,
            metrics=self._metrics,
        )
        self._clock = clock
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._modes = LivenessModeStore(
            CoordinatorStateStore(config.app, client=self._dynamodb, clock=clock, layout=config.table_layout),
            clock=clock,
        )
        self._coordinator = LeaseCoordinator(
            config,
            processor_factory,
            store=self._store,
            kinesis=self._kinesis,
            worker_metrics=self._worker_metrics,
            # KCL's recorder semantics by default (window = renewer interval, EMA 0.5): the leader balances on it.
            throughput=throughput or ThroughputRecorder(window_ms=config.lease.renewer_interval_ms, clock=clock),
            metrics=self._metrics,
            on_records=on_records,
            stop=self._stop,
            clock=clock,
            modes=self._modes,
            cpu_percent=self._latest_cpu,
            on_superseded=self._on_superseded,
            record_source=None if self._fanout is None else self._subscriber,
            failures=failures,
        )
        self._leader_thread: threading.Thread | None = None
        self._superseded = False
        self._start_lock = threading.Lock()  # a shutdown signal either comes before start() or after it finished
        self._run_started = False

    def _subscriber(
        self, stream: str, shard_id: str, checkpoint: Checkpoint, timestamp: datetime | None
    ) -> ShardSubscriber:
        """A lease's enhanced fan-out subscription (retrieval mode ``fanout``)."""
        assert self._fanout is not None
        return ShardSubscriber(
            stream,
            shard_id,
            kinesis_client=self._subscription_kinesis,
            consumer_arn=self._fanout.arn_for(stream),
            start=checkpoint,
            timestamp=timestamp,
            clock=self._clock,
            config=self.config.retrieval,
        )

    def _current_lags(self) -> dict[str, int]:
        return self._coordinator.lags()

    def _latest_cpu(self) -> float | None:
        """The CPU the last worker-metrics window measured (published as WorkerCpuUtilization), if any."""
        if self._reporter is None or not hasattr(self._reporter, "snapshot"):
            return None
        latest: float | None = self._reporter.snapshot().latest("C")
        return latest

    # --- public ---------------------------------------------------------------------------------------------

    @property
    def held_leases(self) -> list[str]:
        """The lease keys this worker holds now."""
        return self._coordinator.keeper.held_keys()

    @property
    def outcomes(self) -> dict[str, ConsumerOutcome]:
        """How each finished shard consumer ended, by lease key."""
        return self._coordinator.outcomes

    @property
    def renewal_failures(self) -> int:
        """Lease renewals that failed since start (a lease lost to another owner, or a renewal that errored)."""
        return self._coordinator.keeper.renewal_failures

    def preflight(self) -> None:
        """Check, before anything starts, that the worker's tables and stream can be reached; else raise one typed
        error with a one-line message (:class:`TableMissingError`, :class:`StreamMissingError`,
        :class:`EndpointUnreachableError`, :class:`CredentialsError`, ...).

        A missing table or stream or rejected credentials fail at once; an unreachable or throttling endpoint is
        retried until ``startup_timeout_ms`` has passed, each probe with one attempt and short timeouts, so the
        whole check ends within about startup_timeout + 10 s (25 s by default). :meth:`run` calls it; once running,
        the worker rides through outages instead (renewals and reads retry, leases fence themselves).
        """
        if self._preflight_done:
            return
        layout = self.config.table_layout
        tables = [lease_table_name(self.config.app)]
        if not layout.single:
            tables.append(worker_metrics_table_name(self.config.app))
            if self.config.leader_mode == "embedded":
                tables.append(coordinator_state_table_name(self.config.app))
        deadline = self._clock.monotonic() + self.config.startup_timeout_ms / 1000
        describe = self._probe_dynamodb.describe_table
        specs = {spec.table_name(self.config.app): spec for spec in layout.specs()}
        for table in tables:
            reply = self._probe("dynamodb DescribeTable", table, functools.partial(describe, TableName=table), deadline)
            # A table created by hand or by another tool with other keys fails here, not at the first write.
            check_schema(specs[table], self.config.app, reply.get("Table", {}))
        for entry in self.config.streams:
            stream = parse_stream_entry(entry)[0]
            try:
                self._probe(
                    "kinesis DescribeStreamSummary",
                    stream,
                    functools.partial(self._probe_kinesis.describe_stream_summary, StreamName=stream),
                    deadline,
                )
            except StreamMissingError as exc:
                if not self.config.multi_stream:
                    raise
                # One deleted stream must not keep a multi-stream worker from the others (its leases are cleaned up).
                log.warning("%s; the other streams are consumed", exc)
        check_layout(self.config.app, self._probe_dynamodb, layout)
        self._check_liveness_mode()
        if self._fanout is not None:
            # Registering (or finding) the consumer now turns a missing permission into one line at start.
            for entry in self.config.streams:
                self._fanout.arn_for(parse_stream_entry(entry)[0])
        self._preflight_done = True

    def _check_liveness_mode(self) -> None:
        """Refuse to start in the other liveness mode (docs/liveness-modes.md). Without a CoordinatorState table
        only ``lease`` mode can run (nothing else can be judged)."""
        setting = self.config.lease.liveness_mode
        try:
            stored = self._modes.read()
        except TableMissingError:
            if setting != LivenessMode.LEASE.value:
                raise
            log.warning("no %s table: running in liveness mode lease", self._modes.table_name)
            return
        check_start(setting, stored, who=f"worker {self.worker_id}")

    def _probe(self, operation: str, resource: str, call: Callable[[], _T], deadline: float) -> _T:
        delay = 0.5
        while True:
            try:
                with aws.translated(operation, resource):
                    return call()
            except (EndpointUnreachableError, ThrottledError) as exc:
                if self._clock.monotonic() + delay >= deadline:
                    waited = self.config.startup_timeout_ms / 1000
                    raise type(exc)(f"{exc} (still failing after {waited:g} s; is the endpoint right?)") from exc
                log.info("worker %s waiting for %s: %s", self.worker_id, resource, exc)
                self._clock.sleep(delay)
                if self._stop.is_set():  # stopped while it waited: do not wait out the startup timeout
                    raise _StoppedBeforeStart from exc
                delay = min(delay * 2, 4.0)

    def start(self) -> None:
        if self._coordinator.keeper.started:
            raise RuntimeError("worker already started")
        self._coordinator.keeper.start_heartbeat()  # refuses a configured liveness mode the application is not in
        if self._reporter is not None:
            self._reporter.start()
        self._coordinator.start()
        if self.config.leader_mode == "embedded":
            self._start_embedded_leader()
        streams = ",".join(self.config.streams) + (" + tracker" if self.config.stream_tracker is not None else "")
        log.info("worker started id=%s app=%s stream=%s", self.worker_id, self.config.app, streams)

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Check the tables and the stream (:meth:`preflight`), start, and block until shutdown. SIGTERM/SIGINT
        shut down gracefully; a second one forces exit."""
        if install_signal_handlers:
            install_shutdown_handlers(self._on_shutdown_signal)
        with contextlib.suppress(_StoppedBeforeStart):  # stopped while it waited for an endpoint
            self.preflight()
        with self._start_lock:
            if self._stop.is_set():
                log.info("worker stopped before it started id=%s", self.worker_id)
                return
            self._run_started = True
            self.start()
        while not self._stopped.wait(0.5):
            pass
        if self._superseded:
            raise SupersededError(f"worker id {self.worker_id} is used by a newer process: this one stopped")

    def _on_shutdown_signal(self) -> None:
        """SIGTERM/SIGINT: a worker that has not started yet (still checking its tables, waiting for an endpoint)
        does not start, and :meth:`run` returns; a started one shuts down gracefully."""
        with self._start_lock:
            if not self._run_started:
                self._stop.set()
                return
        self.shutdown()

    def _on_superseded(self) -> None:
        """A newer process beat under our worker id (the heartbeat fenced us and beats no more): this process can
        never hold a lease again, so it shuts down — on a thread of its own, the heartbeat's must not wait for
        itself — and :meth:`run` raises :class:`SupersededError`."""
        self._superseded = True
        threading.Thread(target=self.shutdown, name=f"superseded-{self.worker_id}", daemon=True).start()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Graceful: each consumer finishes its batch, the processor checkpoints, leases are given up at once.

        Returns True if every consumer finished within the timeout. Checkpoints already written are never
        undone; a lease whose consumer did not finish expires normally.
        """
        timeout = self.config.shutdown_timeout_ms / 1000 if timeout_s is None else timeout_s
        self._coordinator.begin_shutdown()
        self._stop.set()
        running = self._coordinator.request_stop_consumers()
        deadline = self._clock.monotonic() + timeout
        clean = self._coordinator.drain(running, deadline)
        if self._leader_thread is not None:
            self._leader_thread.join(max(1.0, deadline - self._clock.monotonic()))
        self._coordinator.announce_stopped()
        if self._reporter is not None:
            self._reporter.stop()
        self._metrics.flush()
        self._coordinator.close()
        self._stopped.set()
        log.info("worker stopped id=%s clean=%s", self.worker_id, clean)
        return clean

    def _start_embedded_leader(self) -> None:
        """The same Leader the Lambda runs, in a thread of this worker: every worker may contend, the lock picks
        one, and a dead one is replaced within the lock's lease duration (docs/leader-lock.md)."""
        from worker_lib.leader.factory import build_leader_from_env
        from worker_lib.leader.metrics_publisher import LeaderMetricsPublisher

        # The leader's metrics go where this worker's go (SHARDLEASE_METRICS), as the Lambda's would.
        publisher = LeaderMetricsPublisher(self.config.metrics, app=self.config.app, aws_config=self._aws_config)
        parts = build_leader_from_env(
            environ(),
            app=self.config.app,
            stream=self.config.stream_selection,
            owner=f"{self.worker_id}:leader",
            layout=self.config.table_layout,
            dynamodb=self._dynamodb,
            kinesis=self._kinesis,
            clock=self._clock,
        )

        def lead() -> None:
            try:
                parts.leader.run(stop=self._stop, on_cycle=publisher.cycle)
            except Exception:
                log.exception("embedded leader stopped with an error")

        self._leader_thread = threading.Thread(target=lead, name=f"leader-{self.worker_id}", daemon=True)
        self._leader_thread.start()
        log.info("embedded leader started for worker %s", self.worker_id)
