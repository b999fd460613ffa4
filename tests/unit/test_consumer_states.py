"""The shard consumer's state machine (worker_lib/processing/consumer.py) on fakes and a manual clock: the one guard
(stop, hand-off, lease valid) is seen in every state, the processor hears only what its lifecycle allows, and the
source is closed before the lease moves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from worker_lib.core.clock import ManualClock
from worker_lib.core.models import SHARD_END, Checkpoint, KinesisRecord, Lease
from worker_lib.processing.consumer import ConsumerOutcome, ShardConsumer
from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.retrieval import RecordBatch

KEY = "shardId-000000000002"
PARENT = "shardId-000000000001"


@dataclass
class Rig:
    """The consumer's world: a holder, a store, a source and a processor that all write to one journal."""

    clock: ManualClock = field(default_factory=ManualClock)
    journal: list[str] = field(default_factory=list)
    held: Lease = field(
        default_factory=lambda: Lease(lease_key=KEY, lease_owner="w1", checkpoint=Checkpoint(sequence="1"))
    )
    parent_ended: bool = True
    valid: bool = True
    handoff: bool = False
    batches: list[RecordBatch] = field(default_factory=list)
    on_process: Callable[[Rig], None] | None = None
    on_fetch: Callable[[Rig], None] | None = None
    failing: bool = False
    checkpoints_shard_end: bool = True
    written: Checkpoint | None = None
    after_sleep: Callable[[], None] | None = None  # what happens while the consumer waits

    # --- the holder ---
    worker_id = "w1"

    def lease_of(self, key: str) -> Lease:
        return self.held

    def still_valid(self, key: str, *, stop: Any = None) -> bool:
        return self.valid

    def is_valid(self, key: str) -> bool:
        return self.valid

    def handoff_requested(self, key: str) -> bool:
        return self.handoff

    def note(self, what: str) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.journal.append(what)

    def checkpoint(self, key: str, value: Checkpoint, *, writes: Sequence[Any] = ()) -> Lease | None:
        self.written = value
        return self.held if self.valid else None

    # --- the store ---
    def get_lease(self, key: str) -> Lease | None:
        return Lease(lease_key=key, checkpoint=SHARD_END if self.parent_ended else Checkpoint(sequence="5"))

    # --- the source ---
    def open(self, stream: str, shard_id: str, *, start: Checkpoint, timestamp: Any = None) -> Any:
        self.journal.append("open")
        return self

    def seconds_until_next_call(self) -> float:
        return 0.0

    def fetch(self) -> RecordBatch:
        self.clock.advance(1.0)
        if self.on_fetch is not None:
            self.on_fetch(self)
        return self.batches.pop(0) if self.batches else RecordBatch(records=(), millis_behind_latest=0)

    @property
    def last_delivered(self) -> Checkpoint | None:
        return Checkpoint(sequence="9")

    # --- the processor ---
    def initialize(self, input: InitializationInput) -> None:
        self.journal.append("initialize")

    def process_records(self, input: ProcessRecordsInput) -> None:
        self.journal.append(f"process {len(input.records)}")
        if self.on_process is not None:
            self.on_process(self)
        if self.failing:
            raise RuntimeError("poison")

    def shard_ended(self, input: ShardEndedInput) -> None:
        self.journal.append("shard_ended")
        if self.checkpoints_shard_end:
            input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self.journal.append("shutdown_requested")

    def lease_lost(self, input: LeaseLostInput) -> None:
        self.journal.append("lease_lost")

    def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        if self.after_sleep is not None:
            self.after_sleep()

    def consumer(self) -> ShardConsumer:
        holder = cast(Any, self)
        self.clock.sleep = self.sleep  # type: ignore[method-assign]
        holder.lease = self.lease_of
        for what in ("evict", "drop", "complete_handoff", "mark_block", "update_child_shard_ids"):
            setattr(holder, what, self.note(what))
        holder.close = self.note("close")
        return ShardConsumer(
            lease_key=KEY,
            stream="s",
            holder=holder,
            store=holder,
            processor=holder,
            kinesis_client=None,
            list_shards=lambda: [],
            sources=holder,
            clock=self.clock,
        )


def batch(*sequences: int, end: bool = False) -> RecordBatch:
    records = tuple(KinesisRecord(data=b"x", partition_key="k", sequence_number=str(s)) for s in sequences)
    return RecordBatch(records=records, millis_behind_latest=0, end_of_shard=end)


def waiting_on_parents() -> Rig:
    rig = Rig(parent_ended=False)
    rig.held = Lease(lease_key=KEY, lease_owner="w1", parent_shard_ids=frozenset({PARENT}))
    return rig


def test_a_handoff_requested_while_waiting_on_parents_is_completed_without_the_processor() -> None:
    rig = waiting_on_parents()
    consumer = rig.consumer()
    rig.after_sleep = lambda: setattr(rig, "handoff", True)
    assert consumer.run() is ConsumerOutcome.HANDED_OFF
    assert rig.journal == ["complete_handoff"]  # never initialized, no source opened


def test_a_lease_lost_while_waiting_on_parents_ends_the_consumer_without_the_processor() -> None:
    rig = waiting_on_parents()
    consumer = rig.consumer()
    rig.after_sleep = lambda: setattr(rig, "valid", False)
    assert consumer.run() is ConsumerOutcome.LOST
    assert rig.journal == []


def test_stop_while_processing_lets_the_processor_checkpoint_and_closes_the_source_before_the_lease_moves() -> None:
    rig = Rig(batches=[batch(7, 8, 9)])
    consumer = rig.consumer()
    rig.on_process = lambda _: consumer.request_stop()
    assert consumer.run() is ConsumerOutcome.SHUTDOWN
    assert rig.journal == ["open", "initialize", "process 3", "shutdown_requested", "close", "evict", "close"]
    assert consumer.records_delivered == 3


def test_stop_and_handoff_together_take_the_stop_path_first() -> None:
    rig = Rig(handoff=True)
    consumer = rig.consumer()
    consumer.request_stop()
    assert consumer.run() is ConsumerOutcome.SHUTDOWN
    assert "complete_handoff" not in rig.journal and "evict" in rig.journal


def test_a_handoff_requested_during_a_retry_backoff_ends_the_delivery_and_completes_the_handoff() -> None:
    rig = Rig(batches=[batch(7)], failing=True)
    rig.on_process = lambda r: setattr(r, "handoff", True)
    assert rig.consumer().run() is ConsumerOutcome.HANDED_OFF
    assert rig.journal[2:-1] == ["process 1", "mark_block", "shutdown_requested", "close", "complete_handoff"]
    assert rig.written is None  # the failed record was not checkpointed


def test_a_batch_read_after_the_lease_ran_out_is_never_delivered() -> None:
    rig = Rig(batches=[batch(7)])
    consumer = rig.consumer()
    rig.on_fetch = lambda r: setattr(r, "valid", False)
    assert consumer.run() is ConsumerOutcome.LOST
    assert rig.journal == ["open", "initialize", "lease_lost", "close"]


def test_a_handoff_requested_while_shard_end_is_retried_is_completed() -> None:
    rig = Rig(batches=[batch(9, end=True)], checkpoints_shard_end=False)
    consumer = rig.consumer()
    rig.after_sleep = lambda: setattr(rig, "handoff", "shard_ended" in rig.journal)
    assert consumer.run() is ConsumerOutcome.HANDED_OFF
    assert rig.journal[-5:-1] == ["shard_ended", "shutdown_requested", "close", "complete_handoff"]


def test_a_shard_end_checkpointed_finishes_the_lease() -> None:
    rig = Rig(batches=[batch(9, end=True)])
    assert rig.consumer().run() is ConsumerOutcome.FINISHED
    assert rig.written == SHARD_END and rig.journal[-3:] == ["shard_ended", "drop", "close"]
