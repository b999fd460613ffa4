"""Key-ordered lanes: more than one batch of a shard in flight (``parallelism`` > 1, or an async processor).

The consumer deals each batch it reads to lanes by key (:func:`lane_of`); each lane delivers its records in order,
one delivery at a time, under the failure policy; lanes run concurrently — on threads of a pool of ``parallelism``
(a processor whose ``process_records`` is a plain function) or as tasks on the worker's one event loop
(:class:`LaneLoop`; an async processor), never a thread per lane for those.

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
from worker_lib.processing.watermark import LaneCheckpointer, Watermark
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
    return inspect.iscoroutinefunction(method) or bool(getattr(processor, "is_async", False))


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


@dataclass
class _Lane:
    index: int
    queue: deque[tuple[int, KinesisRecord]] = field(default_factory=deque)
    batch: RecordBatch | None = None  # the last batch dealt to it: its lag and receive time
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
    """The lanes of one shard: deals batches, runs lane deliveries, reports how they ended (:meth:`results`)."""

    def __init__(
        self,
        *,
        parallelism: int,
        key_of: LaneKeyFunction,
        context: DeliveryContext,
        written: Callable[[], Checkpoint | None],
        loop: LaneLoop | None,
        clock: Clock,
    ) -> None:
        self._key_of = key_of
        self._clock = clock
        self.closing = threading.Event()  # no new delivery starts; lane waits end
        self._lock = threading.Lock()
        self._progress = threading.Event()
        self._results: deque[LaneResult] = deque()
        self._lanes = [_Lane(i) for i in range(parallelism)]
        self._written = written
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
        """Give each record of ``batch`` to its key's lane, in shard order; start lanes that were idle."""
        indices = self.watermark.admit(batch.records)
        count = len(self._lanes)
        start: list[_Lane] = []
        with self._lock:
            for index, record in zip(indices, batch.records, strict=True):
                lane = self._lanes[lane_of(self._key_of(record), count)]
                lane.queue.append((index, record))
                lane.batch = batch
            for lane in self._lanes:
                if lane.queue and not lane.running and not lane.halted and not self.closing.is_set():
                    lane.running = True
                    start.append(lane)
        for lane in start:
            self._start(lane)

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

    @property
    def busy(self) -> bool:
        """Whether any lane is delivering or has records waiting."""
        with self._lock:
            return any(lane.running or (lane.queue and not lane.halted) for lane in self._lanes)

    def close(self) -> None:
        """Start no new delivery; waits inside deliveries end."""
        self.closing.set()
        self._progress.set()

    def drain(self, seconds: float) -> bool:
        """After :meth:`close`: wait up to ``seconds`` for the deliveries in flight; whether they all ended."""
        end = self._clock.monotonic() + seconds
        while True:
            with self._lock:
                running = any(lane.running for lane in self._lanes)
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

    # --- the lanes' side -------------------------------------------------------------------------------------

    def _start(self, lane: _Lane) -> None:
        try:
            if self._loop is not None:
                self._loop.submit(self._run_async(lane))
            else:
                assert self._pool is not None
                self._pool.submit(self._run(lane))
        except RuntimeError:  # the pool or the loop was shut down: the consumer has ended
            with self._lock:
                lane.running = False

    def _take(self, lane: _Lane) -> tuple[tuple[tuple[int, KinesisRecord], ...], RecordBatch] | None:
        """The lane's waiting records, or None (and the lane stops running) when there are none or it must stop."""
        with self._lock:
            if not lane.queue or lane.halted or self.closing.is_set():
                lane.running = False
                self._progress.set()
                return None
            items = tuple(lane.queue)
            lane.queue.clear()
            assert lane.batch is not None
            return items, lane.batch

    def _report(self, lane: _Lane, result: LaneResult) -> None:
        with self._lock:
            if result.delivered is not Delivered.DONE:
                lane.halted = True  # later records of its keys must not pass the one that failed
            self._results.append(result)
            self._progress.set()

    def _delivery(
        self, lane: _Lane, items: Sequence[tuple[int, KinesisRecord]], batch: RecordBatch
    ) -> tuple[BatchDelivery, LanePorts]:
        checkpointer = LaneCheckpointer(self.watermark, items, self._written)
        ports = LanePorts(self._context, batch=batch, checkpointer=checkpointer, lane=lane.index, mark=self._mark)
        delivery = BatchDelivery(
            config=self._context.failures.config,
            ports=ports,
            lease_key=self._context.lifecycle.shard.lease_key,
            now=self._clock.wall(),
        )
        return delivery, ports

    def _run(self, lane: _Lane) -> Callable[[], None]:
        def run() -> None:
            while (taken := self._take(lane)) is not None:
                items, batch = taken
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

        return run

    async def _run_async(self, lane: _Lane) -> None:
        while (taken := self._take(lane)) is not None:
            items, batch = taken
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
