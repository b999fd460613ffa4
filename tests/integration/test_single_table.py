"""KCL 3.5's single-table mode (docs/kcl-compatibility.md, "Single-table mode"): worker metrics, the leader lock and
coordinator state in the lease table, keyed by ``leaseKey`` and told apart by ``entityType``. Store tests run on moto
and dynalite; the worker run on moto."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_multi_stream import READ_BOUND_S, embedded_worker
from tests.support.processes import CLI_BOUND_S, eventually_showing, run_command
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import WorkerMetricStats, WorkerState
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.coordinator_items import TABLE_MIGRATION_KEY
from worker_lib.tables.schema import TableLayout, coordinator_state_table_name
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

SINGLE = TableLayout.SINGLE_TABLE
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kcl35_single_table_items.json"
KCL_ENTITY_TYPES = {"LEASE", "STREAM", "LEADER", "CLIENT_VERSION_MIGRATION", "TABLE_MIGRATION", "WORKER_METRIC_STATS"}


def kcl_items() -> dict[str, dict[str, Any]]:
    return {entry["kind"]: entry["item"] for entry in json.loads(FIXTURE.read_text())["items"]}


def table_names(ddb: Any, app: str) -> set[str]:
    """The application's tables (every page: a test run creates hundreds of tables on the same emulator)."""
    pages = ddb.get_paginator("list_tables").paginate()
    return {name for page in pages for name in page["TableNames"] if name.startswith(app)}


def test_create_tables_in_single_table_layout_makes_the_lease_table_alone_with_kcls_migration_item(
    ddb_aws: AwsConfig, app_name: str
) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    # WHEN the tables are created in the single-table layout
    created = ensure_tables(app_name, ddb, layout=SINGLE)
    # THEN only the lease table exists, and Migration3.0 sits in it as KCL 3.5 writes it there
    assert list(created) == [app_name] and table_names(ddb, app_name) == {app_name}
    item = ddb.get_item(TableName=app_name, Key={"leaseKey": {"S": "Migration3.0"}}, ConsistentRead=True)["Item"]
    assert item["cv"] == {"S": "CLIENT_VERSION_3X"} and item["entityType"] == {"S": "CLIENT_VERSION_MIGRATION"}
    # AND the lease store does not take it for a lease
    assert DynamoDBLeaseStore(app_name, client=ddb).list_leases() == []


def test_a_kcl_single_table_application_is_read_as_kcl_meant(ddb_aws: AwsConfig, app_name: str) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, ddb, layout=SINGLE)
    # GIVEN the lease table of a KCL 3.5 application in single-table mode
    items = kcl_items()
    for item in items.values():
        ddb.put_item(TableName=app_name, Item=item)
    clock = ManualClock()
    # WHEN our stores read it in the single-table layout
    leases = DynamoDBLeaseStore(app_name, client=ddb).list_leases()
    workers = WorkerMetricsStore(app_name, client=ddb, layout=SINGLE, clock=clock).list_all(consistent=True)
    lock = DynamoDBLeaderLock(app_name, "ours", client=ddb, layout=SINGLE, clock=clock)
    # THEN the lease is the one lease, the worker row is KCL's worker with its CPU, and the lock is KCL's, held
    assert [lease.lease_key for lease in leases] == ["shardId-000000000000"]
    assert [(w.worker_id, w.stats["C"]) for w in workers] == [("ip-10-0-3-41.ec2.internal:5a1f", (41.5, 44.0, 39.0))]
    assert lock.try_acquire() is False
    assert lock.current_leader() == items["lock"]["ownerName"]["S"]


def test_our_writes_in_single_table_mode_carry_kcls_keys_and_entity_types(ddb_aws: AwsConfig, app_name: str) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, ddb, layout=SINGLE)
    clock = ManualClock()
    # WHEN a worker reports and beats, the leader takes the lock and keeps its state
    rows = WorkerMetricsStore(app_name, client=ddb, layout=SINGLE, clock=clock)
    rows.heartbeat("w1", interval_ms=1000, state=WorkerState.ACTIVE, events=0)
    rows.put(WorkerMetricStats(worker_id="w1", last_update_epoch_s=int(clock.wall()), stats={"C": (30.0,)}))
    lock = DynamoDBLeaderLock(app_name, "leader-1", client=ddb, layout=SINGLE, clock=clock)
    assert lock.try_acquire() and lock.heartbeat()
    state = CoordinatorStateStore(app_name, client=ddb, layout=SINGLE, clock=clock)
    assert state.put_if_absent("LivenessMode", {"mode": "lease"})
    assert state.update_if("LivenessMode", {"mode": "worker"}, {"mode": "lease"})
    # THEN every item is in the lease table, keyed by leaseKey, and none but leases would be read as a lease by KCL
    items = {i["leaseKey"]["S"]: i for i in ddb.scan(TableName=app_name, ConsistentRead=True)["Items"]}
    assert set(items) == {"Migration3.0", "w1", "Leader", "LivenessMode"}
    assert {k: i["entityType"]["S"] for k, i in items.items()} == {
        "Migration3.0": "CLIENT_VERSION_MIGRATION",
        "w1": "WORKER_METRIC_STATS",
        "Leader": "LEADER",
        "LivenessMode": "LEADER",
    }
    assert all("leaseOwner" not in item for item in items.values()), "nothing but leases may enter the owner index"
    assert "wid" not in items["w1"] and items["w1"]["sts"] == {"M": {"C": {"L": [{"N": "30"}]}}}
    # AND they read back as written
    assert [w.worker_id for w in rows.list_all(consistent=True)] == ["w1"]
    assert (state.get("LivenessMode") or {}).get("mode") == "worker"
    assert lock.current_leader() == "leader-1"


def test_a_worker_id_equal_to_a_lease_key_never_touches_the_lease(ddb_aws: AwsConfig, app_name: str) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, ddb, layout=SINGLE)
    ddb.put_item(TableName=app_name, Item=kcl_items()["lease"])
    rows = WorkerMetricsStore(app_name, client=ddb, layout=SINGLE)
    # WHEN the leader would notify or delete a "worker" whose id is a lease key
    assert rows.notify_assigned("shardId-000000000000", ["x"]) is False
    assert rows.delete_if_unchanged("shardId-000000000000", 0) is False
    # THEN the lease is untouched
    assert DynamoDBLeaseStore(app_name, client=ddb).get_lease("shardId-000000000000") is not None
    stored = ddb.get_item(TableName=app_name, Key={"leaseKey": {"S": "shardId-000000000000"}})["Item"]
    assert stored == kcl_items()["lease"]


def test_three_tables_are_refused_beside_a_single_table_application(ddb_aws: AwsConfig, app_name: str) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, ddb, layout=SINGLE)
    ddb.put_item(TableName=app_name, Item=kcl_items()["lock"])
    # WHEN the three-table layout is asked for THEN one clear error, and no CoordinatorState table appears (it would
    # make the KCL application believe its table migration never started)
    with pytest.raises(ConfigError, match="SHARDLEASE_TABLE_LAYOUT=single-table"):
        ensure_tables(app_name, ddb, layout=TableLayout.THREE_TABLES)
    assert table_names(ddb, app_name) == {app_name}


@pytest.mark.parametrize("status", [None, "TABLE_MIGRATION_STATUS_DEPLOYED"])
def test_single_table_is_refused_while_kcls_table_migration_is_unfinished(
    ddb_aws: AwsConfig, app_name: str, status: str | None
) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, ddb, layout=TableLayout.THREE_TABLES)
    if status is not None:
        CoordinatorStateStore(app_name, client=ddb, layout=TableLayout.THREE_TABLES).put(
            TABLE_MIGRATION_KEY, {"tm": status}
        )
    with pytest.raises(ConfigError, match="finish KCL's table migration"):
        ensure_tables(app_name, ddb, layout=SINGLE)


def test_single_table_is_accepted_once_kcls_table_migration_is_complete(ddb_aws: AwsConfig, app_name: str) -> None:
    ddb = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, ddb, layout=TableLayout.THREE_TABLES)
    CoordinatorStateStore(app_name, client=ddb, layout=TableLayout.THREE_TABLES).put(
        TABLE_MIGRATION_KEY, {"tm": "TABLE_MIGRATION_STATUS_COMPLETE"}
    )
    ensure_tables(app_name, ddb, layout=SINGLE)
    assert coordinator_state_table_name(app_name) in table_names(ddb, app_name)  # left alone, never read again


def test_a_worker_with_an_embedded_leader_runs_in_single_table_mode(
    moto_aws: AwsConfig, moto_endpoint: str, app_name: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLEASE_INITIAL_POSITION", "TRIM_HORIZON")
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb, layout=SINGLE)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 2)
    kinesis.put_records(
        StreamName=stream, Records=[{"Data": f"r{n}".encode(), "PartitionKey": str(n)} for n in range(30)]
    )
    seen: list[tuple[str, str | None, str, bytes]] = []
    worker = embedded_worker((ddb, kinesis), seen, threading.Lock(), app=app_name, stream=stream, table_layout=SINGLE)
    workers.append(worker)
    # WHEN it runs
    worker.preflight()
    worker.start()
    # THEN every record is processed, and the lease table alone holds everything, KCL's entity types on all of it
    eventually_showing(lambda: len(seen) >= 30, bound_s=READ_BOUND_S, what="30 records", detail=lambda: len(seen))
    assert table_names(ddb, app_name) == {app_name}
    items = ddb.scan(TableName=app_name, ConsistentRead=True)["Items"]
    kinds = {i["leaseKey"]["S"]: i.get("entityType", {}).get("S") for i in items}
    assert set(kinds.values()) <= KCL_ENTITY_TYPES
    assert kinds["w1"] == "WORKER_METRIC_STATS" and kinds["Leader"] == "LEADER"
    assert sum(kind == "LEASE" for kind in kinds.values()) == 2
    # AND `shardlease status` in the same layout shows the worker and the leader
    env = {**os.environ, "SHARDLEASE_TABLE_LAYOUT": "single-table"}
    cmd = [sys.executable, "-m", "worker_lib.cli", "status", "--app", app_name, "--endpoint-url", moto_endpoint]
    result = run_command([*cmd, "--json"], timeout_s=CLI_BOUND_S, env=env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["leader"] == "w1:leader" and [w["worker"] for w in status["workers"]] == ["w1"]
