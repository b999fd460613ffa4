"""bench/fanout.py's processor: checkpoints every batch and writes, per batch, how long it waited in the worker.

``BENCH_OUT``: a JSON-lines file, one line per batch: ``{"records": n, "added_ms": …}`` where ``added_ms`` is
``cache_exit_time - cache_entry_time`` (with fan-out: from the event's arrival to this call), and ``tids``: the
native ids of the threads that read and deliver records (for the CPU measure). ``BENCH_SLOW_S``:
seconds to spend on each batch (a slow processor, for the backpressure measure).
"""

from __future__ import annotations

import json
import os
import threading
import time

from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)


def _reading_threads() -> list[int]:
    """The native ids of the threads that read and deliver records: this one (the shard's consumer) and, with
    fan-out, the subscription reader threads (named ``fanout-<shard>``)."""
    readers = [t.native_id for t in threading.enumerate() if t.name.startswith("fanout-") and t.native_id]
    return [threading.get_native_id(), *readers]


class Measuring:
    def __init__(self) -> None:
        self.out = os.environ["BENCH_OUT"]
        self.slow_s = float(os.environ.get("BENCH_SLOW_S", "0"))

    def initialize(self, input: InitializationInput) -> None:
        pass

    def process_records(self, input: ProcessRecordsInput) -> None:
        added_ms = 0.0
        if input.cache_entry_time is not None and input.cache_exit_time is not None:
            added_ms = (input.cache_exit_time - input.cache_entry_time).total_seconds() * 1000
        with open(self.out, "a", encoding="utf-8") as out:
            line = {"records": len(input.records), "added_ms": added_ms, "at": time.time(), "tids": _reading_threads()}
            out.write(json.dumps(line) + "\n")
        if self.slow_s:
            time.sleep(self.slow_s)  # the slow processor being measured
        if input.records:
            input.checkpointer.checkpoint_record(input.records[-1])

    def lease_lost(self, input: LeaseLostInput) -> None:
        pass

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        input.checkpointer.checkpoint()
