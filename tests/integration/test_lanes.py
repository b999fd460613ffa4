"""Key-ordered lanes in-process against moto (docs/worker.md, "Parallelism: key-ordered lanes"): more than one batch
of a shard in flight, records of one key in order, the checkpoint the contiguous watermark, a failing record
holding only its lane; thread lanes and async lanes alike."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.recording import stream_with_leases
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core.models import KinesisRecord
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.processing.failures import RecordFailedError
from worker_lib.processing.processor import AsyncFunctionProcessor, Checkpointer, FunctionProcessor
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.worker.worker import Worker, WorkerConfig

KEYS = 40
HOLD_S = 0.02  # each record's processing time: long enough for lanes to overlap
FAST_LEASES = LeaseConfig(failover_time_ms=3_000)
FAST_READS = RetrievalConfig(idle_time_between_reads_ms=100)
READ_BOUND_S = hang_bound_s(0.2 + 0.1 + 400 * HOLD_S)  # discovery, a read, and every record one after the other
SHUTDOWN_BOUND_S = hang_bound_s(FAST_LEASES.failover_time_ms / 3000)


def put_keyed(kinesis: Any, stream: str, count: int) -> list[tuple[str, bytes]]:
    """``count`` records over KEYS partition keys, in order: (key, data)."""
    records = [(f"k{n % KEYS}", f"r{n:05d}".encode()) for n in range(count)]
    for i in range(0, count, 100):
        chunk = records[i : i + 100]
        kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": k} for k, d in chunk])
    return records


@dataclass
class Deliveries:
    """Every record delivered (key, data, sequence) and how many deliveries ran at once, at most."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: list[tuple[str, bytes, int]] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0
    poison: bytes | None = None

    def begin(self) -> None:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)

    def end(self, records: Sequence[KinesisRecord]) -> None:
        with self.lock:
            self.running -= 1
            self.seen += [(r.partition_key, r.data, int(r.sequence_number)) for r in records]

    def check_poison(self, records: Sequence[KinesisRecord]) -> None:
        for record in records:
            if record.data == self.poison:
                with self.lock:
                    self.running -= 1
                raise RecordFailedError(record)

    def by_key(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        with self.lock:
            for key, _, sequence in self.seen:
                out.setdefault(key, []).append(sequence)
        return out


def thread_handler(log: Deliveries) -> Any:
    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        log.begin()
        log.check_poison(records)
        time.sleep(HOLD_S * len(records))
        log.end(records)

    return handle


def async_handler(log: Deliveries) -> Any:
    async def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        log.begin()
        log.check_poison(records)
        await asyncio.sleep(HOLD_S * len(records))
        log.end(records)

    return handle


def lanes_worker(app: str, stream: str, handle: Any, *, ddb: Any, kinesis: Any, **consumer: Any) -> Worker:
    wrap = AsyncFunctionProcessor if asyncio.iscoroutinefunction(handle) else FunctionProcessor
    return Worker(
        WorkerConfig(
            app=app,
            stream=stream,
            worker_id="w1",
            lease=FAST_LEASES,
            retrieval=FAST_READS,
            discovery_interval_ms=200,
            shutdown_timeout_ms=10_000,
            consumer=ConsumerConfig(**consumer),
            failures=FailureConfig(),
        ),
        lambda: wrap(handle),
        dynamodb=ddb,
        kinesis=kinesis,
    )


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_lanes_keep_each_keys_order_lose_nothing_and_checkpoint_the_last_record(
    ddb: Any, kinesis: Any, app_name: str, kind: str
) -> None:
    # GIVEN one shard with 400 records over 40 keys, and a worker with 8 lanes per shard
    stream, store, _ = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put_keyed(kinesis, stream, 400)
    log = Deliveries()
    handle = thread_handler(log) if kind == "threads" else async_handler(log)
    worker = lanes_worker(app_name, stream, handle, ddb=ddb, kinesis=kinesis, parallelism=8)
    # WHEN it runs until every record was delivered, then shuts down
    worker.start()
    try:
        eventually(lambda: len(log.seen) >= 400, bound_s=READ_BOUND_S, what="400 records")
    finally:
        assert worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN every record was delivered exactly once
    assert sorted(data for _, data, _ in log.seen) == sorted(data for _, data in produced)
    # AND deliveries ran side by side
    assert log.most_at_once > 1
    # AND each key's records came in sequence order
    for key, sequences in log.by_key().items():
        assert sequences == sorted(sequences), key
    # AND the lease's checkpoint is the shard's last record
    last = max(sequence for _, _, sequence in log.seen)
    (lease,) = store.list_leases()
    assert lease.checkpoint.sequence == str(last)
