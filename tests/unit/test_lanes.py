"""The lanes' pure logic (worker_lib/processing/lanes.py): the watermark, the lane of a key, a lane's checkpointer,
the shard's mark shared by lanes; and the failure policy's one generator run by a thread and by a coroutine alike
(worker_lib/processing/failures.py, BatchDelivery.run / run_async)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.core.models import Checkpoint, KinesisRecord, ShardBlock
from worker_lib.processing.config import FailureConfig
from worker_lib.processing.delivery import ShardMark
from worker_lib.processing.failures import BatchDelivery, Delivered, Failure, PortCall, RecordFailedError
from worker_lib.processing.lane_ports import LaneMark
from worker_lib.processing.lanes import lane_of
from worker_lib.processing.processor import InvalidCheckpointError
from worker_lib.processing.watermark import LaneCheckpointer, Watermark


def record(sequence: int, key: str = "k") -> KinesisRecord:
    return KinesisRecord(data=b"x", partition_key=key, sequence_number=str(sequence))


def at(sequence: int) -> Checkpoint:
    return Checkpoint(sequence=str(sequence))


def where(watermark: Watermark) -> tuple[Checkpoint | None, int]:
    """The watermark's position and the records in flight."""
    return watermark.position, watermark.in_flight


# --- the watermark ---------------------------------------------------------------------------------------------


def test_the_watermark_moves_only_over_a_contiguous_prefix_of_done_records() -> None:
    # GIVEN five records read, in shard order
    watermark = Watermark(ManualClock())
    indices = watermark.admit([record(s) for s in (10, 20, 30, 40, 50)])
    assert list(indices) == [0, 1, 2, 3, 4]
    assert where(watermark) == (None, 5)
    # WHEN records after the first are done (out of order) THEN the watermark does not move
    watermark.done([3])
    watermark.done([1, 2])
    assert where(watermark) == (None, 5)
    # WHEN the first is done THEN it moves over every record done with all before it, and stops at the first not done
    watermark.done([0])
    assert where(watermark) == (at(40), 1)
    # WHEN the last is done THEN nothing is in flight
    watermark.done([4])
    assert where(watermark) == (at(50), 0)


def test_a_record_done_twice_or_after_it_was_passed_does_not_move_the_watermark_again() -> None:
    # GIVEN two records, both done
    watermark = Watermark(ManualClock())
    watermark.admit([record(1), record(2)])
    watermark.done([0, 1])
    # WHEN one is reported done again, and a third record is read
    watermark.done([0])
    watermark.admit([record(3)])
    # THEN the third is in flight and the watermark stays at the second
    assert where(watermark) == (at(2), 1)
    # AND later batches' indices go on from where the first ended
    assert list(watermark.admit([record(4)])) == [3]


def test_the_watermark_lag_is_how_long_the_first_record_not_done_has_waited() -> None:
    # GIVEN a record read at t, and another read 5 s later
    clock = ManualClock()
    watermark = Watermark(clock)
    assert watermark.lag_s() == 0.0  # nothing read: no lag
    watermark.admit([record(1)])
    clock.advance(5)
    watermark.admit([record(2)])
    clock.advance(2)
    # THEN the lag is the first record's wait
    assert watermark.lag_s() == 7.0
    # WHEN the first is done THEN the lag is the second's wait
    watermark.done([0])
    assert watermark.lag_s() == 2.0
    # WHEN every record is done THEN there is no lag
    watermark.done([1])
    assert watermark.lag_s() == 0.0


# --- the lane of a key -----------------------------------------------------------------------------------------


def test_a_key_always_has_the_same_lane() -> None:
    keys = [f"key-{n}" for n in range(50)]
    first = [lane_of(key, 8) for key in keys]
    assert [lane_of(key, 8) for key in keys] == first
    assert all(0 <= lane < 8 for lane in first)


def test_one_lane_takes_every_key() -> None:
    assert {lane_of(f"key-{n}", 1) for n in range(100)} == {0}


def test_keys_spread_over_every_lane() -> None:
    # GIVEN 1000 keys over 8 lanes: 125 a lane on average
    counts = Counter(lane_of(f"partition-{n}", 8) for n in range(1000))
    # THEN every lane has some, none far from its share (a hash's spread, not an exact split)
    assert sorted(counts) == list(range(8))
    assert all(60 <= count <= 190 for count in counts.values()), counts


# --- a lane's checkpointer ---------------------------------------------------------------------------------------


@dataclass
class LaneRig:
    """Six records read (sequence 1..6); the lane under test delivers 2, 4 and 5."""

    watermark: Watermark = field(default_factory=lambda: Watermark(ManualClock()))
    written: Checkpoint | None = None

    def __post_init__(self) -> None:
        self.indices = self.watermark.admit([record(s) for s in range(1, 7)])

    def lane(self, *sequences: int) -> LaneCheckpointer:
        items = [(self.indices[s - 1], record(s)) for s in sequences]
        checkpointer = LaneCheckpointer(self.watermark, items, lambda: self.written)
        checkpointer.largest_permitted = items[-1][1].checkpoint  # as the delivery sets it
        return checkpointer

    def others_done(self, *sequences: int) -> None:
        self.watermark.done([self.indices[s - 1] for s in sequences])


def test_a_lane_checkpoint_marks_every_record_of_its_delivery_done_and_writes_nothing() -> None:
    # GIVEN a lane delivering 2, 4 and 5, and every other record done
    rig = LaneRig()
    checkpointer = rig.lane(2, 4, 5)
    rig.others_done(1, 3, 6)
    # WHEN the processor checkpoints without arguments
    checkpointer.checkpoint()
    # THEN the delivery's records are done: nothing is in flight
    assert where(rig.watermark) == (at(6), 0)
    # AND its last checkpoint is the lease's, untouched
    assert checkpointer.last_checkpoint is None


def test_a_lane_checkpoint_at_a_record_marks_only_the_records_up_to_it() -> None:
    # GIVEN a lane delivering 2, 4 and 5, every other record done
    rig = LaneRig()
    checkpointer = rig.lane(2, 4, 5)
    rig.others_done(1, 3, 6)
    # WHEN the processor checkpoints at 4
    checkpointer.checkpoint("4")
    # THEN 2 and 4 are done, 5 is not: the watermark stops before it
    assert where(rig.watermark) == (at(4), 2)
    # WHEN it checkpoints the record 5
    checkpointer.checkpoint_record(record(5))
    assert rig.watermark.position == at(6)


def test_a_lane_checkpoint_between_its_records_marks_those_before_it() -> None:
    # GIVEN a lane delivering 2, 4 and 5
    rig = LaneRig()
    checkpointer = rig.lane(2, 4, 5)
    rig.others_done(1)
    # WHEN the processor checkpoints at 3 (another lane's record)
    checkpointer.checkpoint("3")
    # THEN only 2 is done
    assert rig.watermark.position == at(2)


def test_a_lane_checkpoint_beyond_its_delivery_is_refused() -> None:
    rig = LaneRig()
    checkpointer = rig.lane(2, 4)
    with pytest.raises(InvalidCheckpointError):
        checkpointer.checkpoint("5")
    assert rig.watermark.position is None  # nothing marked


def test_a_two_phase_checkpoint_in_a_lane_is_refused() -> None:
    checkpointer = LaneRig().lane(1)
    with pytest.raises(InvalidCheckpointError):
        checkpointer.prepare_checkpoint()
    with pytest.raises(InvalidCheckpointError):
        checkpointer.prepare_checkpoint_record(record(1))


def test_a_lane_checkpointer_reports_the_leases_last_written_checkpoint() -> None:
    rig = LaneRig()
    checkpointer = rig.lane(1)
    rig.written = at(1)
    assert checkpointer.last_checkpoint == at(1)


def test_the_awaitable_lane_checkpoints_mark_records_done() -> None:
    # GIVEN a lane delivering 2, 4 and 5, every other record done
    rig = LaneRig()
    checkpointer = rig.lane(2, 4, 5)
    rig.others_done(1, 3, 6)

    async def process() -> None:
        await checkpointer.acheckpoint_record(record(2))
        assert rig.watermark.position == at(3)
        await checkpointer.acheckpoint()

    # WHEN an async processor awaits its checkpoints THEN they mark as the plain ones do
    asyncio.run(process())
    assert rig.watermark.position == at(6)


# --- the mark shared by lanes ------------------------------------------------------------------------------------


@dataclass
class Mark:
    """A ShardMark's one method, recording what the lanes tell it: the record named (None: cleared)."""

    calls: list[Checkpoint | None] = field(default_factory=list)

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        self.calls.append(records[0].checkpoint if failure is not None else None)


FAILED = Failure(ValueError("poison"))


def test_the_shared_mark_names_the_earliest_held_record_and_goes_only_once_no_lane_is_held() -> None:
    # GIVEN the shard's mark shared by lanes
    mark = Mark()
    lanes = LaneMark(mark)  # type: ignore[arg-type]
    # WHEN lane 1 is held at 20 THEN the mark names 20
    lanes.blocked(1, [record(20)], attempts=1, failure=FAILED)
    assert mark.calls == [at(20)]
    # WHEN lane 0 is held at an earlier record THEN the mark names it
    lanes.blocked(0, [record(10)], attempts=1, failure=FAILED)
    assert mark.calls == [at(20), at(10)]
    # WHEN lane 2 is held at a later record THEN the mark still names the earliest
    lanes.blocked(2, [record(30)], attempts=1, failure=FAILED)
    assert mark.calls == [at(20), at(10)]
    # WHEN lanes 2 and 1 get through THEN the mark stays (lane 0 is held)
    lanes.blocked(2, [], attempts=0, failure=None)
    lanes.blocked(1, [], attempts=0, failure=None)
    assert mark.calls == [at(20), at(10)]
    # WHEN lane 0 gets through THEN no lane is held: the mark goes
    lanes.blocked(0, [], attempts=0, failure=None)
    assert mark.calls == [at(20), at(10), None]


def test_a_lane_held_again_at_its_record_renames_it() -> None:
    # GIVEN lane 0 held at 10 (the earliest), lane 1 at 20
    mark = Mark()
    lanes = LaneMark(mark)  # type: ignore[arg-type]
    lanes.blocked(0, [record(10)], attempts=1, failure=FAILED)
    lanes.blocked(1, [record(20)], attempts=1, failure=FAILED)
    # WHEN lane 0 is marked at 10 once more (policy stop-shard, attempts spent) THEN the mark names 10 again
    lanes.blocked(0, [record(10)], attempts=3, failure=FAILED)
    assert mark.calls == [at(10), at(10)]


def test_when_the_named_lane_gets_through_the_mark_names_the_earliest_record_still_held() -> None:
    # GIVEN lane 0 held at 10 and lane 1 at 20: the mark names 10
    mark = Mark()
    lanes = LaneMark(mark)  # type: ignore[arg-type]
    lanes.blocked(1, [record(20)], attempts=1, failure=FAILED)
    lanes.blocked(0, [record(10)], attempts=1, failure=FAILED)
    # WHEN lane 0 gets through
    lanes.blocked(0, [], attempts=0, failure=None)
    # THEN the mark names 20, where the shard is still held (status must not show a record already passed)
    # (the mark names the earliest record still held once the lane it named got through)
    assert mark.calls == [at(20), at(10), at(20)]


@dataclass
class Holder:
    """What ShardMark writes through: the lease's mark in the table."""

    worker_id: str = "w1"
    writes: list[ShardBlock | None] = field(default_factory=list)

    def mark_block(self, lease_key: str, block: ShardBlock | None) -> object:
        self.writes.append(block)
        return object()


def test_a_mark_a_previous_owner_left_goes_once_a_lane_gets_through() -> None:
    # GIVEN a lease its previous owner gave up marked retrying at 10 (policy retry, attempts spent), now held anew
    holder = Holder()
    shard_mark = ShardMark(holder, "shardId-0", worker_id="w1", clock=ManualClock())  # type: ignore[arg-type]
    shard_mark.block = ShardBlock(
        state=ShardBlock.RETRYING, since=0.0, attempts=3, error="ValueError", at=at(10), worker="w0"
    )
    lanes = LaneMark(shard_mark)
    # WHEN a lane delivers record 10 without failure (the policy's last call: the mark's removal)
    lanes.blocked(0, [], attempts=0, failure=None)
    # THEN the mark is removed, as one lane removes it (failures.py: "ours, or one a previous owner left")
    # (a lane that was never held here still removes the previous owner's mark once no lane is held)
    assert holder.writes == [None] and shard_mark.block is None


def test_a_lane_through_that_was_never_held_writes_no_mark_when_there_is_none() -> None:
    holder = Holder()
    lanes = LaneMark(ShardMark(holder, "shardId-0", worker_id="w1", clock=ManualClock()))  # type: ignore[arg-type]
    lanes.blocked(3, [], attempts=0, failure=None)
    assert holder.writes == []


# --- the policy run by a thread and by a coroutine ---------------------------------------------------------------


Script = Callable[[Sequence[KinesisRecord], int], Failure | None]  # (records, delivery number) -> failure


@dataclass
class Ports:
    """Ports that answer the policy from ``script`` and record every call: (name, records, keywords)."""

    script: Script
    calls: list[tuple[str, tuple[str, ...], dict[str, Any]]] = field(default_factory=list)
    deliveries: int = 0

    def _note(self, name: str, records: Sequence[KinesisRecord], **kwargs: Any) -> None:
        # a failure by what it says (each run's errors are its own instances)
        said = {k: _said(v) if isinstance(v, Failure) else v for k, v in kwargs.items()}
        self.calls.append((name, tuple(r.sequence_number for r in records), said))

    def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        self._note("process", records, at_shard_end=at_shard_end)
        self.deliveries += 1
        return self.script(records, self.deliveries)

    def checkpoint(self, record: KinesisRecord) -> None:
        self._note("checkpoint", [record])

    def record(self, records: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None) -> None:
        self._note("record", records, condition=condition, attempts=attempts, error=error)

    def wait(self, seconds: float) -> bool:
        self._note("wait", [], seconds=seconds)
        return True

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        self._note("blocked", records, attempts=attempts, failure=failure)


def _said(failure: Failure) -> tuple[str, str, int]:
    return type(failure.error).__name__, str(failure.error), failure.first_failed


class AsyncPorts:
    """The same ports, awaitable."""

    def __init__(self, ports: Ports) -> None:
        self.ports = ports

    async def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        await asyncio.sleep(0)
        return self.ports.process(records, at_shard_end=at_shard_end)

    async def checkpoint(self, record: KinesisRecord) -> None:
        self.ports.checkpoint(record)

    async def record(
        self, records: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None
    ) -> None:
        self.ports.record(records, condition=condition, attempts=attempts, error=error)

    async def wait(self, seconds: float) -> bool:
        return self.ports.wait(seconds)

    async def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        self.ports.blocked(records, attempts=attempts, failure=failure)


def poison_at(sequence: str, *, until: int | None = None) -> Script:
    """A processor failing (the whole batch) on any batch holding ``sequence`` (``until``: only that many times)."""
    failed = [0]
    error = ValueError("poison")

    def script(records: Sequence[KinesisRecord], _: int) -> Failure | None:
        if any(r.sequence_number == sequence for r in records) and (until is None or failed[0] < until):
            failed[0] += 1
            return Failure(error)
        return None

    return script


def partial_then_through(records: Sequence[KinesisRecord], delivery: int) -> Failure | None:
    """A processor reporting the third record failed on the first delivery, then through."""
    return Failure(RecordFailedError(records[2]), first_failed=2) if delivery == 1 else None


DESTINATION = "arn:aws:sqs:us-east-1:123456789012:failed"

# name: (policy, a new processor's script, how the delivery ends)
SCHEDULES: dict[str, tuple[FailureConfig, Callable[[], Script], Delivered]] = {
    "retry, a partial result": (FailureConfig(retry_backoff_ms=10), lambda: partial_then_through, Delivered.DONE),
    "retry, a record failing twice": (
        FailureConfig(retry_backoff_ms=10),
        lambda: poison_at("104", until=2),
        Delivered.DONE,
    ),
    "retry exhausted": (FailureConfig(retry_backoff_ms=10), lambda: poison_at("104"), Delivered.GIVE_UP),
    "bisection, skip-and-record": (
        FailureConfig(on_failure="skip-and-record", destination=DESTINATION, retry_backoff_ms=10),
        lambda: poison_at("105"),
        Delivered.DONE,
    ),
    "skip-and-record without bisection": (
        FailureConfig(on_failure="skip-and-record", destination=DESTINATION, bisect=False, retry_backoff_ms=10),
        lambda: poison_at("103"),
        Delivered.DONE,
    ),
    "stop-shard": (
        FailureConfig(on_failure="stop-shard", retry_backoff_ms=10),
        lambda: poison_at("106"),
        Delivered.STOP_SHARD,
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_a_coroutine_runs_the_policy_through_the_same_port_calls_as_a_thread(name: str) -> None:
    # GIVEN a policy and a processor's schedule of failures on a batch of 8
    config, script, expected = SCHEDULES[name]
    batch = [record(s) for s in range(101, 109)]
    # WHEN the batch is delivered by run() (a thread's ports) and by run_async() (awaitable ports)
    threaded = Ports(script())
    by_thread = BatchDelivery(config=config, ports=threaded, lease_key="shardId-0", now=0.0)
    thread_outcome = by_thread.run(batch)
    awaited = Ports(script())
    by_coroutine = BatchDelivery(config=config, ports=None, lease_key="shardId-0", now=0.0)
    coroutine_outcome = asyncio.run(by_coroutine.run_async(batch, AsyncPorts(awaited)))
    # THEN both end alike, through the same calls in the same order, with the same counts
    assert thread_outcome is expected and coroutine_outcome is expected
    assert threaded.deliveries > 1  # the schedule did fail
    assert awaited.calls == threaded.calls
    assert by_coroutine.stats == by_thread.stats
    assert by_coroutine.stopped_at == by_thread.stopped_at


def test_the_policy_is_a_generator_of_port_calls() -> None:
    # GIVEN a batch the processor takes at once
    delivery = BatchDelivery(config=FailureConfig(), ports=None, lease_key="shardId-0", now=0.0)
    steps = delivery.steps([record(1), record(2)])
    # THEN its calls are the delivery, then the mark's removal, and it ends DONE
    first = next(steps)
    assert isinstance(first, PortCall) and first.name == "process"
    assert steps.send(None).name == "blocked"
    with pytest.raises(StopIteration) as ended:
        steps.send(None)
    assert ended.value.value is Delivered.DONE
