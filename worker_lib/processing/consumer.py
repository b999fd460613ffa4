"""One shard consumer per held lease: read, deliver to the processor, checkpoint with fencing, end cleanly.

Lifecycle (docs/kcl-compatibility.md, "Shard sync and lease lifecycle"; docs/worker.md)::

    wait for parents ─▶ initialize ─▶ (fetch ─▶ process_records)* ─┬─▶ SHARD_END: create child leases, record
                                                                    │   childShardIds, shard_ended (must checkpoint)
                                                                    ├─▶ handoff requested: shutdown_requested,
                                                                    │   complete the handoff
                                                                    ├─▶ worker stopping: shutdown_requested, give
                                                                    │   the lease up at once
                                                                    └─▶ lease lost / not renewed: lease_lost

The consumer never delivers a batch while its lease is invalid (self-fencing), and never checkpoints except
through :class:`LeaseCheckpointer`, whose every write is conditional on the lease counter.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import ConfigError, DependencyError, StreamMissingError
from worker_lib.core.models import SHARD_END, Checkpoint, Lease, ShardBlock, ShardInfo
from worker_lib.core.streams import split_lease_key
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.processing.destinations import FailureDestination, FailureReport, describe_error
from worker_lib.processing.failures import (
    BatchDelivery,
    Delivered,
    Failure,
    FailureStats,
    failure_from_exception,
    failure_from_result,
    one_line,
)
from worker_lib.processing.processor import (
    InitializationInput,
    KinesisRecord,
    LeaseLostInput,
    ProcessorFailedError,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownError,
    ShutdownRequestedInput,
)
from worker_lib.retrieval import RecordBatch, RecordSource, ShardRecordFetcher
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.shardsync.children import ParentsEnded, ensure_child_leases
from worker_lib.telemetry.names import WorkerMetric
from worker_lib.telemetry.publisher import MetricsPublisher, NullPublisher

log = logging.getLogger(__name__)

# Builds a lease's record source other than polling (enhanced fan-out): (stream, shard id, checkpoint, timestamp).
RecordSourceFactory = Callable[[str, str, Checkpoint, datetime | None], RecordSource]

ShardLister = Callable[[], Sequence[ShardInfo]]
BytesSink = Callable[[str, int], None]  # (lease_key, bytes delivered)


@dataclass(frozen=True, kw_only=True)
class FailureHandling:
    """What a consumer needs to apply the failure policy (docs/failures.md): the policy, where records given up on
    go, who is reporting, and where the counts are published."""

    config: FailureConfig = field(default_factory=FailureConfig)
    destination: FailureDestination | None = None
    application: str = ""
    worker_id: str = ""
    metrics: MetricsPublisher = field(default_factory=NullPublisher)


class _Interrupted(Exception):
    """A wait inside a delivery was cut short: stop requested or lease lost (the consumer tells which)."""


class ConsumerOutcome(enum.Enum):
    FINISHED = "finished"  # SHARD_END checkpointed
    SHUTDOWN = "shutdown"  # worker stopping; lease given up
    HANDED_OFF = "handed_off"  # graceful handoff completed
    LOST = "lost"  # lease lost or not renewed in time
    GAVE_UP = "gave_up"  # processor kept failing (policy retry): lease given up for a retry from the checkpoint
    STOPPED = "stopped"  # processor kept failing (policy stop-shard): lease given up, marked stopped


# --- the consumer ------------------------------------------------------------------------------------------------


class ShardConsumer:
    """Consumes one leased shard on the calling thread until it ends, is lost, handed off or stopped."""

    def __init__(
        self,
        *,
        lease_key: str,
        stream: str,
        holder: LeaseHolder,
        store: LeaseStore,
        processor: RecordProcessor,
        kinesis_client: object,
        list_shards: ShardLister,
        config: ConsumerConfig | None = None,
        retrieval: RetrievalConfig | None = None,
        initial_timestamp: datetime | None = None,
        on_bytes: BytesSink | None = None,
        on_records: Callable[[str, Sequence[KinesisRecord], int | None], None] | None = None,
        record_source: RecordSourceFactory | None = None,
        failures: FailureHandling | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.lease_key = lease_key
        self.stream = stream
        self._stream_identifier, self.shard_id = split_lease_key(lease_key)
        self._holder = holder
        self._store = store
        self._processor = processor
        self._kinesis = kinesis_client
        self._list_shards = list_shards
        self._config = config or ConsumerConfig()
        self._retrieval = retrieval or RetrievalConfig()
        self._initial_timestamp = initial_timestamp
        self._on_bytes = on_bytes
        self._on_records = on_records
        self._record_source = record_source
        self._failures = failures or FailureHandling()
        self.failure_stats = FailureStats()
        self._block: ShardBlock | None = None  # our failure marker as it stands in the table
        self._clock = clock
        self._stop = threading.Event()
        self.records_delivered = 0
        self.bytes_delivered = 0
        self.millis_behind_latest: int | None = None

    def request_stop(self) -> None:
        """Worker shutdown: finish the batch in flight, let the processor checkpoint, give the lease up."""
        self._stop.set()

    # --- helpers --------------------------------------------------------------------------------------------

    def _wait(self, seconds: float) -> None:
        """Wait up to ``seconds``, waking early on stop (real time uses the event; a manual clock just advances)."""
        end = self._clock.monotonic() + seconds
        while not self._stop.is_set():
            remaining = end - self._clock.monotonic()
            if remaining <= 0:
                return
            self._clock.sleep(min(remaining, 0.1))

    def _lease_lost(self) -> ConsumerOutcome:
        log.info("lease lost lease=%s: stopping processing", self.lease_key)
        self._processor_lease_lost()
        return ConsumerOutcome.LOST

    def _shutdown_requested(self, checkpointer: LeaseCheckpointer) -> None:
        try:
            self._processor.shutdown_requested(
                ShutdownRequestedInput(shard_id=self.shard_id, checkpointer=checkpointer)
            )
        except Exception as exc:
            log.warning("processor.shutdown_requested raised on %s: %s", self.lease_key, one_line(exc))

    def _processor_failed(self, exc: ProcessorFailedError, checkpointer: LeaseCheckpointer) -> ConsumerOutcome:
        """The processor can do nothing more: no retry, no checkpoint; the lease goes back to the leader at once."""
        log.error(
            "%s; lease %s given up without checkpointing: it resumes from checkpoint %s",
            exc,
            self.lease_key,
            checkpointer.last_checkpoint,
        )
        self._holder.evict(self.lease_key)
        return ConsumerOutcome.GAVE_UP

    def _lease_deleted(self) -> bool:
        try:
            return self._store.get_lease(self.lease_key) is None
        except DependencyError:
            return False

    # --- main -----------------------------------------------------------------------------------------------

    def run(self) -> ConsumerOutcome:
        try:
            return self._run()
        finally:
            if self._on_bytes is not None:
                self._on_bytes(self.lease_key, 0)  # let the recorder close the window

    def _run(self) -> ConsumerOutcome:
        lease = self._holder.lease(self.lease_key)
        if lease is None or not self._holder.still_valid(self.lease_key, stop=self._stop):
            return ConsumerOutcome.LOST
        if lease.is_finished:
            self._holder.drop(self.lease_key)
            return ConsumerOutcome.FINISHED
        if lease.is_stopped:
            # an older leader assigned a stopped shard: leave it stopped (shardlease resume-shard ends that)
            log.warning("lease %s is stopped by its failure policy: not processed, given up", self.lease_key)
            self._holder.evict(self.lease_key)
            return ConsumerOutcome.STOPPED
        self._block = lease.block

        parents = ParentsEnded(self._store)
        while not parents.ended(lease):
            if self._stop.is_set():
                self._holder.evict(self.lease_key)
                return ConsumerOutcome.SHUTDOWN
            if not self._holder.still_valid(self.lease_key, stop=self._stop):
                if self._stop.is_set():
                    continue
                return ConsumerOutcome.LOST
            log.debug("lease %s waits for its parents %s", self.lease_key, sorted(lease.parent_shard_ids))
            self._wait(self._config.parent_poll_interval_ms / 1000)

        checkpointer = LeaseCheckpointer(self._holder, self.lease_key, initial=lease.checkpoint)
        timestamp = self._initial_timestamp if lease.checkpoint.sequence == "AT_TIMESTAMP" else None
        if self._record_source is None:
            fetcher: RecordSource = ShardRecordFetcher(
                self.stream,
                lease.shard_id,
                kinesis_client=self._kinesis,
                start=lease.checkpoint,
                timestamp=timestamp,
                clock=self._clock,
                config=self._retrieval,
            )
        else:
            fetcher = self._record_source(self.stream, lease.shard_id, lease.checkpoint, timestamp)
        try:
            return self._consume(lease, checkpointer, fetcher)
        finally:
            fetcher.close()

    def _consume(self, lease: Lease, checkpointer: LeaseCheckpointer, fetcher: RecordSource) -> ConsumerOutcome:
        try:
            self._processor.initialize(
                InitializationInput(
                    shard_id=self.shard_id,
                    checkpoint=lease.checkpoint,
                    pending_checkpoint=lease.pending_checkpoint,
                    stream_name=self.stream,
                    stream_identifier=None if self._stream_identifier is None else self._stream_identifier.serialize(),
                )
            )
        except ProcessorFailedError as exc:
            return self._processor_failed(exc, checkpointer)
        while True:
            if self._stop.is_set():
                self._shutdown_requested(checkpointer)
                fetcher.close()  # before the lease moves: the next owner's subscription must not find ours open
                self._holder.evict(self.lease_key)
                log.info(
                    "lease given up at shutdown lease=%s checkpoint=%s", self.lease_key, checkpointer.last_checkpoint
                )
                return ConsumerOutcome.SHUTDOWN
            if self._holder.handoff_requested(self.lease_key):
                self._shutdown_requested(checkpointer)
                fetcher.close()
                self._holder.complete_handoff(self.lease_key)
                return ConsumerOutcome.HANDED_OFF
            if not self._holder.still_valid(self.lease_key, stop=self._stop):
                if self._stop.is_set():
                    continue  # the stop path above gives it up
                return self._lease_lost()
            delay = fetcher.seconds_until_next_call()
            if delay > 0:  # wait here, where a shutdown or a handoff interrupts the wait, not inside fetch()
                self._wait(delay)
                continue
            try:
                batch = fetcher.fetch()
            except StreamMissingError as exc:
                if self._lease_deleted():
                    # The stream is gone and the leader deleted its leases (docs/multi-stream.md): stop here, as for
                    # any lost lease, rather than retry a read that can never succeed (in worker liveness mode
                    # nothing else would tell us).
                    log.info("lease %s was deleted with its stream (%s): consumer stopped", self.lease_key, exc)
                    return self._lease_lost()
                log.warning("reading %s failed: %s", self.lease_key, exc)
                self._wait(self._config.error_backoff_ms / 1000)
                continue
            except DependencyError as exc:
                log.warning("reading %s failed: %s", self.lease_key, exc)
                self._wait(self._config.error_backoff_ms / 1000)
                continue
            if not self._holder.still_valid(self.lease_key, stop=self._stop):
                return self._lease_lost()  # never deliver what we may no longer own
            if batch.records or (self._config.deliver_empty_batches and not batch.end_of_shard):
                checkpointer.largest_permitted = fetcher.last_delivered
                outcome = self._deliver(batch, checkpointer)
                if outcome is not None:
                    return outcome
            elif batch.millis_behind_latest is not None:
                self.millis_behind_latest = batch.millis_behind_latest
            if batch.end_of_shard:
                return self._shard_end(batch, checkpointer)

    def _deliver(self, batch: RecordBatch, checkpointer: LeaseCheckpointer) -> ConsumerOutcome | None:
        """Deliver one batch under the failure policy (:mod:`worker_lib.processing.failures`)."""
        ports = _DeliveryPorts(self, batch, checkpointer)
        delivery = BatchDelivery(
            config=self._failures.config, ports=ports, lease_key=self.lease_key, now=self._clock.wall()
        )
        try:
            if batch.records:
                delivered = delivery.run(batch.records, at_shard_end=batch.end_of_shard)
            else:  # an empty batch (deliver_empty_batches): nothing to retry or record
                failure = ports.process((), at_shard_end=batch.end_of_shard)
                delivered = Delivered.DONE
                if failure is not None:
                    log.warning("processor failed on an empty batch of %s: %s", self.lease_key, failure.error)
        except ShutdownError:
            return self._lease_lost()
        except ProcessorFailedError as exc:
            return self._processor_failed(exc, checkpointer)
        except _Interrupted:
            delivered = Delivered.INTERRUPTED
        finally:
            self._count_failures(delivery.stats)
        if delivered is Delivered.INTERRUPTED:
            # the loop gives the lease up (stop) or reports it lost; nothing past the last checkpoint is lost
            return None if self._holder.is_valid(self.lease_key) else self._lease_lost()
        if delivered is Delivered.GIVE_UP:
            self._holder.evict(self.lease_key)
            return ConsumerOutcome.GAVE_UP
        if delivered is Delivered.STOP_SHARD:
            return self._stop_shard(delivery)
        size = batch.data_bytes
        self.records_delivered += len(batch.records)
        self.bytes_delivered += size
        self.millis_behind_latest = batch.millis_behind_latest
        if self._on_bytes is not None:
            self._on_bytes(self.lease_key, size)
        if self._on_records is not None:
            self._on_records(self.lease_key, batch.records, batch.millis_behind_latest)
        return None

    def _stop_shard(self, delivery: BatchDelivery) -> ConsumerOutcome:
        at = delivery.stopped_at
        failure = delivery.last_failure
        assert at is not None and failure is not None
        block = ShardBlock(
            state=ShardBlock.STOPPED,
            since=self._block.since if self._block is not None else self._clock.wall(),
            attempts=self._failures.config.max_attempts,
            error=type(failure.error).__name__,
            at=at.checkpoint,
            worker=self._failures.worker_id or self._holder.worker_id,
        )
        self._processor_lease_lost()
        stopped = self._holder.stop_shard(self.lease_key, block)
        log.error(
            "shard %s STOPPED at record %s after %d failed deliveries (%s; policy stop-shard%s): nothing more is "
            "processed on it until `shardlease resume-shard --app %s --shard %s`",
            self.lease_key,
            at.checkpoint,
            block.attempts,
            one_line(failure.error),
            "" if stopped else "; the mark could not be written, the lease was given up",
            self._failures.application or "APP",
            self.lease_key,
        )
        return ConsumerOutcome.STOPPED

    def _processor_lease_lost(self) -> None:
        try:
            self._processor.lease_lost(LeaseLostInput(shard_id=self.shard_id))
        except Exception as exc:
            log.warning("processor.lease_lost raised on %s: %s", self.lease_key, one_line(exc))

    def _count_failures(self, stats: FailureStats) -> None:
        """Add one delivery's counts to the consumer's and publish them (nothing to do for a clean batch)."""
        if not stats:
            return
        self.failure_stats.add(stats)
        for field_name, metric in _FAILURE_METRICS.items():
            count = getattr(stats, field_name)
            if count:
                self._failures.metrics.add(metric, count)

    # --- SHARD_END ------------------------------------------------------------------------------------------

    def _child_leases_ready(self, children: Sequence[str]) -> bool:
        if not children:
            return True
        shards = {shard.shard_id: shard for shard in self._list_shards()}
        return ensure_child_leases(self._store, self.lease_key, children, shards)

    def _shard_end(self, batch: RecordBatch, checkpointer: LeaseCheckpointer) -> ConsumerOutcome:
        children = list(batch.child_shards)
        while True:
            if self._stop.is_set():
                self._shutdown_requested(checkpointer)
                self._holder.evict(self.lease_key)
                return ConsumerOutcome.SHUTDOWN
            if not self._holder.still_valid(self.lease_key, stop=self._stop):
                if self._stop.is_set():
                    continue
                return self._lease_lost()
            try:
                ready = self._child_leases_ready(children)
                if ready and children:
                    self._holder.update_child_shard_ids(self.lease_key, children)
                if ready:
                    checkpointer.end_shard()
                    self._processor.shard_ended(
                        ShardEndedInput(
                            shard_id=self.shard_id, checkpointer=checkpointer, child_shard_ids=tuple(children)
                        )
                    )
                    if checkpointer.last_checkpoint == SHARD_END:
                        self._holder.drop(self.lease_key)
                        log.info("shard ended lease=%s children=%s", self.lease_key, ",".join(children) or "-")
                        return ConsumerOutcome.FINISHED
                    log.error(
                        "processor did not checkpoint SHARD_END on %s: its children cannot start; retrying",
                        self.lease_key,
                    )
            except ShutdownError:
                return self._lease_lost()
            except ProcessorFailedError as exc:
                return self._processor_failed(exc, checkpointer)
            except DependencyError as exc:
                log.warning("SHARD_END handling for %s failed: %s", self.lease_key, exc)
            except Exception as exc:
                log.error("processor.shard_ended raised on %s: %s", self.lease_key, one_line(exc))
            self._wait(self._config.shard_end_retry_interval_ms / 1000)


_FAILURE_METRICS = {
    "failures": WorkerMetric.PROCESSOR_FAILURES,
    "retries": WorkerMetric.BATCH_RETRIES,
    "bisections": WorkerMetric.BATCH_BISECTIONS,
    "recorded": WorkerMetric.RECORDS_TO_DESTINATION,
    "expired": WorkerMetric.RECORDS_TO_DESTINATION,
    "skipped": WorkerMetric.RECORDS_SKIPPED,
}


class _DeliveryPorts:
    """The consumer's I/O for one batch's delivery (:class:`~worker_lib.processing.failures.BatchPorts`)."""

    def __init__(self, consumer: ShardConsumer, batch: RecordBatch, checkpointer: LeaseCheckpointer) -> None:
        self._consumer = consumer
        self._batch = batch
        self._checkpointer = checkpointer
        self._attempt = 0

    def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        consumer, batch = self._consumer, self._batch
        now = datetime.fromtimestamp(consumer._clock.wall(), timezone.utc)
        entry = now if batch.received_at is None else datetime.fromtimestamp(batch.received_at, timezone.utc)
        if records:  # a checkpoint without arguments means "this sub-batch's last record"
            self._checkpointer.largest_permitted = records[-1].checkpoint
        self._attempt += 1
        try:
            result = consumer._processor.process_records(
                ProcessRecordsInput(
                    shard_id=consumer.shard_id,
                    records=records,
                    checkpointer=self._checkpointer,
                    millis_behind_latest=batch.millis_behind_latest,
                    cache_entry_time=entry,
                    cache_exit_time=now,
                    is_at_shard_end=at_shard_end,
                )
            )
        except (ShutdownError, ProcessorFailedError):
            raise
        except Exception as exc:
            failure = failure_from_exception(exc, records)
        else:
            found = failure_from_result(result, records)
            if found is None:
                return None
            failure = found
        first = records[failure.first_failed].checkpoint if records else "-"
        log.error(
            "processor failed on %s: %d records from %s (delivery %d of this batch): %s",
            consumer.lease_key,
            len(records) - failure.first_failed,
            first,
            self._attempt,
            one_line(failure.error),
        )
        return failure

    def checkpoint(self, record: KinesisRecord) -> None:
        last = self._checkpointer.last_checkpoint
        if last is not None and not last.is_sentinel and not record.checkpoint.is_after(last):
            return  # the processor checkpointed this far already
        largest = self._checkpointer.largest_permitted
        if largest is None or (not largest.is_sentinel and record.checkpoint.is_after(largest)):
            self._checkpointer.largest_permitted = record.checkpoint  # records sent to the destination unread
        self._checkpointer.checkpoint_record(record)

    def record(self, records: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None) -> None:
        consumer = self._consumer
        handling = consumer._failures
        destination = handling.destination
        if destination is None:
            raise ConfigError("the failure policy needs a destination, and the worker has none")
        error_type, message = describe_error(None if error is None else error.error)
        report = FailureReport(
            application=handling.application,
            worker_id=handling.worker_id,
            stream=consumer.stream,
            shard_id=consumer.shard_id,
            condition=condition,
            attempts=attempts,
            records=records,
            error_type=error_type,
            error_message=message,
            at=consumer._clock.wall(),
        )
        delay = 0.5
        while True:
            try:
                destination.send(report)
                log.info(
                    "%d records of %s (%s..%s) sent to %s (%s)",
                    len(records),
                    consumer.lease_key,
                    records[0].checkpoint,
                    records[-1].checkpoint,
                    destination.description,
                    condition,
                )
                return
            except DependencyError as exc:
                handling.metrics.add(WorkerMetric.DESTINATION_FAILURES, 1)
                log.warning(
                    "failure destination %s failed for %s, retrying in %.1f s (the shard waits): %s",
                    destination.description,
                    consumer.lease_key,
                    delay,
                    exc,
                )
                if not self.wait(delay):
                    raise _Interrupted from exc
                delay = min(delay * 2, 30.0)

    def wait(self, seconds: float) -> bool:
        consumer = self._consumer
        consumer._wait(seconds)
        return not consumer._stop.is_set() and consumer._holder.still_valid(consumer.lease_key, stop=consumer._stop)

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        consumer = self._consumer
        current = consumer._block
        if failure is None:
            if current is None:
                return
            block: ShardBlock | None = None
        else:
            block = ShardBlock(
                state=ShardBlock.RETRYING,
                since=current.since if current is not None else consumer._clock.wall(),
                attempts=attempts,
                error=type(failure.error).__name__,
                at=records[0].checkpoint,
                worker=consumer._failures.worker_id or consumer._holder.worker_id,
            )
        if consumer._holder.mark_block(consumer.lease_key, block) is not None:
            consumer._block = block
