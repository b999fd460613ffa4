"""Key-ordered lanes in-process against moto (docs/worker.md, "Parallelism: key-ordered lanes"): more than one batch
of a shard in flight, records of one key in order, the checkpoint the contiguous watermark, a failing record
holding only its lane; thread lanes and async lanes alike."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from tests.support.kpl import put_aggregate
from tests.support.recording import assign_unowned, stream_with_leases
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.processing.destinations import FailureDestination, SqsDestination
from worker_lib.processing.failures import RecordFailedError
from worker_lib.processing.lanes import lane_count, lane_of
from worker_lib.processing.processor import AsyncFunctionProcessor, Checkpointer, FunctionProcessor
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.testing.waiting import wait_until
from worker_lib.worker.worker import Worker, WorkerConfig

KEYS = 40
HOLD_S = 0.02  # each record's processing time: long enough for lanes to overlap
FAST_LEASES = LeaseConfig(failover_time_ms=3_000)
FAST_READS = RetrievalConfig(idle_time_between_reads_ms=100)
READ_BOUND_S = hang_bound_s(0.2 + 0.1 + 400 * HOLD_S)  # discovery, a read, and every record one after the other
SHUTDOWN_BOUND_S = hang_bound_s(FAST_LEASES.failover_time_ms / 3000)


def put_keyed(kinesis: Any, stream: str, count: int) -> list[tuple[str, bytes]]:
    """``count`` records over KEYS partition keys, in order: (key, data)."""
    return [(put.key, put.data) for put in put_sequenced(kinesis, stream, count)]


class Put(NamedTuple):
    key: str
    data: bytes
    sequence: int


def put_sequenced(kinesis: Any, stream: str, count: int, *, start: int = 0) -> list[Put]:
    """``count`` records over KEYS partition keys (``r00042`` has key ``k2``), in order, with their sequence numbers."""
    records = [(f"k{n % KEYS}", f"r{n:05d}".encode()) for n in range(start, start + count)]
    out: list[Put] = []
    for i in range(0, count, 100):
        chunk = records[i : i + 100]
        answer = kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": k} for k, d in chunk])
        out += [Put(k, d, int(r["SequenceNumber"])) for (k, d), r in zip(chunk, answer["Records"], strict=True)]
    return out


@dataclass
class Deliveries:
    """Every record delivered (key, data, sequence) and how many deliveries ran at once, at most."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: list[tuple[str, bytes, int]] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0
    poison: bytes | None = None

    def begin(self) -> None:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)

    def end(self, records: Sequence[KinesisRecord]) -> None:
        with self.lock:
            self.running -= 1
            self.seen += [(r.partition_key, r.data, int(r.sequence_number)) for r in records]

    def check_poison(self, records: Sequence[KinesisRecord]) -> None:
        for record in records:
            if record.data == self.poison:
                with self.lock:
                    self.running -= 1
                raise RecordFailedError(record)

    def add(self, record: KinesisRecord) -> None:
        with self.lock:
            self.seen.append((record.partition_key, record.data, int(record.sequence_number)))

    def datas(self) -> set[bytes]:
        with self.lock:
            return {data for _, data, _ in self.seen}

    def by_key(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        with self.lock:
            for key, _, sequence in self.seen:
                out.setdefault(key, []).append(sequence)
        return out


def thread_handler(log: Deliveries) -> Any:
    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        log.begin()
        log.check_poison(records)
        time.sleep(HOLD_S * len(records))
        log.end(records)

    return handle


def async_handler(log: Deliveries) -> Any:
    async def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        log.begin()
        log.check_poison(records)
        await asyncio.sleep(HOLD_S * len(records))
        log.end(records)

    return handle


def lanes_worker(
    app: str,
    stream: str,
    handle: Any,
    *,
    ddb: Any,
    kinesis: Any,
    worker_id: str = "w1",
    failures: FailureConfig | None = None,
    destination: FailureDestination | None = None,
    **consumer: Any,
) -> Worker:
    wrap = AsyncFunctionProcessor if asyncio.iscoroutinefunction(handle) else FunctionProcessor
    return Worker(
        WorkerConfig(
            app=app,
            stream=stream,
            worker_id=worker_id,
            lease=FAST_LEASES,
            retrieval=FAST_READS,
            discovery_interval_ms=200,
            shutdown_timeout_ms=10_000,
            consumer=ConsumerConfig(**consumer),
            failures=failures or FailureConfig(),
        ),
        lambda: wrap(handle),
        dynamodb=ddb,
        kinesis=kinesis,
        failure_destination=destination,
    )


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_lanes_keep_each_keys_order_lose_nothing_and_checkpoint_the_last_record(
    ddb: Any, kinesis: Any, app_name: str, kind: str
) -> None:
    # GIVEN one shard with 400 records over 40 keys, and a worker with 8 lanes per shard
    stream, store, _ = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put_keyed(kinesis, stream, 400)
    log = Deliveries()
    handle = thread_handler(log) if kind == "threads" else async_handler(log)
    worker = lanes_worker(app_name, stream, handle, ddb=ddb, kinesis=kinesis, parallelism=8)
    # WHEN it runs until every record was delivered, then shuts down
    worker.start()
    try:
        eventually(lambda: len(log.seen) >= 400, bound_s=READ_BOUND_S, what="400 records")
    finally:
        assert worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN every record was delivered exactly once
    assert sorted(data for _, data, _ in log.seen) == sorted(data for _, data in produced)
    # AND deliveries ran side by side
    assert log.most_at_once > 1
    # AND each key's records came in sequence order
    for key, sequences in log.by_key().items():
        assert sequences == sorted(sequences), key
    # AND the lease's checkpoint is the shard's last record
    last = max(sequence for _, _, sequence in log.seen)
    (lease,) = store.list_leases()
    assert lease.checkpoint.sequence == str(last)


# --- the failure policy per lane, a restart, KPL aggregates (8 lanes, threads) ----------------------------------

LANES = 8
RETRY_BACKOFF_MS = 10
# an owned lease is found and read, and a failing record's attempts run their backoffs
FLOW_BOUND_S = hang_bound_s(0.2 + 0.1 + FailureConfig().max_attempts * RETRY_BACKOFF_MS / 1000)


def in_order(log: Deliveries) -> None:
    for key, sequences in log.by_key().items():
        assert sequences == sorted(sequences), key


def started(workers: list[Worker], worker: Worker) -> Worker:
    workers.append(worker)  # shut down at the end of the test, whatever happens
    worker.start()
    return worker


def test_skip_and_record_sends_a_poison_record_to_the_queue_and_every_other_record_goes_on(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker], *, moto_aws: AwsConfig
) -> None:
    # GIVEN one shard with 200 records over 40 keys, r00050 (key k10) poison, 8 lanes, skip-and-record to a queue
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put_sequenced(kinesis, stream, 200)
    poison = produced[50]
    sqs = aws.client("sqs", moto_aws)
    queue_url = sqs.create_queue(QueueName=f"{app_name}-failed")["QueueUrl"]
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{app_name}-failed"
    log = Deliveries()

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        for record in records:
            if record.data == poison.data:
                raise RecordFailedError(record) from ValueError("cannot parse")
            log.add(record)

    failures = FailureConfig(on_failure="skip-and-record", destination=queue_arn, retry_backoff_ms=RETRY_BACKOFF_MS)
    destination = SqsDestination(sqs, queue_arn)
    worker = lanes_worker(
        app_name,
        stream,
        handle,
        ddb=ddb,
        kinesis=kinesis,
        parallelism=LANES,
        failures=failures,
        destination=destination,
    )
    # WHEN it runs until every other record was delivered, then shuts down
    started(workers, worker)
    eventually(lambda: len(log.seen) >= 199, bound_s=FLOW_BOUND_S, what="every record but the poison")
    assert worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN every other record was delivered once, each key's in order
    assert sorted(data for _, data, _ in log.seen) == sorted(put.data for put in produced if put != poison)
    in_order(log)
    # AND the poison record alone reached the queue, once
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    (report,) = [json.loads(message["Body"]) for message in messages]
    assert report["KinesisBatchInfo"]["batchSize"] == 1
    assert report["KinesisBatchInfo"]["startSequenceNumber"] == str(poison.sequence)
    # AND the lease's checkpoint is the shard's last record, its failure mark gone
    lease = store.get_lease(key)
    assert lease is not None and lease.checkpoint == Checkpoint(sequence=str(produced[-1].sequence))
    assert lease.block is None


def test_a_record_failing_twice_holds_only_its_lane_and_its_keys_later_records_come_after_it(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN 200 records over 40 keys, r00010 (key k10) failing on its first two deliveries, 8 lanes, policy retry
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put_sequenced(kinesis, stream, 200)
    flaky = produced[10]
    log = Deliveries()
    failed: list[int] = []  # the flaky record's failed deliveries (one lane: one at a time)
    others_went_on = threading.Event()  # a record of another key, after the flaky one, was delivered
    went_on: list[bool] = []

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        for record in records:
            if record.data == flaky.data:
                if len(failed) < 2:
                    failed.append(1)
                    raise RecordFailedError(record) from ValueError("not yet")
                # its third delivery goes through only once other lanes delivered past it: they did not wait
                went_on.append(others_went_on.wait(FLOW_BOUND_S))
            log.add(record)
            if int(record.sequence_number) > flaky.sequence and record.partition_key != flaky.key:
                others_went_on.set()

    failures = FailureConfig(retry_backoff_ms=RETRY_BACKOFF_MS)  # 3 attempts
    worker = lanes_worker(app_name, stream, handle, ddb=ddb, kinesis=kinesis, parallelism=LANES, failures=failures)
    # WHEN it runs until every record was delivered, then shuts down
    started(workers, worker)
    eventually(lambda: len(log.seen) >= 200, bound_s=FLOW_BOUND_S, what="every record")
    assert worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN the flaky record went through on its third delivery, after other lanes delivered records after it
    assert len(failed) == 2 and went_on == [True]
    # AND every record was delivered once, each key's in order: k10's later records after it
    assert sorted(data for _, data, _ in log.seen) == sorted(put.data for put in produced)
    in_order(log)
    # AND the lease's checkpoint is the shard's last record, its failure mark gone
    lease = store.get_lease(key)
    assert lease is not None and lease.checkpoint == Checkpoint(sequence=str(produced[-1].sequence))
    assert lease.block is None


def test_stop_shard_stops_at_the_poison_record_with_the_watermark_before_it(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN 200 records over 40 keys, r00050 (key k10) poison, 8 lanes, policy stop-shard
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put_sequenced(kinesis, stream, 200)
    poison = produced[50]
    earlier = {put.data for put in produced[:50]}
    log = Deliveries()
    ready: list[bool] = []

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        for record in records:
            if record.data == poison.data:
                # fail once every record before it was delivered (other lanes go on), so the watermark can reach it
                ready.append(wait_until(lambda: earlier <= log.datas(), timeout_s=FLOW_BOUND_S))
                raise RecordFailedError(record) from ValueError("cannot parse")
            log.add(record)

    failures = FailureConfig(on_failure="stop-shard", retry_backoff_ms=RETRY_BACKOFF_MS)
    worker = lanes_worker(app_name, stream, handle, ddb=ddb, kinesis=kinesis, parallelism=LANES, failures=failures)
    # WHEN it runs
    started(workers, worker)

    # THEN the shard stops at the poison record
    def stopped() -> bool:
        lease = store.get_lease(key)
        return lease is not None and lease.is_stopped

    eventually(stopped, bound_s=FLOW_BOUND_S, what="the shard stopped")
    assert ready and all(ready)
    lease = store.get_lease(key)
    assert lease is not None and lease.block is not None
    assert lease.block.at == Checkpoint(sequence=str(poison.sequence))
    # AND the lease's checkpoint is the watermark: the record before it
    assert lease.checkpoint == Checkpoint(sequence=str(produced[49].sequence))
    # AND no record of its key after it was delivered
    assert [sequence for sequence in log.by_key()[poison.key] if sequence > poison.sequence] == []


def test_a_restart_resumes_from_the_watermark_and_delivers_again_only_what_came_after_it(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN w1 with 8 lanes that delivered 100 records over 40 keys, then 100 more of which r00100 (key k20, the first)
    # is held until w1 has stopped
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    first, second = Deliveries(), Deliveries()
    entered, release = threading.Event(), threading.Event()
    produced = put_sequenced(kinesis, stream, 100)
    held_data = b"r00100"

    def handle_first(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        for record in records:
            if record.data == held_data:
                entered.set()
                release.wait(FLOW_BOUND_S)
                return  # too late: the lease has moved on
            first.add(record)

    def handle_second(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        for record in records:
            second.add(record)

    w1 = started(
        workers,
        lanes_worker(
            app_name, stream, handle_first, ddb=ddb, kinesis=kinesis, parallelism=LANES, lane_drain_timeout_ms=200
        ),
    )
    eventually(lambda: len(first.seen) >= 100, bound_s=FLOW_BOUND_S, what="the first 100 records")
    produced += put_sequenced(kinesis, stream, 100, start=100)
    held = produced[100]
    lanes = lane_count(LANES)
    other_lanes = {put.data for put in produced if lane_of(put.key, lanes) != lane_of(held.key, lanes)}
    eventually(
        lambda: entered.is_set() and other_lanes <= first.datas(),
        bound_s=FLOW_BOUND_S,
        what="every lane but the held one through",
    )
    # WHEN w1 shuts down with that delivery in flight (it does not end within the drain timeout)
    assert w1.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    release.set()
    # THEN the lease's checkpoint is the watermark: the record before the held one, though records after it were done
    lease = store.get_lease(key)
    assert lease is not None and lease.lease_owner is None
    assert lease.checkpoint == Checkpoint(sequence=str(produced[99].sequence))
    # WHEN w2 takes the lease over
    assign_unowned(store, lambda _: "w2")
    w2 = started(
        workers,
        lanes_worker(app_name, stream, handle_second, ddb=ddb, kinesis=kinesis, worker_id="w2", parallelism=LANES),
    )
    after = {put.data for put in produced[100:]}
    eventually(lambda: after <= second.datas(), bound_s=FLOW_BOUND_S, what="w2 delivered what came after")
    assert w2.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN w2 delivered exactly the records after the checkpoint, each once, each key's in order: the duplicates (what
    # w1's other lanes had done past the watermark) are all after it
    assert sorted(data for _, data, _ in second.seen) == sorted(after)
    in_order(second)
    assert first.datas() & second.datas() == other_lanes & after
    # AND nothing is lost, and the lease's checkpoint is the last record
    assert first.datas() | second.datas() == {put.data for put in produced}
    lease = store.get_lease(key)
    assert lease is not None and lease.checkpoint == Checkpoint(sequence=str(produced[-1].sequence))


def test_kpl_aggregates_are_dealt_to_lanes_by_their_user_records_keys(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN 12 KPL aggregates of 10 user records each, keyed user-0..user-9 (aws-kinesis-agg), and 8 lanes
    user_keys = [f"user-{i}" for i in range(10)]
    assert len({lane_of(user_key, lane_count(LANES)) for user_key in user_keys}) > 1  # an aggregate's keys span lanes
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    parts = [[f"a{a:02d}-u{i}".encode() for i in range(10)] for a in range(12)]
    aggregates = [put_aggregate(kinesis, stream, aggregate) for aggregate in parts]
    lock = threading.Lock()
    calls: list[tuple[KinesisRecord, ...]] = []  # each delivery's records, in the order deliveries started

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        with lock:
            calls.append(tuple(records))

    # WHEN a worker runs until every user record was delivered, then shuts down
    worker = started(workers, lanes_worker(app_name, stream, handle, ddb=ddb, kinesis=kinesis, parallelism=LANES))
    eventually(lambda: sum(map(len, calls)) >= 120, bound_s=FLOW_BOUND_S, what="120 user records")
    assert worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    delivered = [record for call in calls for record in call]
    # THEN every user record was delivered once
    assert sorted(record.data for record in delivered) == sorted(data for aggregate in parts for data in aggregate)
    # AND each delivery held one lane's records, and each aggregate's user records came in more than one delivery
    assert all(len({lane_of(record.partition_key, lane_count(LANES)) for record in call}) == 1 for call in calls)
    for sequence in aggregates:
        assert len([call for call in calls if any(r.sequence_number == sequence for r in call)]) > 1, sequence
    # AND each key's user records came in order (sequence, then sub-sequence)
    by_user_key: dict[str, list[tuple[int, int]]] = {}
    for record in delivered:
        by_user_key.setdefault(record.partition_key, []).append(
            (int(record.sequence_number), record.sub_sequence_number)
        )
    assert sorted(by_user_key) == user_keys
    assert all(positions == sorted(positions) for positions in by_user_key.values())
    # AND the lease's checkpoint is the last aggregate's last user record
    lease = store.get_lease(key)
    assert lease is not None and lease.checkpoint == Checkpoint(sequence=aggregates[-1], sub_sequence=9)
