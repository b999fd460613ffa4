"""Enhanced fan-out against kinesis-local (behind FanOutProxy: subscriptions end after 10 s) with leases on moto:
every record once and in order, renewals without gap or repeat, shard end with its children, backpressure."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.support.processes import eventually_showing
from tests.support.recording import Journal, RecordingProcessor, recording_worker, stream_with_leases
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import Checkpoint
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.config import FailureConfig
from worker_lib.processing.processor import ProcessRecordsInput
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.retrieval.fanout import ShardSubscriber, StreamConsumers
from worker_lib.testing.fanout_proxy import FanOutProxy
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig

FANOUT = RetrievalConfig(mode="fanout", idle_time_between_reads_ms=100)
DISCOVERY_MS = 200
SUBSCRIPTION_S = 10.0  # a subscription's life behind the session's FanOutProxy (tests/conftest.py)
WRITER_PAUSE_S = 0.5
# Liveness bounds (tests/support/stalls.py) from these timings: a pushed record or an owned lease is processed within
# a discovery and a read; a shard end may come only with the subscription's end
READ_BOUND_S = hang_bound_s(DISCOVERY_MS / 1000 + FANOUT.idle_time_between_reads_ms / 1000)
SHARD_END_BOUND_S = hang_bound_s(SUBSCRIPTION_S + FANOUT.idle_time_between_reads_ms / 1000)


@pytest.fixture
def kinesis(kinesis_local_endpoint: str) -> Any:
    return aws.client("kinesis", AwsConfig(endpoint_url=kinesis_local_endpoint, read_timeout_s=35.0))


def collect(subscriber: ShardSubscriber, into: list[bytes], at_least: int) -> bool:
    """One fetch's records into ``into``; whether it now holds ``at_least``."""
    into.extend(record.data for record in subscriber.fetch().records)
    return len(into) >= at_least


def put(kinesis: Any, stream: str, prefix: str, count: int, hash_key: str | None = None) -> list[bytes]:
    datas = [f"{prefix}{n:04d}".encode() for n in range(count)]
    for start in range(0, count, 100):
        entries = [
            {"Data": d, "PartitionKey": d.decode(), **({"ExplicitHashKey": hash_key} if hash_key else {})}
            for d in datas[start : start + 100]
        ]
        kinesis.put_records(StreamName=stream, Records=entries)
    return datas


def test_a_fanout_worker_processes_every_record_once_in_order_across_renewals(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker], kinesis_local_proxy: FanOutProxy
) -> None:
    # GIVEN a 2-shard stream with both leases owned by w1, in retrieval mode fanout
    stream, store, keys = stream_with_leases(app_name, ddb, kinesis, 2, owner="w1")
    journal = Journal()
    worker = recording_worker(
        app_name,
        stream,
        ddb=ddb,
        kinesis=kinesis,
        journal=journal,
        retrieval=FANOUT,
        discovery_interval_ms=DISCOVERY_MS,
    )
    workers.append(worker)
    subscriptions_before = kinesis_local_proxy.subscriptions
    worker.start()
    # WHEN records are written over more than two subscription lifetimes (10 s each here; 5 minutes on AWS)
    produced: list[bytes] = []
    for second in range(24):
        produced += put(kinesis, stream, f"t{second:02d}-", 5)
        time.sleep(1.0)  # a real producer's pace across the subscription ends (a fixed sleep, not a bound)
    # THEN every record is processed exactly once, in order per shard: no gap, no repeat across renewals
    eventually(lambda: len(journal.datas()) >= len(produced), bound_s=READ_BOUND_S, what="every record processed")
    assert sorted(journal.datas()) == sorted(produced)
    for records in journal.by_shard().values():
        sequences = [int(seq) for seq, _ in records]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    # AND they came pushed, over renewed subscriptions (each lives 10 s here: every shard's was renewed at least once)
    assert kinesis_local_proxy.subscriptions - subscriptions_before >= 2 * 2
    eventually(
        lambda: all(store.get_lease(k).checkpoint.is_real for k in keys),  # type: ignore[union-attr]
        bound_s=READ_BOUND_S,
        what="every lease checkpointed",
    )


def test_a_subscription_resumes_inside_a_kpl_aggregate_and_hands_out_what_polling_would(
    kinesis: Any, app_name: str
) -> None:
    # GIVEN a shard with plain records and the consumer of the application
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 1)
    arn = StreamConsumers(kinesis, consumer_name=app_name).arn_for(stream)
    put(kinesis, stream, "p", 6)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    first = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    sequences = [r["SequenceNumber"] for r in kinesis.get_records(ShardIterator=first["ShardIterator"])["Records"]]
    # WHEN a subscription starts at a checkpoint (the third record)
    subscriber = ShardSubscriber(
        stream, shard, kinesis_client=kinesis, consumer_arn=arn, start=Checkpoint(sequence=sequences[2])
    )
    try:
        got: list[bytes] = []
        eventually(lambda: collect(subscriber, got, 3), bound_s=READ_BOUND_S, what="3 records pushed")
    finally:
        subscriber.close()
    # THEN it hands out what follows the checkpoint, as polling would
    assert got == [b"p0003", b"p0004", b"p0005"]


def test_a_slow_processor_holds_back_the_subscription_within_bounded_memory(kinesis: Any, app_name: str) -> None:
    # GIVEN a subscription whose reader may hold 2 events while the processor works on one
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 1)
    arn = StreamConsumers(kinesis, consumer_name=app_name).arn_for(stream)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    subscriber = ShardSubscriber(
        stream,
        shard,
        kinesis_client=kinesis,
        consumer_arn=arn,
        start=Checkpoint(sequence="TRIM_HORIZON"),
        config=RetrievalConfig(mode="fanout", fanout_buffer_events=2),
    )
    try:
        subscriber.fetch()  # starts the reader
        # WHEN records keep coming while the processor takes nothing for 6 s (6 pushed events)
        stop = threading.Event()
        writer = threading.Thread(
            target=lambda: [put(kinesis, stream, f"s{n}-", 5) or stop.wait(WRITER_PAUSE_S) for n in range(12)]
        )
        writer.start()
        time.sleep(6.0)  # the processor is busy: real time passing is the point
        waiting = subscriber.events_received
        # THEN the reader stopped reading after the queue filled: at most queue + 1 in hand + 1 being processed
        assert waiting <= 2 + 2, waiting
        writer.join(timeout=hang_bound_s(12 * WRITER_PAUSE_S))
        assert not writer.is_alive(), "the writer hangs"
        # AND nothing was lost: once the processor takes them, every record comes
        got: list[bytes] = []
        eventually(lambda: collect(subscriber, got, 60), bound_s=READ_BOUND_S, what="the 60 records held back")
        assert len(got) == 60 and len(set(got)) == 60
    finally:
        subscriber.close()


def test_a_split_ends_the_parent_with_its_children_and_they_follow(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a 1-shard stream read by w1 in fanout mode, with records in it
    stream, store, (parent,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    journal = Journal()
    worker = recording_worker(
        app_name,
        stream,
        ddb=ddb,
        kinesis=kinesis,
        journal=journal,
        retrieval=FANOUT,
        discovery_interval_ms=DISCOVERY_MS,
        lease=LeaseConfig(failover_time_ms=3_000),
    )
    workers.append(worker)
    worker.start()
    before = put(kinesis, stream, "before-", 20)
    eventually(lambda: len(journal.datas()) >= 20, bound_s=READ_BOUND_S, what="20 records processed")
    # WHEN the shard is split
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(2**127))
    # THEN the parent's subscription ends with its two children, the lease is finished, its children exist
    eventually_showing(
        lambda: parent in journal.ended,
        bound_s=SHARD_END_BOUND_S,
        what="the parent's shard end",
        detail=lambda: journal.events,
    )
    lease = store.get_lease(parent)
    assert lease is not None and lease.checkpoint.is_shard_end
    children = {lease.lease_key for lease in store.list_leases() if lease.lease_key != parent}
    assert len(children) == 2
    assert sorted(journal.datas()) == sorted(before)


def test_a_poison_record_under_fanout_stops_its_shard_by_the_failure_policy(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a 1-shard stream read by fan-out, a processor that cannot take one record, and policy stop-shard
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    journal = Journal()

    class Poisoned(RecordingProcessor):
        def process_records(self, input: ProcessRecordsInput) -> None:
            if any(r.data == b"p-0005" for r in input.records):
                raise ValueError("cannot parse")
            super().process_records(input)

    config = WorkerConfig(
        app=app_name,
        stream=stream,
        worker_id="w1",
        retrieval=FANOUT,
        failures=FailureConfig(on_failure="stop-shard", retry_backoff_ms=10),
        discovery_interval_ms=DISCOVERY_MS,
        shutdown_timeout_ms=10_000,
    )
    worker = Worker(config, lambda: Poisoned(journal), dynamodb=ddb, kinesis=kinesis)
    workers.append(worker)
    produced = put(kinesis, stream, "p-", 10)
    worker.start()
    # THEN the records before it are processed (bisection), the shard stops at it, marked, and given up
    eventually(
        lambda: (lease := store.get_lease(key)) is not None and lease.is_stopped,
        bound_s=READ_BOUND_S,
        what="the shard stopped at the poison record",
    )
    assert journal.datas() == produced[:5]
    stopped = store.get_lease(key)
    assert stopped is not None and stopped.lease_owner is None and stopped.block is not None
    eventually(lambda: key in worker.outcomes, bound_s=READ_BOUND_S, what="the consumer's outcome")
    assert worker.outcomes[key].value == "stopped"
