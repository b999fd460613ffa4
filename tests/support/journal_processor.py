"""A record processor for multi-process tests: appends every record to a journal file, then checkpoints.

``shardlease worker --processor tests.support.journal_processor:JournalProcessor`` with
``SHARDLEASE_TEST_JOURNAL=/path/file`` (and ``SHARDLEASE_TEST_RECORDS_PER_S`` for a worker of limited capacity).
Each line is ``pid shard sequence sub-sequence data`` (in a multi-stream application ``shard`` is
``stream/shardId``); the line is flushed *before* the checkpoint, so a record checkpointed is always in the journal
(duplicates are possible only for records after the last checkpoint, never losses).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)

PROCESSOR = "tests.support.journal_processor:JournalProcessor"  # for `shardlease worker --processor`


class ProcessCapacity:
    """At most ``SHARDLEASE_TEST_RECORDS_PER_S`` records a second for the whole process, across its shards (unset:
    no limit): a worker with a capacity, so that a fleet too small for its stream falls behind (lag grows) and a
    larger one catches up."""

    def __init__(self, records_per_s: float | None) -> None:
        self.records_per_s = records_per_s
        self._lock = threading.Lock()
        self._free_at = 0.0

    def spend(self, records: int) -> None:
        if not self.records_per_s or records <= 0:
            return
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + records / self.records_per_s
            done_at = self._free_at
        time.sleep(max(0.0, done_at - time.monotonic()))


_rate = os.environ.get("SHARDLEASE_TEST_RECORDS_PER_S")
CAPACITY = ProcessCapacity(float(_rate) if _rate else None)


class JournalProcessor:
    def __init__(self) -> None:
        self.path = os.environ["SHARDLEASE_TEST_JOURNAL"]
        self.shard_id = ""

    def _append(self, lines: list[str]) -> None:
        with open(self.path, "a", encoding="utf-8") as journal:
            journal.write("".join(lines))
            journal.flush()
            os.fsync(journal.fileno())

    def initialize(self, input: InitializationInput) -> None:
        multi = input.stream_identifier is not None
        self.shard_id = f"{input.stream_name}/{input.shard_id}" if multi else input.shard_id
        self._append([f"{os.getpid()} {self.shard_id} INIT {input.checkpoint}\n"])

    def process_records(self, input: ProcessRecordsInput) -> None:
        CAPACITY.spend(len(input.records))
        pid = os.getpid()
        self._append(
            [
                f"{pid} {self.shard_id} {r.sequence_number} {r.sub_sequence_number} {r.data.decode()}\n"
                for r in input.records
            ]
        )
        input.checkpointer.checkpoint()

    def lease_lost(self, input: LeaseLostInput) -> None:
        self._append([f"{os.getpid()} {self.shard_id or input.shard_id} LOST -\n"])

    def shard_ended(self, input: ShardEndedInput) -> None:
        self._append([f"{os.getpid()} {self.shard_id} END -\n"])
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self._append([f"{os.getpid()} {self.shard_id or input.shard_id} SHUTDOWN -\n"])
        # a slow flush, to test what a second SIGTERM does while a graceful shutdown is in progress
        time.sleep(float(os.environ.get("SHARDLEASE_TEST_SLOW_SHUTDOWN_S", "0")))
        input.checkpointer.checkpoint()


def read_journal(path: str | Path) -> list[tuple[int, str, str, int, str]]:
    """Record lines only: (pid, shard, sequence, sub-sequence, data)."""
    out = []
    with open(path, encoding="utf-8") as journal:
        for line in journal:
            parts = line.split()
            if len(parts) == 5 and parts[2].isdigit():
                out.append((int(parts[0]), parts[1], parts[2], int(parts[3]), parts[4]))
    return out


def read_lines_with_kinds(path: str | Path) -> list[tuple[str, str]]:
    """Every line in order as (kind, shard): kind is ``REC`` for a record, else the event (INIT, END, LOST, ...)."""
    out = []
    with open(path, encoding="utf-8") as journal:
        for line in journal:
            parts = line.split()
            if len(parts) >= 3:
                out.append(("REC" if parts[2].isdigit() else parts[2], parts[1]))
    return out
