"""Exactly-once effects through ``foreachBatch`` (docs/spark.md, "Exactly-once effects with foreachBatch"): a sink
that writes a micro-batch's rows and its batch id in one sqlite3 transaction is crashed after its commit, before
Spark's commit log; the query restarted from the same checkpoint location runs that batch again, and the sink ends
up holding every record exactly once.

Local[2] against the moto server (tests/spark/conftest.py); every wait is a liveness bound on the query's configured
timings (tests/spark/support.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.spark.support import (
    DISCOVERY_MS,
    MAX_RECORDS_PER_SHARD,
    Env,
    read_s,
    run_to_end,
    source_runners,
)
from tests.support.processes import eventually_showing
from tests.support.recording import assign_unowned
from tests.support.spark_exactly_once import (
    RecordKey,
    create_tables,
    recorded_batch,
    rows_of,
    stored_records,
    write_batch,
)
from tests.support.stalls import hang_bound_s
from worker_lib.spark.source import DEPARTURE_TIMEOUT_S

pytestmark = pytest.mark.slow

ME = "spark-eo"
RECORDS = 400
"""~100 a shard at MAX_RECORDS_PER_SHARD (40) a batch: three micro-batches, so one runs after the replayed one."""
CRASH_AT = 1
"""The batch id whose foreachBatch call dies after its transaction committed."""
QUERY = "orders-to-sqlite"


class SimulatedCrash(RuntimeError):
    """The driver dying between the sink's commit and Spark's commit log."""


def produce(env: Env, count: int) -> set[RecordKey]:
    """``count`` records in one PutRecords; the keys Kinesis gave them."""
    entries = [{"Data": json.dumps({"id": i}).encode(), "PartitionKey": f"key-{i}"} for i in range(count)]
    response = env.kinesis.put_records(StreamName=env.stream, Records=entries)
    assert response.get("FailedRecordCount", 0) == 0
    return {(put["ShardId"], put["SequenceNumber"], 0) for put in response["Records"]}


def start(spark: Any, env: Env, sink: Callable[[Any, int], None], checkpoint: Path) -> Any:
    """An availableNow query of the source into ``sink``, with tests/spark/support.py's timings."""
    return (
        spark.readStream.format("shardlease")
        .options(app=env.app, stream=env.stream, endpoint_url=env.endpoint, region="us-east-1", worker_id=ME)
        .options(max_records_per_shard=str(MAX_RECORDS_PER_SHARD), discovery_interval_ms=str(DISCOVERY_MS))
        .options(idle_probe_interval_ms="300", metrics="false")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_a_batch_replayed_after_a_crash_past_the_sinks_commit_changes_nothing(
    spark: Any, env: Env, tmp_path: Path
) -> None:
    # GIVEN records on the 4-shard stream, every lease assigned to the Spark application, and an empty sqlite3 sink
    assign_unowned(env.store, lambda lease: ME)
    produced = produce(env, RECORDS)
    db, checkpoint = tmp_path / "sink.db", tmp_path / "ckpt"
    create_tables(db)
    calls: list[tuple[int, frozenset[RecordKey], bool]] = []  # (batch id, records it was given, written)

    def sink(df: Any, batch_id: int) -> None:
        rows = rows_of(df)
        written = write_batch(db, QUERY, rows, batch_id)
        calls.append((batch_id, frozenset(row[:3] for row in rows), written))
        if batch_id == CRASH_AT and [b for b, _, _ in calls].count(CRASH_AT) == 1:
            raise SimulatedCrash(f"batch {batch_id} committed to the sink, not yet to Spark's commit log")

    # WHEN the query's foreachBatch function dies right after its transaction committed batch CRASH_AT
    with pytest.raises(StreamingQueryException) as died:
        run_to_end(start(spark, env, sink, checkpoint), read_s(RECORDS), "the query up to its crash")
    assert SimulatedCrash.__name__ in str(died.value)
    # THEN the sink holds batch CRASH_AT while Spark's commit log does not: the batch is planned, not committed
    assert recorded_batch(db, QUERY) == CRASH_AT
    assert (checkpoint / "offsets" / str(CRASH_AT)).exists()
    assert not (checkpoint / "commits" / str(CRASH_AT)).exists()

    # WHEN the query is restarted from the same checkpoint location, once the dead query's source runner left
    # (its leases given up, handed back here as the leader would)
    eventually_showing(
        lambda: source_runners() == [],
        bound_s=hang_bound_s(DEPARTURE_TIMEOUT_S),
        what="the crashed query's source runner ending",
        detail=lambda: f"runners {source_runners()}",
    )
    assign_unowned(env.store, lambda lease: ME)
    run_to_end(start(spark, env, sink, checkpoint), read_s(RECORDS), "the restarted query")

    print(f"calls (batch id, records): {[(batch_id, len(keys)) for batch_id, keys, _ in calls]}")
    # THEN the sink holds every produced record exactly once: none twice, none missing, nothing else
    stored = stored_records(db)
    assert [key for key, times in stored.items() if times > 1] == [], "written twice"
    assert sorted(produced - set(stored)) == [], "missing"
    assert set(stored) == produced and sum(stored.values()) == RECORDS
    # AND that is because Spark ran batch CRASH_AT again, with the same records, and its transaction wrote nothing
    runs: dict[int, list[tuple[frozenset[RecordKey], bool]]] = {}
    for batch_id, keys, written in calls:
        runs.setdefault(batch_id, []).append((keys, written))
    (first, wrote_first), (again, wrote_again) = runs[CRASH_AT]
    assert again == first and (wrote_first, wrote_again) == (True, False)
    # AND every other batch ran once and was written, the last one after the replayed batch
    assert all(len(each) == 1 and each[0][1] for batch_id, each in runs.items() if batch_id != CRASH_AT)
    assert sorted(runs) == list(range(max(runs) + 1)) and max(runs) > CRASH_AT
    assert recorded_batch(db, QUERY) == max(runs)
