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
from dataclasses import dataclass
from datetime import datetime, timezone

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError, StreamMissingError
from worker_lib.core.models import SHARD_END, Checkpoint, Lease, ShardInfo
from worker_lib.core.streams import split_lease_key
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.config import ConsumerConfig, ProcessorFailurePolicy, RetrievalConfig
from worker_lib.processing.processor import (
    InitializationInput,
    KinesisRecord,
    LeaseLostInput,
    PreparedCheckpointer,
    ProcessorFailedError,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownError,
    ShutdownRequestedInput,
    validate_checkpoint_value,
)
from worker_lib.processing.retrieval import RecordBatch, RecordSource, ShardRecordFetcher
from worker_lib.shardsync.children import ParentsEnded, ensure_child_leases

log = logging.getLogger(__name__)

# Builds a lease's record source other than polling (enhanced fan-out): (stream, shard id, checkpoint, timestamp).
RecordSourceFactory = Callable[[str, str, Checkpoint, datetime | None], RecordSource]

ShardLister = Callable[[], Sequence[ShardInfo]]
BytesSink = Callable[[str, int], None]  # (lease_key, bytes delivered)


class ConsumerOutcome(enum.Enum):
    FINISHED = "finished"  # SHARD_END checkpointed
    SHUTDOWN = "shutdown"  # worker stopping; lease given up
    HANDED_OFF = "handed_off"  # graceful handoff completed
    LOST = "lost"  # lease lost or not renewed in time
    GAVE_UP = "gave_up"  # processor kept failing (policy STOP): lease given up for a retry from the checkpoint


# --- checkpointer ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    checkpointer: LeaseCheckpointer
    value: Checkpoint

    @property
    def pending_checkpoint(self) -> Checkpoint:
        return self.value

    def checkpoint(self) -> None:
        self.checkpointer._write(self.value)


class LeaseCheckpointer:
    """The :class:`~worker_lib.processing.processor.Checkpointer` handed to processors for one lease."""

    def __init__(self, holder: LeaseHolder, lease_key: str, *, initial: Checkpoint) -> None:
        self._holder = holder
        self._lease_key = lease_key
        self._last: Checkpoint | None = initial
        self.largest_permitted: Checkpoint | None = None  # the last delivered record, or SHARD_END at the end
        self.last_record_at_shard_end: Checkpoint | None = None  # once the shard ended: its last record
        self.writes = 0

    def end_shard(self) -> None:
        """The shard ended: ``checkpoint()`` now writes SHARD_END, and so does a checkpoint at the shard's last
        record (KCL's sequenceNumberAtShardEnd: MultiLang clients checkpoint a record, not SHARD_END)."""
        if self.largest_permitted != SHARD_END:
            self.last_record_at_shard_end = self.largest_permitted
            self.largest_permitted = SHARD_END

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        return self._last

    def _value(self, sequence: str | None, sub_sequence: int) -> Checkpoint | None:
        if sequence is None:
            return self.largest_permitted  # None: nothing delivered yet, nothing to record
        largest = self.largest_permitted
        if largest == SHARD_END and sequence != SHARD_END.sequence:
            last = self.last_record_at_shard_end
            if last is not None and Checkpoint(sequence=sequence, sub_sequence=sub_sequence) == last:
                return SHARD_END
            largest = last  # a number beyond the shard's last record is refused, as before the end
        return validate_checkpoint_value(sequence, sub_sequence, last_checkpoint=self._last, largest_permitted=largest)

    def _write(self, value: Checkpoint) -> None:
        if self._last is not None and value == self._last:
            return  # already recorded: spare a write
        # Infrastructure errors (throttling, 5xx, timeouts beyond botocore's own retries) are retried here while
        # the lease is still valid: letting them out of process_records would make the consumer deliver the same
        # batch again — duplicates without any ownership change.
        delay = 0.2
        while True:
            try:
                written = self._holder.checkpoint(self._lease_key, value)
                break
            except DependencyError as exc:
                if not self._holder.is_valid(self._lease_key):
                    raise ShutdownError(
                        f"lease {self._lease_key}: checkpoint could not be written before the lease ran out ({exc})"
                    ) from exc
                log.warning("checkpoint on %s failed, retrying in %.1f s: %s", self._lease_key, delay, exc)
                self._holder.clock.sleep(delay)
                delay = min(delay * 2, 2.0)
        if written is None:
            raise ShutdownError(f"lease {self._lease_key} is no longer held by this worker; checkpoint not written")
        self._last = value
        self.writes += 1

    def checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None:
        value = self._value(sequence, sub_sequence)
        if value is not None:
            self._write(value)

    def checkpoint_record(self, record: KinesisRecord) -> None:
        self.checkpoint(record.sequence_number, record.sub_sequence_number)

    def prepare_checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> PreparedCheckpointer:
        value = self._value(sequence, sub_sequence)
        if value is None:
            raise ShutdownError(f"nothing delivered on {self._lease_key} yet: no checkpoint to prepare")
        if self._holder.prepare_checkpoint(self._lease_key, value) is None:
            raise ShutdownError(f"lease {self._lease_key} is no longer held by this worker; nothing prepared")
        return _Prepared(self, value)

    def prepare_checkpoint_record(self, record: KinesisRecord) -> PreparedCheckpointer:
        return self.prepare_checkpoint(record.sequence_number, record.sub_sequence_number)


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
        try:
            self._processor.lease_lost(LeaseLostInput(shard_id=self.shard_id))
        except Exception as exc:
            log.warning("processor.lease_lost raised on %s: %s", self.lease_key, _one_line(exc))
        return ConsumerOutcome.LOST

    def _shutdown_requested(self, checkpointer: LeaseCheckpointer) -> None:
        try:
            self._processor.shutdown_requested(
                ShutdownRequestedInput(shard_id=self.shard_id, checkpointer=checkpointer)
            )
        except Exception as exc:
            log.warning("processor.shutdown_requested raised on %s: %s", self.lease_key, _one_line(exc))

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
        if lease is None or not self._holder.is_valid(self.lease_key):
            return ConsumerOutcome.LOST
        if lease.is_finished:
            self._holder.drop(self.lease_key)
            return ConsumerOutcome.FINISHED

        parents = ParentsEnded(self._store)
        while not parents.ended(lease):
            if self._stop.is_set():
                self._holder.evict(self.lease_key)
                return ConsumerOutcome.SHUTDOWN
            if not self._holder.is_valid(self.lease_key):
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
            if not self._holder.is_valid(self.lease_key):
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
            if not self._holder.is_valid(self.lease_key):
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
        now = datetime.fromtimestamp(self._clock.wall(), timezone.utc)
        entry = now if batch.received_at is None else datetime.fromtimestamp(batch.received_at, timezone.utc)
        records_input = ProcessRecordsInput(
            shard_id=self.shard_id,
            records=batch.records,
            checkpointer=checkpointer,
            millis_behind_latest=batch.millis_behind_latest,
            cache_entry_time=entry,
            cache_exit_time=now,
            is_at_shard_end=batch.end_of_shard,
        )
        backoff_s = self._config.processor_retry_backoff_ms / 1000
        attempts = 1 + self._config.processor_retries
        for attempt in range(1, attempts + 1):
            try:
                self._processor.process_records(records_input)
                break
            except ShutdownError:
                return self._lease_lost()
            except ProcessorFailedError as exc:
                return self._processor_failed(exc, checkpointer)
            except Exception as exc:
                records = batch.records
                first, last = (records[0].checkpoint, records[-1].checkpoint) if records else ("-", "-")
                log.error(
                    "processor failed on %s records %s..%s (attempt %d of %d): %s",
                    self.lease_key,
                    first,
                    last,
                    attempt,
                    attempts,
                    _one_line(exc),
                )
                if attempt == attempts:
                    if self._config.failure_policy is ProcessorFailurePolicy.SKIP:
                        log.error("skipping %d records on %s (policy skip)", len(batch.records), self.lease_key)
                        break
                    log.error(
                        "giving lease %s up without checkpointing (policy stop): the batch will be read again "
                        "from checkpoint %s",
                        self.lease_key,
                        checkpointer.last_checkpoint,
                    )
                    self._holder.evict(self.lease_key)
                    return ConsumerOutcome.GAVE_UP
                self._wait(backoff_s)
                backoff_s *= 2
                if not self._holder.is_valid(self.lease_key):
                    return self._lease_lost()
        size = batch.data_bytes
        self.records_delivered += len(batch.records)
        self.bytes_delivered += size
        self.millis_behind_latest = batch.millis_behind_latest
        if self._on_bytes is not None:
            self._on_bytes(self.lease_key, size)
        if self._on_records is not None:
            self._on_records(self.lease_key, batch.records, batch.millis_behind_latest)
        return None

    # --- SHARD_END ------------------------------------------------------------------------------------------

    def _child_leases_ready(self, children: Sequence[str]) -> bool:
        if not children:
            return True
        shards = {shard.shard_id: shard for shard in self._list_shards()}
        return ensure_child_leases(self._store, self.lease_key, children, shards)

    def _shard_end(self, batch: RecordBatch, checkpointer: LeaseCheckpointer) -> ConsumerOutcome:
        children = list(batch.child_shards)
        while True:
            if not self._holder.is_valid(self.lease_key):
                return self._lease_lost()
            if self._stop.is_set():
                self._shutdown_requested(checkpointer)
                self._holder.evict(self.lease_key)
                return ConsumerOutcome.SHUTDOWN
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
                log.error("processor.shard_ended raised on %s: %s", self.lease_key, _one_line(exc))
            self._wait(self._config.shard_end_retry_interval_ms / 1000)


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
