"""The in-process side of bench/multilang.py: a record processor that does nothing but checkpoint each batch.

It notes the wall time of the first record it sees in ``BENCH_FIRST_RECORD_FILE`` (once per process).
"""

from __future__ import annotations

import os
import time

from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)

_noted: list[bool] = []  # one entry once this process noted its first record


def note_first_record() -> None:
    path = os.environ.get("BENCH_FIRST_RECORD_FILE")
    if not _noted and path:
        _noted.append(True)
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{time.time()}\n")


class CheckpointEveryBatch:
    def initialize(self, input: InitializationInput) -> None:
        pass

    def process_records(self, input: ProcessRecordsInput) -> None:
        if input.records:
            note_first_record()
            input.checkpointer.checkpoint_record(input.records[-1])

    def lease_lost(self, input: LeaseLostInput) -> None:
        pass

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        input.checkpointer.checkpoint()
