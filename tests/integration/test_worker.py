"""The Worker in-process against emulators: every record once, checkpoints, restart, resharding order."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.support.processes import eventually_showing
from tests.support.recording import Journal, RecordingProcessor, assign_unowned, recording_worker, stream_with_leases
from tests.support.stalls import eventually, hang_bound_s, stall_note
from tests.support.tables import create_foreign_table
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import EndpointUnreachableError, StreamMissingError, TableMissingError, TableSchemaError
from worker_lib.core.models import Lease
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.processing.destinations import FailureDestination, SqsDestination
from worker_lib.processing.failures import RecordFailedError
from worker_lib.processing.processor import (
    Checkpointer,
    FunctionProcessor,
    KinesisRecord,
    ProcessorFailedError,
    RecordProcessor,
)
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, split_shard
from worker_lib.testing.waiting import wait_until
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

FAST_LEASES = LeaseConfig(failover_time_ms=3_000)
FAST_READS = RetrievalConfig(idle_time_between_reads_ms=100)
DISCOVERY_MS = 200
METRICS = WorkerMetricsConfig(sample_interval_ms=200, report_interval_ms=1_000, first_report_delay_ms=200)
# The workers' timings in seconds, and the liveness bounds derived from them (tests/support/stalls.py)
RENEWAL_S = FAST_LEASES.failover_time_ms / 3 / 1000  # renewals and heartbeats
READ_S = FAST_READS.idle_time_between_reads_ms / 1000
DISCOVERY_S = DISCOVERY_MS / 1000
PARENT_POLL_S = ConsumerConfig().parent_poll_interval_ms / 1000  # a child re-checks its parents
BACKOFF_MAX_S = FailureConfig().retry_backoff_max_ms / 1000  # a failing destination's retries, at their longest
READ_BOUND_S = hang_bound_s(DISCOVERY_S + READ_S)  # an owned lease is found and read
RENEWAL_BOUND_S = hang_bound_s(RENEWAL_S + READ_S)  # a renewal (or a report) sees what changed
REPORT_BOUND_S = hang_bound_s((METRICS.first_report_delay_ms + METRICS.report_interval_ms) / 1000)
SHUTDOWN_BOUND_S = hang_bound_s(RENEWAL_S)  # a graceful shutdown: the batch in hand, a checkpoint, the release
ASSIGN_S = 0.2  # the stand-in leader's pace (test_split_and_merge_…)
PROBE_TIMEOUT_S = 5.0  # the start-up probe's read timeout (test_an_endpoint_that_never_answers_…)


def put(kinesis: Any, stream: str, start: int, count: int) -> list[bytes]:
    datas = [f"record-{n:05d}".encode() for n in range(start, start + count)]
    for i in range(0, count, 100):
        chunk = datas[i : i + 100]
        kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": d.decode()} for d in chunk])
    return datas


def start_worker(
    app: str, stream: str, worker_id: str, journal: Journal, *, ddb: Any, kinesis: Any, workers: list[Worker]
) -> Worker:
    """An in-process worker recording into ``journal``, started (and shut down at the end of the test)."""
    worker = recording_worker(
        app,
        stream,
        ddb=ddb,
        kinesis=kinesis,
        journal=journal,
        worker_id=worker_id,
        lease=FAST_LEASES,
        discovery_interval_ms=DISCOVERY_MS,
        worker_metrics=METRICS,
    )
    workers.append(worker)
    worker.start()
    return worker


def test_a_worker_processes_every_record_once_and_a_restart_resumes_from_checkpoints(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN 4 leases assigned to w1 and 300 records
    stream, store, _ = stream_with_leases(app_name, ddb, kinesis, 4, owner="w1")
    produced = put(kinesis, stream, 0, 300)
    journal = Journal()
    # WHEN w1 runs
    w1 = start_worker(app_name, stream, "w1", journal, ddb=ddb, kinesis=kinesis, workers=workers)
    # THEN every record is processed exactly once
    eventually(lambda: len(journal.datas()) >= 300, bound_s=READ_BOUND_S, what="300 records")
    assert sorted(journal.datas()) == sorted(produced)
    # AND per-shard order is the sequence order
    for sequence in journal.by_shard().values():
        assert sequence == sorted(sequence, key=lambda s: (int(s[0]), s[1]))
    # AND the worker reports its CPU to the leader in KCL's worker-metrics format
    metrics = WorkerMetricsStore(app_name, client=ddb)
    eventually(
        lambda: (m := metrics.get("w1")) is not None and bool(m.stats.get("C")),
        bound_s=REPORT_BOUND_S,
        what="w1 reported its CPU",
    )
    # AND the renewals report each lease's throughput to the leader (KCL's throughputKBps)
    eventually(
        lambda: all((x.throughput_kbps or 0) > 0 for x in store.list_leases()),
        bound_s=RENEWAL_BOUND_S,
        what="every lease's throughput",
    )
    # WHEN w1 shuts down gracefully
    assert w1.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN its leases are free at once and hold the last sequence number of each shard
    leases = store.list_leases()
    assert all(lease.lease_owner is None for lease in leases)
    last = {shard: seqs[-1][0] for shard, seqs in journal.by_shard().items()}
    assert {lease.lease_key: lease.checkpoint.sequence for lease in leases if lease.lease_key in last} == last
    # WHEN 100 more records arrive and w2 takes over
    produced += put(kinesis, stream, 300, 100)
    assign_unowned(store, lambda lease: "w2")
    w2 = start_worker(app_name, stream, "w2", journal, ddb=ddb, kinesis=kinesis, workers=workers)
    # THEN w2 processes only the new records: nothing lost, nothing twice
    eventually(lambda: len(journal.datas()) >= 400, bound_s=READ_BOUND_S, what="400 records")
    assert w2.shutdown(timeout_s=SHUTDOWN_BOUND_S)  # drains in-flight batches: a duplicate would show up now
    assert sorted(journal.datas()) == sorted(produced)


def test_a_lease_taken_away_stops_processing_and_never_checkpoints_again(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN w1 processing the one lease of a 1-shard stream
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    put(kinesis, stream, 0, 10)
    journal = Journal()
    start_worker(app_name, stream, "w1", journal, ddb=ddb, kinesis=kinesis, workers=workers)
    eventually(lambda: len(journal.datas()) >= 10, bound_s=READ_BOUND_S, what="10 records")
    # WHEN the leader reassigns the lease to w2 (as after an expiry)
    lease = store.get_lease(key)
    assert lease is not None and store.assign_lease(lease, "w2") is not None
    # THEN w1 notices at its next renewal and calls lease_lost
    eventually(lambda: ("lease_lost", key) in journal.events, bound_s=RENEWAL_BOUND_S, what="w1's lease_lost")
    # AND records put afterwards are not processed by w1 (watched for a while: a fixed window, not a bound)
    put(kinesis, stream, 10, 5)
    assert wait_until(lambda: len(journal.datas()) > 10, timeout_s=1.5) is False
    stored = store.get_lease(key)
    assert stored is not None and stored.lease_owner == "w2"


@pytest.mark.kinesalite
def test_split_and_merge_while_producing_keep_order_and_lose_nothing(
    kinesalite_endpoint: str, moto_aws: AwsConfig, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a 3-shard stream on kinesalite (faithful resharding), leases in moto, two workers
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=2))
    stream, store, _ = stream_with_leases(app_name, ddb, kinesis, 3)
    journal = Journal()
    names = ["w1", "w2"]
    for name in names:
        start_worker(app_name, stream, name, journal, ddb=ddb, kinesis=kinesis, workers=workers)
    stop = threading.Event()

    def assigner() -> None:  # stand-in for the leader: round-robin every unowned lease
        turn = 0
        while not stop.wait(ASSIGN_S):

            def owner(_lease: object) -> str:
                nonlocal turn
                turn += 1
                return names[turn % 2]

            assign_unowned(store, owner)

    helper = threading.Thread(target=assigner, daemon=True)
    helper.start()
    try:
        produced = put(kinesis, stream, 0, 150)
        # WHEN shard 0 is split and shards 1+2 merged while records keep coming
        shards = sorted(list_all_shards(kinesis, stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
        split_shard(kinesis, stream, shards[0]["ShardId"])
        produced += put(kinesis, stream, 150, 150)
        merge_shards(kinesis, stream, shards[1]["ShardId"], shards[2]["ShardId"])
        produced += put(kinesis, stream, 300, 150)
        # THEN every record is processed exactly once
        eventually_showing(
            lambda: len(journal.datas()) >= len(produced),
            bound_s=hang_bound_s(PARENT_POLL_S + ASSIGN_S + DISCOVERY_S + READ_S),  # children wait for their parents
            what="every record of the parents and the children",
            detail=lambda: len(journal.datas()),
        )
        stop.set()
        helper.join(timeout=hang_bound_s(ASSIGN_S))
        assert all(worker.shutdown(timeout_s=SHUTDOWN_BOUND_S) for worker in workers)  # drain: duplicates show now
        assert sorted(journal.datas()) == sorted(produced)
    finally:
        stop.set()
        helper.join(timeout=hang_bound_s(ASSIGN_S))
    # AND per-shard order holds
    for sequence in journal.by_shard().values():
        assert sequence == sorted(sequence, key=lambda s: (int(s[0]), s[1]))
    # AND every child started only after all its parents ended
    listing = list_all_shards(kinesis, stream)
    for shard in listing:
        parents = [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p]
        child_first = min((r[4] for r in journal.records if r[0] == shard["ShardId"]), default=None)
        if parents and child_first is not None:
            assert all(p in journal.ended and journal.ended[p] <= child_first for p in parents)
    # AND the parents' leases hold SHARD_END with their children recorded
    for shard in listing:
        if shard.get("SequenceNumberRange", {}).get("EndingSequenceNumber"):
            lease = store.get_lease(shard["ShardId"])
            assert lease is not None and lease.is_finished and lease.child_shard_ids


def test_a_graceful_handoff_moves_a_lease_at_a_batch_boundary_without_loss_or_duplicates(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN w1 holding the one lease of a 1-shard stream, w2 running beside it, 100 records processed
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    journal = Journal()
    w1, w2 = (
        start_worker(app_name, stream, w, journal, ddb=ddb, kinesis=kinesis, workers=workers) for w in ("w1", "w2")
    )
    produced = put(kinesis, stream, 0, 100)
    eventually(lambda: len(journal.datas()) >= 100, bound_s=READ_BOUND_S, what="100 records")
    # WHEN the leader starts a graceful handoff from w1 to w2
    lease = store.get_lease(key)
    assert lease is not None and store.initiate_graceful_handoff(lease, "w2") is not None
    # THEN w1 finishes, checkpoints in shutdown_requested and completes the handoff; w2 takes over
    eventually(lambda: ("shutdown_requested", key) in journal.events, bound_s=RENEWAL_BOUND_S, what="w1 asked to stop")
    eventually(lambda: key in w2.held_leases, bound_s=RENEWAL_BOUND_S, what="w2 holds the lease")
    stored = store.get_lease(key)
    assert stored is not None and stored.lease_owner == "w2" and stored.checkpoint_owner is None
    # AND records after the handoff are processed once, by w2
    produced += put(kinesis, stream, 100, 50)
    eventually(lambda: len(journal.datas()) >= 150, bound_s=READ_BOUND_S, what="150 records")
    assert all(w.shutdown(timeout_s=SHUTDOWN_BOUND_S) for w in (w1, w2))
    assert sorted(journal.datas()) == sorted(produced)


def w1_worker(
    app: str,
    stream: str,
    factory: Callable[[], RecordProcessor],
    consumer: ConsumerConfig | None = None,
    *,
    failures: FailureConfig | None = None,
    destination: FailureDestination | None = None,
    ddb: Any,
    kinesis: Any,
) -> Worker:
    """Worker w1 with short timings and ``consumer``'s and ``failures``' settings, not started."""
    config = WorkerConfig(
        app=app,
        stream=stream,
        worker_id="w1",
        lease=FAST_LEASES,
        retrieval=FAST_READS,
        consumer=consumer or ConsumerConfig(),
        failures=failures or FailureConfig(),
        discovery_interval_ms=DISCOVERY_MS,
    )
    return Worker(config, factory, dynamodb=ddb, kinesis=kinesis, failure_destination=destination)


def test_a_processor_that_keeps_failing_gives_the_lease_up_without_losing_the_batch(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN w1's one lease with 20 records, and a processor that raises on every batch (2 retries)
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    put(kinesis, stream, 0, 20)
    attempts: list[int] = []

    class Failing(RecordingProcessor):
        def process_records(self, input: Any) -> None:
            attempts.append(len(input.records))
            raise ValueError("poison")

    worker = w1_worker(
        app_name,
        stream,
        lambda: Failing(Journal()),
        failures=FailureConfig(max_attempts=3, retry_backoff_ms=10),
        ddb=ddb,
        kinesis=kinesis,
    )
    workers.append(worker)
    # WHEN the processor raises on every attempt
    worker.start()
    # THEN after 1 + 2 attempts the lease is given up, unowned, and its checkpoint never moved
    eventually(lambda: len(attempts) >= 3, bound_s=READ_BOUND_S, what="3 attempts")
    eventually(
        lambda: (store.get_lease(key) or Lease(lease_key="?")).lease_owner is None,
        bound_s=RENEWAL_BOUND_S,
        what="the lease given up",
    )
    stored = store.get_lease(key)
    assert stored is not None and not stored.checkpoint.is_real
    assert attempts[:3] == [20, 20, 20]


def test_a_processor_failure_ends_the_lease_at_once_without_retry(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN w1's one lease with 20 records, and a processor that can do nothing more (a MultiLang child that died)
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    put(kinesis, stream, 0, 20)
    attempts: list[int] = []

    class Gone(RecordingProcessor):
        def process_records(self, input: Any) -> None:
            attempts.append(len(input.records))
            raise ProcessorFailedError("the child exited with code 3")

    worker = w1_worker(
        app_name,
        stream,
        lambda: Gone(Journal()),
        failures=FailureConfig(max_attempts=4, retry_backoff_ms=10),
        ddb=ddb,
        kinesis=kinesis,
    )
    workers.append(worker)
    worker.start()
    # THEN the lease is given up after the one attempt (no retries), unowned, its checkpoint unmoved
    eventually(
        lambda: (store.get_lease(key) or Lease(lease_key="?")).lease_owner is None,
        bound_s=READ_BOUND_S,
        what="the lease given up",
    )
    eventually(lambda: key in worker.outcomes, bound_s=READ_BOUND_S, what="the consumer's outcome")
    assert attempts == [20] and worker.outcomes[key].value == "gave_up"
    stored = store.get_lease(key)
    assert stored is not None and not stored.checkpoint.is_real


def skip_and_record_worker(
    app: str, stream: str, handle: Callable[..., object], sqs: Any, queue_arn: str, *, ddb: Any, kinesis: Any
) -> Worker:
    """w1 with a function processor, policy skip-and-record to the queue (short backoffs), started."""
    worker = w1_worker(
        app,
        stream,
        lambda: FunctionProcessor(handle),
        failures=FailureConfig(on_failure="skip-and-record", destination=queue_arn, retry_backoff_ms=10),
        destination=SqsDestination(sqs, queue_arn),
        ddb=ddb,
        kinesis=kinesis,
    )
    worker.start()
    return worker


@pytest.mark.parametrize("style", ["returns batchItemFailures", "raises RecordFailedError"])
def test_a_function_processor_reports_a_partial_batch_and_the_poison_record_goes_to_the_queue(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker], *, moto_aws: AwsConfig, style: str
) -> None:
    # GIVEN w1's one lease with 20 records, record 7 poison, a function processor that reports the first record it
    # could not handle (as a Lambda function with ReportBatchItemFailures does), and skip-and-record to a queue
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put(kinesis, stream, 0, 20)
    sqs = aws.client("sqs", moto_aws)
    queue_url = sqs.create_queue(QueueName=f"{app_name}-failed")["QueueUrl"]
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{app_name}-failed"
    handled: list[bytes] = []

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> object:
        for record in records:
            if record.data == b"record-00007":
                if style == "raises RecordFailedError":
                    raise RecordFailedError(record) from ValueError("cannot parse")
                return {"batchItemFailures": [{"itemIdentifier": record.sequence_number}]}
            handled.append(record.data)
        return None

    workers.append(skip_and_record_worker(app_name, stream, handle, sqs, queue_arn, ddb=ddb, kinesis=kinesis))
    # THEN every other record is handled once, in order; the poison record alone reaches the queue, once
    eventually(lambda: len(handled) >= 19, bound_s=READ_BOUND_S, what="19 records handled")
    assert handled == [d for d in produced if d != b"record-00007"]
    body = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    (report,) = [json.loads(m["Body"]) for m in body]
    assert report["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert report["KinesisBatchInfo"]["batchSize"] == 1 and report["shardlease"]["workerId"] == "w1"
    # AND it names the stream by its ARN, as Lambda's on-failure record does (a redrive reads it from there)
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    assert report["KinesisBatchInfo"]["streamArn"] == arn

    # AND the lease's checkpoint moves past it, without a failure mark left behind
    def moved_past() -> bool:
        lease = store.get_lease(key)
        return lease is not None and lease.block is None and lease.checkpoint.is_real

    eventually(moved_past, bound_s=READ_BOUND_S, what="the checkpoint past the poison record")


def test_a_failure_destination_that_fails_holds_the_shard_and_drops_nothing(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker], *, moto_aws: AwsConfig
) -> None:
    # GIVEN skip-and-record to a queue that does not exist yet, and a poison record among 12
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put(kinesis, stream, 0, 12)
    sqs = aws.client("sqs", moto_aws)
    queue = f"{app_name}-failed"
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{queue}"
    handled: list[bytes] = []

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> object:
        if any(r.data == b"record-00005" for r in records):
            raise ValueError("cannot parse")
        handled.extend(r.data for r in records)
        return None

    workers.append(skip_and_record_worker(app_name, stream, handle, sqs, queue_arn, ddb=ddb, kinesis=kinesis))

    # WHEN the destination cannot take the report THEN the shard waits at the poison record, marked as blocked
    def blocked() -> bool:
        lease = store.get_lease(key)
        return lease is not None and lease.block is not None

    eventually(lambda: handled == produced[:5] and blocked(), bound_s=READ_BOUND_S, what="the shard blocked")
    time.sleep(1.5)  # the destination keeps failing meanwhile (its retries are real-time backoffs; not a bound)
    assert handled == produced[:5]
    # WHEN the queue appears THEN the report is sent, the shard goes on, and the mark is removed
    queue_url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    eventually(
        lambda: handled == [d for d in produced if d != b"record-00005"],
        bound_s=hang_bound_s(BACKOFF_MAX_S + READ_S),  # the destination's next retry, at its longest backoff
        what="the shard went on",
    )
    (message,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert json.loads(message["Body"])["KinesisBatchInfo"]["batchSize"] == 1
    eventually(lambda: not blocked(), bound_s=READ_BOUND_S, what="the block mark removed")


def test_empty_reads_reach_the_processor_when_asked(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN w1's one lease on an empty shard, and KCL's callProcessRecordsEvenForEmptyRecordList
    stream, _, _ = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    batches: list[int] = []

    class Counting(RecordingProcessor):
        def process_records(self, input: Any) -> None:
            batches.append(len(input.records))

    worker = w1_worker(
        app_name,
        stream,
        lambda: Counting(Journal()),
        ConsumerConfig(deliver_empty_batches=True),
        ddb=ddb,
        kinesis=kinesis,
    )
    workers.append(worker)
    worker.start()
    # THEN process_records is called for reads that returned nothing (each read, after the idle time)
    eventually(lambda: len(batches) >= 3, bound_s=hang_bound_s(3 * READ_S), what="3 empty batches")
    assert set(batches) == {0}


# --- start: one clear error within 30 s, never a retry loop --------------------------------------------------------


def _blank_worker(app: str, stream: str, aws_config: AwsConfig, clock: Any = None, **config: Any) -> Worker:
    """A worker built as the README builds it: no clients injected, only settings."""
    settings = WorkerConfig(app=app, stream=stream, worker_id="w-start", aws=aws_config, **config)
    kwargs = {} if clock is None else {"clock": clock}
    return Worker(settings, lambda: RecordingProcessor(Journal()), **kwargs)


def test_an_unreachable_endpoint_at_start_is_one_error_within_the_startup_timeout() -> None:
    # GIVEN a worker whose endpoint refuses connections (nothing listens on port 9), on a manual clock
    clock = ManualClock()
    worker = _blank_worker("orders", "orders-stream", AwsConfig(endpoint_url="http://127.0.0.1:9"), clock)
    started_wall, started = time.monotonic(), clock.monotonic()
    # WHEN it is run as the README runs it
    with pytest.raises(EndpointUnreachableError) as err:
        worker.run(install_signal_handlers=False)
    # THEN it gives up with one line naming the endpoint, having retried for the startup timeout (15 s) at most
    message = str(err.value)
    assert "\n" not in message and "cannot reach endpoint http://127.0.0.1:9" in message
    assert "still failing after 15 s" in message
    assert 10 <= clock.monotonic() - started <= 15
    assert time.monotonic() - started_wall < hang_bound_s(0.0), stall_note(started_wall)  # liveness: no real waits
    # AND nothing was started
    assert worker.held_leases == [] and not any(t.name == "worker-w-start" for t in threading.enumerate())


def test_an_endpoint_that_never_answers_fails_within_30_seconds() -> None:
    # GIVEN an endpoint that accepts connections and never answers (the worst case: every probe times out)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        worker = _blank_worker("orders", "orders-stream", AwsConfig(endpoint_url=url), startup_timeout_ms=0)
        started = time.monotonic()
        # WHEN the worker starts THEN it fails with a typed error after one probe's read timeout (5 s), not minutes
        # (how long is a liveness bound derived from that timeout)
        with pytest.raises(EndpointUnreachableError, match="timed out"):
            worker.preflight()
        assert time.monotonic() - started < hang_bound_s(PROBE_TIMEOUT_S), stall_note(started)


def test_a_missing_table_at_start_fails_at_once_naming_create_tables(moto_aws: AwsConfig, app_name: str) -> None:
    # GIVEN an emulator without the application's tables
    worker = _blank_worker(app_name, "orders-stream", moto_aws, ManualClock())
    # WHEN the worker is run THEN it fails at once with one line telling what to do
    with pytest.raises(TableMissingError) as err:
        worker.run(install_signal_handlers=False)
    expected = f"dynamodb DescribeTable on {app_name}: table not found (run `shardlease create-tables`)"
    assert str(err.value) == expected


def test_a_missing_stream_at_start_fails_at_once(ddb: Any, kinesis: Any, app_name: str, moto_aws: AwsConfig) -> None:
    # GIVEN the application's tables but no stream
    worker = _blank_worker(app_name, "no-such-stream", moto_aws, ManualClock())
    # WHEN the worker is run THEN it fails at once with one line naming the stream
    with pytest.raises(
        StreamMissingError, match=r"^kinesis DescribeStreamSummary on no-such-stream: stream not found$"
    ):
        worker.run(install_signal_handlers=False)


def test_an_embedded_leader_needs_the_coordinator_table_at_start(
    ddb: Any, kinesis: Any, app_name: str, moto_aws: AwsConfig
) -> None:
    # GIVEN the tables without CoordinatorState, and a worker that would also lead
    ddb.delete_table(TableName=f"{app_name}-CoordinatorState")
    create_stream(kinesis, f"{app_name}-s", 1)
    worker = _blank_worker(app_name, f"{app_name}-s", moto_aws, ManualClock(), leader_mode="embedded")
    # WHEN it starts THEN the missing leader table is named before anything runs
    with pytest.raises(TableMissingError, match="CoordinatorState"):
        worker.preflight()


def test_a_table_with_other_keys_at_start_is_one_schema_error(
    ddb: Any, kinesis: Any, app_name: str, moto_aws: AwsConfig
) -> None:
    # GIVEN the worker-metrics table replaced by one with another key (made by hand or another tool)
    metrics_table = f"{app_name}-WorkerMetricStats"
    create_foreign_table(ddb, metrics_table, replace=True)
    create_stream(kinesis, f"{app_name}-s", 1)
    worker = _blank_worker(app_name, f"{app_name}-s", moto_aws, ManualClock())
    # WHEN it starts THEN one line names the table and the key it needs, before anything is written
    with pytest.raises(
        TableSchemaError, match=rf"^table {metrics_table} exists with key .* needs hash key 'wid' only$"
    ):
        worker.run(install_signal_handlers=False)
