"""The demo's producer: skewed traffic into the stream, recorded so the report can prove nothing was lost."""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

from worker_lib.tools.demo.fleet import DemoState

log = logging.getLogger(__name__)

HASH_SPACE = 2**128


class Producer:
    """Skewed traffic: 40 % into one hot hash range (the first shard's), 60 % spread over the whole key space."""

    def __init__(self, kinesis: Any, stream: str, state: DemoState, *, rate: int, size: int, seed: int = 7) -> None:
        self.kinesis, self.stream, self.state = kinesis, stream, state
        self.rate, self.size = rate, size
        self.rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _hash_key(self) -> int:
        low, high = self.state.hot_range
        if self.rng.random() < 0.4:
            return self.rng.randrange(low, high + 1)
        return self.rng.randrange(0, HASH_SPACE)

    def _run(self) -> None:
        tick = 0.1
        per_tick = max(1, int(self.rate * tick))
        n = 0
        while not self._stop.wait(tick):
            batch, ids = [], []
            for _ in range(per_tick):
                rid = f"r{n:07d}"
                n += 1
                payload = (rid + "|").encode() + b"x" * max(0, self.size - len(rid) - 1)
                batch.append({"Data": payload, "PartitionKey": rid, "ExplicitHashKey": str(self._hash_key())})
                ids.append(rid)
            try:
                response = self.kinesis.put_records(StreamName=self.stream, Records=batch)
            except Exception as exc:  # the emulator is busy resharding: retry the batch next tick
                self.errors += 1
                log.debug("producer put_records failed: %s", exc)
                n -= per_tick
                continue
            with self.state.lock:
                for rid, result in zip(ids, response["Records"], strict=True):
                    if "ShardId" in result:
                        self.state.produced[rid] = result["ShardId"]
                        self.state.produced_per_shard[result["ShardId"]] += 1
