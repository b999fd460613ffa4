"""The worker: the composition root users embed (DESIGN.md §4).

One coordinator thread renews held leases every renewer interval (failover / 3 − ε) and discovers newly assigned
ones — at once when the heartbeat brings the leader's notice, else every discovery interval; one consumer thread
per lease reads and processes its shard; a heartbeat thread tells the leader every second that this worker is
alive (and fences it when it cannot, docs/failover.md); an optional reporter thread writes worker metrics (CPU, …)
for the leader. ``shutdown()`` (or SIGTERM through :meth:`Worker.run`) announces the departure (the leader assigns
nothing more to it), lets every consumer finish its batch in flight, asks the processor to checkpoint, gives the
leases up at once and announces ``STOPPED``, so the leader reassigns them within about a second.

Nothing starts at construction: threads start in :meth:`start`; AWS clients are created in ``__init__`` from
the injected session/config (or passed in).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import FrameType
from typing import Any, Protocol

import boto3

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, InitialPosition, parse_timestamp, validate_app_name
from worker_lib.core.env import env_int, env_str, environ
from worker_lib.core.errors import ConfigError, DependencyError, EndpointUnreachableError, ThrottledError
from worker_lib.core.models import ShardInfo, WorkerState
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.heartbeat import HeartbeatLoop
from worker_lib.leases.renewer import LeaseDiscoverer, LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.config import ConsumerConfig, RetrievalConfig
from worker_lib.processing.consumer import ConsumerOutcome, ShardConsumer
from worker_lib.processing.processor import KinesisRecord, ProcessorFactory, RecordProcessor
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.tables.schema import coordinator_state_table_name, lease_table_name, worker_metrics_table_name
from worker_lib.telemetry.names import WorkerMetric as MetricName
from worker_lib.telemetry.publisher import MetricsConfig, MetricsPublisher, make_publisher
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.cpu import cpu_metric_from_env
from worker_lib.workermetrics.reporter import WorkerMetricsReporter
from worker_lib.workermetrics.stats_store import WorkerMetricsStore
from worker_lib.workermetrics.throughput import ThroughputRecorder

log = logging.getLogger("shardlease.worker")

KCL_DISCOVERY_INTERVAL_MS = 9_975
"""KCL's lease discovery interval: the GSI query is the only way a worker learns of new leases there."""

DISCOVERY_SAFETY_NET_MS = 60_000
"""With the heartbeat on, new leases arrive by notice; the GSI query only catches a lost notice."""


def _worker_id(env: Mapping[str, str]) -> str:
    return env_str(env, "SHARDLEASE_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}"


def _initial_timestamp(env: Mapping[str, str]) -> datetime | None:
    raw = env_str(env, "SHARDLEASE_INITIAL_TIMESTAMP")
    return parse_timestamp(raw) if raw else None


# The worker's own settings that the environment may give: one reader per field, used by ``WorkerConfig.from_env``
# and as the default of every field the caller leaves out (so both paths parse a variable the same way).
_ENV_READERS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    "worker_id": _worker_id,
    "initial_position": lambda e: InitialPosition.parse(env_str(e, "SHARDLEASE_INITIAL_POSITION", "LATEST")),
    "initial_timestamp": _initial_timestamp,
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

    app / stream: the application (= lease table name) and the Kinesis stream.
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
    lease / consumer / retrieval / metrics / worker_metrics: each area's settings, each from its ``from_env()``.
    """

    app: str
    stream: str
    aws: AwsConfig = field(default_factory=AwsConfig.from_env)
    worker_id: str = field(default_factory=_from_env("worker_id"))
    initial_position: InitialPosition = field(default_factory=_from_env("initial_position"))
    initial_timestamp: datetime | None = field(default_factory=_from_env("initial_timestamp"))
    lease: LeaseConfig = field(default_factory=LeaseConfig.from_env)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig.from_env)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig.from_env)
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
        if not self.stream:
            raise ConfigError("a worker needs a stream name")
        if not self.worker_id:
            object.__setattr__(self, "worker_id", f"{socket.gethostname()}:{os.getpid()}")
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
        ``SHARDLEASE_STREAM`` included; ``overrides`` that are not ``None`` win."""
        e = environ(env)
        values: dict[str, Any] = {
            "app": e.get("SHARDLEASE_APP", ""),
            "stream": e.get("SHARDLEASE_STREAM", ""),
            "aws": AwsConfig.from_env(e),
            **{name: read(e) for name, read in _ENV_READERS.items()},
            "lease": LeaseConfig.from_env(e),
            "consumer": ConsumerConfig.from_env(e),
            "retrieval": RetrievalConfig.from_env(e),
            "metrics": MetricsConfig.from_env(e),
            "worker_metrics": WorkerMetricsConfig.from_env(e),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class ThroughputTracker(Protocol):
    """Per-lease throughput for the leader (reference §6): bytes in, KBps out at each renewal."""

    def record(self, lease_key: str, nbytes: int) -> None: ...

    def renewal_value(self, lease_key: str) -> float | None: ...

    def seed(self, lease_key: str, kbps: float | None) -> None: ...

    def forget(self, lease_key: str) -> None: ...


class MetricsReporter(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class _Running:
    consumer: ShardConsumer
    thread: threading.Thread
    outcome: ConsumerOutcome | None = None


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
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.worker_id = config.worker_id
        aws_config = aws_config or config.aws  # an explicit aws_config wins (tests, the CLI's --endpoint-url)
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
        self._preflight_done = False
        self._store = lease_store or DynamoDBLeaseStore(config.app, client=self._dynamodb, clock=clock)
        self._factory = processor_factory
        # KCL's recorder semantics by default (window = renewer interval, EMA 0.5): the leader balances on it.
        self._throughput: ThroughputTracker = throughput or ThroughputRecorder(
            window_ms=config.lease.renewer_interval_ms, clock=clock
        )
        self._worker_metrics = WorkerMetricsStore(config.app, client=self._dynamodb, clock=clock)
        self._reporter = metrics_reporter
        if self._reporter is None and config.report_worker_metrics:
            cpu = cpu_metric_from_env(clock=clock) if config.cpu_metric is None else config.cpu_metric
            self._reporter = WorkerMetricsReporter(
                config.worker_id,
                [cpu] if cpu is not None else [],
                self._worker_metrics,
                config=config.worker_metrics,
                clock=clock,
            )
        self._user_on_records = on_records
        self._metrics = metrics_publisher or make_publisher(
            config.metrics, app=config.app, worker_id=config.worker_id, aws_config=aws_config, clock=clock
        )
        self._clock = clock
        self._holder = LeaseHolder(
            self._store,
            self.worker_id,
            config=config.lease,
            clock=clock,
            throughput=self._throughput.renewal_value,
            on_release=self._on_release,
        )
        self._heartbeat: HeartbeatLoop | None = None
        if config.lease.heartbeat_enabled:
            self._heartbeat = HeartbeatLoop(
                self._worker_metrics,
                self.worker_id,
                interval_ms=config.lease.heartbeat_interval_ms,
                fence=self._holder,
                on_notice=self._on_notice,
                clock=clock,
            )
        self._notice_guard = threading.Lock()
        self._noticed_keys: set[str] = set()
        self._notice_full = False
        self._discoverer = LeaseDiscoverer(self._store, self.worker_id)
        self._detector = KinesisShardDetector(config.stream, client=self._kinesis, clock=clock)
        self._running: dict[str, _Running] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._coordinator_stop = threading.Event()  # set after the consumers finished: renewals go on until then
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._leader_thread: threading.Thread | None = None
        self._shard_cache: tuple[float, list[ShardInfo]] | None = None
        self.renewal_failures = 0
        self.outcomes: dict[str, ConsumerOutcome] = {}

    # --- public ---------------------------------------------------------------------------------------------

    @property
    def held_leases(self) -> list[str]:
        return self._holder.held_keys()

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
        tables = [lease_table_name(self.config.app), worker_metrics_table_name(self.config.app)]
        if self.config.leader_mode == "embedded":
            tables.append(coordinator_state_table_name(self.config.app))
        deadline = self._clock.monotonic() + self.config.startup_timeout_ms / 1000
        describe = self._probe_dynamodb.describe_table
        for table in tables:
            self._probe("dynamodb DescribeTable", table, functools.partial(describe, TableName=table), deadline)
        stream = self.config.stream
        self._probe(
            "kinesis DescribeStreamSummary",
            stream,
            lambda: self._probe_kinesis.describe_stream_summary(StreamName=stream),
            deadline,
        )
        self._preflight_done = True

    def _probe(self, operation: str, resource: str, call: Callable[[], object], deadline: float) -> None:
        delay = 0.5
        while True:
            try:
                with aws.translated(operation, resource):
                    call()
                return
            except (EndpointUnreachableError, ThrottledError) as exc:
                if self._clock.monotonic() + delay >= deadline:
                    waited = self.config.startup_timeout_ms / 1000
                    raise type(exc)(f"{exc} (still failing after {waited:g} s; is the endpoint right?)") from exc
                log.info("worker %s waiting for %s: %s", self.worker_id, resource, exc)
                self._clock.sleep(delay)
                delay = min(delay * 2, 4.0)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("worker already started")
        if self._heartbeat is not None:
            self._heartbeat.start()
        if self._reporter is not None:
            self._reporter.start()
        self._thread = threading.Thread(target=self._coordinate, name=f"worker-{self.worker_id}", daemon=True)
        self._thread.start()
        if self.config.leader_mode == "embedded":
            self._start_embedded_leader()
        log.info("worker started id=%s app=%s stream=%s", self.worker_id, self.config.app, self.config.stream)

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Check the tables and the stream (:meth:`preflight`), start, and block until shutdown. SIGTERM/SIGINT
        shut down gracefully; a second one forces exit."""
        self.preflight()
        if install_signal_handlers:
            self._install_signal_handlers()
        self.start()
        while not self._stopped.wait(0.5):
            pass

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Graceful: each consumer finishes its batch, the processor checkpoints, leases are given up at once.

        Returns True if every consumer finished within the timeout. Checkpoints already written are never
        undone; a lease whose consumer did not finish expires normally.
        """
        timeout = self.config.shutdown_timeout_ms / 1000 if timeout_s is None else timeout_s
        started = self._thread is not None
        if self._heartbeat is not None and started:  # first: from now on the leader assigns nothing more to us
            self._heartbeat.announce(WorkerState.DEPARTING)
        self._stop.set()
        with self._guard:
            running = list(self._running.values())
        for entry in running:
            entry.consumer.request_stop()
        deadline = self._clock.monotonic() + timeout
        clean = True
        for entry in running:
            entry.thread.join(max(0.0, deadline - self._clock.monotonic()))
            clean = clean and not entry.thread.is_alive()
        # Leases held but without a running consumer (e.g. waiting to start) are given up too.
        for key in self._holder.held_keys():
            with self._guard:
                busy = key in self._running and self._running[key].thread.is_alive()
            if not busy:
                self._holder.evict(key)
        self._give_up_undiscovered()
        self._coordinator_stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - self._clock.monotonic()))
        if self._leader_thread is not None:
            self._leader_thread.join(max(1.0, deadline - self._clock.monotonic()))
        if self._heartbeat is not None and started:
            # Fence first, then say so: whatever a consumer that did not finish still holds may move at once.
            self._holder.fence_all("worker stopped")
            self._heartbeat.stop()
            self._heartbeat.announce(WorkerState.STOPPED)
        if self._reporter is not None:
            self._reporter.stop()
        self._metrics.flush()
        self._holder.close()
        self._stopped.set()
        log.info("worker stopped id=%s clean=%s", self.worker_id, clean)
        return clean

    def _start_embedded_leader(self) -> None:
        """The same Leader the Lambda runs, in a thread of this worker: every worker may contend, the lock picks
        one, and a dead one is replaced within the lock's lease duration (docs/leader-lock.md)."""
        from worker_lib.leader.factory import build_leader_from_env

        env = {**os.environ, "SHARDLEASE_APP": self.config.app, "SHARDLEASE_STREAM": self.config.stream}
        parts = build_leader_from_env(
            env, owner=f"{self.worker_id}:leader", dynamodb=self._dynamodb, kinesis=self._kinesis, clock=self._clock
        )

        def lead() -> None:
            try:
                parts.leader.run(stop=self._stop)
            except Exception:
                log.exception("embedded leader stopped with an error")

        self._leader_thread = threading.Thread(target=lead, name=f"leader-{self.worker_id}", daemon=True)
        self._leader_thread.start()
        log.info("embedded leader started for worker %s", self.worker_id)

    def _give_up_undiscovered(self) -> None:
        """Leases the leader assigned to us that we never started: hand them back now rather than let them
        expire (the eviction is conditional on the owner still being us, so it cannot take anything away)."""
        try:
            leases = self._discoverer.discover(set(self._holder.held_keys()))
        except DependencyError as exc:
            log.warning("could not list leases assigned to %s at shutdown: %s", self.worker_id, exc)
            return
        for lease in leases:
            try:
                self._store.evict_lease(lease, self.worker_id)
            except DependencyError as exc:
                log.warning("could not give up lease=%s at shutdown: %s", lease.lease_key, exc)

    # --- coordinator thread ---------------------------------------------------------------------------------

    def _coordinate(self) -> None:
        next_renewal = self._clock.monotonic()
        next_discovery = self._clock.monotonic()
        next_flush = self._clock.monotonic() + self.config.metrics.flush_interval_ms / 1000
        while not self._coordinator_stop.is_set():
            now = self._clock.monotonic()
            if self._stop.is_set():
                # Shutting down: no new leases, but the ones whose consumers still finish their batch and checkpoint
                # keep being renewed, so that a slow final checkpoint is not lost to expiry.
                if now >= next_renewal:
                    next_renewal = now + self.config.renewer_interval_s
                    try:
                        self._renew()
                    except DependencyError as exc:
                        log.warning("worker %s renewal during shutdown failed: %s", self.worker_id, exc)
                self._sleep(min(max(0.0, next_renewal - self._clock.monotonic()), 0.2))
                continue
            if self._heartbeat is not None and not self._heartbeat.established.is_set():
                # No lease is taken before the first heartbeat landed: from then on the fence protects them.
                next_discovery = now
                self._sleep(0.05)
                continue
            try:
                if now >= next_renewal:
                    next_renewal = now + self.config.renewer_interval_s
                    self._renew()
                noticed = self._take_notice()
                if noticed is not None and now < next_discovery:
                    if noticed:
                        self._discover(keys=noticed)
                    else:
                        next_discovery = now
                if now >= next_discovery:
                    notices_seen = self._heartbeat is not None and self._heartbeat.notices_seen
                    next_discovery = now + self.config.discovery_interval_s(notices_seen=notices_seen)
                    self._discover()
                if now >= next_flush:
                    next_flush = now + self.config.metrics.flush_interval_ms / 1000
                    self._metrics.flush()
            except DependencyError as exc:
                log.warning("worker %s coordination step failed: %s", self.worker_id, exc)
            except Exception:
                log.exception("worker %s coordination step raised", self.worker_id)
            self._reap()
            wait = max(0.0, min(next_renewal, next_discovery) - self._clock.monotonic())
            self._sleep(min(wait, 0.2))

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._clock.sleep(seconds)

    def _renew(self) -> None:
        report = self._holder.renew_all()
        self.renewal_failures += len(report.failed)
        self._metrics.add("LeasesHeld", len(self._holder.held_keys()), aggregation="last")
        if report.failed:
            self._metrics.add("RenewalFailures", len(report.failed))
        if report.lost:
            self._metrics.add("LeasesLost", len(report.lost))

    def _discover(self, keys: Sequence[str] | None = None) -> None:
        with self._guard:
            busy = set(self._running)
        held = set(self._holder.held_keys()) | busy
        found = self._discoverer.discover(held) if keys is None else self._discoverer.discover_keys(keys, held)
        for lease in found:
            if self._stop.is_set():
                return
            self._throughput.seed(lease.lease_key, lease.throughput_kbps)
            if self._holder.take(lease):
                self._spawn(lease.lease_key)

    def _spawn(self, lease_key: str) -> None:
        processor: RecordProcessor = self._factory()
        consumer = ShardConsumer(
            lease_key=lease_key,
            stream=self.config.stream,
            holder=self._holder,
            store=self._store,
            processor=processor,
            kinesis_client=self._kinesis,
            list_shards=self._list_shards,
            config=self.config.consumer,
            retrieval=self.config.retrieval,
            initial_timestamp=self.config.initial_timestamp,
            on_bytes=self._record_bytes,
            on_records=self._on_records,
            clock=self._clock,
        )
        entry = _Running(consumer=consumer, thread=threading.Thread(target=lambda: None))

        def target() -> None:
            try:
                entry.outcome = consumer.run()
            except Exception:
                log.exception("consumer for %s crashed; the lease will be given up", lease_key)
                self._holder.evict(lease_key)
                entry.outcome = ConsumerOutcome.GAVE_UP

        entry.thread = threading.Thread(target=target, name=f"consumer-{lease_key}", daemon=True)
        with self._guard:
            self._running[lease_key] = entry
        entry.thread.start()

    def _reap(self) -> None:
        with self._guard:
            done = [key for key, entry in self._running.items() if not entry.thread.is_alive()]
            finished = [(key, self._running.pop(key)) for key in done]
        for key, entry in finished:
            outcome = entry.outcome or ConsumerOutcome.LOST
            self.outcomes[key] = outcome
            self._throughput.forget(key)
            if outcome is ConsumerOutcome.LOST:
                self._holder.drop(key)
            if outcome is ConsumerOutcome.FINISHED and self._heartbeat is not None:
                self._heartbeat.note_event()  # child leases were created: the leader assigns them at once

    def _on_records(self, lease_key: str, records: Sequence[KinesisRecord], millis_behind: int | None) -> None:
        self._metrics.add(MetricName.RECORDS_PROCESSED, len(records))
        self._metrics.add("BytesProcessed", sum(len(r.data) for r in records), unit="Bytes")
        if millis_behind is not None:
            self._metrics.add(MetricName.MILLIS_BEHIND_LATEST, millis_behind, unit="Milliseconds", aggregation="max")
        if self._user_on_records is not None:
            self._user_on_records(lease_key, records, millis_behind)

    # --- notices (docs/failover.md) ---------------------------------------------------------------------------

    def _on_notice(self, keys: tuple[str, ...] | None) -> None:
        """From the heartbeat thread: the leader assigned us leases (``None``: ask the index which)."""
        with self._notice_guard:
            if keys is None:
                self._notice_full = True
            else:
                self._noticed_keys.update(keys)

    def _take_notice(self) -> list[str] | None:
        """What the coordinator should discover now: keys, ``[]`` for a full discovery, ``None`` for nothing."""
        with self._notice_guard:
            if self._notice_full:
                self._notice_full = False
                self._noticed_keys.clear()
                return []
            if not self._noticed_keys:
                return None
            keys = sorted(self._noticed_keys)
            self._noticed_keys.clear()
            return keys

    def _on_release(self, lease_key: str, new_owner: str | None) -> None:
        """A lease left us: tell whoever must act. After a graceful handoff the new owner may start now — it gets
        the notice directly; either way our next beat (``evc``) wakes the leader."""
        if self._heartbeat is None:
            return
        if new_owner is not None:
            try:
                self._worker_metrics.notify_assigned(new_owner, [lease_key])
            except DependencyError as exc:
                log.warning("could not notify %s of lease %s: %s", new_owner, lease_key, exc)
        # The leader looks too: the lease may have gone to a worker that left meanwhile (a handoff started before
        # its SIGTERM), and must then move on at once rather than at the next full cycle.
        self._heartbeat.note_event()

    def _record_bytes(self, lease_key: str, nbytes: int) -> None:
        if nbytes:
            self._throughput.record(lease_key, nbytes)

    def _list_shards(self) -> list[ShardInfo]:
        """The stream's shards, for child-lease creation at SHARD_END (cached briefly: several parents may end
        together)."""
        now = self._clock.monotonic()
        if self._shard_cache is not None and now - self._shard_cache[0] < 2.0:
            return self._shard_cache[1]
        listing = self._detector.list_shards()
        shards = list(listing.shards)
        if listing.complete:
            self._shard_cache = (now, shards)
        return shards

    # --- signals --------------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        signals_seen = 0

        def handler(signum: int, frame: FrameType | None) -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen == 1:
                log.info("signal %s: shutting down gracefully", signal.Signals(signum).name)
                threading.Thread(target=self.shutdown, name="worker-shutdown", daemon=True).start()
            else:
                log.warning("second signal: exiting now (checkpoints already written are kept)")
                os._exit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: the host handles signals
                signal.signal(sig, handler)
