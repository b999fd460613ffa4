"""What the Spark source tests share: an emulated application (tables, a 4-shard stream, a lease per shard), an
idempotent foreachBatch sink, a query started on the source with short timings, and the times those timings give
(for the liveness bounds: tests/support/stalls.py)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.stalls import hang_bound_s, stall_note
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.testing.processes import ProcessFleet

SHARDS = 4

TRIGGER_MS = 300
"""start_query's processing-time trigger."""
MAX_RECORDS_PER_SHARD = 40
"""start_query's cap on the records a micro-batch reads from one shard."""
DISCOVERY_MS = 500
"""start_query's discovery interval (the driver's look for leases assigned to it)."""

QUERY_START_S = 3.0
"""Not a setting: a query's start to its first micro-batch in the warmed-up shared local[2] session
(tests/spark/conftest.py): the source runner (a Python process of its own importing PySpark and boto3), the liveness
mode, the first beat and the takes. bench/spark.py measures it (docs/benchmarks.md: 1.4 s to the first trigger alone
on the 2-core machine); twice that here, as a test's query starts beside the moto server it reads."""
MICRO_BATCH_S = 1.0
"""Not a setting: one micro-batch of at most SHARDS × MAX_RECORDS_PER_SHARD records in the shared local[2] session
(planning, the Python tasks, the foreachBatch sink, the commit; the reads themselves take milliseconds). A query's
start and its first two such batches took 4–6 s at a load average of 10 (2026-11-27), within read_s's 7 s."""


def read_s(records: int, *, shards: int = SHARDS, per_shard: int = MAX_RECORDS_PER_SHARD) -> float:
    """How long a starting query takes, by its configured timings, to read ``records`` spread over ``shards``: its
    start, then a micro-batch per trigger (or per batch, when a batch takes longer than the trigger) of at most
    ``per_shard`` records a shard — one more for a spread that is not even, one more replayed after a restart."""
    batches = math.ceil(records / (shards * per_shard)) + 2
    return QUERY_START_S + batches * max(TRIGGER_MS / 1000, MICRO_BATCH_S)


def commit_s() -> float:
    """From the last record read to its checkpoint in the lease table: the batch's commit, then the next trigger
    asks for the next offset, which writes the checkpoints of the committed batch."""
    return 2 * max(TRIGGER_MS / 1000, MICRO_BATCH_S)


def run_to_end(query: Any, expected_s: float, what: str) -> None:
    """Wait for an availableNow query to end by itself (a liveness bound on ``expected_s``); stopped if it did not."""
    bound_s, started = hang_bound_s(expected_s), time.monotonic()
    try:
        ended = query.awaitTermination(bound_s)
    finally:
        if query.isActive:
            query.stop()
    assert ended, f"{what}: not ended within the liveness bound of {bound_s:.0f} s; {stall_note(started)}"


def exit_code(fleet: ProcessFleet, name: str, *, bound_s: float, what: str) -> int:
    """The exit code of ``fleet``'s process ``name``, which ends within ``bound_s`` (a liveness bound); a miss fails
    with ``what``, what the timer probe saw meanwhile and the end of the process's log."""
    started = time.monotonic()
    code = fleet.wait(name, timeout_s=bound_s)
    if code is None:
        raise AssertionError(
            f"{what}: still running after its liveness bound of {bound_s:.0f} s; {stall_note(started)}\n"
            f"{fleet.log(name)[-3000:]}"
        )
    return code


RUNNER_MODULE = "python_streaming_source_runner"
"""The module of the Python process Spark starts per streaming query for a Python data source (the source's
driver side: its leases and heartbeat)."""


def source_runners() -> list[int]:
    """The live source runners started by this process's Spark (its JVM is a child of this process): a stopped
    query's runner is gone once it departed, or once its deadline (DEPARTURE_TIMEOUT_S) ended it."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if RUNNER_MODULE.encode() in cmdline and _descends_from(int(entry.name), me):
            found.append(int(entry.name))
    return found


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
    return False


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
        "max_records_per_shard": str(MAX_RECORDS_PER_SHARD),
        "discovery_interval_ms": str(DISCOVERY_MS),
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
    trigger = {"availableNow": True} if available_now else {"processingTime": f"{TRIGGER_MS} milliseconds"}
    writer = writer.trigger(**trigger)
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
