"""A record processor that records what it saw (for tests and the demo), and lease helpers for worker tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker_lib.core.models import TRIM_HORIZON, Lease
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig


@dataclass
class Journal:
    """Every record delivered: (shard, sequence, sub-sequence, data, monotonic time)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    records: list[tuple[str, str, int, bytes, float]] = field(default_factory=list)
    ended: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)

    def datas(self) -> list[bytes]:
        with self.lock:
            return [r[3] for r in self.records]

    def by_shard(self) -> dict[str, list[tuple[str, int]]]:
        out: dict[str, list[tuple[str, int]]] = {}
        with self.lock:
            for shard, seq, sub, _, _ in self.records:
                out.setdefault(shard, []).append((seq, sub))
        return out


class RecordingProcessor:
    """Checkpoints after every batch; checkpoints SHARD_END and at shutdown."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.shard_id = ""

    def initialize(self, input: InitializationInput) -> None:
        self.shard_id = input.shard_id
        with self.journal.lock:
            self.journal.started.setdefault(input.shard_id, time.monotonic())
            self.journal.events.append(("initialize", input.shard_id))

    def process_records(self, input: ProcessRecordsInput) -> None:
        now = time.monotonic()
        with self.journal.lock:
            for record in input.records:
                self.journal.records.append(
                    (input.shard_id, record.sequence_number, record.sub_sequence_number, record.data, now)
                )
        input.checkpointer.checkpoint()

    def lease_lost(self, input: LeaseLostInput) -> None:
        with self.journal.lock:
            self.journal.events.append(("lease_lost", input.shard_id))

    def shard_ended(self, input: ShardEndedInput) -> None:
        with self.journal.lock:
            self.journal.ended[input.shard_id] = time.monotonic()
            self.journal.events.append(("shard_ended", input.shard_id))
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        with self.journal.lock:
            self.journal.events.append(("shutdown_requested", input.shard_id))
        input.checkpointer.checkpoint()


def create_leases_for_open_shards(store: DynamoDBLeaseStore, kinesis: Any, stream: str) -> list[str]:
    """Stand-in for the leader's shard sync in worker tests: a TRIM_HORIZON lease per shard."""
    keys = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        lease = Lease(lease_key=shard["ShardId"], checkpoint=TRIM_HORIZON)
        store.create_lease_if_absent(lease)
        keys.append(shard["ShardId"])
    return keys


def recording_worker(
    app: str,
    stream: str,
    *,
    ddb: Any,
    kinesis: Any,
    journal: Journal | None = None,
    worker_id: str = "w1",
    **config: Any,
) -> Worker:
    """An in-process Worker on the test's clients whose processors record into ``journal``: 100 ms between reads
    and a 10 s shutdown timeout unless ``config`` (any other :class:`WorkerConfig` field) says otherwise."""
    settings: dict[str, Any] = {
        "retrieval": RetrievalConfig(idle_time_between_reads_ms=100),
        "shutdown_timeout_ms": 10_000,
        **config,
    }
    recorded = journal if journal is not None else Journal()
    return Worker(
        WorkerConfig(app=app, stream=stream, worker_id=worker_id, **settings),
        lambda: RecordingProcessor(recorded),
        dynamodb=ddb,
        kinesis=kinesis,
    )


def stream_with_leases(
    app: str, ddb: Any, kinesis: Any, shards: int, *, owner: str | None = None
) -> tuple[str, DynamoDBLeaseStore, list[str]]:
    """A stream ``<app>-s`` of ``shards`` shards and a TRIM_HORIZON lease per shard, each assigned to ``owner`` if
    one is named (stand-ins for the leader's shard sync and assignment); (stream, lease store, lease keys)."""
    stream = f"{app}-s"
    create_stream(kinesis, stream, shards)
    store = DynamoDBLeaseStore(app, client=ddb)
    keys = create_leases_for_open_shards(store, kinesis, stream)
    if owner is not None:
        assert assign_unowned(store, lambda lease: owner) == len(keys)
    return stream, store, keys


def owners(store: DynamoDBLeaseStore) -> dict[str, str | None]:
    """Lease key -> ``leaseOwner`` (``None``: unowned), as the table says now."""
    return {lease.lease_key: lease.lease_owner for lease in store.list_leases()}


def assign_unowned(store: DynamoDBLeaseStore, owner_for: Callable[[Lease], str]) -> int:
    """Stand-in for the leader's assignment: give every unowned, unfinished lease to ``owner_for(lease)``."""
    assigned = 0
    for lease in store.list_leases():
        if lease.lease_owner is None and not lease.is_finished and store.assign_lease(lease, owner_for(lease)):
            assigned += 1
    return assigned
