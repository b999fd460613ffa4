"""Worker-metrics and coordinator-state stores in KCL's formats, on moto and dynalite."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import EndpointUnreachableError, TableMissingError
from worker_lib.core.models import WorkerMetricStats
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import coordinator_state_table_name, worker_metrics_table_name
from worker_lib.tables.state_store import CoordinatorStateStore, LeaseCapRecorder
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

# An item as KCL 3.x writes it (docs/kcl-compatibility.md "Worker-metrics table").
KCL_ITEM = {
    "wid": {"S": "java-worker"},
    "lut": {"N": "1700000000"},
    "sts": {"M": {"C": {"L": [{"N": "40.5"}, {"N": "-1"}, {"N": "55"}]}}},
    "opr": {"M": {"C": {"L": [{"N": "100"}]}}},
}


@pytest.fixture
def ddb(ddb_aws: AwsConfig, app_name: str) -> Any:
    client = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, client)
    return client


# --- worker metrics -----------------------------------------------------------------------------------------


def test_put_get_list_and_conditional_stale_delete(ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture) -> None:
    store = WorkerMetricsStore(app_name, client=ddb)
    table = worker_metrics_table_name(app_name)
    # GIVEN two workers, a KCL-written item, a foreign item and a corrupt item
    store.put(WorkerMetricStats(worker_id="a", last_update_epoch_s=100, stats={"C": (10.5,)}, operating_range={}))
    store.put(WorkerMetricStats(worker_id="b", last_update_epoch_s=200))
    ddb.put_item(TableName=table, Item=KCL_ITEM)
    ddb.put_item(TableName=table, Item={"wid": {"S": "x"}, "entityType": {"S": "LEASE"}})
    ddb.put_item(TableName=table, Item={"wid": {"S": "bad"}, "lut": {"S": "secret-payload"}})
    # AND an item that holds only its key (what moto shows while its UpdateItem creates an item)
    ddb.put_item(TableName=table, Item={"wid": {"S": "being-created"}})
    # WHEN the leader lists them
    with caplog.at_level(logging.WARNING, logger="worker_lib.workermetrics.stats_store"):
        workers = sorted(store.list_all(), key=lambda w: w.worker_id)
    # THEN foreign and corrupt items are skipped, the corrupt one logged by key only
    assert [w.worker_id for w in workers] == ["a", "b", "java-worker"]
    assert workers[2].stats == {"C": (40.5, -1.0, 55.0)} and workers[2].has_failed_metric() is False
    assert "wid=bad" in caplog.text and "secret-payload" not in caplog.text and "wid=x" not in caplog.text
    assert "being-created" not in caplog.text  # skipped without a warning: nothing is corrupt in it
    assert store.get("a") == workers[0] and store.get("bad") is None and store.get("x") is None
    assert store.get("nobody") is None
    # AND the KCL item is stored exactly as KCL would write it when we put it back
    store.put(workers[2])
    assert ddb.get_item(TableName=table, Key={"wid": {"S": "java-worker"}})["Item"] == KCL_ITEM


def test_a_stale_entry_is_deleted_only_if_its_lut_is_still_the_one_seen(ddb: Any, app_name: str) -> None:
    store = WorkerMetricsStore(app_name, client=ddb)
    # GIVEN the leader saw worker a at lut 100, and a revived in the meantime (lut 150)
    store.put(WorkerMetricStats(worker_id="a", last_update_epoch_s=100))
    store.put(WorkerMetricStats(worker_id="a", last_update_epoch_s=150))
    # WHEN the leader deletes the entry it judged stale THEN the revived worker keeps its entry
    assert not store.delete_if_unchanged("a", 100)
    assert store.get("a") is not None
    # WHEN it deletes with the current lut THEN the entry goes; a second delete finds nothing
    assert store.delete_if_unchanged("a", 150)
    assert store.get("a") is None
    assert not store.delete_if_unchanged("a", 150)


def test_list_all_follows_scan_pages(ddb: Any, app_name: str) -> None:
    store = WorkerMetricsStore(app_name, client=ddb)
    # GIVEN 25 workers and a scan that returns 4 items per page
    for n in range(25):
        store.put(WorkerMetricStats(worker_id=f"w{n:02d}", last_update_epoch_s=n, stats={"C": (float(n),)}))
    calls: list[int] = []

    def small_pages(params: dict[str, Any], **_: Any) -> None:
        params["Limit"] = 4
        calls.append(1)

    ddb.meta.events.register("provide-client-params.dynamodb.Scan", small_pages, unique_id="small-pages")
    try:
        # WHEN listed THEN every worker is there, read over several pages
        workers = store.list_all()
    finally:
        ddb.meta.events.unregister("provide-client-params.dynamodb.Scan", unique_id="small-pages")
    assert sorted(w.worker_id for w in workers) == [f"w{n:02d}" for n in range(25)]
    assert len(calls) >= 7


# --- coordinator state --------------------------------------------------------------------------------------


def test_coordinator_state_conditional_writes(ddb: Any, app_name: str) -> None:
    store = CoordinatorStateStore(app_name, client=ddb)
    # GIVEN an item created once
    assert store.put_if_absent("k", {"v": 1, "name": "x", "ratio": 0.5, "tags": ["a"], "on": True, "m": {"n": 2}})
    assert not store.put_if_absent("k", {"v": 2})
    # THEN it reads back as plain values
    assert store.get("k") == {"key": "k", "v": 1, "name": "x", "ratio": 0.5, "tags": ["a"], "on": True, "m": {"n": 2}}
    # WHEN updated against a stale expectation THEN nothing changes
    assert not store.update_if("k", {"v": 3}, {"v": 2})
    # WHEN updated against the current one THEN it lands (None removes an attribute)
    assert store.update_if("k", {"v": 3, "name": None}, {"v": 1})
    assert store.get("k") == {"key": "k", "v": 3, "ratio": 0.5, "tags": ["a"], "on": True, "m": {"n": 2}}
    # AND an expectation of None means "absent"
    assert not store.update_if("k", {"w": 1}, {"ratio": None})
    assert store.update_if("k", {"w": 1}, {"name": None, "v": 3})
    # AND deletes are conditional the same way
    assert not store.delete_if("k", {"v": 1})
    assert not store.delete_if("k", {"w": None})
    assert store.delete_if("k", {"v": 3, "name": None}) and store.get("k") is None


def test_conditional_writes_on_a_missing_item_lose(ddb: Any, app_name: str) -> None:
    store = CoordinatorStateStore(app_name, client=ddb)
    # GIVEN no item WHEN updated or deleted THEN both lose, and no item is created
    assert not store.update_if("ghost", {"v": 1}, {})
    assert not store.delete_if("ghost", {})
    assert store.get("ghost") is None


def test_update_if_refuses_empty_and_key_updates(ddb: Any, app_name: str) -> None:
    store = CoordinatorStateStore(app_name, client=ddb)
    with pytest.raises(ValueError, match="at least one attribute"):
        store.update_if("k", {}, {})
    with pytest.raises(ValueError, match="cannot be updated"):
        store.update_if("k", {"key": "other"}, {})
    with pytest.raises(ValueError, match="cannot store"):
        store.put_if_absent("k", {"x": float("nan")})


def test_a_kcl_migration_item_reads_as_plain_values(ddb: Any, app_name: str) -> None:
    # GIVEN KCL 3.x's migration item, written raw
    ddb.put_item(
        TableName=coordinator_state_table_name(app_name),
        Item={"key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_3x"}, "mb": {"S": "w1"}, "mts": {"N": "17"}},
    )
    # WHEN read THEN every attribute is a plain python value
    item = CoordinatorStateStore(app_name, client=ddb).get("Migration3.0")
    assert item == {"key": "Migration3.0", "cv": "CLIENT_VERSION_3x", "mb": "w1", "mts": 17}


def test_two_leaders_publishing_the_cap_never_interleave_stale_values(ddb: Any, app_name: str) -> None:
    # GIVEN two leaders (an old one not yet aware it lost the lock, and the new one) publishing the dynamic lease cap
    # (docs/assignment.md)
    old, new = (LeaseCapRecorder(CoordinatorStateStore(app_name, client=ddb)) for _ in range(2))
    old.record(10, shards=30, workers=3)
    new.record(20, shards=60, workers=3)
    # WHEN the old leader writes again from what it last read (version 1) — its conditional update loses
    store = CoordinatorStateStore(app_name, client=ddb)
    assert not store.update_if("MaxLeasesPerWorker", {"cap": 10}, {"version": 1})
    # THEN the item holds the newest value with a strictly increasing version
    item = store.get("MaxLeasesPerWorker")
    assert item is not None and item["cap"] == 20 and item["shards"] == 60 and item["version"] == 2


# --- errors -------------------------------------------------------------------------------------------------


def test_missing_tables_raise_table_missing(ddb_aws: AwsConfig) -> None:
    # GIVEN an application whose tables were never created
    client = aws.client("dynamodb", ddb_aws)
    metrics, state = (
        WorkerMetricsStore("never-created", client=client),
        CoordinatorStateStore("never-created", client=client),
    )
    # WHEN anything is read or written THEN our typed error says so (no botocore error leaks)
    with pytest.raises(TableMissingError):
        metrics.list_all()
    with pytest.raises(TableMissingError):
        metrics.put(WorkerMetricStats(worker_id="a", last_update_epoch_s=1))
    with pytest.raises(TableMissingError):
        metrics.delete_if_unchanged("a", 1)
    with pytest.raises(TableMissingError):
        state.get("k")
    with pytest.raises(TableMissingError):
        state.put_if_absent("k", {"v": 1})


def test_an_unreachable_endpoint_raises_one_typed_error() -> None:
    # GIVEN an endpoint nothing listens on
    config = AwsConfig(endpoint_url="http://127.0.0.1:9", max_attempts=1, connect_timeout_s=1, read_timeout_s=1)
    client = aws.client("dynamodb", config)
    # WHEN a store is used THEN EndpointUnreachableError is raised
    with pytest.raises(EndpointUnreachableError):
        WorkerMetricsStore("app", client=client).get("a")
    with pytest.raises(EndpointUnreachableError):
        CoordinatorStateStore("app", client=client).update_if("k", {"v": 1}, {})
