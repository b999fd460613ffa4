"""Data-plane throughput: a shardlease Worker with a no-op processor vs a raw boto3 GetRecords loop.

Both read the same pre-filled stream on the same emulator, in the same run, alternating rounds so that machine
noise hits both alike. The baseline is what a careful hand-written consumer does: one thread per shard, GetRecords
with the maximum limit, at most 5 calls per second per shard (the Kinesis limit the Worker also obeys), no
leases, no checkpoints. The Worker additionally renews leases, checkpoints after every batch, records throughput
and de-aggregates.

    .venv/bin/python bench/dataplane.py [--records 40000] [--shards 4] [--size 512] [--rounds 3] [--backend moto]

Prints records/s for each, the ratio (target ≥ 0.9×), and CPU seconds per MB consumed (this process only).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import TRIM_HORIZON, Lease
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.processing.processor import ProcessRecordsInput
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.emulators import Emulator, start_kinesalite, start_moto
from worker_lib.testing.streams import create_stream, list_all_shards
from worker_lib.worker.worker import Worker, WorkerConfig

MIN_INTERVAL_S = 0.2  # 5 GetRecords calls per second per shard


class Counting:
    """The no-op processor: counts records and bytes, checkpoints every batch (as a real consumer would)."""

    total = 0
    nbytes = 0
    lock = threading.Lock()

    def initialize(self, input: object) -> None:
        pass

    def process_records(self, input: ProcessRecordsInput) -> None:
        size = sum(len(r.data) for r in input.records)
        with Counting.lock:
            Counting.total += len(input.records)
            Counting.nbytes += size
        input.checkpointer.checkpoint()

    def lease_lost(self, input: object) -> None:
        pass

    def shard_ended(self, input: Any) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: object) -> None:
        pass


def fill(kinesis: Any, stream: str, records: int, size: int) -> None:
    payload = b"x" * size
    for start in range(0, records, 500):
        batch = [{"Data": payload, "PartitionKey": f"k{n}"} for n in range(start, min(records, start + 500))]
        kinesis.put_records(StreamName=stream, Records=batch)


def run_baseline(kinesis: Any, stream: str, expected: int) -> tuple[float, float]:
    total = 0
    lock = threading.Lock()

    def read(shard_id: str) -> None:
        nonlocal total
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")[
            "ShardIterator"
        ]
        last_call = 0.0
        while True:
            wait = last_call + MIN_INTERVAL_S - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            last_call = time.monotonic()
            response = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            with lock:
                total += len(response["Records"])
                if total >= expected:
                    return
            if not response["Records"] and not response.get("MillisBehindLatest"):
                return
            iterator = response["NextShardIterator"]

    cpu0, t0 = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=read, args=(s["ShardId"],)) for s in list_all_shards(kinesis, stream)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - t0, time.process_time() - cpu0


def run_worker(ddb: Any, kinesis: Any, stream: str, expected: int) -> tuple[float, float]:
    app = f"bench-{uuid.uuid4().hex[:8]}"
    ensure_tables(app, ddb)
    store = DynamoDBLeaseStore(app, client=ddb)
    for shard in list_all_shards(kinesis, stream):
        store.create_lease_if_absent(Lease(lease_key=shard["ShardId"], checkpoint=TRIM_HORIZON))
        lease = store.get_lease(shard["ShardId"])
        assert lease is not None
        store.assign_lease(lease, "bench-worker")
    Counting.total = Counting.nbytes = 0
    config = WorkerConfig(
        app=app,
        stream=stream,
        worker_id="bench-worker",
        lease=LeaseConfig(failover_time_ms=10_000),
        retrieval=RetrievalConfig(idle_time_between_reads_ms=200),
        discovery_interval_ms=100,
    )
    worker = Worker(config, Counting, dynamodb=ddb, kinesis=kinesis)
    cpu0, t0 = time.process_time(), time.perf_counter()
    worker.start()
    while Counting.total < expected:
        time.sleep(0.01)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    worker.shutdown(timeout_s=10)
    return elapsed, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", type=int, default=512, help="bytes per record")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["moto", "kinesalite"], default="moto")
    args = parser.parse_args()

    moto = start_moto()
    kinesis_emulator: Emulator = start_kinesalite() if args.backend == "kinesalite" else moto
    try:
        ddb = aws.client("dynamodb", AwsConfig(endpoint_url=moto.endpoint_url))
        kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesis_emulator.endpoint_url, read_timeout_s=60))
        stream = f"bench-{uuid.uuid4().hex[:8]}"
        create_stream(kinesis, stream, args.shards)
        fill(kinesis, stream, args.records, args.size)
        mb = args.records * args.size / 1e6
        results: dict[str, list[tuple[float, float]]] = {"raw boto3 loop": [], "shardlease Worker": []}
        for _ in range(args.rounds):
            results["raw boto3 loop"].append(run_baseline(kinesis, stream, args.records))
            results["shardlease Worker"].append(run_worker(ddb, kinesis, stream, args.records))
        print(
            f"backend={args.backend} records={args.records} shards={args.shards} size={args.size}B rounds={args.rounds}"
        )
        print(f"{'consumer':<20} {'records/s (median)':>20} {'CPU s per MB':>14}")
        rates = {}
        for name, runs in results.items():
            rate = statistics.median(args.records / elapsed for elapsed, _ in runs)
            cpu_per_mb = statistics.median(cpu / mb for _, cpu in runs)
            rates[name] = rate
            print(f"{name:<20} {rate:>20,.0f} {cpu_per_mb:>14.3f}")
        ratio = rates["shardlease Worker"] / rates["raw boto3 loop"]
        print(f"ratio Worker / raw loop: {ratio:.2f}x (target >= 0.90x)")
    finally:
        if kinesis_emulator is not moto:
            kinesis_emulator.stop()
        moto.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
