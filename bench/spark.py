"""Records/s through the shardlease Spark source vs a plain Python reader of the same shards, side by side.

    .venv/bin/python bench/spark.py [--records 20000] [--shards 4]

Everything runs on one machine against a moto server: a stream is filled once; then (1) a plain reader — one
thread per shard running the library's ShardRecordFetcher from TRIM_HORIZON to the tip, no leases, no Spark — and
(2) the source in local[2] mode with Trigger.AvailableNow and a foreachBatch sink that counts rows, reading the
same shards under a fresh application (its own lease table). The source is run twice: the first run pays the
SparkSession's first-job warm-up. Ratios compare records/s; absolute numbers are context only.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def plain_reader(kinesis: Any, stream: str, shard_ids: list[str]) -> int:
    from worker_lib.core.models import TRIM_HORIZON
    from worker_lib.processing.retrieval import ShardRecordFetcher

    counts = dict.fromkeys(shard_ids, 0)

    def read(shard_id: str) -> None:
        fetcher = ShardRecordFetcher(stream, shard_id, kinesis_client=kinesis, start=TRIM_HORIZON)
        while True:
            batch = fetcher.fetch()
            counts[shard_id] += len(batch.records)
            if batch.end_of_shard or (not batch.records and not batch.millis_behind_latest):
                return

    threads = [threading.Thread(target=read, args=(s,)) for s in shard_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts.values())


def main() -> int:
    parser = argparse.ArgumentParser(description="shardlease Spark source vs plain reader")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--max-records-per-shard", type=int, default=10_000)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "local")

    from worker_lib.core import aws
    from worker_lib.core.config import AwsConfig
    from worker_lib.core.models import TRIM_HORIZON, Lease
    from worker_lib.leases.dynamodb import DynamoDBLeaseStore
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.testing.emulators import start_moto
    from worker_lib.testing.streams import create_stream

    emulator = start_moto()
    try:
        config = AwsConfig(endpoint_url=emulator.endpoint_url, max_attempts=2)
        ddb, kinesis = aws.client("dynamodb", config), aws.client("kinesis", config)
        stream = "bench-spark"
        create_stream(kinesis, stream, args.shards)
        payload = b"x" * 200
        for i in range(0, args.records, 500):
            batch = [{"Data": payload, "PartitionKey": f"k{i + j}"} for j in range(min(500, args.records - i))]
            kinesis.put_records(StreamName=stream, Records=batch)
        shard_ids = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
        say(f"stream {stream}: {args.shards} shards, {args.records} records of {len(payload)} B (moto)")

        started = time.monotonic()
        plain_count = plain_reader(kinesis, stream, shard_ids)
        plain_s = time.monotonic() - started
        plain_rate = plain_count / plain_s
        say(f"plain reader : {plain_count:>7} records in {plain_s:6.2f} s = {plain_rate:9.0f} records/s")

        from pyspark.sql import SparkSession

        from worker_lib.spark import register

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        rates: list[float] = []
        try:
            for run in (1, 2):
                app = f"bench-spark-{run}"
                ensure_tables(app, ddb)
                store = DynamoDBLeaseStore(app, client=ddb)
                for shard_id in shard_ids:
                    store.create_lease_if_absent(Lease(lease_key=shard_id, checkpoint=TRIM_HORIZON))
                for lease in store.list_leases():
                    store.assign_lease(lease, "bench")
                seen = [0]

                def count(df: Any, batch_id: int, seen: list[int] = seen) -> None:
                    seen[0] += df.count()

                checkpoint = Path(f"/tmp/shardlease-bench-spark-{os.getpid()}-{run}")
                started = time.monotonic()
                query = (
                    spark.readStream.format("shardlease")
                    .options(
                        app=app,
                        stream=stream,
                        endpoint_url=emulator.endpoint_url,
                        worker_id="bench",
                        max_records_per_shard=str(args.max_records_per_shard),
                        metrics="false",
                    )
                    .load()
                    .writeStream.foreachBatch(count)
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                elapsed = time.monotonic() - started
                rate = seen[0] / elapsed
                rates.append(rate)
                label = "cold" if run == 1 else "warm"
                say(f"spark source ({label}): {seen[0]:>7} records in {elapsed:6.2f} s = {rate:9.0f} records/s")
        finally:
            spark.stop()
        say(f"ratio source/plain: cold {rates[0] / plain_rate:.2f}x, warm {rates[1] / plain_rate:.2f}x")
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
