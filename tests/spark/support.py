"""What the Spark source tests share: an emulated application (tables, a 4-shard stream, a lease per shard), an
idempotent foreachBatch sink, and a query started on the source with short timings."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker_lib.leases.dynamodb import DynamoDBLeaseStore

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
    ddb: Any
    kinesis: Any
    store: DynamoDBLeaseStore
    produced: list[bytes] = field(default_factory=list)

    def produce(self, count: int) -> None:
        start = len(self.produced)
        for i in range(start, start + count):
            data = json.dumps({"id": i}).encode()
            self.kinesis.put_record(StreamName=self.stream, Data=data, PartitionKey=f"key-{i}")
            self.produced.append(data)


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
