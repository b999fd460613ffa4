"""The demo's record processor: real work proportional to bytes, and a journal the demo's report is built from.

Each worker process appends one line per record to ``$SHARDLEASE_DEMO_JOURNAL/<pid>.log``
(``<shard> <sequence> <sub-sequence> <record id> <wall time>``) *before* checkpointing, so a checkpointed record
is always journaled: the report can prove nothing was lost and explain every duplicate. Record payloads are not
logged anywhere else.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from worker_lib.core.clock import SYSTEM_CLOCK
from worker_lib.core.env import env_int, env_str, environ
from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)

WORK_ENV = "SHARDLEASE_DEMO_WORK_PER_KB"
JOURNAL_ENV = "SHARDLEASE_DEMO_JOURNAL"


def record_id(data: bytes) -> str:
    """Demo payloads start with ``<id>|``; anything else is identified by its hash."""
    head, sep, _ = data.partition(b"|")
    return head.decode("ascii", "replace") if sep else hashlib.sha1(data).hexdigest()[:12]


class DemoProcessor:
    def __init__(self) -> None:
        env = environ()
        directory = Path(env_str(env, JOURNAL_ENV, "."))
        self.path = directory / f"{os.getpid()}.log"
        self.work_per_kb = env_int(env, WORK_ENV, 200)
        self.shard_id = ""

    def _append(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as journal:
            journal.write(text)

    def _work(self, data: bytes) -> None:
        rounds = max(1, len(data) * self.work_per_kb // 1024)
        digest = data[:64]
        for _ in range(rounds):
            digest = hashlib.sha256(digest).digest()

    def initialize(self, input: InitializationInput) -> None:
        self.shard_id = input.shard_id

    def process_records(self, input: ProcessRecordsInput) -> None:
        lines = []
        for record in input.records:
            self._work(record.data)
            lines.append(
                f"{input.shard_id} {record.sequence_number} {record.sub_sequence_number} "
                f"{record_id(record.data)} {SYSTEM_CLOCK.wall():.3f}\n"
            )
        self._append("".join(lines))
        input.checkpointer.checkpoint()

    def lease_lost(self, input: LeaseLostInput) -> None:
        pass

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        input.checkpointer.checkpoint()
