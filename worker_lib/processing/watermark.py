"""Where a shard's lanes stand: the contiguous watermark of records done (:class:`Watermark`), and the checkpointer a
lane's processor call is given (:class:`LaneCheckpointer`), which marks records done and never writes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from worker_lib.core.clock import Clock
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.outputs import StagedOutputs, Write
from worker_lib.processing.processor import (
    InvalidCheckpointError,
    PreparedCheckpointer,
    validate_checkpoint_value,
)

# --- the watermark -------------------------------------------------------------------------------------------


class Watermark:
    """Every record read and not yet passed, in shard order; where every record before it is done. Thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[int, tuple[KinesisRecord, float]] = {}  # index -> (record, admitted at)
        self._done: set[int] = set()
        self._first = 0  # the first index not yet passed
        self._next = 0
        self._position: Checkpoint | None = None

    def admit(self, records: Sequence[KinesisRecord]) -> range:
        """Take ``records`` (in shard order) in; their indices."""
        now = self._clock.monotonic()
        with self._lock:
            start = self._next
            for offset, record in enumerate(records):
                self._records[start + offset] = (record, now)
            self._next = start + len(records)
            return range(start, self._next)

    def done(self, indices: Sequence[int]) -> None:
        """These records are done; the watermark moves past every record done with all before it."""
        with self._lock:
            self._done.update(i for i in indices if i >= self._first)
            while self._first in self._done:
                self._done.discard(self._first)
                record, _ = self._records.pop(self._first)
                self._position = record.checkpoint
                self._first += 1

    @property
    def position(self) -> Checkpoint | None:
        """The last record with every record before it done (None: none yet)."""
        with self._lock:
            return self._position

    @property
    def in_flight(self) -> int:
        """Records read and not yet passed by the watermark."""
        with self._lock:
            return self._next - self._first

    def lag_s(self) -> float:
        """How long the first record not yet done has been in (0 when none is)."""
        with self._lock:
            entry = self._records.get(self._first)
        return 0.0 if entry is None else max(0.0, self._clock.monotonic() - entry[1])


class LeaseProgress(Protocol):
    """What a lane's checkpointer shares with the lease's checkpointer."""

    lease_key: str
    fencing_token: int
    outputs: StagedOutputs


# --- one lane's checkpointer -------------------------------------------------------------------------------------


class LaneCheckpointer:
    """What ``process_records`` is given in a lane: a checkpoint marks the lane's records up to it done; the consumer
    writes the watermark (docs/worker.md). It never blocks on I/O; the ``a``-methods are its awaitable forms."""

    def __init__(
        self,
        watermark: Watermark,
        items: Sequence[tuple[int, KinesisRecord]],
        written: Callable[[], Any],
        *,
        lease: LeaseProgress | None = None,
    ):
        self._watermark = watermark
        self._items = items
        self._written = written  # the lease's last written checkpoint
        # the lease's staged outputs, committed once the watermark passes their records
        self.outputs = lease.outputs if lease is not None else StagedOutputs(written)
        self.lease_key = lease.lease_key if lease is not None else ""
        self.fencing_token = lease.fencing_token if lease is not None else 0
        self.largest_permitted: Checkpoint | None = None  # the last record of the delivery in progress

    def stage(self, record: KinesisRecord, *writes: Write) -> None:
        """Outputs of ``record``, committed with the watermark's checkpoint once it passes ``record``."""
        self.outputs.stage(record.checkpoint, writes)

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        last: Checkpoint | None = self._written()
        return last

    def done_through(self, record: KinesisRecord) -> None:
        """Every record of this lane's delivery up to ``record`` is done."""
        self._done_up_to(record.checkpoint)

    def _done_up_to(self, value: Checkpoint) -> None:
        # (a lane's records are in shard order)
        self._watermark.done([index for index, record in self._items if not record.checkpoint.is_after(value)])

    def checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None:
        largest = self.largest_permitted
        if sequence is None:
            if largest is None:
                return
            value = largest
        else:
            value = validate_checkpoint_value(sequence, sub_sequence, last_checkpoint=None, largest_permitted=largest)
        self._done_up_to(value)

    def checkpoint_record(self, record: KinesisRecord) -> None:
        self.checkpoint(record.sequence_number, record.sub_sequence_number)

    def prepare_checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> PreparedCheckpointer:
        raise InvalidCheckpointError("two-phase checkpoints need parallelism 1: with lanes the watermark is written")

    def prepare_checkpoint_record(self, record: KinesisRecord) -> PreparedCheckpointer:
        return self.prepare_checkpoint(record.sequence_number, record.sub_sequence_number)

    async def acheckpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None:
        self.checkpoint(sequence, sub_sequence)

    async def acheckpoint_record(self, record: KinesisRecord) -> None:
        self.checkpoint_record(record)
