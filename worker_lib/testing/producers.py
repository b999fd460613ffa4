"""A steady producer for tests, benchmarks and the demo: uniquely numbered records put from a thread.

Every record's id is ``<prefix><number>`` (``r0000000``, ``r0000001``, …): its partition key and the start of its
data, so a processor that journals what it got can be checked against :attr:`Producer.produced` — nothing lost,
and each duplicate explained. The Kinesis client is the caller's (a test's emulator client, a benchmark's); the
thread starts with :meth:`Producer.start` or ``with``, never at construction.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.testing.streams import list_all_shards

PUT_RECORDS_LIMIT = 500  # records per PutRecords call (Kinesis's limit)


@dataclass(frozen=True)
class Put:
    """Where one accepted record went: the shard Kinesis put it in, the explicit hash key it was aimed with
    (``None``: routed by its partition key) and the wall time (``Clock.wall``) of the put."""

    shard_id: str
    hash_key: str | None
    wall: float


def shard_hash_keys(kinesis: Any, stream: str) -> list[str]:
    """The starting hash key of every open shard of ``stream``, lowest first: as a :class:`Producer`'s
    ``hash_keys`` (with ``per_tick`` a multiple of their number) every open shard gets the same number of records."""
    shards = list_all_shards(kinesis, stream)
    shards = [s for s in shards if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})]
    starts = [int(s["HashKeyRange"]["StartingHashKey"]) for s in shards]
    return [str(start) for start in sorted(starts)]


class Producer:
    """Puts ``per_tick`` uniquely numbered records every ``tick_s`` from a thread until stopped.

    * ``prefix`` and ``digits``: record ids ``<prefix><number, zero-padded to digits>``, numbered from 0.
    * ``hash_keys``: aim record number ``n`` with an ``ExplicitHashKey``: ``hash_keys[n % len(hash_keys)]`` for a
      sequence (e.g. :func:`shard_hash_keys`, or the keys of the shards that should get records), or
      ``hash_keys(n)`` for a function (a skewed distribution); by default the partition key (the id) spreads them.
    * ``payload_bytes``: pad each record's data to this size as ``<id>|xxx…`` (a reader takes the id before
      ``|``); by default the data is the id alone. ``data``: a function of the id giving the record's bytes instead
      (a JSON event, say).

    A put call that raises (an emulator busy resharding, a throttle) counts one error and is retried with the same
    numbers at the next tick; a record the reply says failed counts one error and its number is skipped. Ticks
    keep a steady schedule; a producer that falls more than a tick behind starts afresh instead of bursting.

    :attr:`produced` lists the ids Kinesis accepted, in order; :meth:`placed` says where each went. Use as a
    context manager (started on entry, stopped on exit), or :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        *,
        per_tick: int = 10,
        tick_s: float = 0.1,
        prefix: str = "r",
        digits: int = 7,
        hash_keys: Sequence[str] | Callable[[int], str] = (),
        payload_bytes: int = 0,
        data: Callable[[str], bytes] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        name: str = "producer",
    ) -> None:
        if per_tick < 1 or tick_s <= 0:
            raise ValueError(f"a producer needs per_tick >= 1 and tick_s > 0, not {per_tick} and {tick_s}")
        self.kinesis, self.stream = kinesis, stream
        self.per_tick, self.tick_s = per_tick, tick_s
        self.prefix, self.digits = prefix, digits
        self.hash_keys = hash_keys if callable(hash_keys) else list(hash_keys)
        self.payload_bytes = payload_bytes
        self.data = data
        self.clock = clock
        self.name = name
        self.produced: list[str] = []
        self.errors = 0
        self._placed: dict[str, Put] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> Producer:
        """Start the thread (once); the first records go out at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop producing and wait (up to ``timeout_s``) for a put in flight; idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what was produced ----------------------------------------------------------------------------------------

    def placed(self) -> dict[str, Put]:
        """Record id -> :class:`Put`, for every record Kinesis accepted so far (a copy)."""
        with self._lock:
            return dict(self._placed)

    def per_shard(self) -> Counter[str]:
        """Accepted records per shard id so far."""
        with self._lock:
            return Counter(put.shard_id for put in self._placed.values())

    # --- the thread -------------------------------------------------------------------------------------------------

    def record_id(self, number: int) -> str:
        return f"{self.prefix}{number:0{self.digits}d}"

    def _hash_key(self, number: int) -> str | None:
        if callable(self.hash_keys):
            return self.hash_keys(number)
        return self.hash_keys[number % len(self.hash_keys)] if self.hash_keys else None

    def _data(self, rid: str) -> bytes:
        if self.data is not None:
            return self.data(rid)
        if self.payload_bytes <= len(rid):
            return rid.encode()
        return (rid + "|").encode() + b"x" * (self.payload_bytes - len(rid) - 1)

    def _run(self) -> None:
        number = 0
        next_at = self.clock.monotonic()
        while not self._stop.is_set():
            if self._put(number):
                number += self.per_tick
            now = self.clock.monotonic()
            next_at += self.tick_s
            if next_at < now - self.tick_s:
                next_at = now  # fell behind (a slow emulator): a steady pace from here, not a burst
            if self._stop.wait(max(0.0, next_at - now)):
                return

    def _put(self, first: int) -> bool:
        """Put records ``first`` … ``first + per_tick - 1``; False if no call went through (retry them)."""
        ids = [self.record_id(first + i) for i in range(self.per_tick)]
        keys = [self._hash_key(first + i) for i in range(self.per_tick)]
        entries: list[dict[str, Any]] = []
        for rid, key in zip(ids, keys, strict=True):
            entry: dict[str, Any] = {"Data": self._data(rid), "PartitionKey": rid}
            if key is not None:
                entry["ExplicitHashKey"] = key
            entries.append(entry)
        wall = self.clock.wall()
        went_through = False
        for start in range(0, len(entries), PUT_RECORDS_LIMIT):
            try:
                batch = entries[start : start + PUT_RECORDS_LIMIT]
                reply = self.kinesis.put_records(StreamName=self.stream, Records=batch)
            except Exception:  # e.g. the stream is UPDATING during a reshard on some emulators
                with self._lock:
                    self.errors += 1
                if not went_through:
                    return False
                continue
            went_through = True
            with self._lock:
                for offset, result in enumerate(reply.get("Records", [])):
                    index = start + offset
                    if result.get("ErrorCode") or "ShardId" not in result:
                        self.errors += 1
                        continue
                    self.produced.append(ids[index])
                    self._placed[ids[index]] = Put(str(result["ShardId"]), keys[index], wall)
        return True
