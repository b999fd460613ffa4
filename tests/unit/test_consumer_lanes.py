"""The shard consumer with key-ordered lanes (worker_lib/processing/consumer.py, ``_process_in_lanes``) on fakes and a
manual clock: every record once and each key in order, the checkpoint the contiguous watermark written by the
consumer alone, and a stop, hand-off, lost lease or shard end only once the lanes in flight ended.

Lanes run on real threads: the fake processor holds a delivery on a ``threading.Event`` the test (or the consumer's
own wait, through the clock) releases; the consumer's waits move the manual clock (``wait_for``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.support.stalls import hang_bound_s
from worker_lib.core.clock import ManualClock
from worker_lib.core.models import (
    SHARD_BLOCK_ATTRIBUTE,
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    KinesisRecord,
    Lease,
    ShardBlock,
)
from worker_lib.processing.config import ConsumerConfig
from worker_lib.processing.consumer import ConsumerOutcome, ConsumerState, ShardConsumer
from worker_lib.processing.lanes import lane_count, lane_of
from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.retrieval import RecordBatch

KEY = "shardId-000000000002"
LANES = 4
# Real waits only detect a hang: a lane held on an event, the consumer's thread joined.
BOUND_S = hang_bound_s(1.0)
# With the manual clock, a drain of this long is thousands of 2 ms real waits: never the test's limit.
DRAIN_MS = 600_000


def _a_key_per_lane() -> list[str]:
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < LANES:
        keys.setdefault(lane_of(f"key-{n}", lane_count(LANES)), f"key-{n}")
        n += 1
    return list(keys.values())


LANE_KEYS = _a_key_per_lane()  # LANE_KEYS[i] is dealt to lane i


def rec(sequence: int, lane: int) -> KinesisRecord:
    return KinesisRecord(data=f"r{sequence}".encode(), partition_key=LANE_KEYS[lane], sequence_number=str(sequence))


def batch(*records: KinesisRecord, end: bool = False) -> RecordBatch:
    return RecordBatch(records=records, millis_behind_latest=0, end_of_shard=end)


def at(sequence: int) -> Checkpoint:
    return Checkpoint(sequence=str(sequence))


@dataclass
class Rig:
    """The consumer's world: holder, store, source and processor, all writing to one journal (thread-safe)."""

    batches: list[RecordBatch]
    clock: ManualClock = field(default_factory=ManualClock)
    lock: threading.Lock = field(default_factory=threading.Lock)
    journal: list[str] = field(default_factory=list)
    delivered: list[KinesisRecord] = field(default_factory=list)  # in the order deliveries ended
    written: list[Checkpoint] = field(default_factory=list)
    writers: set[str] = field(default_factory=set)  # the threads that wrote checkpoints
    entered: dict[int, threading.Event] = field(default_factory=dict)  # sequence -> its delivery started
    gates: dict[int, threading.Event] = field(default_factory=dict)  # sequence -> its delivery waits for this
    block: ShardBlock | None = None  # the lease's failure mark as found
    valid: bool = True
    handoff: bool = False
    fetches: int = 0
    after_sleep: Callable[[], None] | None = None  # on every wait of the consumer (its thread)
    checkpoint_at_shutdown: str | None = None  # what the processor checkpoints in shutdown_requested

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)
        for b in self.batches:
            for r in b.records:
                self.entered[int(r.sequence_number)] = threading.Event()

    def note(self, what: str) -> None:
        with self.lock:
            self.journal.append(what)
            self.changed.notify_all()

    def wait_until(self, predicate: Callable[[], bool], what: str) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, BOUND_S), f"{what}: not within {BOUND_S:.0f} s (a hang)"

    def done(self) -> set[int]:
        """The sequence numbers delivered (call with the lock held)."""
        return {int(r.sequence_number) for r in self.delivered}

    def release(self, sequence: int) -> threading.Event:
        """The gate of ``sequence``'s delivery: it waits until this is set."""
        return self.gates.setdefault(sequence, threading.Event())

    # --- the holder ---
    worker_id = "w1"

    def lease(self, key: str) -> Lease:
        extra = {} if self.block is None else {SHARD_BLOCK_ATTRIBUTE: self.block.to_attribute()}
        return Lease(lease_key=KEY, lease_owner="w1", checkpoint=TRIM_HORIZON, extra=extra)

    def still_valid(self, key: str, *, stop: Any = None) -> bool:
        return self.valid

    def is_valid(self, key: str) -> bool:
        return self.valid

    def handoff_requested(self, key: str) -> bool:
        return self.handoff

    def lose(self) -> None:
        with self.lock:  # one step with checkpoint(): no write is journaled on either side of it by mistake
            self.valid = False
            self.journal.append("lease invalid")

    def checkpoint(self, key: str, value: Checkpoint, *, writes: Sequence[Any] = ()) -> Lease | None:
        with self.lock:
            self.journal.append(f"checkpoint {value}" if self.valid else f"checkpoint {value} while invalid")
            self.writers.add(threading.current_thread().name)
            if not self.valid:
                return None
            self.written.append(value)
            self.changed.notify_all()
            return self.lease(key)

    def mark_block(self, key: str, block: ShardBlock | None) -> object:
        self.note(f"mark {'-' if block is None else block.at}")
        return object()

    def journaled(self, what: str) -> Callable[..., None]:
        return lambda *args, **kwargs: self.note(what)

    # --- the store ---
    def get_lease(self, key: str) -> Lease | None:
        return None

    # --- the source ---
    def open(self, stream: str, shard_id: str, *, start: Checkpoint, timestamp: Any = None) -> Any:
        return self

    def seconds_until_next_call(self) -> float:
        return 0.0 if self.batches else 0.1  # nothing more to read: the consumer waits between reads

    def fetch(self) -> RecordBatch:
        self.clock.advance(1.0)
        with self.lock:
            self.fetches += 1
        return self.batches.pop(0) if self.batches else batch()

    @property
    def last_delivered(self) -> Checkpoint | None:
        return None

    def close(self) -> None:
        self.note("close")

    # --- the processor (process_records runs on the lanes' threads) ---
    def initialize(self, input: InitializationInput) -> None:
        self.note("initialize")

    def process_records(self, input: ProcessRecordsInput) -> None:
        sequences = [int(r.sequence_number) for r in input.records]
        self.note(f"deliver {','.join(map(str, sequences))}")
        for sequence in sequences:
            self.entered[sequence].set()
        for sequence in sequences:
            gate = self.gates.get(sequence)
            if gate is not None:
                assert gate.wait(BOUND_S), f"record {sequence} held past {BOUND_S:.0f} s (a hang)"
        with self.lock:
            self.delivered += input.records
            self.journal.append(f"done {','.join(map(str, sequences))}")
            self.changed.notify_all()
        input.checkpointer.checkpoint()  # in a lane: marks the records done, never writes

    def shard_ended(self, input: ShardEndedInput) -> None:
        self.note("shard_ended")
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self.note("shutdown_requested")
        if self.checkpoint_at_shutdown is not None:
            input.checkpointer.checkpoint(self.checkpoint_at_shutdown)
            self.note("checkpointed at shutdown")

    def lease_lost(self, input: LeaseLostInput) -> None:
        self.note("lease_lost")

    def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        if self.after_sleep is not None and threading.current_thread().name == "consumer":
            self.after_sleep()

    def consumer(self, **config: Any) -> ShardConsumer:
        holder = cast(Any, self)
        self.clock.sleep = self.sleep  # type: ignore[method-assign]
        for what in ("evict", "drop", "complete_handoff", "update_child_shard_ids"):
            setattr(holder, what, self.journaled(what))
        return ShardConsumer(
            lease_key=KEY,
            stream="s",
            holder=holder,
            store=holder,
            processor=holder,
            kinesis_client=None,
            list_shards=lambda: [],
            config=ConsumerConfig(**({"parallelism": LANES, "lane_drain_timeout_ms": DRAIN_MS} | config)),
            sources=holder,
            clock=self.clock,
        )

    def position(self, entry: str) -> int:
        with self.lock:
            return self.journal.index(entry)


class Running:
    """A consumer running on its own thread (named "consumer"), as a worker runs it."""

    def __init__(self, consumer: ShardConsumer, rig: Rig) -> None:
        self.consumer = consumer
        self._rig = rig
        self._result: list[ConsumerOutcome] = []
        self._thread = threading.Thread(target=self._run, name="consumer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._result.append(self.consumer.run())

    def outcome(self) -> ConsumerOutcome:
        """How the consumer ended (it must end within the hang bound)."""
        self._thread.join(BOUND_S)
        rig = self._rig
        if self._thread.is_alive():
            for gate in rig.gates.values():
                gate.set()
            raise AssertionError(f"the consumer did not end within {BOUND_S:.0f} s (a hang); journal: {rig.journal}")
        assert self._result, f"the consumer raised; journal: {rig.journal}"
        return self._result[0]


def start(rig: Rig, **config: Any) -> Running:
    return Running(rig.consumer(**config), rig)


def by_key(records: list[KinesisRecord]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in records:
        out.setdefault(r.partition_key, []).append(int(r.sequence_number))
    return out


# --- the tests ---------------------------------------------------------------------------------------------------


def test_every_record_is_delivered_once_each_key_in_order_and_only_the_consumer_writes_checkpoints() -> None:
    # GIVEN 60 records over 12 keys in three batches, the last at the shard's end, and 4 lanes
    records = [KinesisRecord(data=b"x", partition_key=f"key-{n % 12}", sequence_number=str(n)) for n in range(1, 61)]
    rig = Rig(batches=[batch(*records[:20]), batch(*records[20:40]), batch(*records[40:], end=True)])
    # WHEN the consumer runs to the shard's end
    running = start(rig)
    consumer = running.consumer
    # THEN the lease is finished
    assert running.outcome() is ConsumerOutcome.FINISHED
    # AND every record was delivered once, and each key's records in sequence order
    assert sorted(int(r.sequence_number) for r in rig.delivered) == list(range(1, 61))
    for key, sequences in by_key(rig.delivered).items():
        assert sequences == sorted(sequences), key
    assert consumer.records_delivered == 60
    # AND checkpoints moved forward only, the last record's then SHARD_END, all written on the consumer's thread
    # (a processor's checkpoint() in a lane marks its records done)
    assert rig.written[-2:] == [at(60), SHARD_END]
    real = [int(c.sequence) for c in rig.written[:-1]]
    assert real == sorted(set(real))
    assert rig.writers == {"consumer"}


def test_lanes_deliver_side_by_side() -> None:
    # GIVEN records of two lanes, each delivery waiting until the other's has started
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), end=True)])
    rig.gates = {1: rig.entered[2], 2: rig.entered[1]}
    # WHEN the consumer runs THEN both are delivered (one lane at a time would hang) and the shard ends
    running = start(rig)
    assert running.outcome() is ConsumerOutcome.FINISHED
    assert sorted(int(r.sequence_number) for r in rig.delivered) == [1, 2]


def test_a_lane_held_on_a_record_holds_the_checkpoint_back_while_other_lanes_go_on() -> None:
    # GIVEN records 1..6 over 4 lanes, the shard's last, and record 2's delivery (lane 1) held
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3), rec(5, 0), rec(6, 2), end=True)])
    held = rig.release(2)
    # WHEN the consumer runs
    running = start(rig)
    # THEN every other record is delivered, and the watermark written is the record before the held one
    rig.wait_until(lambda: rig.done() == {1, 3, 4, 5, 6} and bool(rig.written), "the other lanes done, a checkpoint")
    with rig.lock:
        assert rig.written == [at(1)]
    # WHEN record 2 is through
    held.set()
    # THEN the watermark jumps to the last record, then SHARD_END is written
    assert running.outcome() is ConsumerOutcome.FINISHED
    assert rig.written == [at(1), at(6), SHARD_END]


def test_a_handoff_lets_deliveries_in_flight_end_starts_none_and_writes_the_watermark_before_it_completes() -> None:
    # GIVEN records 1..4 over 4 lanes with record 2's delivery held, then records 5 (lane 1, behind 2) and 6 (lane 0)
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3)), batch(rec(5, 1), rec(6, 0))])
    held = rig.release(2)
    rig.checkpoint_at_shutdown = "6"  # past the watermark: the processor cannot know where the other lanes are
    running = start(rig)
    consumer = running.consumer
    rig.wait_until(lambda: rig.done() == {1, 3, 4, 6} and rig.entered[2].is_set(), "every lane but the held one")
    # WHEN a hand-off is requested while record 2 is in flight, and 2 ends once the consumer waits for its lanes
    rig.after_sleep = lambda: held.set() if consumer.state is ConsumerState.HANDING_OFF else None
    rig.handoff = True
    # THEN the hand-off completes
    assert running.outcome() is ConsumerOutcome.HANDED_OFF
    # AND record 2's delivery ended, record 5's never started
    assert rig.done() == {1, 2, 3, 4, 6}
    assert not rig.entered[5].is_set()
    # AND the watermark (4: record 5 is not done) was written after 2 ended, then the processor was told, then the
    # hand-off completed; its checkpoint past the watermark wrote the watermark (already written: no write)
    assert rig.written[-1] == at(4) and rig.written.count(at(4)) == 1
    order = ["done 2", "checkpoint 4", "shutdown_requested", "checkpointed at shutdown", "complete_handoff"]
    assert [rig.position(entry) for entry in order] == sorted(rig.position(entry) for entry in order)


def test_a_stop_writes_the_watermark_and_a_checkpoint_past_it_at_shutdown_writes_the_watermark() -> None:
    # GIVEN record 2 (lane 1) held while 1, 3 and 4 are done, and a processor checkpointing 4 at shutdown
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3))])
    held = rig.release(2)
    rig.checkpoint_at_shutdown = "4"
    running = start(rig, lane_drain_timeout_ms=0)
    consumer = running.consumer
    rig.wait_until(lambda: rig.done() == {1, 3, 4} and rig.entered[2].is_set(), "every lane but the held one")
    # WHEN the worker stops and record 2 does not end within the drain timeout (none)
    consumer.request_stop()
    # THEN the lease is given up at the watermark, 1: the processor's checkpoint at 4 wrote the watermark
    assert running.outcome() is ConsumerOutcome.SHUTDOWN
    held.set()
    assert rig.written[-1] == at(1) and "checkpointed at shutdown" in rig.journal
    assert rig.position("shutdown_requested") < rig.position("evict")


def test_a_lost_lease_is_told_to_the_processor_only_once_lanes_stopped_and_nothing_is_written_after() -> None:
    # GIVEN records 1..4 over 4 lanes with record 2's delivery held, then 5 (behind 2) and 6
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3)), batch(rec(5, 1), rec(6, 0))])
    held = rig.release(2)
    running = start(rig)
    consumer = running.consumer
    rig.wait_until(lambda: rig.done() == {1, 3, 4, 6} and rig.entered[2].is_set(), "every lane but the held one")
    # WHEN the lease is lost while record 2 is in flight, and 2 ends once the consumer waits for its lanes
    rig.after_sleep = lambda: held.set() if consumer.state is ConsumerState.LEASE_LOST else None
    rig.lose()
    # THEN the consumer ends LOST, lease_lost told after record 2's delivery ended
    assert running.outcome() is ConsumerOutcome.LOST
    assert rig.position("done 2") < rig.position("lease_lost")
    # AND no delivery started and no checkpoint was tried once the lease was lost
    assert not rig.entered[5].is_set()
    after = rig.journal[rig.position("lease invalid") :]
    assert not [entry for entry in after if entry.startswith(("checkpoint", "deliver"))], after


def test_a_lane_starts_no_delivery_once_the_lease_ran_out_even_before_the_consumer_noticed() -> None:
    # GIVEN record 2's delivery held, with record 5 queued behind it in its lane
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3)), batch(rec(5, 1), rec(6, 0))])
    held = rig.release(2)
    running = start(rig)
    rig.wait_until(lambda: rig.done() == {1, 3, 4, 6} and rig.entered[2].is_set(), "every lane but the held one")
    # WHEN the lease runs out and record 2's delivery ends at once (a frozen worker waking past its lease: the lane's
    # runner is free before the consumer's guard runs again)
    rig.lose()
    held.set()
    # THEN the consumer ends LOST and record 5 was never delivered: the runner checked the lease first
    assert running.outcome() is ConsumerOutcome.LOST
    assert not rig.entered[5].is_set()
    after = rig.journal[rig.position("lease invalid") :]
    assert not [entry for entry in after if entry.startswith("deliver")], after


def test_the_reader_waits_while_too_many_records_are_in_flight() -> None:
    # GIVEN at most 10 records in flight, record 1 (lane 0) held, and three batches: 1..5, 6..10, 11..12 (the end)
    rig = Rig(
        batches=[
            batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3), rec(5, 1)),
            batch(rec(6, 2), rec(7, 3), rec(8, 1), rec(9, 2), rec(10, 3)),
            batch(rec(11, 1), rec(12, 2), end=True),
        ]
    )
    held = rig.release(1)
    seen: list[tuple[int, int]] = []  # (reads, records in flight) while the reader waited with records 2..10 done
    consumer = rig.consumer(max_records_in_flight=10)

    def waited() -> None:
        with rig.lock:
            if rig.fetches == 2 and rig.done() == set(range(2, 11)):
                stats = consumer.lane_stats
                seen.append((rig.fetches, -1 if stats is None else stats.in_flight))
        if len(seen) == 50:  # the reader waited 50 times: let record 1 through
            held.set()

    rig.after_sleep = waited
    # WHEN the consumer runs
    running = Running(consumer, rig)
    assert running.outcome() is ConsumerOutcome.FINISHED
    # THEN while record 1 was held the reader made no read after the second batch (10 records in flight)
    assert len(seen) >= 50 and set(seen) == {(2, 10)}
    # AND once it was through it read the last batch: every record delivered, the shard ended
    assert rig.fetches == 3
    assert sorted(int(r.sequence_number) for r in rig.delivered) == list(range(1, 13))
    assert rig.written[-2:] == [at(12), SHARD_END]


def test_the_shard_ends_only_once_every_lane_finished() -> None:
    # GIVEN the shard's last records 1..4 over 4 lanes, record 2 held until the consumer has waited for lanes a while
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3), end=True)])
    held = rig.release(2)
    waits: list[int] = []

    def waited() -> None:
        waits.append(1)
        if len(waits) == 20:
            held.set()

    rig.after_sleep = waited
    # WHEN the consumer runs
    running = start(rig)
    assert running.outcome() is ConsumerOutcome.FINISHED
    # THEN shard_ended came after record 2's delivery ended, with the last record's watermark written before it
    assert rig.position("done 2") < rig.position("checkpoint 4") < rig.position("shard_ended")
    assert rig.written[-2:] == [at(4), SHARD_END]
    assert rig.journal[-2:] == ["drop", "close"]


@pytest.mark.parametrize("parallelism", [1, LANES])
def test_a_mark_a_previous_owner_left_is_removed_once_a_delivery_is_through(parallelism: int) -> None:
    # GIVEN a lease its previous owner gave up marked retrying at record 1 (policy retry, attempts spent)
    rig = Rig(batches=[batch(rec(1, 0), rec(2, 1), end=True)])
    rig.block = ShardBlock(state=ShardBlock.RETRYING, since=0.0, attempts=3, error="ValueError", at=at(1), worker="w0")
    # WHEN this owner delivers the records without failure
    running = start(rig, parallelism=parallelism)
    assert running.outcome() is ConsumerOutcome.FINISHED
    # THEN the mark is removed, with lanes as without (shardlease status no longer shows the shard blocked)
    # (with lanes too: the removal reaches the shard's mark once no lane is held)
    assert "mark -" in rig.journal
