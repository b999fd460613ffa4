"""A steady producer for tests and benchmarks: the same number of records into every shard."""

from __future__ import annotations

import threading
from typing import Any


class EvenProducer:
    """Puts ``per_shard_per_tick`` records into every shard (explicit hash keys) each ``tick_s``, from a thread,
    as ``r0000000``, ``r0000001``, … (``payload_bytes`` pads each record)."""

    def __init__(
        self, kinesis: Any, stream: str, *, per_shard_per_tick: int = 10, tick_s: float = 0.2, payload_bytes: int = 0
    ) -> None:
        self.kinesis, self.stream = kinesis, stream
        shards = kinesis.list_shards(StreamName=stream)["Shards"]
        self.hash_keys = [shard["HashKeyRange"]["StartingHashKey"] for shard in shards]
        self.per_shard_per_tick, self.tick_s = per_shard_per_tick, tick_s
        self.padding = b" " * max(0, payload_bytes - 8)
        self.produced: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="even-producer", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            entries: list[dict[str, Any]] = []
            names: list[str] = []
            for key in self.hash_keys:
                for _ in range(self.per_shard_per_tick):
                    name = f"r{len(self.produced) + len(names):07d}"
                    names.append(name)
                    entries.append({"Data": name.encode() + self.padding, "PartitionKey": name, "ExplicitHashKey": key})
            for i in range(0, len(entries), 500):
                self.kinesis.put_records(StreamName=self.stream, Records=entries[i : i + 500])
            self.produced.extend(names)
            self._stop.wait(self.tick_s)

    def __enter__(self) -> EvenProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
