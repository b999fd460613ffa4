"""One lease's deliveries: each batch to the processor under the failure policy, through explicit collaborators.

:class:`Deliveries` runs every batch of one lease through :class:`~worker_lib.processing.failures.BatchDelivery`
(the policy's rules) with a :class:`DeliveryPorts` (one batch's I/O: the processor, the checkpointer, the failure
destination, the shard's mark in the table, the wait), and counts and publishes what the policy did. Neither sees
the consumer: a :class:`DeliveryContext` gives them the processor's lifecycle (the processor and the shard's
identity), the holder (only through :class:`ShardMark`), the :class:`FailureHandling`, the clock, and a ``wait``
that ends with the consumer's transition guard (False: stop here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol

from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.clock import Clock
from worker_lib.core.errors import ConfigError, DependencyError
from worker_lib.core.models import Checkpoint, ShardBlock
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.config import FailureConfig
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
from worker_lib.processing.lifecycle import ProcessorLifecycle
from worker_lib.processing.outputs import StagedOutputs
from worker_lib.processing.processor import (
    Checkpointer,
    KinesisRecord,
    ProcessorFailedError,
    ProcessRecordsInput,
    RecordProcessor,
    ShutdownError,
)
from worker_lib.retrieval import RecordBatch
from worker_lib.telemetry.names import WorkerMetric
from worker_lib.telemetry.publisher import MetricsPublisher, NullPublisher

log = logging.getLogger(__name__)

# Wait up to the seconds given; False if the consumer must stop now (its guard: stop, hand-off, lease lost).
Wait = Callable[[float], bool]

# A destination that cannot take a report holds the shard: retried from 0.5 s, doubling to 30 s, exact (one caller).
DESTINATION_BACKOFF = Backoff(base_s=0.5, max_s=30.0)

_FAILURE_METRICS = {
    "failures": WorkerMetric.PROCESSOR_FAILURES,
    "retries": WorkerMetric.BATCH_RETRIES,
    "bisections": WorkerMetric.BATCH_BISECTIONS,
    "recorded": WorkerMetric.RECORDS_TO_DESTINATION,
    "expired": WorkerMetric.RECORDS_TO_DESTINATION,
    "skipped": WorkerMetric.RECORDS_SKIPPED,
}


@dataclass(frozen=True, kw_only=True)
class FailureHandling:
    """What a consumer needs to apply the failure policy (docs/failures.md): the policy, where records given up on
    go, who is reporting, and where the counts are published."""

    config: FailureConfig = field(default_factory=FailureConfig)
    destination: FailureDestination | None = None
    application: str = ""
    worker_id: str = ""
    metrics: MetricsPublisher = field(default_factory=NullPublisher)
    stream_arns: Callable[[str], str | None] | None = None  # a stream's ARN, which the reports name (Lambda's shape)


class Interrupted(Exception):
    """A wait inside a delivery was cut short (stop, hand-off or lease lost: the consumer's guard tells which)."""


class ShardMark:
    """The lease's failure mark (:class:`ShardBlock`) as it stands in the table, written through the holder."""

    def __init__(self, holder: LeaseHolder, lease_key: str, *, worker_id: str, clock: Clock) -> None:
        self._holder = holder
        self._lease_key = lease_key
        self._worker_id = worker_id or holder.worker_id
        self._clock = clock
        self.block: ShardBlock | None = None  # set from the lease when the consumer starts

    def _next(self, state: str, *, attempts: int, failure: Failure, at: KinesisRecord) -> ShardBlock:
        current = self.block
        return ShardBlock(
            state=state,
            since=current.since if current is not None else self._clock.wall(),
            attempts=attempts,
            error=type(failure.error).__name__,
            at=at.checkpoint,
            worker=self._worker_id,
        )

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        """Mark the shard held up at ``records[0]`` (failure None: remove the mark, if there is one)."""
        if failure is None:
            if self.block is None:
                return
            block: ShardBlock | None = None
        else:
            block = self._next(ShardBlock.RETRYING, attempts=attempts, failure=failure, at=records[0])
        if self._holder.mark_block(self._lease_key, block) is not None:
            self.block = block

    def stop(self, at: KinesisRecord, *, attempts: int, failure: Failure) -> tuple[ShardBlock, bool]:
        """Give the lease up marked stopped at ``at``; the mark, and whether it was written."""
        block = self._next(ShardBlock.STOPPED, attempts=attempts, failure=failure, at=at)
        return block, self._holder.stop_shard(self._lease_key, block)


@dataclass(frozen=True, kw_only=True)
class DeliveryContext:
    """What every delivery of one lease works with."""

    lifecycle: ProcessorLifecycle  # the processor and the shard it works on
    mark: ShardMark  # the holder, for the shard's failure mark
    failures: FailureHandling
    clock: Clock
    wait: Wait


class BatchCheckpointer(Checkpointer, Protocol):
    """The checkpointer a delivery hands the processor: the lease's (one lane), or a lane's."""

    largest_permitted: Checkpoint | None  # what a checkpoint without arguments records
    outputs: StagedOutputs  # the lease's staged DynamoDB outputs


class DeliveryPorts:
    """One batch's I/O for the failure policy (:class:`~worker_lib.processing.failures.BatchPorts`)."""

    def __init__(self, context: DeliveryContext, *, batch: RecordBatch, checkpointer: BatchCheckpointer) -> None:
        self._context = context
        self._shard = context.lifecycle.shard
        self._clock = context.clock
        self._batch = batch
        self._checkpointer = checkpointer
        self._attempt = 0

    @property
    def processor(self) -> RecordProcessor:
        return self._context.lifecycle.processor

    def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        given = self.input_for(records, at_shard_end=at_shard_end)
        try:
            result = self._context.lifecycle.processor.process_records(given)
        except (ShutdownError, ProcessorFailedError):
            raise
        except Exception as exc:
            return self.judge(records, error=exc)
        return self.judge(records, result=result)

    def input_for(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> ProcessRecordsInput:
        """What ``process_records`` is given for ``records``; counts the delivery."""
        batch = self._batch
        now = datetime.fromtimestamp(self._clock.wall(), timezone.utc)
        entry = now if batch.received_at is None else datetime.fromtimestamp(batch.received_at, timezone.utc)
        if records:  # a checkpoint without arguments means "this sub-batch's last record"
            self._checkpointer.largest_permitted = records[-1].checkpoint
        self._attempt += 1
        return ProcessRecordsInput(
            shard_id=self._shard.shard_id,
            records=records,
            checkpointer=self._checkpointer,
            millis_behind_latest=batch.millis_behind_latest,
            cache_entry_time=entry,
            cache_exit_time=now,
            is_at_shard_end=at_shard_end,
        )

    def judge(
        self, records: Sequence[KinesisRecord], *, result: object = None, error: Exception | None = None
    ) -> Failure | None:
        """How ``process_records`` ended on ``records`` (what it returned, or raised) as the policy sees it."""
        if error is not None:
            failure = failure_from_exception(error, records)
        else:
            found = failure_from_result(result, records)
            if found is None:
                return None
            failure = found
        # what the failed records staged is not their effect: they are delivered again (or recorded, or skipped)
        self._checkpointer.outputs.discard(record.checkpoint for record in records[failure.first_failed :])
        first = records[failure.first_failed].checkpoint if records else "-"
        log.error(
            "processor failed on %s: %d records from %s (delivery %d of this batch): %s",
            self._shard.lease_key,
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
        handling, shard = self._context.failures, self._shard
        destination = handling.destination
        if destination is None:
            raise ConfigError("the failure policy needs a destination, and the worker has none")
        error_type, message = describe_error(None if error is None else error.error)
        report = FailureReport(
            application=handling.application,
            worker_id=handling.worker_id,
            stream=shard.stream,
            shard_id=shard.shard_id,
            condition=condition,
            attempts=attempts,
            records=records,
            error_type=error_type,
            error_message=message,
            stream_arn=None if handling.stream_arns is None else handling.stream_arns(shard.stream),
            at=self._clock.wall(),
        )
        retry = Retry(backoff=DESTINATION_BACKOFF, clock=self._clock)
        while True:
            try:
                destination.send(report)
            except DependencyError as exc:
                delay = retry.failed()
                handling.metrics.add(WorkerMetric.DESTINATION_FAILURES, 1)
                log.warning(
                    "failure destination %s failed for %s, retrying in %.1f s (the shard waits): %s",
                    destination.description,
                    shard.lease_key,
                    delay,
                    exc,
                )
                # the consumer's wait, not retry.wait(): it also ends on a hand-off or a lost lease
                if not self._context.wait(delay):
                    raise Interrupted from exc
                continue
            log.info(
                "%d records of %s (%s..%s) sent to %s (%s)",
                len(records),
                shard.lease_key,
                records[0].checkpoint,
                records[-1].checkpoint,
                destination.description,
                condition,
            )
            return

    def wait(self, seconds: float) -> bool:
        return self._context.wait(seconds)

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        self._context.mark.blocked(records, attempts=attempts, failure=failure)


class Deliveries:
    """Every batch of one lease to its processor under the failure policy; what the policy did, counted.

    :meth:`deliver` returns how the batch's delivery ended; with ``STOP_SHARD`` the lease is already given up
    marked stopped. :class:`ShutdownError` (a checkpoint found the lease gone) and :class:`ProcessorFailedError`
    propagate: they end the consumer, not the policy.
    """

    def __init__(self, context: DeliveryContext) -> None:
        self.context = context  # (lanes deliver with it too, their own wait in place)
        self._shard = context.lifecycle.shard
        self._failures = context.failures
        self.stats = FailureStats()  # summed over the lease's batches

    def deliver(self, batch: RecordBatch, checkpointer: LeaseCheckpointer) -> Delivered:
        ports = DeliveryPorts(self.context, batch=batch, checkpointer=checkpointer)
        delivery = BatchDelivery(
            config=self._failures.config, ports=ports, lease_key=self._shard.lease_key, now=self.context.clock.wall()
        )
        try:
            if batch.records:
                delivered = delivery.run(batch.records, at_shard_end=batch.end_of_shard)
            else:  # an empty batch (deliver_empty_batches): nothing to retry or record
                failure = ports.process((), at_shard_end=batch.end_of_shard)
                delivered = Delivered.DONE
                if failure is not None:
                    log.warning("processor failed on an empty batch of %s: %s", self._shard.lease_key, failure.error)
        except Interrupted:
            delivered = Delivered.INTERRUPTED
        finally:
            self.count(delivery.stats)
        if delivered is Delivered.STOP_SHARD:
            self.stop_shard(delivery)
        return delivered

    def stop_shard(self, delivery: BatchDelivery) -> None:
        """The policy stopped the shard at ``delivery.stopped_at``: tell the processor, give the lease up marked."""
        at, failure = delivery.stopped_at, delivery.last_failure
        assert at is not None and failure is not None
        self.context.lifecycle.lease_lost()
        block, stopped = self.context.mark.stop(at, attempts=self._failures.config.max_attempts, failure=failure)
        log.error(
            "shard %s STOPPED at record %s after %d failed deliveries (%s; policy stop-shard%s): nothing more is "
            "processed on it until `shardlease resume-shard --app %s --shard %s`",
            self._shard.lease_key,
            at.checkpoint,
            block.attempts,
            one_line(failure.error),
            "" if stopped else "; the mark could not be written, the lease was given up",
            self._failures.application or "APP",
            self._shard.lease_key,
        )

    def count(self, stats: FailureStats) -> None:
        """Add one delivery's counts to the lease's and publish them (nothing to do for a clean batch)."""
        if not stats:
            return
        self.stats.add(stats)
        for field_name, metric in _FAILURE_METRICS.items():
            count = getattr(stats, field_name)
            if count:
                self._failures.metrics.add(metric, count)
