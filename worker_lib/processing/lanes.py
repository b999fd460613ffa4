"""Key-ordered lanes: more than one batch of a shard in flight (``parallelism`` > 1, or an async processor).

The consumer deals each batch it reads to lanes by key (:func:`lane_of`, :func:`lane_count`); each lane delivers
its records in order, one delivery at a time, under the failure policy; up to ``parallelism`` lanes deliver at
once — on a pool of ``parallelism`` threads (a processor whose ``process_records`` is a plain function) or as tasks
on the worker's one event loop (:class:`LaneLoop`; an async processor), never a thread per lane for those.

A record is *done* once its lane's delivery returned without a failure (or the policy recorded or skipped it).
:class:`Watermark` holds every record read and not yet passed: its position is the last record before which
every record, in every lane, is done — the only value the consumer checkpoints. A failing record holds only its
lane; the watermark stops at it. Records read but not done are bounded by ``max_records_in_flight``: the consumer
reads no more until lanes catch up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker_lib.core.clock import Clock, wait_for
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.config import LaneKeyFunction
from worker_lib.processing.delivery import DeliveryContext, Interrupted
from worker_lib.processing.failures import BatchDelivery, Delivered, FailureStats
from worker_lib.processing.lane_ports import AsyncLanePorts, LaneMark, LanePorts
from worker_lib.processing.watermark import LaneCheckpointer, LeaseProgress, Watermark
from worker_lib.retrieval import RecordBatch

log = logging.getLogger(__name__)


def lane_of(key: str, lanes: int) -> int:
    """The lane of a record keyed ``key``: the same for every process and run (not Python's salted ``hash``)."""
    if lanes == 1:
        return 0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % lanes


def is_async_processor(processor: object) -> bool:
    """Whether ``process_records`` is a coroutine function (it then runs on the worker's event loop)."""
    method = getattr(processor, "process_records", None)
    return inspect.iscoroutinefunction(method)


# --- where lanes run ---------------------------------------------------------------------------------------------


class LaneLoop:
    """One asyncio event loop on a thread of its own, started at its first use: where every async lane of a worker
    runs (and an async processor's other methods, when they are coroutines)."""

    def __init__(self, name: str = "shardlease-lanes") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._started())

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (from any thread but the loop's)."""
        return self.submit(coroutine).result()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5.0)
            if not thread.is_alive():
                loop.close()


def loop_for(processor: object, given: LaneLoop | None, *, name: str) -> tuple[LaneLoop | None, bool]:
    """Where an async processor's lanes run: ``given`` (the worker's loop), else a loop of its own (True: the
    caller closes it); (None, False) for a processor that is not async."""
    if not is_async_processor(processor):
        return None, False
    return (given, False) if given is not None else (LaneLoop(name), True)


# --- the lanes of one shard --------------------------------------------------------------------------------------

LANES_PER_DELIVERY = 64
"""Lanes per delivery running at once: keys hashed to exactly ``parallelism`` lanes leave the busiest lane with
about 1.4 × its share at 32 (a shard as fast as that lane); 64 × finer lanes, served by ``parallelism`` runners
from one queue of ready lanes, keep every runner busy while the keys last (docs/benchmarks.md, "Key-ordered lanes")."""


def lane_count(parallelism: int) -> int:
    """How many lanes (key groups, each delivered in order) a shard has at ``parallelism``."""
    return 1 if parallelism == 1 else parallelism * LANES_PER_DELIVERY


@dataclass
class _Lane:
    index: int
    queue: deque[tuple[int, KinesisRecord]] = field(default_factory=deque)
    batch: RecordBatch | None = None  # the last batch dealt to it: its lag and receive time
    ready: bool = False  # waiting in the ready queue
    running: bool = False
    halted: bool = False  # ended otherwise than done: nothing more is delivered in it


@dataclass(frozen=True)
class LaneResult:
    """How one lane delivery ended: ``delivered`` (None when it raised ``error``), its records and the policy's
    counts; with STOP_SHARD, ``delivery`` says where."""

    lane: int
    records: tuple[KinesisRecord, ...]
    batch: RecordBatch
    delivered: Delivered | None
    stats: FailureStats
    delivery: BatchDelivery | None = None
    error: BaseException | None = None


class Lanes:
    """The lanes of one shard: deals batches to lanes by key, runs at most ``parallelism`` lane deliveries at once
    (each runner takes the lane ready longest), reports how they ended (:meth:`results`)."""

    def __init__(
        self,
        *,
        parallelism: int,
        key_of: LaneKeyFunction,
        context: DeliveryContext,
        written: Callable[[], Checkpoint | None],
        lease: LeaseProgress | None = None,
        loop: LaneLoop | None,
        clock: Clock,
        valid: Callable[[], bool] = lambda: True,
    ) -> None:
        self._valid = valid  # the lease's fence (never waits), checked before every lane delivery starts
        self._key_of = key_of
        self._clock = clock
        self.closing = threading.Event()  # no new delivery starts; lane waits end
        self._lock = threading.Lock()
        self._progress = threading.Event()
        self._results: deque[LaneResult] = deque()
        self._count = lane_count(parallelism)
        self._lanes: dict[int, _Lane] = {}  # lanes with records waiting, delivering or halted
        self._ready: deque[_Lane] = deque()
        self._runners = parallelism
        self._running = 0
        self._written = written
        self._lease = lease  # the lease's checkpointer: its staged outputs and fencing token
        self._mark = LaneMark(context.mark)
        self.watermark = Watermark(clock)
        self._loop = loop
        self._pool = (
            None
            if loop is not None
            else concurrent.futures.ThreadPoolExecutor(
                max_workers=parallelism, thread_name_prefix=f"lane-{context.lifecycle.shard.lease_key}"
            )
        )
        self._context = dataclasses.replace(context, wait=self._wait)

    # --- the consumer's side ---------------------------------------------------------------------------------

    def deal(self, batch: RecordBatch) -> None:
        """Give each record of ``batch`` to its key's lane, in shard order; start runners for lanes now ready."""
        indices = self.watermark.admit(batch.records)
        with self._lock:
            for index, record in zip(indices, batch.records, strict=True):
                number = lane_of(self._key_of(record), self._count)
                lane = self._lanes.get(number)
                if lane is None:
                    lane = self._lanes[number] = _Lane(number)
                lane.queue.append((index, record))
                lane.batch = batch
                self._make_ready(lane)
        self.resume()

    def resume(self) -> None:
        """Start a runner per ready lane, up to ``parallelism`` (those running take ready lanes too, when theirs
        ends): after a deal, and once the lease is known valid again (a runner ends when it is not)."""
        with self._lock:
            starting = 0 if self.closing.is_set() else min(self._runners - self._running, len(self._ready))
            self._running += starting
        for _ in range(starting):
            self._start()

    def results(self) -> list[LaneResult]:
        """How the lane deliveries that ended since the last call ended."""
        with self._lock:
            out = list(self._results)
            self._results.clear()
            self._progress.clear()
            return out

    def wait_for_progress(self, seconds: float) -> None:
        """Wait until a lane delivery ends (or ``seconds`` pass)."""
        wait_for(self._progress, seconds, self._clock)

    def wake(self) -> None:
        self._progress.set()

    def close(self) -> None:
        """Start no new delivery; waits inside deliveries end."""
        self.closing.set()
        self._progress.set()

    def drain(self, seconds: float) -> bool:
        """After :meth:`close`: wait up to ``seconds`` for the deliveries in flight; whether they all ended."""
        end = self._clock.monotonic() + seconds
        while True:
            with self._lock:
                running = self._running
            if not running:
                return True
            left = end - self._clock.monotonic()
            if left <= 0:
                return False
            self._progress.clear()
            wait_for(self._progress, min(left, 0.1), self._clock)

    def shutdown(self) -> None:
        """The consumer ended: what still runs is left to end on its own."""
        self.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the runners' side -----------------------------------------------------------------------------------

    def _make_ready(self, lane: _Lane) -> None:
        if lane.queue and not (lane.ready or lane.running or lane.halted):
            lane.ready = True
            self._ready.append(lane)

    def _start(self) -> None:
        try:
            if self._loop is not None:
                self._loop.submit(self._run_async())
            else:
                assert self._pool is not None
                self._pool.submit(self._run)
        except RuntimeError:  # the pool or the loop was shut down: the consumer has ended
            with self._lock:
                self._running -= 1

    def _take(self) -> tuple[_Lane, tuple[tuple[int, KinesisRecord], ...], RecordBatch] | None:
        """The lane ready longest and its waiting records, or None (and the runner ends) when none is ready or no
        delivery may start (the lanes closed, or the lease no longer valid: the consumer's guard says what next)."""
        valid = self._valid()
        with self._lock:
            if not self._ready or self.closing.is_set() or not valid:
                self._running -= 1
                self._progress.set()
                return None
            lane = self._ready.popleft()
            lane.ready, lane.running = False, True
            items = tuple(lane.queue)
            lane.queue.clear()
            assert lane.batch is not None
            return lane, items, lane.batch

    def _report(self, lane: _Lane, result: LaneResult) -> None:
        with self._lock:
            lane.running = False
            if result.delivered is not Delivered.DONE:
                lane.halted = True  # later records of its keys must not pass the one that failed
            elif lane.queue:
                self._make_ready(lane)
            else:
                del self._lanes[lane.index]  # an idle lane holds no memory
            self._results.append(result)
            self._progress.set()

    def _delivery(
        self, lane: _Lane, items: Sequence[tuple[int, KinesisRecord]], batch: RecordBatch
    ) -> tuple[BatchDelivery, LanePorts]:
        checkpointer = LaneCheckpointer(self.watermark, items, self._written, lease=self._lease)
        ports = LanePorts(self._context, batch=batch, checkpointer=checkpointer, lane=lane.index, mark=self._mark)
        delivery = BatchDelivery(
            config=self._context.failures.config,
            ports=ports,
            lease_key=self._context.lifecycle.shard.lease_key,
            now=self._clock.wall(),
        )
        return delivery, ports

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            lane, items, batch = taken
            records = tuple(record for _, record in items)
            delivery, _ = self._delivery(lane, items, batch)
            try:
                delivered: Delivered | None = delivery.run(records)
                error: BaseException | None = None
            except Interrupted:  # a destination's retries were cut short: the consumer is leaving
                delivered, error = Delivered.INTERRUPTED, None
            except Exception as exc:
                delivered, error = None, exc
            self._report(lane, LaneResult(lane.index, records, batch, delivered, delivery.stats, delivery, error))

    async def _run_async(self) -> None:
        while (taken := self._take()) is not None:
            lane, items, batch = taken
            records = tuple(record for _, record in items)
            delivery, ports = self._delivery(lane, items, batch)
            try:
                delivered: Delivered | None = await delivery.run_async(
                    records, AsyncLanePorts(ports, closing=self.closing, clock=self._clock)
                )
                error: BaseException | None = None
            except Interrupted:
                delivered, error = Delivered.INTERRUPTED, None
            except Exception as exc:
                delivered, error = None, exc
            self._report(lane, LaneResult(lane.index, records, batch, delivered, delivery.stats, delivery, error))

    def _wait(self, seconds: float) -> bool:
        """A lane's wait (policy backoff, destination retry): False once the consumer closes its lanes."""
        return not wait_for(self.closing, seconds, self._clock)
