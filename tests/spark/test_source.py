"""The shardlease source in local[2] mode against a moto server: exactly once across a restart, resume from the
lease table with availableNow, two queries (two workers) sharing one stream, a query in worker liveness mode, and a
query refused for the other mode.

Every wait is a liveness bound (tests/support/stalls.py) on what the query's configured timings give
(tests/spark/support.py: ``read_s``, ``commit_s``); what is asserted — every record once, the checkpoints at the
stream's tips, who holds what — is asserted exactly.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.spark.support import (
    QUERY_START_S,
    Env,
    Sink,
    commit_s,
    last_sequence_per_shard,
    lease_checkpoints,
    read_s,
    run_to_end,
    source_runners,
    start_query,
)
from tests.support.processes import eventually_showing
from tests.support.recording import assign_unowned
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.mode import LivenessMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.spark import stop_between_batches
from worker_lib.spark.source import DEPARTURE_TIMEOUT_S
from worker_lib.tables.schema import worker_metrics_table_name
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.telemetry.names import UNITS
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

pytestmark = pytest.mark.slow

REASSIGN_S = 0.25
"""The stand-in leader's look for unowned leases (test_exactly_once_…)."""


def test_exactly_once_across_a_restart_and_resume_from_the_lease_table(spark: Any, env: Env, tmp_path: Path) -> None:
    # A stopped query may give its leases up (when Spark calls the source's stop()): hand unowned leases back to
    # the application, as the leader would.
    stop = threading.Event()

    def reassign() -> None:
        while not stop.wait(0.25):
            assign_unowned(env.store, lambda lease: "spark-a")

    reassigner = threading.Thread(target=reassign, daemon=True)
    reassigner.start()
    try:
        run_restart_scenario(spark, env, tmp_path)
    finally:
        stop.set()
        reassigner.join(timeout=5)


def run_restart_scenario(spark: Any, env: Env, tmp_path: Path) -> None:
    assign_unowned(env.store, lambda lease: "spark-a")
    env.produce(400)
    sink = Sink()
    query = start_query(spark, env, sink, tmp_path / "ckpt", "spark-a")
    try:
        took_s = eventually_showing(
            lambda: len(sink.rows()) >= 300,
            bound_s=hang_bound_s(read_s(300)),
            what="the first query reading 300 records",
            detail=lambda: f"{len(sink.rows())} records",
        )
    finally:
        query.stop()  # abruptly, perhaps in the middle of a micro-batch
    first_run = len(sink.rows())
    print(f"the first query read {first_run} records in {took_s:.1f} s (by its timings: {read_s(300):.1f} s)")
    assert first_run < 400, "the restart should happen in the middle"
    env.produce(200)
    # Same lease table, same worker id, same Spark checkpoint: Spark replays or resumes; recorded ends make a
    # replayed batch read the same records.
    query = start_query(spark, env, sink, tmp_path / "ckpt", "spark-a")
    try:
        eventually_showing(
            lambda: len(sink.rows()) >= 600,
            bound_s=hang_bound_s(read_s(600 - first_run)),
            what="the restarted query reading the rest of the 600 records",
            detail=lambda: f"{len(sink.rows())} records",
        )
        # Checkpoints follow once Spark committed the last batch (the next trigger asks for the next offset).
        expected = last_sequence_per_shard(env)
        eventually_showing(
            lambda: lease_checkpoints(env) == expected,
            bound_s=hang_bound_s(commit_s()),
            what=f"the checkpoints reaching the stream's tips {expected}",
            detail=lambda: lease_checkpoints(env),
        )
    finally:
        stop_between_batches(query)
    datas = sink.datas()
    assert sorted(datas) == sorted(env.produced)
    assert len(datas) == len(set(datas)) == 600

    # A new query with a *new* Spark checkpoint resumes from the lease table; availableNow stops by itself. It reads
    # what is assigned to it when it starts: wait for the stand-in leader to hand the given-up leases back first
    # (under CI's load a fresh query could otherwise start between the give-up and the reassignment, hold nothing,
    # and — rightly for availableNow — end at once).
    # The stopped query's runner leaves on a thread of its own, after the query stopped: wait until it is done — its
    # process gone, after its departure (STOPPED, leases given up) or ended by its deadline without one (what it held
    # is still ours, and the fresh query under the same worker id takes it over) — or the leases could still be its
    # own here, be given up just after, and the fresh query start in the gap.
    rows = WorkerMetricsStore(env.app, client=env.ddb)
    eventually_showing(
        lambda: source_runners() == [],
        bound_s=hang_bound_s(DEPARTURE_TIMEOUT_S),
        what="the stopped queries' source runners ending",
        detail=lambda: f"runners {source_runners()}, row {rows.get('spark-a')}",
    )
    eventually_showing(
        lambda: all(lease.lease_owner == "spark-a" for lease in env.store.list_leases()),
        bound_s=hang_bound_s(REASSIGN_S),
        what="the stand-in leader handing every lease back to spark-a",
        detail=lambda: [lease.lease_owner for lease in env.store.list_leases()],
    )
    env.produce(100)
    fresh = Sink()
    query = start_query(spark, env, fresh, tmp_path / "ckpt-new", "spark-a", available_now=True)
    run_to_end(query, read_s(100), "the availableNow query on a new checkpoint")
    assert sorted(fresh.datas()) == sorted(env.produced[600:])
    assert lease_checkpoints(env) == last_sequence_per_shard(env)


def test_two_queries_share_one_stream(spark: Any, env: Env, tmp_path: Path) -> None:
    keys = sorted(lease.lease_key for lease in env.store.list_leases())
    owners = {key: ("spark-a" if i % 2 == 0 else "spark-b") for i, key in enumerate(keys)}
    assign_unowned(env.store, lambda lease: owners[lease.lease_key])
    env.produce(400)
    sink_a, sink_b = Sink(), Sink()
    query_a = start_query(spark, env, sink_a, tmp_path / "a", "spark-a")
    query_b = start_query(spark, env, sink_b, tmp_path / "b", "spark-b")
    try:
        # (each query reads its two shards: about half the records each)
        eventually_showing(
            lambda: len(sink_a.rows()) + len(sink_b.rows()) >= 400,
            bound_s=hang_bound_s(read_s(200, shards=2)),
            what="the two queries reading the 400 records",
            detail=lambda: f"{len(sink_a.rows())} + {len(sink_b.rows())} records",
        )
        expected = last_sequence_per_shard(env)
        eventually_showing(
            lambda: lease_checkpoints(env) == expected,
            bound_s=hang_bound_s(commit_s()),
            what=f"the checkpoints reaching the stream's tips {expected}",
            detail=lambda: lease_checkpoints(env),
        )
    finally:
        stop_between_batches(query_a)
        stop_between_batches(query_b)
    shards_a = {row[0] for row in sink_a.rows()}
    shards_b = {row[0] for row in sink_b.rows()}
    assert shards_a == {k for k, o in owners.items() if o == "spark-a"}
    assert shards_b == {k for k, o in owners.items() if o == "spark-b"}
    datas = sink_a.datas() + sink_b.datas()
    assert sorted(datas) == sorted(env.produced)
    assert len(datas) == len(set(datas))
    # Both applications report their load to the worker-metrics table in KCL's format.
    ddb = aws.client("dynamodb", AwsConfig(endpoint_url=env.endpoint))
    items = ddb.scan(TableName=worker_metrics_table_name(env.app))["Items"]
    by_worker = {item["wid"]["S"]: item for item in items}
    assert {"spark-a", "spark-b"} <= set(by_worker)
    for item in by_worker.values():
        assert "C" in item["sts"]["M"] and item["opr"]["M"]["C"]["L"][0]["N"] == "100"
        assert int(item["lut"]["N"]) > 0


def test_a_worker_mode_query_reads_every_record_once(spark: Any, env: Env, tmp_path: Path) -> None:
    # GIVEN an application in worker liveness mode whose leases are all assigned to the Spark application
    LivenessModeStore(CoordinatorStateStore(env.app, client=env.ddb)).record_if_absent(LivenessMode.WORKER, by="test")
    assign_unowned(env.store, lambda lease: "spark-w")
    env.produce(200)
    # WHEN an availableNow query configured for worker mode runs to its end
    sink = Sink()
    query = start_query(
        spark,
        env,
        sink,
        tmp_path / "ckpt",
        "spark-w",
        available_now=True,
        liveness_mode="worker",
        max_records_per_shard="1000",
        metrics_first_report_delay_ms="0",
        publish_metrics="cloudwatch",
        metrics_namespace=f"Spark/{env.app}",
        metrics_flush_interval_ms="1000",
    )
    run_to_end(query, read_s(200, per_shard=1000), "the availableNow query in worker mode")
    # THEN every record reached the sink once and the lease table holds the last checkpoint of every shard
    datas = sink.datas()
    assert sorted(datas) == sorted(env.produced) and len(datas) == len(set(datas))
    assert lease_checkpoints(env) == last_sequence_per_shard(env)
    # AND the driver heartbeat for the application in worker mode, on the row its load metric goes to
    row = WorkerMetricsStore(env.app, client=env.ddb).get("spark-w")
    assert row is not None and row.heartbeat is not None and row.heartbeat.liveness == "worker"
    assert "C" in row.stats
    # AND it published the per-worker CloudWatch series a worker publishes, under its worker id: every record and
    # byte committed counted once, its lag and the leases it held (the last flush is the source's departure)
    cloudwatch = aws.client("cloudwatch", AwsConfig(endpoint_url=env.endpoint))
    wanted = {"RecordsProcessed": len(datas), "BytesProcessed": sum(len(d) for d in datas)}
    # (the last flush comes with the runner's departure: within its deadline of the query's end)
    eventually_showing(
        lambda: published_sums(cloudwatch, env.app, "spark-w", list(wanted)) == wanted,
        bound_s=hang_bound_s(DEPARTURE_TIMEOUT_S),
        what=f"the published sums reaching {wanted}",
        detail=lambda: published_sums(cloudwatch, env.app, "spark-w", list(wanted)),
    )
    for name in ("MillisBehindLatest", "LeasesHeld"):
        assert published_sums(cloudwatch, env.app, "spark-w", [name]), name


def published_sums(cloudwatch: Any, app: str, worker_id: str, names: list[str]) -> dict[str, int]:
    """The sum of each metric the application's worker ``worker_id`` put to ``Spark/<app>`` (absent: not put)."""
    now = datetime.now(timezone.utc)
    sums: dict[str, int] = {}
    for name in names:
        points = cloudwatch.get_metric_statistics(
            Namespace=f"Spark/{app}",
            MetricName=name,
            Dimensions=[{"Name": "Application", "Value": app}, {"Name": "WorkerId", "Value": worker_id}],
            StartTime=now - timedelta(minutes=10),
            EndTime=now + timedelta(minutes=1),
            Period=3600,
            Statistics=["Sum"],
            Unit=UNITS[name],
        )["Datapoints"]
        if points:
            sums[name] = int(sum(point["Sum"] for point in points))
    return sums


def test_a_query_configured_for_the_other_mode_fails_with_the_reason(spark: Any, env: Env, tmp_path: Path) -> None:
    # GIVEN an application in worker liveness mode
    LivenessModeStore(CoordinatorStateStore(env.app, client=env.ddb)).record_if_absent(LivenessMode.WORKER, by="test")
    assign_unowned(env.store, lambda lease: "spark-l")
    # WHEN a query configured for lease mode starts
    query = start_query(spark, env, Sink(), tmp_path / "ckpt", "spark-l", available_now=True, liveness_mode="lease")
    # THEN it fails at once, and the error Spark reports carries the refusal naming both modes
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(hang_bound_s(QUERY_START_S))  # False (then "DID NOT RAISE") if it hangs
    message = str(failed.value)
    assert "LivenessModeMismatchError" in message and "'lease'" in message and "'worker'" in message
    assert all(lease.lease_owner == "spark-l" for lease in env.store.list_leases())  # nothing was taken or moved


def test_a_multi_stream_query_reads_each_lease_from_its_own_stream(
    spark: Any, moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    from worker_lib.core.config import InitialPosition
    from worker_lib.core.streams import split_lease_key
    from worker_lib.leader.factory import build_leader
    from worker_lib.leases.dynamodb import DynamoDBLeaseStore
    from worker_lib.shardsync.config import ShardSyncConfig
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.testing.streams import create_stream

    config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=2)
    ddb, kinesis = aws.client("dynamodb", config), aws.client("kinesis", config)
    ensure_tables(app_name, ddb)
    names = (f"{app_name}-a", f"{app_name}-b")
    for name in names:
        create_stream(kinesis, name, 2)
        for n in range(30):
            kinesis.put_record(StreamName=name, Data=f"{name}/{n}".encode(), PartitionKey=str(n))
    # GIVEN a multi-stream application whose leader synced both streams, every lease assigned to the query
    build_leader(
        app=app_name,
        stream=names,
        shard_sync=ShardSyncConfig(initial_position=InitialPosition.TRIM_HORIZON),
        with_assignment=False,
        dynamodb=ddb,
        kinesis=kinesis,
    ).syncer.sync_once()
    store = DynamoDBLeaseStore(app_name, client=ddb)
    assert assign_unowned(store, lambda lease: "spark-a") == 4
    rows: list[tuple[str, str, bytes]] = []
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        with lock:
            rows.extend((r.stream, r.shard_id, bytes(r.data)) for r in df.collect())

    # WHEN a query names both streams and reads what is there
    query = (
        spark.readStream.format("shardlease")
        .options(app=app_name, stream=",".join(names), endpoint_url=moto_endpoint, region="us-east-1")
        .options(worker_id="spark-a", discovery_interval_ms="500", metrics="false")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    run_to_end(query, read_s(60, per_shard=100_000), "the availableNow query on two streams")
    # THEN every record of both streams arrives once, its stream column the stream it was written to
    assert sorted(data for *_, data in rows) == sorted(f"{name}/{n}".encode() for name in names for n in range(30))
    for stream, lease_key, data in rows:
        identifier, _ = split_lease_key(lease_key)
        assert identifier is not None and identifier.stream_name == stream and data.decode().startswith(f"{stream}/")
    # AND the checkpoints were written to the multi-stream leases
    assert all(not lease.checkpoint.is_sentinel for lease in store.list_leases())
