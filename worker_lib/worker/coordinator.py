"""Lease coordination inside a worker: the leases it holds and one consumer per lease.

The keeping of leases — renewals in ``lease`` liveness mode, the heartbeat and its fence, notices, discovery and the
departure — is the one :class:`~worker_lib.leases.keeper.LeaseKeeper` that the Spark source's driver runs too
(docs/design.md, "One lease keeper"). The coordinator adds what is the worker's own: one consumer thread per lease
it took, which reads and processes the shard, the metrics of its leases, and the order of a graceful shutdown
(consumers finish their batch in flight while their leases keep being renewed). :class:`~worker_lib.worker.worker.
Worker` composes it with the metrics reporter, the embedded leader and the process lifecycle.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker_lib.core.clock import Clock
from worker_lib.core.models import KinesisRecord, LaneStats, Lease, ShardInfo
from worker_lib.core.streams import stream_name_of
from worker_lib.leases.keeper import KeeperOptions, LeaseKeeper, ThroughputTracker
from worker_lib.leases.mode_store import LivenessModeSource
from worker_lib.leases.renewer import RenewalReport
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.consumer import ConsumerOutcome, ShardConsumer
from worker_lib.processing.delivery import FailureHandling
from worker_lib.processing.lanes import LaneLoop
from worker_lib.processing.positions import PositionSink
from worker_lib.processing.processor import ProcessorFactory, RecordProcessor
from worker_lib.retrieval import RecordSources
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.telemetry.names import WorkerMetric as MetricName
from worker_lib.telemetry.publisher import MetricsPublisher
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

if TYPE_CHECKING:
    from worker_lib.worker.worker import WorkerConfig

log = logging.getLogger(__name__)


@dataclass
class _Running:
    consumer: ShardConsumer
    thread: threading.Thread
    outcome: ConsumerOutcome | None = None


class LeaseCoordinator:
    """The worker's lease keeper and one consumer per held lease.

    ``stop`` is the worker's stop event: once set, consumers stop after their batch; the keeper has been told to
    :meth:`begin_shutdown` (nothing new is taken) and renews what is held until :meth:`drain` ends it.
    """

    def __init__(
        self,
        config: WorkerConfig,
        processor_factory: ProcessorFactory,
        *,
        store: LeaseStore,
        kinesis: Any,
        worker_metrics: WorkerMetricsStore,
        throughput: ThroughputTracker,
        metrics: MetricsPublisher,
        on_records: Callable[[str, Sequence[KinesisRecord], int | None], None] | None,
        stop: threading.Event,
        clock: Clock,
        modes: LivenessModeSource | None = None,
        cpu_percent: Callable[[], float | None] | None = None,
        on_superseded: Callable[[], None] | None = None,
        sources: RecordSources | None = None,
        failures: FailureHandling | None = None,
        positions: PositionSink | None = None,
    ) -> None:
        self.config = config
        self._failures = failures
        self._positions = positions
        # None: polling with ``kinesis`` (RecordSources.for_application gives an application's fan-out sources)
        self._sources = sources or RecordSources(config.retrieval, kinesis_client=kinesis, clock=clock)
        self._cpu_percent = cpu_percent
        self.worker_id = config.worker_id
        self._store = store
        self._kinesis = kinesis
        self._factory = processor_factory
        self._throughput = throughput
        self._metrics = metrics
        self._user_on_records = on_records
        self._clock = clock
        self._stop = stop
        self._running: dict[str, _Running] = {}
        self._lags: dict[str, int] = {}  # MillisBehindLatest of each running lease's last batch (status view)
        self._guard = threading.Lock()
        self._detectors: dict[str, KinesisShardDetector] = {}  # per stream: a multi-stream worker reads several
        self._shard_cache: dict[str, tuple[float, list[ShardInfo]]] = {}
        self._next_flush = clock.monotonic() + config.metrics.flush_interval_ms / 1000
        # Async processors' lanes, on one event loop for the whole worker (started at its first use)
        self._lane_loop = LaneLoop(f"lanes-{self.worker_id}")
        self.outcomes: dict[str, ConsumerOutcome] = {}
        self.keeper = LeaseKeeper(
            store,
            worker_metrics,
            self.worker_id,
            config=config.lease,
            options=KeeperOptions(
                discovery_interval_s=lambda notices_seen: config.discovery_interval_s(notices_seen=notices_seen),
                on_superseded=on_superseded,
            ),
            modes=modes,
            who=f"worker {self.worker_id}",
            default_stream=config.stream,
            clock=clock,
            throughput=throughput,
            on_taken=self._spawn_for,
            on_renewed=self._renewed,
            on_tick=self._upkeep,
            in_use=self._consumer_running,
        )
        self._holder = self.keeper.holder

    def lags(self) -> dict[str, int]:
        """MillisBehindLatest of each lease's last batch, for the worker-metrics report (``shardlease status``)."""
        return dict(self._lags)

    def lanes(self) -> dict[str, LaneStats]:
        """Records in flight and the watermark's lag of each running lease processed in lanes, for the
        worker-metrics report (``shardlease status``)."""
        with self._guard:
            running = [(key, entry) for key, entry in self._running.items() if entry.thread.is_alive()]
        stats = {key: entry.consumer.lane_stats for key, entry in running}
        return {key: lanes for key, lanes in stats.items() if lanes is not None}

    def start(self) -> None:
        self.keeper.start(name=f"worker-{self.worker_id}")

    def begin_shutdown(self) -> None:
        """Announce the departure (the leader assigns nothing more to us) and take nothing more; the caller then
        sets ``stop`` and asks every consumer to stop after its batch in flight."""
        self.keeper.depart()

    def request_stop_consumers(self) -> list[_Running]:
        with self._guard:
            running = list(self._running.values())
        for entry in running:
            entry.consumer.request_stop()
        return running

    def drain(self, running: list[_Running], deadline: float) -> bool:
        """Wait for the consumers until ``deadline``, give every other lease up at once, end the keeper's thread.
        True if every consumer finished."""
        clean = True
        for entry in running:
            entry.thread.join(max(0.0, deadline - self._clock.monotonic()))
            clean = clean and not entry.thread.is_alive()
        # Leases held but without a running consumer (e.g. waiting to start) are given up too.
        self.keeper.give_up(key for key in self.keeper.held_keys() if not self._consumer_running(key))
        self.keeper.give_up_undiscovered()
        self.keeper.stop(deadline - self._clock.monotonic())
        return clean

    def announce_stopped(self) -> None:
        """Fence, then say ``STOPPED``: whatever a consumer that did not finish still holds may move at once."""
        self.keeper.leave("worker stopped")

    def close(self) -> None:
        self.keeper.close()
        self._lane_loop.close()

    # --- the keeper's hooks -----------------------------------------------------------------------------------

    def _spawn_for(self, lease: Lease) -> None:
        self._spawn(lease.lease_key)
        self._leases_held()  # the gauge moves when the set does, not only at the next renewal

    def _leases_held(self) -> None:
        self._metrics.add(MetricName.LEASES_HELD, len(self.keeper.held_keys()), aggregation="last")

    def _renewed(self, report: RenewalReport | None) -> None:
        self._leases_held()
        if report is None:
            return
        if report.failed:
            self._metrics.add(MetricName.RENEWAL_FAILURES, len(report.failed))
        if report.lost:
            self._metrics.add(MetricName.LEASES_LOST, len(report.lost))

    def _upkeep(self) -> None:
        self._reap()
        now = self._clock.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + self.config.metrics.flush_interval_ms / 1000
            cpu = self._cpu_percent() if self._cpu_percent is not None else None
            if cpu is not None:
                self._metrics.add(MetricName.CPU_UTILIZATION, cpu, unit="Percent", aggregation="last")
            self._metrics.flush()

    def _spawn(self, lease_key: str) -> None:
        processor: RecordProcessor = self._factory()
        stream = stream_name_of(lease_key, self.config.stream)
        consumer = ShardConsumer(
            lease_key=lease_key,
            stream=stream,
            holder=self._holder,
            store=self._store,
            processor=processor,
            kinesis_client=self._kinesis,
            list_shards=functools.partial(self._list_shards, stream),
            config=self.config.consumer,
            initial_timestamp=self.config.initial_timestamp,
            on_bytes=self._record_bytes,
            on_records=self._on_records,
            sources=self._sources,
            failures=self._failures,
            lane_loop=self._lane_loop,
            positions=self._positions,
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

    def _consumer_running(self, lease_key: str) -> bool:
        with self._guard:
            entry = self._running.get(lease_key)
        return entry is not None and entry.thread.is_alive()

    def _reap(self) -> None:
        with self._guard:
            done = [key for key, entry in self._running.items() if not entry.thread.is_alive()]
            finished = [(key, self._running.pop(key)) for key in done]
        for key, entry in finished:
            outcome = entry.outcome or ConsumerOutcome.LOST
            self.outcomes[key] = outcome
            self._throughput.forget(key)
            self._lags.pop(key, None)
            if outcome is ConsumerOutcome.LOST:
                self._holder.drop(key)
                if not self._holder.renewing and not self._holder.fenced:
                    # Worker mode: the leader moves nothing from a live worker but by hand-off, so a lease our consumer
                    # gave up as lost (e.g. it ended just after a lapse of the fence) may well still be ours: look.
                    self.keeper.notice()
            if outcome is ConsumerOutcome.FINISHED:
                self.keeper.note_event()  # child leases were created: the leader assigns them at once
        if finished:
            self._leases_held()

    def _on_records(self, lease_key: str, records: Sequence[KinesisRecord], millis_behind: int | None) -> None:
        self._metrics.add(MetricName.RECORDS_PROCESSED, len(records))
        self._metrics.add(MetricName.BYTES_PROCESSED, sum(len(r.data) for r in records), unit="Bytes")
        if millis_behind is not None:
            self._lags[lease_key] = millis_behind
            self._metrics.add(MetricName.MILLIS_BEHIND_LATEST, millis_behind, unit="Milliseconds", aggregation="max")
        if self._user_on_records is not None:
            self._user_on_records(lease_key, records, millis_behind)

    def _record_bytes(self, lease_key: str, nbytes: int) -> None:
        if nbytes:
            self._throughput.record(lease_key, nbytes)

    def _list_shards(self, stream: str) -> list[ShardInfo]:
        """The stream's shards, for child-lease creation at SHARD_END (cached briefly: several parents may end
        together)."""
        now = self._clock.monotonic()
        cached = self._shard_cache.get(stream)
        if cached is not None and now - cached[0] < 2.0:
            return cached[1]
        detector = self._detectors.get(stream)
        if detector is None:
            detector = self._detectors[stream] = KinesisShardDetector(stream, client=self._kinesis, clock=self._clock)
        listing = detector.list_shards()
        shards = list(listing.shards)
        if listing.complete:
            self._shard_cache[stream] = (now, shards)
        return shards
