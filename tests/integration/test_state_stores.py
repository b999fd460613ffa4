"""Worker-metrics and coordinator-state stores in KCL's formats, on moto and dynalite."""

from __future__ import annotations

from typing import Any

import pytest

from worker_lib import aws
from worker_lib.config import AwsConfig
from worker_lib.leader.state_store import CoordinatorStateStore, LeaseCapRecorder
from worker_lib.metrics.stats_store import WorkerMetricsStore, from_item, to_item
from worker_lib.models import WorkerMetricStats
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import worker_metrics_table_name

# An item as KCL 3.x writes it (reference §2): wid, lut (epoch s), sts and opr maps of number lists.
KCL_ITEM = {
    "wid": {"S": "worker-1"},
    "lut": {"N": "1700000000"},
    "sts": {"M": {"C": {"L": [{"N": "40.5"}, {"N": "-1"}, {"N": "55"}]}, "M": {"L": [{"N": "30"}]}}},
    "opr": {"M": {"C": {"L": [{"N": "100"}]}, "M": {"L": [{"N": "80"}]}}},
}


@pytest.fixture
def ddb(ddb_aws: AwsConfig, app_name: str) -> Any:
    client = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, client)
    return client


def test_kcl_worker_metric_items_round_trip_unchanged() -> None:
    stats = from_item(KCL_ITEM)
    assert stats.worker_id == "worker-1" and stats.last_update_epoch_s == 1_700_000_000
    assert stats.stats == {"C": (40.5, -1.0, 55.0), "M": (30.0,)}
    assert stats.operating_range == {"C": (100.0,), "M": (80.0,)}
    assert to_item(stats) == KCL_ITEM


def test_put_get_list_and_conditional_stale_delete(ddb: Any, app_name: str) -> None:
    store = WorkerMetricsStore(app_name, client=ddb)
    table = worker_metrics_table_name(app_name)
    # GIVEN two workers, a foreign item and a corrupt item
    store.put(WorkerMetricStats(worker_id="a", last_update_epoch_s=100, stats={"C": (10.0,)}, operating_range={}))
    store.put(WorkerMetricStats(worker_id="b", last_update_epoch_s=200))
    ddb.put_item(TableName=table, Item={"wid": {"S": "x"}, "entityType": {"S": "SOMETHING_ELSE"}})
    ddb.put_item(TableName=table, Item={"wid": {"S": "bad"}, "lut": {"S": "yesterday"}})
    # WHEN the leader lists them
    workers = sorted(store.list_all(), key=lambda w: w.worker_id)
    # THEN foreign and corrupt items are skipped
    assert [w.worker_id for w in workers] == ["a", "b"]
    assert store.get("a") == workers[0] and store.get("bad") is None and store.get("x") is None
    # AND a stale delete only succeeds if lut is still the one seen (a revived worker keeps its entry)
    store.put(WorkerMetricStats(worker_id="a", last_update_epoch_s=150))
    assert not store.delete_if_unchanged("a", 100)
    assert store.delete_if_unchanged("a", 150)
    assert store.get("a") is None


def test_coordinator_state_conditional_writes(ddb: Any, app_name: str) -> None:
    store = CoordinatorStateStore(app_name, client=ddb)
    assert store.put_if_absent("k", {"v": 1, "name": "x", "ratio": 0.5, "tags": ["a"]})
    assert not store.put_if_absent("k", {"v": 2})
    assert store.get("k") == {"key": "k", "v": 1, "name": "x", "ratio": 0.5, "tags": ["a"]}
    assert not store.update_if("k", {"v": 3}, {"v": 2})
    assert store.update_if("k", {"v": 3, "name": None}, {"v": 1})
    assert store.get("k") == {"key": "k", "v": 3, "ratio": 0.5, "tags": ["a"]}
    assert not store.delete_if("k", {"v": 1})
    assert store.delete_if("k", {"v": 3}) and store.get("k") is None


def test_two_leaders_publishing_the_cap_never_interleave_stale_values(ddb: Any, app_name: str) -> None:
    # GIVEN two leaders (an old one not yet aware it lost the lock, and the new one) publishing seed 004's cap
    old, new = (LeaseCapRecorder(CoordinatorStateStore(app_name, client=ddb)) for _ in range(2))
    old.record(10, shards=30, workers=3)
    new.record(20, shards=60, workers=3)
    # WHEN the old leader writes again from what it last read (version 1) — its conditional update loses
    old._last = None
    store = CoordinatorStateStore(app_name, client=ddb)
    assert not store.update_if("MaxLeasesPerWorker", {"cap": 10}, {"version": 1})
    # THEN the item holds the newest value with a strictly increasing version
    item = store.get("MaxLeasesPerWorker")
    assert item is not None and item["cap"] == 20 and item["shards"] == 60 and item["version"] == 2
