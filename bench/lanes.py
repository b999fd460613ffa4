"""Key-ordered lanes: records/s of one shard whose handler waits 50 ms per record, at parallelism 1, 8 and 32.

A real :class:`~worker_lib.worker.worker.Worker` (``ConsumerConfig(parallelism=N)``) on one shard of a moto server
(HTTP on loopback), its lease table made and its one TRIM_HORIZON lease assigned to it beforehand. Each
configuration reads a stream of its own, pre-filled with 100-byte records keyed on 1 000 partition keys in turn
(record n: ``pk-{n mod 1000}``):

- parallelism 1 (today's behaviour, KCL's one batch at a time per shard) — the baseline, in the same run;
- parallelism 8 and 32, a plain ``handle(records, checkpointer)`` that ``time.sleep``\\s 50 ms per record;
- async 32: ``async def handle`` that awaits ``asyncio.sleep`` 50 ms per record (the worker's one event loop);
- KPL-aggregated 32: aggregates of 100 user records (the KPL's reference encoder), each user record with its own
  key; lanes key on the user record's key after de-aggregation;
- memory: a further parallelism-32 run under ``tracemalloc``, on a backlog past ``max_records_in_flight`` (10 000
  records in flight at most): the peak of Python's heap above what it held just before the worker started (one
  shard, so per shard). The peak resident memory above the start is printed beside it, for every run.

records/s: the records of the run / (end of the delivery that completed them − start of the first delivery).
Beside each, the lanes' ceiling: total / (the heaviest lane's records × 50 ms). Keys go to lanes by hash, so lanes
are not equally loaded, and a backlog takes as long as its heaviest lane.

    .venv/bin/python bench/lanes.py [--baseline-records 100] [--records 4000]

The last line: ``lanes: records/s at parallelism 1 A; 8 B (B/A X×); 32 C (C/A Y×); async 32 D (D/A Z×);
KPL-aggregated 32 E (E/A W×); memory per shard at 32 M MB``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lanes_support import PAYLOAD, Tally, fill_kpl, fill_plain, lane_ceiling  # noqa: E402

from worker_lib.core import aws  # noqa: E402
from worker_lib.core.config import AwsConfig  # noqa: E402
from worker_lib.core.models import TRIM_HORIZON, Lease  # noqa: E402
from worker_lib.leases.config import LeaseConfig  # noqa: E402
from worker_lib.leases.dynamodb import DynamoDBLeaseStore  # noqa: E402
from worker_lib.processing.config import ConsumerConfig  # noqa: E402
from worker_lib.processing.processor import (  # noqa: E402
    AsyncFunctionProcessor,
    Checkpointer,
    FunctionProcessor,
    KinesisRecord,
    RecordProcessor,
)
from worker_lib.retrieval.config import RetrievalConfig  # noqa: E402
from worker_lib.tables.admin import ensure_tables  # noqa: E402
from worker_lib.testing.emulators import start_moto  # noqa: E402
from worker_lib.testing.streams import create_stream, list_all_shards  # noqa: E402
from worker_lib.worker.worker import Worker, WorkerConfig  # noqa: E402

PER_RECORD_S = 0.05
WORKER_ID = "bench-lanes"
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Run:
    name: str
    parallelism: int
    records: int  # user records in its stream; the run ends once all are done
    mode: str = "threads"  # threads | async | kpl (threads, KPL-aggregated records)
    trace_memory: bool = False


@dataclass(frozen=True)
class Result:
    run: Run
    rate: float
    ceiling: float
    seconds: float
    deliveries: int
    most_running: int
    out_of_order: int
    rss_mb: float
    checkpointed: bool  # the lease's checkpoint is at the last record written, once the worker stopped
    heap_mb: float | None = None


def thread_handler(tally: Tally) -> Callable[[Sequence[KinesisRecord], Checkpointer], None]:
    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        tally.started(records)
        time.sleep(PER_RECORD_S * len(records))
        tally.ended(records)

    return handle


def async_handler(tally: Tally) -> Callable[[Sequence[KinesisRecord], Checkpointer], Awaitable[None]]:
    async def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        tally.started(records)
        await asyncio.sleep(PER_RECORD_S * len(records))
        tally.ended(records)

    return handle


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE / 1e6


class RssPeak:
    """The process's peak resident memory, sampled every 20 ms on a thread of its own while in use."""

    def __init__(self) -> None:
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


class Bench:
    def __init__(self, endpoint_url: str) -> None:
        self.ddb = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint_url))
        self.kinesis = aws.client("kinesis", AwsConfig(endpoint_url=endpoint_url, read_timeout_s=60))

    def prepare(self, run: Run) -> tuple[str, str, str]:
        """A fresh stream, filled, and a fresh lease table whose one TRIM_HORIZON lease is ours; (app, stream, the
        sequence number of the last record written)."""
        app = f"bench-lanes-{uuid.uuid4().hex[:8]}"
        stream = f"{app}-s"
        create_stream(self.kinesis, stream, 1)
        fill = fill_kpl if run.mode == "kpl" else fill_plain
        last = fill(self.kinesis, stream, run.records)
        ensure_tables(app, self.ddb)
        store = DynamoDBLeaseStore(app, client=self.ddb)
        (shard,) = list_all_shards(self.kinesis, stream)
        store.create_lease_if_absent(Lease(lease_key=shard["ShardId"], checkpoint=TRIM_HORIZON))
        lease = store.get_lease(shard["ShardId"])
        assert lease is not None and store.assign_lease(lease, WORKER_ID)
        return app, stream, last

    def checkpoint(self, app: str) -> str:
        (lease,) = DynamoDBLeaseStore(app, client=self.ddb).list_leases()
        return lease.checkpoint.sequence

    def measure(self, run: Run) -> Result:
        app, stream, last = self.prepare(run)
        tally = Tally(expected=run.records)
        processor: RecordProcessor
        if run.mode == "async":
            processor = AsyncFunctionProcessor(async_handler(tally))
        else:
            processor = FunctionProcessor(thread_handler(tally))
        config = WorkerConfig(
            app=app,
            stream=stream,
            worker_id=WORKER_ID,
            lease=LeaseConfig(failover_time_ms=10_000),
            consumer=ConsumerConfig(parallelism=run.parallelism),
            retrieval=RetrievalConfig(idle_time_between_reads_ms=200),
            discovery_interval_ms=100,
            shutdown_timeout_ms=15_000,
        )
        worker = Worker(config, lambda: processor, dynamodb=self.ddb, kinesis=self.kinesis)
        timeout_s = 60 + run.records * PER_RECORD_S / run.parallelism * 3
        heap_mb: float | None = None
        if run.trace_memory:
            tracemalloc.start()
            heap_before = tracemalloc.get_traced_memory()[0]
        try:
            with RssPeak() as rss:
                rss_before = rss_mb()
                worker.start()
                if not tally.finished.wait(timeout_s):
                    raise SystemExit(f"{run.name}: {tally.done} of {run.records} records done in {timeout_s:.0f} s")
            if run.trace_memory:
                heap_mb = (tracemalloc.get_traced_memory()[1] - heap_before) / 1e6
        finally:
            if run.trace_memory:
                tracemalloc.stop()
            worker.shutdown(timeout_s=15)
        rate = tally.rate()
        return Result(
            run=run,
            rate=rate,
            ceiling=lane_ceiling(run.records, run.parallelism, PER_RECORD_S),
            seconds=run.records / rate,
            deliveries=tally.deliveries,
            most_running=tally.most_running,
            out_of_order=tally.out_of_order,
            rss_mb=rss.peak - rss_before,
            checkpointed=self.checkpoint(app) == last,
            heap_mb=heap_mb,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--baseline-records", type=int, default=100, help="records at parallelism 1 (20/s)")
    parser.add_argument("--records", type=int, default=4_000, help="records (user records) of every other run")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs", flush=True)
    runs = [
        Run("parallelism 1", 1, args.baseline_records),
        Run("parallelism 8", 8, args.records),
        Run("parallelism 32", 32, args.records),
        Run("async 32", 32, args.records, mode="async"),
        Run("KPL-aggregated 32", 32, args.records, mode="kpl"),
    ]
    cap = ConsumerConfig().max_records_in_flight
    # The memory run: a backlog past the in-flight cap (the reader takes in up to the cap, then waits for lanes).
    memory_run = Run("memory (tracemalloc)", 32, cap + 2_000, trace_memory=True)
    results: dict[str, Result] = {}
    with start_moto() as moto:
        bench = Bench(moto.endpoint_url)
        print(
            f"{'run':<20} {'records':>7} {'s':>6} {'records/s':>9} {'ceiling':>8} {'deliveries':>10} "
            f"{'at once':>7} {'out of order':>12} {'checkpointed':>12} {'RSS +MB':>7}",
            flush=True,
        )
        for run in [*runs, memory_run]:
            result = bench.measure(run)
            results[run.name] = result
            checkpointed = "yes" if result.checkpointed else "NO"
            print(
                f"{run.name:<20} {run.records:>7} {result.seconds:>6.1f} {result.rate:>9.0f} {result.ceiling:>8.0f} "
                f"{result.deliveries:>10} {result.most_running:>7} {result.out_of_order:>12} {checkpointed:>12} "
                f"{result.rss_mb:>7.1f}",
                flush=True,
            )
    memory = results[memory_run.name]
    assert memory.heap_mb is not None
    print(
        f"memory at 32, {memory_run.records} records of {len(PAYLOAD)} B in the stream (in flight at most {cap}): "
        f"Python heap peak +{memory.heap_mb:.1f} MB (tracemalloc), RSS peak +{memory.rss_mb:.1f} MB"
    )
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}")
    base = results["parallelism 1"].rate

    def part(name: str, label: str, letter: str) -> str:
        rate = results[name].rate
        return f"{label} {rate:.0f} ({letter}/A {rate / base:.1f}×)"

    print(
        f"lanes: records/s at parallelism 1 {base:.0f}; {part('parallelism 8', '8', 'B')}; "
        f"{part('parallelism 32', '32', 'C')}; {part('async 32', 'async 32', 'D')}; "
        f"{part('KPL-aggregated 32', 'KPL-aggregated 32', 'E')}; memory per shard at 32 {memory.heap_mb:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
