"""The worker: the composition root users embed (``from worker_lib import Worker, WorkerConfig``; docs/worker.md).

:class:`WorkerConfig` (:mod:`worker_lib.worker.config`) holds its settings, its embedded leader's included (every
one defaults to the environment, read once, docs/api.md); :class:`Worker` checks at start that its tables and stream
can be reached (:meth:`Worker.preflight`, :mod:`worker_lib.worker.preflight`), then composes the lease
coordinator (:mod:`worker_lib.worker.coordinator`: renewals, discovery, heartbeat, one consumer per lease), the
worker-metrics reporter (CPU, … for the leader), CloudWatch publishing and, in ``embedded`` leader mode, the leader
loop. ``shutdown()`` (or SIGTERM through :meth:`Worker.run`, :mod:`worker_lib.worker.signals`) announces the
departure (the leader assigns nothing more to it), lets every consumer finish its batch in flight, asks the
processor to checkpoint, gives the leases up at once and announces ``STOPPED``, so the leader reassigns them within
about a second.

Nothing starts at construction: threads start in :meth:`Worker.start`; AWS clients and the record sources
(:class:`~worker_lib.retrieval.factory.RecordSources`: polling or fan-out) are made in ``__init__`` from the
configuration (or passed in).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import boto3

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ConfigError, SupersededError
from worker_lib.core.models import KinesisRecord, LaneStats
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.keeper import ThroughputTracker
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.consumer import ConsumerOutcome
from worker_lib.processing.delivery import FailureHandling
from worker_lib.processing.destinations import FailureDestination, make_destination
from worker_lib.processing.positions import PositionSink
from worker_lib.processing.processor import ProcessorFactory
from worker_lib.retrieval.factory import RecordSources
from worker_lib.retrieval.stream_arns import StreamArns
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.telemetry.publisher import MetricsPublisher, make_publisher
from worker_lib.worker.config import WorkerConfig
from worker_lib.worker.coordinator import LeaseCoordinator
from worker_lib.worker.preflight import Preflight, StoppedBeforeStart, probe_config
from worker_lib.worker.signals import install_shutdown_handlers
from worker_lib.workermetrics.cpu import available_cpus
from worker_lib.workermetrics.cpu.detect import cpu_metric_for
from worker_lib.workermetrics.reporter import WorkerMetricsReporter
from worker_lib.workermetrics.stats_store import WorkerMetricsStore
from worker_lib.workermetrics.throughput import ThroughputRecorder

__all__ = ["MetricsReporter", "Worker", "WorkerConfig"]

log = logging.getLogger(__name__)


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
        position_sink: PositionSink | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if position_sink is not None and config.consumer.parallelism > 1:
            raise ConfigError(
                "a position sink needs parallelism 1: a lane cannot write the shard's position past records other "
                "lanes have not done (DynamoDB outputs in the checkpoint's transaction work with lanes)"
            )
        self.config = config
        self.worker_id = config.worker_id
        aws_config = aws_config or config.aws  # an explicit aws_config wins (tests, the CLI's --endpoint-url)
        self._aws_config = aws_config
        self._dynamodb = dynamodb or aws.client("dynamodb", aws_config, boto3_session)
        self._kinesis = kinesis or aws.client("kinesis", aws_config, boto3_session)
        self._sources = RecordSources.for_application(
            config.retrieval,
            app=config.app,
            aws_config=aws_config,
            kinesis_client=self._kinesis,
            boto3_session=boto3_session,
            subscription_client=kinesis,  # an injected client serves subscriptions too
            clock=clock,
        )
        self._store = lease_store or DynamoDBLeaseStore(config.app, client=self._dynamodb, clock=clock)
        self._worker_metrics = WorkerMetricsStore(
            config.app, client=self._dynamodb, clock=clock, layout=config.table_layout
        )
        self._reporter = metrics_reporter
        if self._reporter is None and config.report_worker_metrics:
            choice = config.cpu_metric
            cpu = cpu_metric_for(choice or "auto", clock=clock) if choice is None or isinstance(choice, str) else choice
            self._reporter = WorkerMetricsReporter(
                config.worker_id,
                [cpu] if cpu is not None else [],
                self._worker_metrics,
                config=config.worker_metrics,
                clock=clock,
                capacity=functools.partial(available_cpus, cpu),
                lags=self._current_lags,  # the coordinator is made below; read at each report
                lanes=self._current_lanes,
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
            stream_arns=StreamArns(self._kinesis),
        )
        self._clock = clock
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._modes = LivenessModeStore(
            CoordinatorStateStore(config.app, client=self._dynamodb, clock=clock, layout=config.table_layout),
            clock=clock,
        )
        probing = probe_config(aws_config)  # injected clients are used as they are (their owner chose their retries)
        self._preflight = Preflight(
            config=config,
            dynamodb=dynamodb or aws.client("dynamodb", probing, boto3_session),
            kinesis=kinesis or aws.client("kinesis", probing, boto3_session),
            modes=self._modes,
            consumers=self._sources.consumers,  # None unless retrieval is fan-out
            stop=self._stop,
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
            sources=self._sources,
            failures=failures,
            positions=position_sink,
        )
        self._leader_thread: threading.Thread | None = None
        self._superseded = False
        self._start_lock = threading.Lock()  # a shutdown signal either comes before start() or after it finished
        self._run_started = False

    def _current_lags(self) -> dict[str, int]:
        return self._coordinator.lags()

    def _current_lanes(self) -> dict[str, LaneStats]:
        return self._coordinator.lanes()

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
        self._preflight.run()

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
        with contextlib.suppress(StoppedBeforeStart):  # stopped while it waited for an endpoint
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
        one, and a dead one is replaced within the lock's lease duration (docs/leader-lock.md). It is built from
        this worker's configuration (its lease settings included) and clients: nothing is read again."""
        from worker_lib.leader.factory import build_leader  # a worker that does not lead never imports the leader
        from worker_lib.leader.metrics_publisher import LeaderMetricsPublisher

        config = self.config
        # The leader's metrics go where this worker's go (SHARDLEASE_METRICS), as the Lambda's would.
        publisher = LeaderMetricsPublisher(config.metrics, app=config.app, aws_config=self._aws_config)
        parts = build_leader(
            app=config.app,
            stream=config.stream_selection,
            aws_config=self._aws_config,
            shard_sync=config.shard_sync,
            owner=f"{self.worker_id}:leader",
            leader_config=config.leader,
            lock_config=config.leader_lock,
            assignment=config.assignment,
            lease_config=config.lease,
            scaling=config.scaling,
            layout=config.table_layout,
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
