"""A Spark application reading a stream through the shardlease source, for end-to-end tests and benchmarks.

    python -m worker_lib.testing.spark_app --app APP --stream STREAM --worker-id spark-a --out DIR \\
        [--cores 2] [--trigger-ms 1000] [--option name=value ...] [--remote sc://127.0.0.1:15002]

It runs one query (local[cores], or on a Spark Connect server with ``--remote``; a processing-time trigger)
whose ``foreachBatch`` sink writes each micro-batch's rows to ``DIR/<worker id>/batch-<id>.jsonl`` (overwritten
when Spark replays the batch, so the output is idempotent) as ``{"shard", "seq", "sub", "data", "arrival_ms",
"written_ms"}``. SIGTERM or SIGINT stops the query between micro-batches (``stop_between_batches``) and the
session, then the process exits 0. AWS settings come from the environment (``SHARDLEASE_ENDPOINT_URL``,
``AWS_REGION``) as for any worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()


def write_batch(out: Path, df: Any, batch_id: int) -> int:
    rows = df.select("shard_id", "sequence_number", "sub_sequence_number", "data", "approximate_arrival_timestamp")
    written_ms = int(time.time() * 1000)
    lines = []
    for row in rows.collect():
        arrival = row.approximate_arrival_timestamp
        lines.append(
            json.dumps(
                {
                    "shard": row.shard_id,
                    "seq": row.sequence_number,
                    "sub": row.sub_sequence_number,
                    "data": bytes(row.data).decode("utf-8", "replace"),
                    "arrival_ms": int(arrival.timestamp() * 1000) if arrival is not None else None,
                    "written_ms": written_ms,
                }
            )
        )
    partial = out / f".batch-{batch_id}.tmp"
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    partial.replace(out / f"batch-{batch_id}.jsonl")
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--trigger-ms", type=int, default=1_000)
    parser.add_argument("--option", action="append", default=[], help="a source option, name=value")
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run as a Spark Connect client of this server (the source, its "
        "leases and the sink run in the server's processes)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())

    from pyspark.sql import SparkSession

    from worker_lib.spark import register, stop_between_batches

    out = args.out / args.worker_id
    out.mkdir(parents=True, exist_ok=True)
    if args.remote:
        spark = SparkSession.builder.remote(args.remote).getOrCreate()  # the server's session settings apply
    else:
        spark = (
            SparkSession.builder.master(f"local[{args.cores}]")
            .appName(f"shardlease-{args.worker_id}")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(args.cores))
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
    register(spark)
    options = dict(option.split("=", 1) for option in args.option)
    rows = [0]

    def sink(df: Any, batch_id: int) -> None:
        rows[0] += write_batch(out, df, batch_id)

    query = (
        spark.readStream.format("shardlease")
        .options(app=args.app, stream=args.stream, worker_id=args.worker_id, **options)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(args.out / f"checkpoint-{args.worker_id}"))
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    say(f"{args.worker_id}: query started")
    while not stopping.wait(5.0):
        if not query.isActive:
            say(f"{args.worker_id}: query ended: {query.exception()}")
            spark.stop()
            return 1
        say(f"{args.worker_id}: {rows[0]} rows so far")
    say(f"{args.worker_id}: stopping the query")
    stop_between_batches(query)
    # When the micro-batch in flight had ended and the query stopped (the system's monotonic clock, which a test in
    # another process reads too): a hand-over is measured from here, the batch's own duration apart.
    say(f"{args.worker_id}: query stopped at monotonic {time.monotonic():.3f}")
    spark.stop()
    say(f"{args.worker_id}: stopped after {rows[0]} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
