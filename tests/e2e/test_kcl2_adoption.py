"""A KCL 2.x application adopted by real `shardlease` processes on a moto server (issue "KCL parity", point 4): the
2.x lease table (no owner index, no other tables, checkpoints part-way into each shard, leases still owned by the
stopped 2.x workers) goes through `shardlease create-tables`; three workers on two shards — more workers than shards,
where KCL's own 2.x → 3.x migration never starts (KCL issue 1500) — resume every shard exactly after its
checkpoint."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.journal_processor import PROCESSOR, read_journal
from tests.support.processes import (
    CLI_BOUND_S,
    EMBEDDED_LEADER_ENV,
    FAILOVER_S,
    GRACEFUL_STOP_S,
    first_read_s,
    process_group,
)
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.coordinator_items import MIGRATION_KEY
from worker_lib.tables.schema import coordinator_state_table_name
from worker_lib.testing.streams import create_stream

# Liveness bounds (tests/support/stalls.py) from the test timings (tests/support/processes.py): three workers start
# and read every shard once the 2.x workers' leases, never renewed by anyone here, have expired
READ_BOUND_S = hang_bound_s(first_read_s(3) + FAILOVER_S)
STOP_BOUND_S = hang_bound_s(GRACEFUL_STOP_S)


def put(kinesis: Any, stream: str, names: list[str]) -> None:
    kinesis.put_records(StreamName=stream, Records=[{"Data": n.encode(), "PartitionKey": n} for n in names])


def shard_records(kinesis: Any, stream: str, shard_id: str) -> list[tuple[str, str]]:
    """(sequence number, data) of every record in the shard, in order."""
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
    response = kinesis.get_records(ShardIterator=iterator["ShardIterator"], Limit=10_000)
    return [(r["SequenceNumber"], r["Data"].decode()) for r in response["Records"]]


@pytest.mark.heavy
def test_a_kcl2_application_is_adopted_and_resumes_after_its_checkpoints(
    moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 2)
    # GIVEN records a KCL 2.x fleet read part of: its checkpoint sits at the 15th record of each shard
    put(kinesis, stream, [f"old{i:03d}" for i in range(60)])
    shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    before = {shard: shard_records(kinesis, stream, shard) for shard in shards}
    assert all(len(records) >= 20 for records in before.values())
    checkpoints = {shard: records[14][0] for shard, records in before.items()}
    done = {data for shard, records in before.items() for _, data in records[:15]}
    # AND the lease table as KCL 2.x left it: no owner index, no other table, leases owned by stopped workers
    ddb.create_table(
        TableName=app_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PROVISIONED",
        ProvisionedThroughput={"ReadCapacityUnits": 10, "WriteCapacityUnits": 10},
    )
    for n, shard in enumerate(shards):
        ddb.put_item(
            TableName=app_name,
            Item={
                "leaseKey": {"S": shard},
                "leaseCounter": {"N": str(300 + n)},
                "leaseOwner": {"S": f"kcl2-worker-{n}"},
                "checkpoint": {"S": checkpoints[shard]},
                "checkpointSubSequenceNumber": {"N": "0"},
                "ownerSwitchesSinceCheckpoint": {"N": "0"},
            },
        )
    journal = tmp_path / "journal.txt"
    journal.touch()
    env = {"SHARDLEASE_TEST_JOURNAL": str(journal), **EMBEDDED_LEADER_ENV}
    args = ["--app", app_name, "--endpoint-url", moto_endpoint]
    with process_group(tmp_path) as group:
        # WHEN the tables go through `shardlease create-tables`
        group.start_shardlease("create-tables", "create-tables", *args, env=env)
        assert group.wait("create-tables", timeout_s=CLI_BOUND_S) == 0, group.log("create-tables")[-2000:]
        # AND three workers start on the two shards while new records arrive
        for name in ("w1", "w2", "w3"):
            group.start_shardlease(
                name, "worker", *args, "--stream", stream, "--processor", PROCESSOR, "--worker-id", name, env=env
            )
        put(kinesis, stream, [f"new{i:03d}" for i in range(40)])
        expected = {data for records in before.values() for _, data in records[15:]} | {
            f"new{i:03d}" for i in range(40)
        }
        # THEN every record after the checkpoints is processed
        eventually(
            lambda: {r[4] for r in read_journal(journal)} >= expected,
            bound_s=READ_BOUND_S,
            what="every record after the checkpoints processed",
        )
        for name in ("w1", "w2", "w3"):
            group.signal(name, signal.SIGTERM)
        for name in ("w1", "w2", "w3"):
            assert group.wait(name, timeout_s=STOP_BOUND_S) == 0, group.log(name)[-2000:]
    records = read_journal(journal)
    # AND none at or before a checkpoint the 2.x fleet had made
    assert not {r[4] for r in records} & done
    # AND each shard was read in order from just after its checkpoint
    for shard in shards:
        sequence = [int(r[2]) for r in records if r[1] == shard]
        assert sequence and sequence[0] > int(checkpoints[shard])
    # AND the table now has the owner index, the leases are ours, and KCL's migration item says 3.x
    indexes = ddb.describe_table(TableName=app_name)["Table"].get("GlobalSecondaryIndexes", [])
    assert [g["IndexName"] for g in indexes] == ["LeaseOwnerToLeaseKeyIndex"]
    store = DynamoDBLeaseStore(app_name, client=ddb)
    assert all(not (lease.lease_owner or "").startswith("kcl2-") for lease in store.list_leases())
    migration = ddb.get_item(
        TableName=coordinator_state_table_name(app_name), Key={"key": {"S": MIGRATION_KEY}}, ConsistentRead=True
    )["Item"]
    assert migration["cv"] == {"S": "CLIENT_VERSION_3X"}
