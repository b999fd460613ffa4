"""Adopting a KCL 2.x application's tables (issue "KCL parity", point 4): the owner index is added to the existing
lease table, the other two tables created, KCL's migration item recorded as a 3.x worker writes it, checkpoints
untouched; workers find their leases with a scan until the index can be read.

Adding an index runs on moto only: dynalite requires provisioned throughput on every index it adds, even to an
on-demand table, which DynamoDB rejects. The migration item's tests run on both."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import OWNER_INDEX_RETRY_S, DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_migration_state, ensure_tables
from worker_lib.tables.coordinator_items import MIGRATION_KEY
from worker_lib.tables.schema import LEASE_OWNER_INDEX, coordinator_state_table_name

# Lease items as KCL 2.x writes them (amazon-kinesis-client v2.6.0 DynamoDBLeaseSerializer.toDynamoRecord): no
# throughputKBps, no checkpointOwner, no entityType; hash keys since 2.3.
KCL2_ITEMS = [
    {
        "leaseKey": {"S": "shardId-000000000000"},
        "leaseCounter": {"N": "5121"},
        "leaseOwner": {"S": "kcl2-worker-a"},
        "checkpoint": {"S": "49655487212318045317163212470183826744342512591337816066"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "170141183460469231731687303715884105727"},
    },
    {
        "leaseKey": {"S": "shardId-000000000001"},
        "leaseCounter": {"N": "77"},
        "leaseOwner": {"S": "kcl2-worker-b"},
        "checkpoint": {"S": "TRIM_HORIZON"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "1"},
        "startingHashKey": {"S": "170141183460469231731687303715884105728"},
        "endingHashKey": {"S": "340282366920938463463374607431768211455"},
    },
]


@pytest.fixture
def ddb(ddb_aws: AwsConfig) -> Any:
    return aws.client("dynamodb", ddb_aws)


@pytest.fixture
def moto_ddb(moto_aws: AwsConfig) -> Any:
    return aws.client("dynamodb", moto_aws)


def make_kcl2_table(ddb: Any, app: str) -> None:
    """The lease table as KCL 2.x creates it: hash key leaseKey, no index; no other table."""
    ddb.create_table(
        TableName=app,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for item in KCL2_ITEMS:
        ddb.put_item(TableName=app, Item=item)


def migration_item(ddb: Any, app: str) -> dict[str, Any] | None:
    response = ddb.get_item(
        TableName=coordinator_state_table_name(app), Key={"key": {"S": MIGRATION_KEY}}, ConsistentRead=True
    )
    item = response.get("Item")
    return dict(item) if item else None


def test_a_kcl2_table_is_adopted_with_its_index_added_and_its_checkpoints_untouched(
    moto_ddb: Any, app_name: str
) -> None:
    ddb = moto_ddb
    # GIVEN a KCL 2.x application's lease table and nothing else
    make_kcl2_table(ddb, app_name)
    # WHEN the tables are ensured (`shardlease create-tables`)
    created = ensure_tables(app_name, ddb)
    # THEN the lease table was kept and given the owner index; the other two tables were created
    assert created == {app_name: False, f"{app_name}-WorkerMetricStats": True, f"{app_name}-CoordinatorState": True}
    indexes = ddb.describe_table(TableName=app_name)["Table"].get("GlobalSecondaryIndexes", [])
    assert [g["IndexName"] for g in indexes] == [LEASE_OWNER_INDEX.name]
    # AND every lease item is exactly as KCL 2.x left it
    for item in KCL2_ITEMS:
        stored = ddb.get_item(TableName=app_name, Key={"leaseKey": item["leaseKey"]}, ConsistentRead=True)["Item"]
        assert stored == item
    # AND KCL's migration item says 3.x, as a KCL 3.x worker configured for 3.x writes it when it finds none
    migration = migration_item(ddb, app_name)
    assert migration is not None
    assert migration["cv"] == {"S": "CLIENT_VERSION_3X"}
    assert migration["mb"] == {"S": "shardlease"}
    assert int(migration["mts"]["N"]) > 1_700_000_000_000
    assert migration["h"]["L"][0]["M"]["cv"] == {"S": "CLIENT_VERSION_INIT"}
    assert migration["entityType"] == {"S": "CLIENT_VERSION_MIGRATION"}
    # AND the leases are found through the new index
    store = DynamoDBLeaseStore(app_name, client=ddb)
    assert store.list_lease_keys_for_owner("kcl2-worker-a") == ["shardId-000000000000"]
    # AND ensuring again changes nothing
    assert ensure_tables(app_name, ddb) == dict.fromkeys(created, False)
    assert migration_item(ddb, app_name) == migration


@pytest.mark.parametrize("version", ["CLIENT_VERSION_UPGRADE_FROM_2X", "CLIENT_VERSION_2X", "CLIENT_VERSION_3X"])
def test_a_migration_item_a_java_fleet_wrote_is_left_as_it_is(
    ddb: Any, app_name: str, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the tables and a migration item written by a Java fleet
    ensure_tables(app_name, ddb)
    item = {"key": {"S": MIGRATION_KEY}, "cv": {"S": version}, "mb": {"S": "java-1"}, "mts": {"N": "1700000000000"}}
    ddb.put_item(TableName=coordinator_state_table_name(app_name), Item=item)
    # WHEN we ensure the migration state
    with caplog.at_level(logging.WARNING, logger="worker_lib.tables.admin"):
        found = ensure_migration_state(app_name, ddb, modified_by="shardlease")
    # THEN it is untouched, and a fleet still taking leases the 2.x way is reported in one warning
    assert found == version
    assert migration_item(ddb, app_name) == item
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and MIGRATION_KEY in r.getMessage()]
    assert len(warned) == (0 if version == "CLIENT_VERSION_3X" else 1)


def test_workers_find_their_leases_with_a_scan_until_the_owner_index_exists(
    moto_ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    ddb = moto_ddb
    # GIVEN a KCL 2.x lease table whose owner index is not there yet (or still backfilling)
    make_kcl2_table(ddb, app_name)
    clock = ManualClock()
    store = DynamoDBLeaseStore(app_name, client=ddb, clock=clock)
    queries: list[str] = []
    ddb.meta.events.register("before-call.dynamodb.Query", lambda **_: queries.append("Query"))
    # WHEN a worker looks for its leases
    with caplog.at_level(logging.WARNING, logger="worker_lib.leases.dynamodb"):
        first = store.list_lease_keys_for_owner("kcl2-worker-b")
        second = store.list_lease_keys_for_owner("kcl2-worker-b")
    # THEN it finds them by a scan, says so once, and does not ask the index again at once
    assert first == second == ["shardId-000000000001"]
    assert len([r for r in caplog.records if "owner index" in r.getMessage()]) == 1
    assert queries == ["Query"]
    # WHEN the index has been added and the retry interval passed
    ensure_tables(app_name, ddb)
    clock.advance(OWNER_INDEX_RETRY_S)
    store.list_lease_keys_for_owner("kcl2-worker-b")  # the scan that notices the interval passed
    # THEN the index is used again
    assert store.list_lease_keys_for_owner("kcl2-worker-b") == ["shardId-000000000001"]
    assert queries == ["Query", "Query"]
