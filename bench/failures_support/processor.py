"""bench/failures.py's processor: fails on the poison records it is told about, journals every delivery.

``BENCH_OUT``: a JSON-lines file, one line per delivery: ``{"shard", "first", "last", "records", "at", "failed"}``
(``failed``: the poison record's id when the delivery failed, else null). ``BENCH_POISON``: comma-separated record
ids that are poison. Like a processor that writes a batch in one transaction, a batch holding a poison record fails
before anything of it is written; the work per record is a SHA-256 of its data (so that deliveries cost something).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping

from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)


class Poisoned:
    def __init__(self) -> None:
        self.out = os.environ["BENCH_OUT"]
        self.poison = frozenset(filter(None, os.environ.get("BENCH_POISON", "").split(",")))

    def _write(self, line: Mapping[str, object]) -> None:
        with open(self.out, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def initialize(self, input: InitializationInput) -> None:
        self.shard = input.shard_id

    def process_records(self, input: ProcessRecordsInput) -> None:
        records = input.records
        line = {
            "shard": input.shard_id,
            "first": records[0].sequence_number if records else None,
            "last": records[-1].sequence_number if records else None,
            "records": len(records),
            "at": time.monotonic(),
            "failed": None,
        }
        for record in records:
            identifier = record.data.split(b"|", 1)[0].decode()
            if identifier in self.poison:
                self._write({**line, "failed": identifier})
                raise ValueError("cannot parse this record")
        for record in records:
            hashlib.sha256(record.data).digest()  # the work
        self._write(line)
        if records:
            input.checkpointer.checkpoint()

    def lease_lost(self, input: LeaseLostInput) -> None:
        pass

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        input.checkpointer.checkpoint()
