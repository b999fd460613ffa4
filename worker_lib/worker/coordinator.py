"""Lease coordination inside a worker: which leases it holds and the consumers that process them.

One coordinator thread renews held leases every renewer interval (failover / 3 − ε) in ``lease`` liveness mode (in
``worker`` mode the heartbeat alone keeps them and throughput is written only when it changed; it follows the stored
mode, docs/liveness-modes.md), and discovers newly assigned ones — at once when the heartbeat brings the leader's
notice, else every discovery interval; one consumer thread per lease reads and processes its shard; a heartbeat
thread tells the leader every beat that this worker is alive (and fences it when it cannot, docs/failover.md).
:class:`~worker_lib.worker.worker.Worker` composes it with the metrics reporter, the embedded leader and the process
lifecycle.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import ShardInfo, WorkerState
from worker_lib.core.streams import stream_name_of
from worker_lib.leases.keeping import (
    NoticeBox,
    apply_liveness_mode,
    give_up_undiscovered,
    heartbeat_loop,
    mode_follower,
    released,
)
from worker_lib.leases.mode import StoredMode
from worker_lib.leases.mode_store import LivenessModeSource
from worker_lib.leases.renewer import LeaseDiscoverer, LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.consumer import ConsumerOutcome, ShardConsumer
from worker_lib.processing.processor import KinesisRecord, ProcessorFactory, RecordProcessor
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.telemetry.names import WorkerMetric as MetricName
from worker_lib.telemetry.publisher import MetricsPublisher
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

if TYPE_CHECKING:
    from worker_lib.worker.worker import WorkerConfig

log = logging.getLogger(__name__)


class ThroughputTracker(Protocol):
    """Per-lease throughput for the leader (KCL's throughputKBps, docs/kcl-compatibility.md): bytes in, KBps out at each
    renewal."""

    def record(self, lease_key: str, nbytes: int) -> None: ...

    def renewal_value(self, lease_key: str) -> float | None: ...

    def seed(self, lease_key: str, kbps: float | None) -> None: ...

    def forget(self, lease_key: str) -> None: ...


@dataclass
class _Running:
    consumer: ShardConsumer
    thread: threading.Thread
    outcome: ConsumerOutcome | None = None


class LeaseCoordinator:
    """Renewal, discovery, notices and one consumer per held lease, for one worker.

    ``stop`` is the worker's stop event: once set, nothing new is taken, while the leases whose consumers still
    finish their batch keep being renewed until :meth:`drain` ends the coordinator thread.
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
    ) -> None:
        self.config = config
        self._cpu_percent = cpu_percent
        self.worker_id = config.worker_id
        self._store = store
        self._kinesis = kinesis
        self._factory = processor_factory
        self._worker_metrics = worker_metrics
        self._throughput = throughput
        self._metrics = metrics
        self._user_on_records = on_records
        self._clock = clock
        self._stop = stop
        self._notices = NoticeBox()
        self._holder = LeaseHolder(
            store,
            self.worker_id,
            config=config.lease,
            clock=clock,
            throughput=throughput.renewal_value,
            on_release=self._on_release,
            in_use=self._consumer_running,
        )
        self._heartbeat = heartbeat_loop(
            config.lease, worker_metrics, self.worker_id, holder=self._holder, on_notice=self._notices.put, clock=clock
        )
        self._modes = mode_follower(config.lease, modes, who=f"worker {self.worker_id}", clock=clock)
        self._discoverer = LeaseDiscoverer(store, self.worker_id)
        self._detectors: dict[str, KinesisShardDetector] = {}  # per stream: a multi-stream worker reads several
        self._running: dict[str, _Running] = {}
        self._lags: dict[str, int] = {}  # MillisBehindLatest of each running lease's last batch (status view)
        self._guard = threading.Lock()
        self._coordinator_stop = threading.Event()  # set after the consumers finished: renewals go on until then
        self._thread: threading.Thread | None = None
        self._shard_cache: dict[str, tuple[float, list[ShardInfo]]] = {}
        self.renewal_failures = 0
        self.outcomes: dict[str, ConsumerOutcome] = {}

    @property
    def held_leases(self) -> list[str]:
        return self._holder.held_keys()

    def lags(self) -> dict[str, int]:
        """MillisBehindLatest of each lease's last batch, for the worker-metrics report (``shardlease status``)."""
        return dict(self._lags)

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def liveness(self) -> StoredMode:
        return self._modes.current

    def start_heartbeat(self) -> None:
        """Read the liveness mode (refusing a configured one that disagrees), then start beating."""
        apply_liveness_mode(self._modes.start(), self._holder, self._heartbeat, self.config.lease)
        if self._heartbeat is not None:
            self._heartbeat.start()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._coordinate, name=f"worker-{self.worker_id}", daemon=True)
        self._thread.start()

    def begin_shutdown(self) -> None:
        """Announce the departure (the leader assigns nothing more to us), then ask every consumer to stop after
        its batch in flight. The caller has set ``stop``."""
        if self._heartbeat is not None and self.started:  # first: from now on the leader assigns nothing more to us
            self._heartbeat.announce(WorkerState.DEPARTING)

    def request_stop_consumers(self) -> list[_Running]:
        with self._guard:
            running = list(self._running.values())
        for entry in running:
            entry.consumer.request_stop()
        return running

    def drain(self, running: list[_Running], deadline: float) -> bool:
        """Wait for the consumers until ``deadline``, give every other lease up at once, end the coordinator
        thread. True if every consumer finished."""
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
        give_up_undiscovered(self._holder, self._discoverer, self._store, self.worker_id)
        self._coordinator_stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - self._clock.monotonic()))
        return clean

    def announce_stopped(self) -> None:
        if self._heartbeat is not None and self.started:
            # Fence first, then say so: whatever a consumer that did not finish still holds may move at once.
            self._holder.fence_all("worker stopped")
            self._heartbeat.stop()
            self._heartbeat.announce(WorkerState.STOPPED)

    def close(self) -> None:
        self._holder.close()

    # --- coordinator thread ---------------------------------------------------------------------------------

    def _coordinate(self) -> None:
        next_renewal = self._clock.monotonic()
        next_discovery = self._clock.monotonic()
        next_flush = self._clock.monotonic() + self.config.metrics.flush_interval_ms / 1000
        throughput_s = self.config.lease.throughput_update_interval_ms / 1000
        next_throughput = self._clock.monotonic() + throughput_s
        while not self._coordinator_stop.is_set():
            now = self._clock.monotonic()
            changed = self._modes.poll()
            if changed is not None and apply_liveness_mode(changed, self._holder, self._heartbeat, self.config.lease):
                next_renewal = now
            if self._stop.is_set():
                # Shutting down: no new leases, but the ones whose consumers still finish their batch and checkpoint
                # keep being renewed (in worker mode: the heartbeat keeps them), so that a slow final checkpoint is
                # not lost to expiry.
                if now >= next_renewal and self._holder.renewing:
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
            if self._holder.fenced:
                # The heartbeat fence ran out: every lease is invalid and nothing may be taken until a beat lands
                # (the heartbeat loop then asks for a look at what is still ours).
                self._reap()
                self._sleep(0.05)
                continue
            try:
                if now >= next_renewal:
                    next_renewal = now + self.config.renewer_interval_s
                    if self._holder.renewing:
                        self._renew()
                    else:
                        self._metrics.add(MetricName.LEASES_HELD, len(self._holder.held_keys()), aggregation="last")
                if now >= next_throughput:
                    next_throughput = now + throughput_s
                    if not self._holder.renewing:
                        self._holder.refresh_throughput()
                noticed = self._notices.take()
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
                    cpu = self._cpu_percent() if self._cpu_percent is not None else None
                    if cpu is not None:
                        self._metrics.add(MetricName.CPU_UTILIZATION, cpu, unit="Percent", aggregation="last")
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
        self._metrics.add(MetricName.LEASES_HELD, len(self._holder.held_keys()), aggregation="last")
        if report.failed:
            self._metrics.add(MetricName.RENEWAL_FAILURES, len(report.failed))
        if report.lost:
            self._metrics.add(MetricName.LEASES_LOST, len(report.lost))

    def _discover(self, keys: Sequence[str] | None = None) -> None:
        with self._guard:
            busy = set(self._running)
        held = set(self._holder.held_keys()) | busy
        found = self._discoverer.discover(held) if keys is None else self._discoverer.discover_keys(keys, held)
        for lease in found:
            if self._stop.is_set():
                return
            if not stream_name_of(lease.lease_key, self.config.stream):
                # A bare shard-id key in an application of several streams: no way to tell which stream it reads.
                log.warning("lease %s names no stream and this worker has several: not taken", lease.lease_key)
                continue
            self._throughput.seed(lease.lease_key, lease.throughput_kbps)
            if self._holder.take(lease):
                self._spawn(lease.lease_key)

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
                    self._notices.put(None)
            if outcome is ConsumerOutcome.FINISHED and self._heartbeat is not None:
                self._heartbeat.note_event()  # child leases were created: the leader assigns them at once

    def _on_records(self, lease_key: str, records: Sequence[KinesisRecord], millis_behind: int | None) -> None:
        self._metrics.add(MetricName.RECORDS_PROCESSED, len(records))
        self._metrics.add(MetricName.BYTES_PROCESSED, sum(len(r.data) for r in records), unit="Bytes")
        if millis_behind is not None:
            self._lags[lease_key] = millis_behind
            self._metrics.add(MetricName.MILLIS_BEHIND_LATEST, millis_behind, unit="Milliseconds", aggregation="max")
        if self._user_on_records is not None:
            self._user_on_records(lease_key, records, millis_behind)

    # --- notices (docs/failover.md) ---------------------------------------------------------------------------

    def _on_release(self, lease_key: str, new_owner: str | None) -> None:
        released(lease_key, new_owner, notices=self._worker_metrics, heartbeat=self._heartbeat)

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
