"""DynamoDB outputs committed with the checkpoint in one TransactWriteItems, against a moto server.

dynalite, the second opinion elsewhere, has no TransactWriteItems (docs/testing.md), so these run on moto only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import pytest

from tests.integration.test_worker import FAST_LEASES, READ_BOUND_S, RENEWAL_BOUND_S, put, w1_worker
from tests.support.faults import lose_replies
from tests.support.leases import assigned_lease
from tests.support.recording import stream_with_leases
from tests.support.stalls import eventually
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import OutputConditionError
from worker_lib.core.models import Checkpoint, KinesisRecord, Lease
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.config import FailureConfig
from worker_lib.processing.destinations import SqsDestination
from worker_lib.processing.outputs import put_item, update_item
from worker_lib.processing.processor import ExactlyOnceCheckpointer, FunctionProcessor, ShutdownError
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import TableLayout
from worker_lib.telemetry.names import WorkerMetric
from worker_lib.worker.worker import Worker


class CountingPublisher:
    """Counts what the checkpointer publishes (the one metric it sends)."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}

    def add(self, name: str, value: float, **_: Any) -> None:
        self.counts[name] = self.counts.get(name, 0) + value


def output_table(ddb: Any, name: str) -> str:
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def items(ddb: Any, table: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for page in ddb.get_paginator("scan").paginate(TableName=table):
        for item in page["Items"]:
            found[item["pk"]["S"]] = item
    return found


def record(n: int) -> KinesisRecord:
    return KinesisRecord(data=b"x", partition_key=f"k{n}", sequence_number=str(10_000 + n))


@pytest.fixture
def ddb(moto_aws: AwsConfig, app_name: str) -> Any:
    return aws.client("dynamodb", moto_aws)


class Held(NamedTuple):
    store: DynamoDBLeaseStore
    holder: LeaseHolder
    lease: Lease  # as w1 took it
    table: str  # the outputs' table
    checkpointer: LeaseCheckpointer


def holding(
    ddb: Any, app: str, key: str = "shard-a", *, layout: TableLayout | None = None, metrics: Any = None
) -> Held:
    """w1 holding lease ``key`` of ``app``, an empty output table, and the lease's checkpointer."""
    ensure_tables(app, ddb, layout=layout)
    store = DynamoDBLeaseStore(app, client=ddb, layout=layout)
    holder = LeaseHolder(store, "w1", clock=ManualClock())
    assert holder.take(assigned_lease(store, key, "w1"))
    lease = store.get_lease(key)
    assert lease is not None
    checkpointer = LeaseCheckpointer(
        holder, key, initial=lease.checkpoint, fencing_token=lease.lease_counter, metrics=metrics
    )
    return Held(store, holder, lease, output_table(ddb, f"{app}-out"), checkpointer)


@pytest.mark.parametrize(
    ("layout", "key"),
    [
        (TableLayout.THREE_TABLES, "shardId-000000000000"),
        (TableLayout.SINGLE_TABLE, "shardId-000000000000"),
        (TableLayout.THREE_TABLES, "123456789012:orders:1700000000:shardId-000000000001"),  # multi-stream
    ],
    ids=["three-tables", "single-table", "multi-stream"],
)
def test_outputs_and_the_checkpoint_land_in_one_transaction(
    ddb: Any, app_name: str, layout: TableLayout, key: str
) -> None:
    # GIVEN w1 holding a lease, and a processor that stages one output per record
    store, _, before, table, checkpointer = holding(ddb, app_name, key, layout=layout)
    assert isinstance(checkpointer, ExactlyOnceCheckpointer)
    checkpointer.largest_permitted = record(3).checkpoint
    for n in (1, 2, 3):
        checkpointer.stage(record(n), put_item(table, {"pk": f"r{n}", "seq": record(n).sequence_number}))
    # WHEN the processor checkpoints
    checkpointer.checkpoint()
    # THEN the three items and the checkpoint landed, in one write (the counter moved once)
    assert sorted(items(ddb, table)) == ["r1", "r2", "r3"]
    after = store.get_lease(key)
    assert after is not None and after.checkpoint == record(3).checkpoint
    assert after.lease_counter == before.lease_counter + 1
    # AND the holder's view is the table's, so the next checkpoint is accepted by the fence
    checkpointer.largest_permitted = record(4).checkpoint
    checkpointer.stage(record(4), put_item(table, {"pk": "r4"}))
    checkpointer.checkpoint()
    assert "r4" in items(ddb, table)


def test_a_zombies_transaction_is_refused_and_nothing_of_it_lands(
    ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN w1 holding a lease with outputs staged, frozen while the leader gives the lease to w2
    metrics = CountingPublisher()
    store, _, lease, table, zombie = holding(ddb, app_name, metrics=metrics)
    zombie.largest_permitted = record(2).checkpoint
    zombie.stage(record(1), put_item(table, {"pk": "r1"}))
    zombie.stage(record(2), put_item(table, {"pk": "r2"}))
    assert store.assign_lease(lease, "w2") is not None
    # WHEN the zombie wakes and checkpoints
    with caplog.at_level(logging.WARNING), pytest.raises(ShutdownError):
        zombie.checkpoint()
    # THEN its transaction was refused: no output, the checkpoint unmoved
    assert items(ddb, table) == {}
    now = store.get_lease("shard-a")
    assert now is not None and now.lease_owner == "w2" and not now.checkpoint.is_real
    # AND the refusal is counted and logged
    assert metrics.counts == {WorkerMetric.FENCED_TRANSACTIONS: 1}
    assert "transaction refused on shard-a" in caplog.text and "fenced" in caplog.text


def test_a_failed_output_condition_applies_nothing_and_names_the_output(ddb: Any, app_name: str) -> None:
    # GIVEN an output table holding item "taken", and outputs staged: one new item, one conditioned on absence
    store, holder, _, table, checkpointer = holding(ddb, app_name)
    ddb.put_item(TableName=table, Item={"pk": {"S": "taken"}})
    checkpointer.largest_permitted = record(2).checkpoint
    checkpointer.stage(record(1), put_item(table, {"pk": "new"}))
    checkpointer.stage(record(2), put_item(table, {"pk": "taken"}, condition="attribute_not_exists(pk)"))
    # WHEN the checkpoint commits them
    with pytest.raises(OutputConditionError, match="output 2 of 2"):
        checkpointer.checkpoint()
    # THEN nothing was applied: no new item, the checkpoint unmoved, the lease still ours
    assert sorted(items(ddb, table)) == ["taken"]
    after = store.get_lease("shard-a")
    assert after is not None and not after.checkpoint.is_real and holder.is_valid("shard-a")


def test_outputs_beyond_one_transaction_are_committed_in_consecutive_transactions(ddb: Any, app_name: str) -> None:
    # GIVEN 50 records with 5 outputs each (250 actions: three transactions' worth)
    store, _, lease, table, checkpointer = holding(ddb, app_name)
    checkpointer.largest_permitted = record(49).checkpoint
    for n in range(50):
        checkpointer.stage(record(n), *(put_item(table, {"pk": f"r{n}-{i}"}) for i in range(5)))
    # WHEN the processor checkpoints at the last record
    checkpointer.checkpoint()
    # THEN every output landed once, in three transactions (the counter moved three times), ending at record 49
    assert len(items(ddb, table)) == 250
    after = store.get_lease("shard-a")
    assert after is not None and after.checkpoint == record(49).checkpoint
    assert after.lease_counter == lease.lease_counter + 3


def test_a_worker_commits_outputs_exactly_once_through_bisection_and_skip_and_record(
    moto_aws: AwsConfig, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN 30 records on one lease; a function processor that counts every record it sees in an output item, in
    # the checkpoint's transaction, and fails on record 17 (bisection, then skip-and-record to a queue)
    ddb = aws.client("dynamodb", moto_aws)
    kinesis = aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb)
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put(kinesis, stream, 0, 30)
    table = output_table(ddb, f"{app_name}-out")
    sqs = aws.client("sqs", moto_aws)
    queue_url = sqs.create_queue(QueueName=f"{app_name}-failed")["QueueUrl"]
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{app_name}-failed"
    seen: list[bytes] = []

    def handle(records: Sequence[KinesisRecord], checkpointer: ExactlyOnceCheckpointer) -> None:
        for r in records:
            seen.append(r.data)
            checkpointer.stage(
                r, update_item(table, {"pk": r.data.decode()}, "ADD #n :one", names={"#n": "n"}, values={":one": 1})
            )
            if r.data == b"record-00017":
                raise ValueError("cannot parse")
        checkpointer.checkpoint()

    worker = w1_worker(
        app_name,
        stream,
        lambda: FunctionProcessor(handle),
        failures=FailureConfig(on_failure="skip-and-record", destination=queue_arn, retry_backoff_ms=10, bisect=True),
        destination=SqsDestination(sqs, queue_arn),
        ddb=ddb,
        kinesis=kinesis,
    )
    workers.append(worker)
    # WHEN the worker runs
    worker.start()
    # THEN every record but the poison one has its output exactly once (n = 1), though the processor saw some twice
    good = [d.decode() for d in produced if d != b"record-00017"]
    eventually(lambda: len(items(ddb, table)) >= 29, bound_s=READ_BOUND_S, what="29 outputs")

    def checkpoint_at_end() -> bool:
        lease = store.get_lease(key)
        return lease is not None and lease.checkpoint.is_real and lease.block is None

    eventually(checkpoint_at_end, bound_s=RENEWAL_BOUND_S + READ_BOUND_S, what="the checkpoint past record 29")
    assert worker.shutdown(timeout_s=FAST_LEASES.failover_time_ms / 1000 * 3)
    stored = items(ddb, table)
    assert sorted(stored) == good
    assert {pk: item["n"]["N"] for pk, item in stored.items()} == dict.fromkeys(good, "1")
    assert len(seen) > len(produced)  # the failing batch was delivered again: effects, not deliveries, are once
    # AND the poison record alone went to the queue, and its output never landed
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    (report,) = [json.loads(m["Body"]) for m in messages]
    assert report["KinesisBatchInfo"]["batchSize"] == 1
    last = store.get_lease(key)
    assert last is not None and last.checkpoint == Checkpoint(sequence=last.checkpoint.sequence)


def test_a_lost_reply_is_recognised_and_the_outputs_apply_once(ddb: Any, app_name: str) -> None:
    # GIVEN outputs that count (ADD) staged for two records
    store, holder, _, table, checkpointer = holding(ddb, app_name)
    checkpointer.largest_permitted = record(2).checkpoint
    for n in (1, 2):
        checkpointer.stage(record(n), update_item(table, {"pk": f"r{n}"}, "ADD n :one", values={":one": 1}))
    # WHEN the transaction is applied but its reply is lost (botocore sends it again; the emulator, like DynamoDB
    # past the idempotency window, refuses the copy on the lease's condition)
    with lose_replies(ddb, "TransactWriteItems") as lost:
        checkpointer.checkpoint()
    # THEN the re-read recognises the checkpoint as ours: no error, and every output applied exactly once
    assert lost == [1]
    assert {pk: item["n"]["N"] for pk, item in items(ddb, table).items()} == {"r1": "1", "r2": "1"}
    after = store.get_lease("shard-a")
    assert after is not None and after.checkpoint == record(2).checkpoint and holder.is_valid("shard-a")
