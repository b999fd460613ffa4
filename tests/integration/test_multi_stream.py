"""Multi-stream applications on moto (docs/multi-stream.md): one lease table, several streams, KCL's keys.

The leader's shard sync of every tracked stream, a stream deleted in Kinesis, a stream dropped from the tracker
and its grace period (an injected clock, carried across a change of leader), and a worker reading two streams.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from tests.support.processes import eventually_showing
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.models import TRIM_HORIZON
from worker_lib.core.streams import StreamIdentifier, StreamSelection, split_lease_key
from worker_lib.leader.factory import build_leader
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.processing.config import FailureConfig
from worker_lib.processing.destinations import FailureDestination, SqsDestination
from worker_lib.processing.failures import RecordFailedError
from worker_lib.processing.processor import (
    Checkpointer,
    FunctionProcessor,
    InitializationInput,
    KinesisRecord,
    LeaseLostInput,
    ProcessorFactory,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.shardsync.multistream import FORMER_STREAMS_KEY
from worker_lib.shardsync.syncer import ShardSyncResult
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig

GRACE_MS = 600_000
# The embedded worker's timings (embedded_worker, and what its tests set), and the liveness bounds derived from them
# (tests/support/stalls.py): its leader makes and assigns the leases once it reported, it finds them and reads; a
# deleted stream is seen by a shard sync and its lease's renewal then fails
FAILOVER_MS, READ_MS, DISCOVERY_MS, FIRST_REPORT_MS = 3_000, 100, 200, 200
FAST_TICK_MS, CYCLE_MS, SHARD_SYNC_MS = 200, 500, 1_000
READ_BOUND_S = hang_bound_s((FIRST_REPORT_MS + CYCLE_MS + DISCOVERY_MS + READ_MS) / 1000)
DELETED_BOUND_S = hang_bound_s((SHARD_SYNC_MS + CYCLE_MS + FAILOVER_MS / 3) / 1000)


@pytest.fixture
def clients(moto_aws: AwsConfig, app_name: str) -> tuple[Any, Any]:
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    return ddb, aws.client("kinesis", moto_aws)


def identifier(kinesis: Any, stream: str) -> StreamIdentifier:
    summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    return StreamIdentifier(
        account_id=summary["StreamARN"].split(":")[4],
        stream_name=stream,
        creation_epoch=int(summary["StreamCreationTimestamp"].timestamp()),
    )


def two_streams(kinesis: Any, app_name: str, shards: int) -> tuple[str, str]:
    """Streams ``<app>-a`` and ``<app>-b`` created, of ``shards`` shards each; their names."""
    names = (f"{app_name}-a", f"{app_name}-b")
    for name in names:
        create_stream(kinesis, name, shards)
    return names


def sync(
    app: str, clients: tuple[Any, Any], streams: StreamSelection, clock: ManualClock | None = None
) -> ShardSyncResult:
    """One shard sync by a leader built afresh (as every Lambda invocation builds it)."""
    ddb, kinesis = clients
    parts = build_leader(
        app=app,
        stream=streams,
        shard_sync=ShardSyncConfig(initial_position=InitialPosition.TRIM_HORIZON, former_stream_grace_ms=GRACE_MS),
        with_assignment=False,
        dynamodb=ddb,
        kinesis=kinesis,
        clock=clock or ManualClock(),
    )
    return parts.syncer.sync_once()


def keys_by_stream(store: DynamoDBLeaseStore) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for lease in store.list_leases():
        stream, shard = split_lease_key(lease.lease_key)
        out.setdefault(stream.stream_name if stream else "", set()).add(shard)
    return out


def test_the_leader_syncs_every_stream_into_one_table_with_kcls_multi_stream_items(
    clients: tuple[Any, Any], app_name: str
) -> None:
    ddb, kinesis = clients
    # GIVEN two streams of 2 and 3 shards
    create_stream(kinesis, f"{app_name}-a", 2)
    create_stream(kinesis, f"{app_name}-b", 3)
    # WHEN a multi-stream leader syncs them
    result = sync(app_name, clients, StreamSelection(names=(f"{app_name}-a", f"{app_name}-b")))
    # THEN each shard has one lease keyed account:stream:creationEpoch:shardId, carrying streamName and shardId
    a, b = identifier(kinesis, f"{app_name}-a"), identifier(kinesis, f"{app_name}-b")
    assert set(result.streams_synced) == {a.serialize(), b.serialize()}
    items = ddb.scan(TableName=app_name, ConsistentRead=True)["Items"]
    assert len(items) == 5 and len(result.created) == 5
    for item in items:
        stream, shard = split_lease_key(item["leaseKey"]["S"])
        assert stream in (a, b)
        assert item["streamName"] == {"S": stream.serialize()}
        assert item["shardId"] == {"S": shard}
        assert item["entityType"] == {"S": "LEASE"}
        assert item["checkpoint"] == {"S": TRIM_HORIZON.sequence}
    # AND a second sync changes nothing
    again = sync(app_name, clients, StreamSelection(names=(f"{app_name}-a", f"{app_name}-b")))
    assert again.created == () and again.deleted == ()


def test_a_stream_deleted_in_kinesis_loses_its_leases_and_does_not_hold_the_others_back(
    clients: tuple[Any, Any], app_name: str
) -> None:
    ddb, kinesis = clients
    store = DynamoDBLeaseStore(app_name, client=ddb)
    names = two_streams(kinesis, app_name, 2)
    sync(app_name, clients, StreamSelection(names=names))
    doomed = identifier(kinesis, names[1])
    # GIVEN stream b is deleted in Kinesis while still tracked, and a new stream c is tracked
    kinesis.delete_stream(StreamName=names[1])
    create_stream(kinesis, f"{app_name}-c", 2)
    tracked = (*names, f"{app_name}-c")
    # WHEN the leader syncs
    result = sync(app_name, clients, StreamSelection(names=tracked))
    # THEN b is reported missing and its leases are gone, while a and c are synced in the same pass
    assert result.streams_missing == (names[1],)
    assert result.former_streams_deleted == (doomed.serialize(),)
    assert set(result.streams_synced) == {identifier(kinesis, n).serialize() for n in (names[0], tracked[2])}
    assert keys_by_stream(store) == {
        names[0]: {"shardId-000000000000", "shardId-000000000001"},
        tracked[2]: {"shardId-000000000000", "shardId-000000000001"},
    }


class Tracker:
    """A stream tracker whose answer the test changes."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)

    def __call__(self) -> list[str]:
        return list(self.names)


def tracked_application(
    clients: tuple[Any, Any], app_name: str
) -> tuple[DynamoDBLeaseStore, list[str], Tracker, StreamSelection, ManualClock]:
    """Two one-shard streams a tracker answers, synced once on an injected clock."""
    ddb, kinesis = clients
    names = list(two_streams(kinesis, app_name, 1))
    tracker = Tracker(names)
    streams = StreamSelection(tracker=tracker)
    clock = ManualClock()
    sync(app_name, clients, streams, clock)
    return DynamoDBLeaseStore(app_name, client=ddb), names, tracker, streams, clock


def test_a_stream_dropped_from_the_tracker_keeps_its_leases_for_the_grace_period_across_leaders(
    clients: tuple[Any, Any], app_name: str
) -> None:
    ddb, kinesis = clients
    store, names, tracker, streams, clock = tracked_application(clients, app_name)
    dropped = identifier(kinesis, names[1]).serialize()
    # GIVEN the tracker stops answering stream b
    tracker.names = names[:1]
    # WHEN leaders sync over almost the grace period
    first = sync(app_name, clients, streams, clock)
    clock.advance(GRACE_MS / 1000 - 1)
    before = sync(app_name, clients, streams, clock)
    # THEN b's leases stay, its clock kept in CoordinatorState across the (new) leaders
    assert first.former_streams_waiting == (dropped,) and before.former_streams_waiting == (dropped,)
    assert set(keys_by_stream(store)) == set(names)
    stored = CoordinatorStateStore(app_name, client=ddb).get(FORMER_STREAMS_KEY)
    assert stored is not None and stored["since"] == {dropped: int(ManualClock().wall() * 1000)}
    # WHEN the grace period is over
    clock.advance(1)
    after = sync(app_name, clients, streams, clock)
    # THEN b's leases are deleted and nothing waits any more
    assert after.former_streams_deleted == (dropped,) and after.former_streams_waiting == ()
    assert set(keys_by_stream(store)) == {names[0]}
    assert CoordinatorStateStore(app_name, client=ddb).get(FORMER_STREAMS_KEY) == {
        "key": FORMER_STREAMS_KEY,
        "since": {},
    }


def test_a_stream_tracked_again_within_its_grace_period_keeps_everything(
    clients: tuple[Any, Any], app_name: str
) -> None:
    store, names, tracker, streams, clock = tracked_application(clients, app_name)
    before = {lease.lease_key: lease for lease in store.list_leases()}
    # GIVEN b drops out of the tracker for a while
    tracker.names = names[:1]
    sync(app_name, clients, streams, clock)
    clock.advance(GRACE_MS / 2000)
    # WHEN it comes back and the rest of the grace period passes
    tracker.names = names
    back = sync(app_name, clients, streams, clock)
    clock.advance(GRACE_MS / 1000)
    later = sync(app_name, clients, streams, clock)
    # THEN its leases were never touched and its clock was cleared
    assert back.former_streams_waiting == () and later.former_streams_deleted == ()
    assert {lease.lease_key: lease for lease in store.list_leases()} == before


def test_a_tracker_that_raises_makes_the_sync_write_nothing(clients: tuple[Any, Any], app_name: str) -> None:
    _, kinesis = clients
    create_stream(kinesis, f"{app_name}-a", 1)

    def broken() -> list[str]:
        raise RuntimeError("config service down")

    result = sync(app_name, clients, StreamSelection(tracker=broken))
    assert result.listing_complete is False and result.created == ()


Seen = list[tuple[str, str | None, str, bytes]]
"""(stream name, stream identifier, shard, data) of every record a :class:`StreamRecorder` got, in order."""


class StreamRecorder:
    """Records (stream name, stream identifier, shard, data) of every record; checkpoints every batch."""

    def __init__(self, seen: Seen, lock: threading.Lock) -> None:
        self.seen, self.lock = seen, lock
        self.stream, self.shard = "", ""
        self.identifier: str | None = None

    def initialize(self, input: InitializationInput) -> None:
        self.stream, self.identifier, self.shard = input.stream_name, input.stream_identifier, input.shard_id

    def process_records(self, input: ProcessRecordsInput) -> None:
        with self.lock:
            self.seen.extend((self.stream, self.identifier, input.shard_id, r.data) for r in input.records)
        input.checkpointer.checkpoint()

    def lease_lost(self, input: LeaseLostInput) -> None:
        pass

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        input.checkpointer.checkpoint()


def recording() -> tuple[Seen, threading.Lock]:
    """An empty record of what a :class:`StreamRecorder` gets, and the lock it takes to add to it."""
    return [], threading.Lock()


def embedded_worker(
    clients: tuple[Any, Any],
    seen: Seen,
    lock: threading.Lock,
    *,
    processor: ProcessorFactory | None = None,
    destination: FailureDestination | None = None,
    **settings: Any,
) -> Worker:
    """A worker ``w1`` leading too (embedded leader, unless ``settings`` say otherwise), with short timings,
    recording into ``seen`` (or running ``processor``)."""
    ddb, kinesis = clients
    settings.setdefault("leader_mode", "embedded")
    config = WorkerConfig(
        worker_id="w1",
        lease=LeaseConfig(failover_time_ms=FAILOVER_MS),
        retrieval=RetrievalConfig(idle_time_between_reads_ms=READ_MS),
        discovery_interval_ms=DISCOVERY_MS,
        worker_metrics=WorkerMetricsConfig(
            sample_interval_ms=200, report_interval_ms=1_000, first_report_delay_ms=FIRST_REPORT_MS
        ),
        **settings,
    )
    factory = processor or (lambda: StreamRecorder(seen, lock))
    return Worker(config, factory, dynamodb=ddb, kinesis=kinesis, failure_destination=destination)


def test_a_record_sent_to_the_failure_destination_names_its_own_streams_arn(
    clients: tuple[Any, Any], app_name: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch, moto_aws: AwsConfig
) -> None:
    # GIVEN a two-stream application whose processor fails on record 7 of each stream, policy skip-and-record to a
    # queue
    _, kinesis = clients
    names = two_streams(kinesis, app_name, 1)
    for name in names:
        kinesis.put_records(
            StreamName=name, Records=[{"Data": f"{name}/{n}".encode(), "PartitionKey": str(n)} for n in range(10)]
        )
    monkeypatch.setenv("SHARDLEASE_INITIAL_POSITION", "TRIM_HORIZON")
    sqs = aws.client("sqs", moto_aws)
    queue_url = sqs.create_queue(QueueName=f"{app_name}-failed")["QueueUrl"]
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{app_name}-failed"
    handled: list[bytes] = []

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        for record in records:
            if record.data.endswith(b"/7"):
                raise RecordFailedError(record) from ValueError("poison")
            handled.append(record.data)

    seen, lock = recording()
    worker = embedded_worker(
        clients,
        seen,
        lock,
        processor=lambda: FunctionProcessor(handle),
        destination=SqsDestination(sqs, queue_arn),
        app=app_name,
        streams=names,
        failures=FailureConfig(on_failure="skip-and-record", destination=queue_arn, retry_backoff_ms=10),
    )
    workers.append(worker)
    # WHEN it runs until every other record was handled
    worker.start()
    eventually(lambda: len(handled) >= 18, bound_s=READ_BOUND_S, what="18 records handled")

    found: list[dict[str, Any]] = []

    def two_reports() -> bool:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        found.extend(json.loads(m["Body"]) for m in messages.get("Messages", []))
        return len(found) >= 2

    eventually(two_reports, bound_s=READ_BOUND_S, what="two reports")
    # THEN each poison record's report names its own stream, by name and by ARN (Lambda's KinesisBatchInfo.streamArn)
    summaries = {name: kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"] for name in names}
    arns = {name: summary["StreamARN"] for name, summary in summaries.items()}
    named = {(r["shardlease"]["streamName"], r["KinesisBatchInfo"]["streamArn"]) for r in found}
    assert named == set(arns.items())


def test_a_worker_with_an_embedded_leader_reads_both_streams_and_tells_the_processor_which(
    clients: tuple[Any, Any], app_name: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    ddb, kinesis = clients
    names = two_streams(kinesis, app_name, 2)
    for name in names:
        kinesis.put_records(
            StreamName=name,
            Records=[{"Data": f"{name}/{n}".encode(), "PartitionKey": str(n)} for n in range(40)],
        )
    monkeypatch.setenv("SHARDLEASE_INITIAL_POSITION", "TRIM_HORIZON")
    monkeypatch.setenv("SHARDLEASE_LEADER_FAST_TICK_MS", str(FAST_TICK_MS))
    seen, lock = recording()
    # GIVEN one worker of a two-stream application, leading too
    worker = embedded_worker(clients, seen, lock, app=app_name, streams=names)
    workers.append(worker)
    # WHEN it runs
    worker.start()
    # THEN every record of both streams arrives once, each with its own stream's name and identifier
    eventually_showing(
        lambda: len(seen) >= 80, bound_s=READ_BOUND_S, what="80 records", detail=lambda: f"{len(seen)} of 80 records"
    )
    with lock:
        got = list(seen)
    assert sorted(data for *_, data in got) == sorted(f"{name}/{n}".encode() for name in names for n in range(40))
    ids = {name: identifier(kinesis, name).serialize() for name in names}
    for stream, ident, shard, data in got:
        assert data.decode().startswith(f"{stream}/") and ident == ids[stream] and shard.startswith("shardId-")
    # AND the checkpoints land on the multi-stream leases
    store = DynamoDBLeaseStore(app_name, client=ddb)
    eventually(
        lambda: all(not lease.checkpoint.is_sentinel for lease in store.list_leases()),
        bound_s=READ_BOUND_S,
        what="every lease checkpointed",
    )


def test_a_missing_stream_fails_a_single_stream_start_but_only_warns_in_a_multi_stream_one(
    clients: tuple[Any, Any], app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    from worker_lib.core.errors import StreamMissingError
    from worker_lib.leader.factory import preflight

    ddb, kinesis = clients
    create_stream(kinesis, f"{app_name}-a", 1)
    gone = f"{app_name}-gone"
    # GIVEN one existing stream and one that does not exist
    multi = WorkerConfig(app=app_name, streams=(f"{app_name}-a", gone), worker_id="w1")
    single = WorkerConfig(app=app_name, stream=gone, worker_id="w1")
    parts = build_leader(app=app_name, stream=multi.stream_selection, dynamodb=ddb, kinesis=kinesis)
    # WHEN a multi-stream worker and leader check before starting THEN they start, with one warning each
    Worker(multi, lambda: StreamRecorder([], threading.Lock()), dynamodb=ddb, kinesis=kinesis).preflight()
    preflight(parts, app=app_name, stream=multi.stream_selection)
    assert sum(gone in r.getMessage() and "other streams are consumed" in r.getMessage() for r in caplog.records) == 2
    # AND a single-stream worker refuses to start
    with pytest.raises(StreamMissingError):
        Worker(single, lambda: StreamRecorder([], threading.Lock()), dynamodb=ddb, kinesis=kinesis).preflight()


def test_a_stream_deleted_while_workers_read_it_stops_its_consumers_and_not_the_others(
    clients: tuple[Any, Any], app_name: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker_lib.processing.consumer import ConsumerOutcome

    ddb, kinesis = clients
    names = two_streams(kinesis, app_name, 1)
    monkeypatch.setenv("SHARDLEASE_INITIAL_POSITION", "TRIM_HORIZON")
    monkeypatch.setenv("SHARDLEASE_SHARD_SYNC_INTERVAL_MS", str(SHARD_SYNC_MS))
    monkeypatch.setenv("SHARDLEASE_LEADER_CYCLE_INTERVAL_MS", str(CYCLE_MS))
    seen, lock = recording()
    worker = embedded_worker(clients, seen, lock, app=app_name, streams=names)
    workers.append(worker)
    worker.start()
    store = DynamoDBLeaseStore(app_name, client=ddb)
    # GIVEN a worker reading both streams
    eventually_showing(
        lambda: len(worker.held_leases) == 2,
        bound_s=READ_BOUND_S,
        what="both leases held",
        detail=lambda: worker.held_leases,
    )
    doomed = identifier(kinesis, names[1]).lease_key("shardId-000000000000")
    # WHEN stream b is deleted in Kinesis while stream a keeps receiving records
    kinesis.delete_stream(StreamName=names[1])
    kinesis.put_records(StreamName=names[0], Records=[{"Data": b"after", "PartitionKey": "k"}])
    # THEN b's lease is deleted by the leader and its consumer stops, while a's record still arrives
    eventually_showing(
        lambda: worker.outcomes.get(doomed) is ConsumerOutcome.LOST,
        bound_s=DELETED_BOUND_S,
        what="the deleted stream's consumer lost its lease",
        detail=lambda: worker.outcomes,
    )
    assert store.get_lease(doomed) is None
    eventually(lambda: any(data == b"after" for *_, data in seen), bound_s=READ_BOUND_S, what="a's record arrived")
    assert worker.held_leases == [identifier(kinesis, names[0]).lease_key("shardId-000000000000")]


def test_a_bare_shard_key_in_an_application_of_several_streams_is_not_taken(
    clients: tuple[Any, Any], app_name: str, workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    from worker_lib.core.models import Lease

    ddb, kinesis = clients
    names = two_streams(kinesis, app_name, 1)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    good = identifier(kinesis, names[0]).lease_key("shardId-000000000000")
    # GIVEN w1 is assigned a multi-stream lease and a bare shard-id lease (which names no stream)
    for key in (good, "shardId-000000000000"):
        store.create_lease_if_absent(Lease(lease_key=key, checkpoint=TRIM_HORIZON))
        lease = store.get_lease(key)
        assert lease is not None and store.assign_lease(lease, "w1")
    worker = embedded_worker(clients, [], threading.Lock(), app=app_name, streams=names, leader_mode="none")
    workers.append(worker)
    # WHEN it runs
    worker.start()
    # THEN it takes the one it can read and leaves the other, with one warning
    eventually_showing(
        lambda: worker.held_leases == [good],
        bound_s=READ_BOUND_S,
        what="only the multi-stream lease held",
        detail=lambda: worker.held_leases,
    )
    assert any("names no stream" in r.getMessage() for r in caplog.records)
