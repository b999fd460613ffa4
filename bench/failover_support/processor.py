"""The record processor of the failover benchmark (runs inside ``shardlease worker`` processes).

``--processor bench.failover_support.processor:JournalProcessor`` with ``FAILOVER_JOURNAL_DIR`` (a directory)
and ``FAILOVER_WORKER_ID`` set. Each process appends to its own file ``<dir>/<worker id>-<pid>.jnl``, one line
per record, written and flushed *before* the checkpoint (so a checkpointed record is always in a journal)::

    <wall time> <pid> <worker id> <shard id> <sequence number> <record id>

and one line per lifecycle call, with the event in place of the sequence number and ``-`` as record id::

    <wall time> <pid> <worker id> <shard id> INIT|LOST|END|SHUTDOWN -

Wall times are ``time.time()``: every process runs on the benchmark's machine, so they compare with the times at
which the benchmark sent its signals.

While a file ``<dir>/hang-<pid>`` exists, that process's ``shutdown_requested`` hangs after journaling its
``SHUTDOWN`` line (the ``hang`` scenario: a flush that never returns, so the worker says DEPARTING and then only its
shutdown timeout ends its hold on the leases).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO

from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)

JOURNAL_DIR_ENV = "FAILOVER_JOURNAL_DIR"
WORKER_ID_ENV = "FAILOVER_WORKER_ID"
HANG_MARKER_PREFIX = "hang-"  # + pid: that process's shutdown_requested hangs while the file exists
SPEC = "bench.failover_support.processor:JournalProcessor"


class _Journal:
    """One append-only file per process, shared by the consumer threads (one write + flush per batch)."""

    _lock = threading.Lock()
    _file: IO[str] | None = None

    @classmethod
    def write(cls, lines: list[str]) -> None:
        with cls._lock:
            if cls._file is None:
                directory = os.environ[JOURNAL_DIR_ENV]
                worker = os.environ.get(WORKER_ID_ENV, "worker")
                cls._file = open(  # noqa: SIM115 - lives as long as the process
                    os.path.join(directory, f"{worker}-{os.getpid()}.jnl"), "a", encoding="utf-8"
                )
            cls._file.write("".join(lines))
            cls._file.flush()


def _worker_id() -> str:
    return os.environ.get(WORKER_ID_ENV, "worker")


def _event(shard_id: str, kind: str) -> None:
    _Journal.write([f"{time.time():.6f} {os.getpid()} {_worker_id()} {shard_id} {kind} -\n"])


class JournalProcessor:
    """Journals every record, then checkpoints the batch; checkpoints at shard end and on shutdown requests."""

    def initialize(self, input: InitializationInput) -> None:
        _event(input.shard_id, "INIT")

    def process_records(self, input: ProcessRecordsInput) -> None:
        if not input.records:
            return
        now = f"{time.time():.6f}"
        head = f"{now} {os.getpid()} {_worker_id()} {input.shard_id}"
        _Journal.write([f"{head} {r.sequence_number} {r.data.decode()}\n" for r in input.records])
        input.checkpointer.checkpoint()  # ShutdownError (lease lost) propagates: the consumer handles it

    def lease_lost(self, input: LeaseLostInput) -> None:
        _event(input.shard_id, "LOST")

    def shard_ended(self, input: ShardEndedInput) -> None:
        _event(input.shard_id, "END")
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        _event(input.shard_id, "SHUTDOWN")
        marker = os.path.join(os.environ[JOURNAL_DIR_ENV], f"{HANG_MARKER_PREFIX}{os.getpid()}")
        while os.path.exists(marker):  # the `hang` scenario: a flush that never returns
            time.sleep(0.5)
        input.checkpointer.checkpoint()  # nothing delivered yet: a no-op
