"""Example pipeline: Kinesis → shardlease source → parse JSON events → aggregate per 10 s window → Parquet.

Run it locally, with no AWS account (starts a moto server, creates the tables and a 4-shard stream, produces
events, runs the query with Trigger.AvailableNow and prints a summary)::

    .venv/bin/python examples/spark_pipeline.py --local

Against AWS (EMR, see docs/spark.md)::

    spark-submit examples/spark_pipeline.py --app orders --stream orders-stream --region eu-west-1 \\
        --worker-id emr-a --output s3://my-bucket/orders-agg/ --checkpoint s3://my-bucket/checkpoints/orders/

Idempotent output: each micro-batch overwrites ``<output>/batch_id=<id>``, so a batch that Spark replays after a
failure replaces its own files instead of adding duplicates (the source makes a replayed batch read exactly the
same records).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

EVENT_SCHEMA = "id long, kind string, amount double, ts double"


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def application_cores(spark: Any) -> int | None:
    """The application's executor cores (Spark's default parallelism: its executors' cores, at least 2), or None
    where the session has no SparkContext (Spark Connect: set ``executor_slots`` yourself)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect raises for sparkContext
        return None


def build_query(spark: Any, args: argparse.Namespace, *, available_now: bool) -> Any:
    from pyspark.sql import functions as F

    options = {
        "app": args.app,
        "stream": args.stream,
        "region": args.region,
        "worker_id": args.worker_id,
    }
    if args.max_records_per_shard:
        options["max_records_per_shard"] = str(args.max_records_per_shard)
    if args.endpoint_url:
        options["endpoint_url"] = args.endpoint_url
    cores = application_cores(spark)
    if cores is not None:
        # The capacity the leader shares shards by. Left unset, the source measures it from the reads it sees running
        # at once: a lower bound, so an application that holds one shard looks like one core and stays at one shard.
        options["executor_slots"] = str(cores)
    options.update(option.split("=", 1) for option in args.option)  # any other source option (docs/spark.md)
    events = (
        spark.readStream.format("shardlease")
        .options(**options)
        .load()
        .select(F.from_json(F.col("data").cast("string"), EVENT_SCHEMA).alias("e"), "shard_id")
        .select("e.*", "shard_id")
        .where(F.col("id").isNotNull())  # malformed events are dropped (count them in a real pipeline)
        .withColumn("event_time", F.col("ts").cast("timestamp"))
    )
    output = args.output

    def write_batch(df: Any, batch_id: int) -> None:
        aggregated = df.groupBy(F.window("event_time", "10 seconds").alias("w"), "kind").agg(
            F.count("*").alias("events"), F.sum("amount").alias("amount")
        )
        (
            aggregated.select(
                F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "kind", "events", "amount"
            )
            .withColumn("batch_id", F.lit(batch_id))
            .write.mode("overwrite")
            .parquet(f"{output.rstrip('/')}/batch_id={batch_id}")
        )

    writer = events.writeStream.foreachBatch(write_batch).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="5 seconds")
    return writer.start()


def local_setup(args: argparse.Namespace, events: int) -> tuple[Any, int]:
    """Start moto, create tables + stream, create and assign leases (the leader's job), produce events."""
    # worker_lib.core/.leases/.tables are internal: used here only to stand in for the leader (create and assign the
    # leases) in a local run; the rest is public API.
    from worker_lib import AwsConfig
    from worker_lib.core import aws
    from worker_lib.core.models import TRIM_HORIZON, Lease
    from worker_lib.leases.dynamodb import DynamoDBLeaseStore
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.testing import create_stream, start_moto

    say("starting a moto server (DynamoDB and Kinesis on loopback) ...")
    emulator = start_moto()
    args.endpoint_url = emulator.endpoint_url
    config = AwsConfig(endpoint_url=emulator.endpoint_url, region=args.region)
    ddb, kinesis = aws.client("dynamodb", config), aws.client("kinesis", config)
    say(f"creating the lease tables of {args.app} and the 4-shard stream {args.stream} ...")
    ensure_tables(args.app, ddb)
    create_stream(kinesis, args.stream, 4)
    store = DynamoDBLeaseStore(args.app, client=ddb)
    for shard in kinesis.list_shards(StreamName=args.stream)["Shards"]:
        store.create_lease_if_absent(Lease(lease_key=shard["ShardId"], checkpoint=TRIM_HORIZON))
    for lease in store.list_leases():  # in production the leader assigns by load
        store.assign_lease(lease, args.worker_id)
    rng = random.Random(7)
    now = time.time()
    records = [
        {
            "Data": json.dumps(
                {
                    "id": i,
                    "kind": rng.choice(["order", "refund", "view"]),
                    "amount": round(rng.uniform(1, 100), 2),
                    "ts": now - rng.uniform(0, 60),
                }
            ).encode(),
            "PartitionKey": f"user-{rng.randrange(1000)}",
        }
        for i in range(events)
    ]
    records.append({"Data": b"not json", "PartitionKey": "bad"})
    say(f"producing {events} events and one malformed record ...")
    for i in range(0, len(records), 500):
        kinesis.put_records(StreamName=args.stream, Records=records[i : i + 500])
    return emulator, events


STOP_REQUESTED = threading.Event()  # set by SIGTERM: the query stops between micro-batches, as on Ctrl-C


def await_with_progress(query: Any, started: float) -> None:
    """Wait for the query, printing each new micro-batch (batch id, rows, elapsed) as Spark reports it; a SIGTERM
    ends the wait as Ctrl-C does."""
    seen = -1
    while True:
        if STOP_REQUESTED.is_set():
            raise KeyboardInterrupt
        finished = query.awaitTermination(2)
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != seen:
            seen = progress["batchId"]
            rows = progress["numInputRows"]
            say(f"  micro-batch {seen}: {rows} rows ({time.monotonic() - started:.1f} s)")
        if finished:
            return


def _request_stop(signum: int, frame: Any) -> None:
    # Only a flag: raising here could land inside a Py4J call and break the connection to the JVM.
    STOP_REQUESTED.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="run everything locally on moto")
    parser.add_argument("--app", default="spark-example")
    parser.add_argument("--stream", default="spark-example-events")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--worker-id", default="spark-example-a")
    parser.add_argument("--output", default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--max-records-per-shard", type=int, default=None, help="default: the source's (100 000)")
    parser.add_argument("--continuous", action="store_true", help="keep running (processing-time trigger)")
    parser.add_argument(
        "--option", action="append", default=[], metavar="NAME=VALUE", help="another source option (repeatable)"
    )
    parser.add_argument("--keep-output", action="store_true", help="keep the temporary output and checkpoint")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="shardlease-spark-example-"))
    args.output = args.output or str(workdir / "aggregates")
    args.checkpoint = args.checkpoint or str(workdir / "checkpoint")

    # SIGTERM (a container stopping, a cluster manager, `kill`) stops the query between micro-batches as Ctrl-C does.
    signal.signal(signal.SIGTERM, _request_stop)
    emulator = None
    if args.local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(name, "local")
        emulator, produced = local_setup(args, args.events)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import worker_lib
    from worker_lib.spark import register, stop_between_batches

    say(f"shardlease from {Path(worker_lib.__file__).resolve().parent}")
    say("starting Spark" + (" (local[2])" if args.local else "") + " ...")
    builder = SparkSession.builder.appName("shardlease-example")
    if args.local:
        builder = builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
    spark = builder.config("spark.sql.shuffle.partitions", "4").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        started = time.monotonic()
        query = build_query(spark, args, available_now=not args.continuous)
        say(f"query running (worker id {args.worker_id}, {'continuous' if args.continuous else 'availableNow'})")
        try:
            await_with_progress(query, started)
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM in --continuous mode: let the running micro-batch finish, so the source leaves cleanly.
            say("stopping the query between micro-batches ...")
            stop_between_batches(query)
        elapsed = time.monotonic() - started
        result = spark.read.parquet(args.output)
        totals = result.groupBy("kind").agg(
            F.sum("events").alias("events"), F.round(F.sum("amount"), 2).alias("amount")
        )
        say(f"output: {args.output}  ({result.select('batch_id').distinct().count()} micro-batches, {elapsed:.1f} s)")
        for row in totals.orderBy("kind").collect():
            say(f"  {row.kind:<8} events={row.events:>6}  amount={row.amount:>12.2f}")
        first = result.agg(F.sum("events")).first()
        total = first[0] if first is not None else 0
        say(f"events aggregated: {total}" + (f" of {produced} produced (+1 malformed, dropped)" if args.local else ""))
        return 0 if not args.local or total == produced else 1
    finally:
        spark.stop()
        if emulator is not None:
            emulator.stop()
        # Only the temporary directory goes: an --output or --checkpoint given on the command line is the user's.
        if args.keep_output and any(workdir.iterdir()):
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
