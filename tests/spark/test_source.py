"""The shardlease source in local[2] mode against a moto server: exactly once across a restart, resume from the
lease table with availableNow, and two queries (two workers) sharing one stream."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.recording import assign_unowned, create_leases_for_open_shards, wait_until
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import worker_metrics_table_name
from worker_lib.testing.streams import create_stream

pytestmark = pytest.mark.slow

SHARDS = 4


@dataclass
class Sink:
    """An idempotent foreachBatch sink: a batch id seen before is skipped (as a Parquet overwrite would)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: dict[int, list[tuple[str, str, int, bytes]]] = field(default_factory=dict)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, bytes(r.data)) for r in df.collect()]
        with self.lock:
            self.batches.setdefault(batch_id, rows)

    def rows(self) -> list[tuple[str, str, int, bytes]]:
        with self.lock:
            return [row for rows in self.batches.values() for row in rows]

    def datas(self) -> list[bytes]:
        return [row[3] for row in self.rows()]


@dataclass
class Env:
    app: str
    stream: str
    endpoint: str
    kinesis: Any
    store: DynamoDBLeaseStore
    produced: list[bytes] = field(default_factory=list)

    def produce(self, count: int) -> None:
        start = len(self.produced)
        for i in range(start, start + count):
            data = json.dumps({"id": i}).encode()
            self.kinesis.put_record(StreamName=self.stream, Data=data, PartitionKey=f"key-{i}")
            self.produced.append(data)


@pytest.fixture
def env(moto_endpoint: str, app_name: str) -> Env:
    config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=2)
    ddb = aws.client("dynamodb", config)
    kinesis = aws.client("kinesis", config)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-stream"
    create_stream(kinesis, stream, SHARDS)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    create_leases_for_open_shards(store, kinesis, stream)
    return Env(app=app_name, stream=stream, endpoint=moto_endpoint, kinesis=kinesis, store=store)


def start_query(
    spark: Any, env: Env, sink: Sink, checkpoint: Path, worker_id: str, *, available_now: bool = False, **extra: str
) -> Any:
    options = {
        "app": env.app,
        "stream": env.stream,
        "endpoint_url": env.endpoint,
        "region": "us-east-1",
        "worker_id": worker_id,
        "max_records_per_shard": "40",
        "discovery_interval_ms": "500",
        "idle_probe_interval_ms": "300",
        "metrics_report_interval_ms": "1000",
        "metrics_first_report_delay_ms": "500",
        **extra,
    }
    writer = (
        spark.readStream.format("shardlease")
        .options(**options)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="300 milliseconds")
    return writer.start()


def lease_checkpoints(env: Env) -> dict[str, str]:
    return {lease.lease_key: lease.checkpoint.sequence for lease in env.store.list_leases()}


def last_sequence_per_shard(env: Env) -> dict[str, str]:
    last: dict[str, str] = {}
    for shard in env.kinesis.list_shards(StreamName=env.stream)["Shards"]:
        iterator = env.kinesis.get_shard_iterator(
            StreamName=env.stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records = env.kinesis.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
        if records:
            last[shard["ShardId"]] = records[-1]["SequenceNumber"]
    return last


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
        assert wait_until(lambda: len(sink.rows()) >= 300, timeout_s=60), "the first query read too little"
    finally:
        query.stop()
    first_run = len(sink.rows())
    assert first_run < 400, "the restart should happen in the middle"
    env.produce(200)
    # Same lease table, same worker id, same Spark checkpoint: Spark replays or resumes; recorded ends make a
    # replayed batch read the same records.
    query = start_query(spark, env, sink, tmp_path / "ckpt", "spark-a")
    try:
        assert wait_until(lambda: len(sink.rows()) >= 600, timeout_s=90), f"only {len(sink.rows())} of 600"
        # Checkpoints follow once Spark committed the last batch (the next trigger asks for the next offset).
        expected = last_sequence_per_shard(env)
        assert wait_until(lambda: lease_checkpoints(env) == expected, timeout_s=20), lease_checkpoints(env)
    finally:
        query.stop()
    datas = sink.datas()
    assert sorted(datas) == sorted(env.produced)
    assert len(datas) == len(set(datas)) == 600

    # A new query with a *new* Spark checkpoint resumes from the lease table; availableNow stops by itself.
    env.produce(100)
    fresh = Sink()
    query = start_query(spark, env, fresh, tmp_path / "ckpt-new", "spark-a", available_now=True)
    query.awaitTermination(120)
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
        assert wait_until(lambda: len(sink_a.rows()) + len(sink_b.rows()) >= 400, timeout_s=90)
        expected = last_sequence_per_shard(env)
        assert wait_until(lambda: lease_checkpoints(env) == expected, timeout_s=20)
    finally:
        query_a.stop()
        query_b.stop()
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
