"""Helpers of bench/lanes.py: filling a stream (plain records or KPL aggregates) and timing the handlers."""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worker_lib.processing.lanes import lane_count, lane_of
from worker_lib.processing.processor import KinesisRecord

KEYS = 1_000  # distinct partition keys in every stream
PAYLOAD = b"x" * 100
KPL_USER_RECORDS = 100  # user records per aggregate


def key(n: int) -> str:
    """The partition key of the ``n``-th record (user record) written: the keys in turn."""
    return f"pk-{n % KEYS}"


def lane_ceiling(records: int, parallelism: int, per_record_s: float) -> float:
    """Records/s if ``parallelism`` runners stay busy until the heaviest lane's records are done: records over the
    longer of (heaviest lane's records × per-record time) and (records × per-record time / parallelism). The keys
    are dealt to lanes by hash, so lanes are not equally loaded."""
    loads = Counter(lane_of(key(n), lane_count(parallelism)) for n in range(records))
    return records / max(max(loads.values()) * per_record_s, records * per_record_s / parallelism)


def fill_plain(kinesis: Any, stream: str, records: int) -> str:
    """``records`` records, the keys in turn; the last one's sequence number."""
    last = ""
    for start in range(0, records, 500):
        entries = [{"Data": PAYLOAD, "PartitionKey": key(n)} for n in range(start, min(records, start + 500))]
        reply = kinesis.put_records(StreamName=stream, Records=entries)
        assert reply.get("FailedRecordCount", 0) == 0
        last = reply["Records"][-1]["SequenceNumber"]
    return last


@functools.cache
def _kpl_encoder() -> Any:
    """``aws_kinesis_agg.aggregator`` (the KPL's reference encoder, a dev dependency), imported without keeping the
    entries the package puts at the front of ``sys.path``."""
    saved = list(sys.path)
    try:
        return importlib.import_module("aws_kinesis_agg.aggregator")
    finally:
        sys.path[:] = saved


def fill_kpl(kinesis: Any, stream: str, user_records: int) -> str:
    """``user_records`` user records as KPL aggregates of :data:`KPL_USER_RECORDS` each, every user record with its
    own partition key (the keys in turn); the last aggregate's sequence number."""
    entries = []
    for start in range(0, user_records, KPL_USER_RECORDS):
        aggregator = _kpl_encoder().RecordAggregator()
        for n in range(start, min(user_records, start + KPL_USER_RECORDS)):
            assert aggregator.add_user_record(key(n), PAYLOAD) is None  # never full: 100 × 100 B
        partition_key, explicit_hash_key, payload = aggregator.clear_and_get().get_contents()
        entry = {"Data": payload, "PartitionKey": partition_key}
        if explicit_hash_key:
            entry["ExplicitHashKey"] = explicit_hash_key
        entries.append(entry)
    last = ""
    for start in range(0, len(entries), 100):
        reply = kinesis.put_records(StreamName=stream, Records=entries[start : start + 100])
        assert reply.get("FailedRecordCount", 0) == 0
        last = reply["Records"][-1]["SequenceNumber"]
    return last


@dataclass
class Tally:
    """What the handlers did: when the first delivery started, when each delivery ended and with how many records,
    how many ran at once, and whether any key's records came out of order."""

    expected: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: threading.Event = field(default_factory=threading.Event)
    first_start: float | None = None
    ends: list[tuple[float, int]] = field(default_factory=list)
    done: int = 0
    running: int = 0
    most_running: int = 0
    last_of_key: dict[str, tuple[int, int]] = field(default_factory=dict)
    out_of_order: int = 0

    def started(self, records: Sequence[KinesisRecord]) -> None:
        now = time.monotonic()
        with self.lock:
            if self.first_start is None:
                self.first_start = now
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            for record in records:
                position = (int(record.sequence_number), record.sub_sequence_number)
                previous = self.last_of_key.get(record.partition_key)
                if previous is not None and previous >= position:
                    self.out_of_order += 1
                self.last_of_key[record.partition_key] = position

    def ended(self, records: Sequence[KinesisRecord]) -> None:
        now = time.monotonic()
        with self.lock:
            self.running -= 1
            self.done += len(records)
            self.ends.append((now, len(records)))
            if self.done >= self.expected:
                self.finished.set()

    def rate(self) -> float:
        """Records/s from the first delivery's start to the end of the delivery that completed ``expected``."""
        with self.lock:
            assert self.first_start is not None and self.done >= self.expected
            count = 0
            for at, records in sorted(self.ends):
                count += records
                if count >= self.expected:
                    return self.expected / (at - self.first_start)
        raise AssertionError("unreachable: done >= expected")

    @property
    def deliveries(self) -> int:
        with self.lock:
            return len(self.ends)
