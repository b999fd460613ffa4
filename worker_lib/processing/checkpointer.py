"""The checkpointer a shard consumer hands its processor: every write fenced by the lease counter, values checked
against what was delivered, infrastructure errors retried while the lease is valid (docs/worker.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import SHARD_END, Checkpoint
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.processing.outputs import StagedOutputs, Write, plan_commits
from worker_lib.processing.processor import (
    KinesisRecord,
    PreparedCheckpointer,
    ShutdownError,
    validate_checkpoint_value,
)
from worker_lib.telemetry.names import WorkerMetric
from worker_lib.telemetry.publisher import MetricsPublisher, NullPublisher

log = logging.getLogger(__name__)

# One lease's checkpoint retried while the lease is valid: from 0.2 s, doubling to 2 s, exact (one caller).
CHECKPOINT_BACKOFF = Backoff(base_s=0.2, max_s=2.0)


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

    def __init__(
        self,
        holder: LeaseHolder,
        lease_key: str,
        *,
        initial: Checkpoint,
        watermark: bool = False,
        fencing_token: int = 0,
        metrics: MetricsPublisher | None = None,
    ) -> None:
        self._holder = holder
        self.lease_key = lease_key
        # The lease counter when this consumer took the lease: it grows with every change of owner, so a sink that
        # keeps the largest token it saw refuses an earlier owner's writes (docs/exactly-once.md).
        self.fencing_token = fencing_token
        self._metrics = metrics or NullPublisher()
        self._last: Checkpoint | None = initial
        self.outputs = StagedOutputs(lambda: self._last)  # DynamoDB outputs, committed with the checkpoint
        self.largest_permitted: Checkpoint | None = None  # the last delivered record, or SHARD_END at the end
        # With lanes, the largest permitted is the watermark; a value past it (a record done in a lane with a record
        # before it not yet done) writes the watermark: the processor cannot know where the other lanes are.
        self._clamp = watermark
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
        if self._clamp:
            if largest is None:
                return None  # no record is done with all before it: nothing to record yet
            asked = Checkpoint(sequence=sequence, sub_sequence=sub_sequence)
            if not largest.is_sentinel and sequence.isdigit() and asked.is_after(largest):
                return largest
        return validate_checkpoint_value(sequence, sub_sequence, last_checkpoint=self._last, largest_permitted=largest)

    def stage(self, record: KinesisRecord, *writes: Write) -> None:
        """Outputs of ``record`` (``TransactWriteItems`` actions: :func:`~worker_lib.put_item`, ...),
        committed in one transaction with the next checkpoint at or past ``record`` (docs/exactly-once.md)."""
        self.outputs.stage(record.checkpoint, writes)

    def _write(self, value: Checkpoint) -> None:
        if self._last is not None and value == self._last:
            return  # already recorded: spare a write
        staged = self.outputs.up_to(value) if len(self.outputs) else []
        if not staged:
            self._send(value)
            return
        for commit in plan_commits(staged, value, key_names=self._holder.output_key_names):
            self._send(commit.checkpoint, commit.writes)
            self.outputs.committed(commit.covers)

    def _send(self, value: Checkpoint, writes: Sequence[Write] = ()) -> None:
        # Three layers, one failure each: botocore retries a request (throttling, 5xx, a lost connection); the store
        # re-reads once after a failed condition (botocore's retry of a write that had landed; a hand-off begun
        # meanwhile: written once more as checkpoint owner) — a new condition, not an error retried; this loop
        # retries what got past botocore while the lease is valid: out of process_records, it would make the
        # consumer deliver the same batch again — duplicates without any ownership change.
        retry = Retry(backoff=CHECKPOINT_BACKOFF, clock=self._holder.clock)
        while True:
            try:
                written = self._holder.checkpoint(self.lease_key, value, writes=writes)
                break
            except DependencyError as exc:
                if not self._holder.is_valid(self.lease_key):
                    raise ShutdownError(
                        f"lease {self.lease_key}: checkpoint could not be written before the lease ran out ({exc})"
                    ) from exc
                delay = retry.failed()
                log.warning("checkpoint on %s failed, retrying in %.1f s: %s", self.lease_key, delay, exc)
                retry.wait(delay)
        if written is None:
            if writes:  # a zombie's outputs: refused by the fence, as its checkpoint is
                self._metrics.add(WorkerMetric.FENCED_TRANSACTIONS, 1)
                self.outputs.clear()
                log.warning(
                    "transaction refused on %s: the lease is no longer ours (moved to another owner, or run out "
                    "before the commit); %d outputs and checkpoint %s not applied (fenced)",
                    self.lease_key,
                    len(writes),
                    value,
                )
            raise ShutdownError(f"lease {self.lease_key} is no longer held by this worker; checkpoint not written")
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
            raise ShutdownError(f"nothing delivered on {self.lease_key} yet: no checkpoint to prepare")
        if self._holder.prepare_checkpoint(self.lease_key, value) is None:
            raise ShutdownError(f"lease {self.lease_key} is no longer held by this worker; nothing prepared")
        return _Prepared(self, value)

    def prepare_checkpoint_record(self, record: KinesisRecord) -> PreparedCheckpointer:
        return self.prepare_checkpoint(record.sequence_number, record.sub_sequence_number)

    # awaitable forms, for async processors: the write runs on a thread, the event loop goes on

    async def acheckpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None:
        await asyncio.to_thread(self.checkpoint, sequence, sub_sequence)

    async def acheckpoint_record(self, record: KinesisRecord) -> None:
        await asyncio.to_thread(self.checkpoint_record, record)

    async def aprepare_checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> PreparedCheckpointer:
        return await asyncio.to_thread(self.prepare_checkpoint, sequence, sub_sequence)
