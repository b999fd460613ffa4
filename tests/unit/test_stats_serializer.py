"""Worker-metrics items <-> WorkerMetricStats: pure conversion in KCL 3.x's format (docs/kcl-compatibility.md)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from worker_lib.core.errors import CorruptItemError
from worker_lib.core.models import Checkpoint, LaneStats, WorkerMetricStats
from worker_lib.workermetrics.stats_serializer import from_item, is_foreign, key_of, number, to_item

# An item as KCL 3.x writes it: wid, lut (epoch s), sts and opr maps of number lists (−1 = window without samples).
KCL_ITEM: dict[str, Any] = {
    "wid": {"S": "worker-1"},
    "lut": {"N": "1700000000"},
    "sts": {"M": {"C": {"L": [{"N": "40.5"}, {"N": "-1"}, {"N": "55"}]}, "M": {"L": [{"N": "30"}]}}},
    "opr": {"M": {"C": {"L": [{"N": "100"}]}, "M": {"L": [{"N": "80"}]}}},
}


def test_a_kcl_item_reads_as_the_model_and_writes_back_byte_for_byte() -> None:
    # GIVEN an item KCL wrote
    # WHEN it is read and written again
    stats = from_item(KCL_ITEM)
    # THEN every value survives and the item is identical
    assert stats.worker_id == "worker-1" and stats.last_update_epoch_s == 1_700_000_000
    assert stats.stats == {"C": (40.5, -1.0, 55.0), "M": (30.0,)}
    assert stats.operating_range == {"C": (100.0,), "M": (80.0,)}
    assert stats.entity_type is None and stats.has_failed_metric() is False
    assert to_item(stats) == KCL_ITEM


def test_a_model_round_trips_through_an_item() -> None:
    # GIVEN a model with fractional values, an empty metric list and a KCL 3.5 entity type
    stats = WorkerMetricStats(
        worker_id="w-ü",
        last_update_epoch_s=1_800_000_123,
        stats={"C": (0.1, 33.333333, -1.0), "NI": ()},
        operating_range={"C": (75.0,)},
        entity_type="WORKER_METRIC_STATS",
    )
    # WHEN converted to an item and back THEN it is unchanged
    item = to_item(stats)
    assert item["entityType"] == {"S": "WORKER_METRIC_STATS"}
    assert item["sts"]["M"]["NI"] == {"L": []}
    assert from_item(item) == stats


def test_a_default_metric_worker_writes_empty_maps() -> None:
    # GIVEN a worker with no metric provider (KCL: a "default-metric" worker)
    stats = WorkerMetricStats(worker_id="plain", last_update_epoch_s=5)
    # WHEN written THEN sts and opr are empty maps, and it reads back as default-metric
    item = to_item(stats)
    assert item["sts"] == {"M": {}} and item["opr"] == {"M": {}}
    assert from_item(item).is_default_metric_worker


@pytest.mark.parametrize(
    ("value", "text"),
    [(55.0, "55"), (-1, "-1"), (40.5, "40.5"), (0.1, "0.1"), (0, "0"), (1e-7, "1e-07"), (12345678.25, "12345678.25")],
)
def test_numbers_are_written_as_kcl_writes_them(value: float, text: str) -> None:
    # GIVEN a metric value WHEN encoded THEN integral values carry no ".0" and nothing is rounded
    assert number(value) == {"N": text}
    assert float(text) == value


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_before_dynamodb_sees_them(bad: float) -> None:
    # GIVEN a metric value DynamoDB cannot store WHEN the item is built THEN a ValueError says so
    with pytest.raises(ValueError, match="non-finite"):
        to_item(WorkerMetricStats(worker_id="w", last_update_epoch_s=1, stats={"C": (bad,)}))


def test_an_item_without_worker_id_cannot_be_written() -> None:
    with pytest.raises(ValueError, match="worker id"):
        to_item(WorkerMetricStats(worker_id="", last_update_epoch_s=1))


def test_a_fractional_lut_is_read_as_whole_seconds() -> None:
    # GIVEN a writer that stored lut with a fraction WHEN read THEN it is truncated to epoch seconds
    item = {**KCL_ITEM, "lut": {"N": "1700000000.75"}}
    assert from_item(item).last_update_epoch_s == 1_700_000_000


def test_missing_metric_maps_and_unknown_attributes_are_tolerated() -> None:
    # GIVEN an item with only wid and lut plus an attribute we do not know (a newer KCL)
    item = {"wid": {"S": "w"}, "lut": {"N": "10"}, "futureAttr": {"S": "x"}, "sts": {"NULL": True}}
    # WHEN read THEN it is a default-metric worker
    stats = from_item(item)
    assert stats.stats == {} and stats.operating_range == {} and stats.is_default_metric_worker


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    item = copy.deepcopy(KCL_ITEM)
    target = item
    for step in path[:-1]:
        target = target[step]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return item


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (_with(("wid",), None), "no wid"),
        (_with(("wid",), {"N": "1"}), "no wid"),
        (_with(("lut",), None), "lut missing"),
        (_with(("lut",), {"S": "yesterday"}), "lut missing"),
        (_with(("lut",), {"N": "NaN"}), "lut missing"),
        (_with(("lut",), {"N": "Infinity"}), "lut missing"),
        (_with(("sts",), {"L": []}), "sts is not a map"),
        (_with(("sts", "M", "C"), {"NS": ["1"]}), "sts.C is not a list"),
        (_with(("opr", "M", "C"), {"L": [{"S": "high"}]}), "opr.C holds a non-number"),
        (_with(("opr", "M", "C"), {"L": [{"N": "abc"}]}), "opr.C holds a non-number"),
        (_with(("sts", "M", "C"), {"L": [{"NULL": True}]}), "sts.C holds a non-number"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_corrupt_items_raise_with_the_key_and_attribute_only(item: dict[str, Any], reason: str) -> None:
    # GIVEN an item with one attribute of the wrong shape
    # WHEN read THEN CorruptItemError names the key and the attribute, never the offending value
    with pytest.raises(CorruptItemError) as caught:
        from_item(item)
    assert reason in caught.value.reason
    for secret in ("yesterday", "high", "abc"):
        assert secret not in str(caught.value)


def test_foreign_entities_are_recognised() -> None:
    # GIVEN items of KCL 3.5's single-table mode
    ours = {**KCL_ITEM, "entityType": {"S": "WORKER_METRIC_STATS"}}
    lease = {**KCL_ITEM, "entityType": {"S": "LEASE"}}
    # THEN only another entity type is foreign; no entityType means ours
    assert not is_foreign(KCL_ITEM) and not is_foreign(ours) and is_foreign(lease)
    assert from_item(ours).entity_type == "WORKER_METRIC_STATS"


def test_key_of_never_fails() -> None:
    assert key_of(KCL_ITEM) == "worker-1"
    assert key_of({}) == "?" and key_of({"wid": {"N": "3"}}) == "?" and key_of({"wid": "raw"}) == "?"


def test_capacity_round_trips_as_cap_and_is_absent_from_a_kcl_item() -> None:
    # GIVEN a worker reporting 1.5 CPUs (a cgroup limit) and KCL's item, which has no capacity
    stats = WorkerMetricStats(worker_id="w", last_update_epoch_s=5, capacity=1.5)
    # WHEN written and read THEN it is the `cap` number, and KCL's item reads as not reported
    item = to_item(stats)
    assert item["cap"] == {"N": "1.5"}
    assert from_item(item) == stats
    assert from_item(KCL_ITEM).capacity is None and "cap" not in to_item(from_item(KCL_ITEM))


@pytest.mark.parametrize("raw", [{"S": "2"}, {"N": "0"}, {"N": "-2"}, {"N": "NaN"}, {"NULL": True}])
def test_a_capacity_that_is_not_a_positive_number_is_read_as_not_reported(raw: dict[str, Any]) -> None:
    # GIVEN an item whose cap another writer got wrong WHEN read THEN the item is kept, without a capacity
    assert from_item({**KCL_ITEM, "cap": raw}).capacity is None


def test_lanes_round_trip_as_a_map_per_lease_and_are_absent_from_a_kcl_item() -> None:
    # GIVEN a worker processing one lease in lanes: 1 200 records in flight, the first waiting for 3.4 s
    stats = WorkerMetricStats(
        worker_id="w", last_update_epoch_s=5, lanes={"shard-1": LaneStats(in_flight=1_200, watermark_lag_ms=3_400)}
    )
    # WHEN written and read THEN it is the `lanes` map of `rif` / `wml` numbers, and it reads back unchanged
    item = to_item(stats)
    assert item["lanes"] == {"M": {"shard-1": {"M": {"rif": {"N": "1200"}, "wml": {"N": "3400"}}}}}
    assert from_item(item) == stats
    # AND KCL's item has no lanes, and none are written back
    assert from_item(KCL_ITEM).lanes == {} and "lanes" not in to_item(from_item(KCL_ITEM))


@pytest.mark.parametrize(
    "entry",
    [
        {"N": "3"},
        "raw",
        {"NULL": True},
        {"M": {"rif": {"N": "2"}}},
        {"M": {"wml": {"N": "2"}}},
        {"M": {"rif": {"S": "2"}, "wml": {"N": "1"}}},
        {"M": {"rif": {"N": "x"}, "wml": {"N": "1"}}},
        {"M": {"rif": {"N": "1"}, "wml": {"N": "NaN"}}},
        {"M": {"rif": {"N": "1"}, "wml": {"N": "Infinity"}}},
        {"M": {"rif": {"N": "-1"}, "wml": {"N": "1"}}},
        {"M": {"rif": {"N": "1"}, "wml": {"N": "-5"}}},
        {"M": "raw"},
    ],
)
def test_a_lane_entry_another_writer_got_wrong_is_left_out_and_the_others_kept(entry: Any) -> None:
    # GIVEN an item whose lanes hold one good entry and one another writer got wrong
    good = {"M": {"rif": {"N": "2"}, "wml": {"N": "40"}, "extra": {"S": "ignored"}}}
    item = {**KCL_ITEM, "lanes": {"M": {"good": good, "bad": entry}}}
    # WHEN read THEN the item is kept, with the good entry alone
    stats = from_item(item)
    assert stats.lanes == {"good": LaneStats(in_flight=2, watermark_lag_ms=40)}
    assert stats.stats == from_item(KCL_ITEM).stats


@pytest.mark.parametrize("raw", [{"S": "x"}, {"L": []}, {"NULL": True}, {"M": "raw"}, "raw", {"N": "1"}])
def test_a_lanes_attribute_that_is_not_a_map_reads_as_no_lanes(raw: Any) -> None:
    # GIVEN an item whose lanes attribute is not a map WHEN read THEN the item is kept, without lanes
    assert from_item({**KCL_ITEM, "lanes": raw}) == from_item(KCL_ITEM)


def test_a_spark_batch_end_carries_its_shards_lag_and_an_older_item_reads_as_unknown() -> None:
    # GIVEN a read that ended 1 500 ms behind the tip of its shard
    from worker_lib.spark.batches import batch_end_item, parse_batch_end
    from worker_lib.spark.planning import BatchEnd
    from worker_lib.tables.coordinator_items import BatchEndAttr

    end = BatchEnd(lease_key="shardId-1", position=Checkpoint(sequence="49"), records=3, millis_behind_latest=1_500)
    # WHEN it is written as a batch-end item and read back
    item = batch_end_item("spark-batch#a", end, now_epoch_s=1_800_000_000)
    # THEN the lag survives; an item written before lags were recorded reads as unknown
    assert BatchEnd(**parse_batch_end(item)) == end
    del item[BatchEndAttr.MILLIS_BEHIND]
    assert parse_batch_end(item)["millis_behind_latest"] is None
