"""One lane delivery's I/O (processing/lanes.py): the lease's ports, but a success marks its records done, the shard's
failure mark is shared by the lanes (:class:`LaneMark`), and an async processor's calls are awaited
(:class:`AsyncLanePorts`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from worker_lib.core.clock import Clock
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.delivery import DeliveryContext, DeliveryPorts, ShardMark
from worker_lib.processing.failures import Failure
from worker_lib.processing.processor import (
    ProcessorFailedError,
    ShutdownError,
)
from worker_lib.processing.watermark import LaneCheckpointer
from worker_lib.retrieval import RecordBatch

# --- one lane's ports --------------------------------------------------------------------------------------------


class LaneMark:
    """The shard's failure mark shared by its lanes: it names the earliest record a lane is held at, and goes once
    no lane is held (a mark a previous owner left included)."""

    def __init__(self, mark: ShardMark) -> None:
        self._mark = mark
        self._lock = threading.Lock()
        self._held: dict[int, tuple[Sequence[KinesisRecord], int, Failure]] = {}  # lane -> what it is held at
        self._named: int | None = None  # the lane whose record the mark names

    def blocked(self, lane: int, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        with self._lock:
            if failure is None or not records:
                self._held.pop(lane, None)
                if not self._held:
                    self._named = None
                    self._mark.blocked((), attempts=0, failure=None)  # no write when there is no mark
                elif self._named == lane:
                    self._name(min(self._held, key=lambda held: _order(self._held[held][0][0].checkpoint)))
                return
            self._held[lane] = (records, attempts, failure)
            named = self._held.get(self._named) if self._named is not None else None
            if named is None or _order(records[0].checkpoint) <= _order(named[0][0].checkpoint):
                self._name(lane)

    def _name(self, lane: int) -> None:
        records, attempts, failure = self._held[lane]
        self._named = lane
        self._mark.blocked(records, attempts=attempts, failure=failure)


def _order(checkpoint: Checkpoint) -> tuple[int, int]:
    return (int(checkpoint.sequence), checkpoint.sub_sequence) if checkpoint.sequence.isdigit() else (-1, 0)


class LanePorts(DeliveryPorts):
    """One lane delivery's I/O: as the lease's, but a success marks its records done and the mark is shared."""

    def __init__(
        self,
        context: DeliveryContext,
        *,
        batch: RecordBatch,
        checkpointer: LaneCheckpointer,
        lane: int,
        mark: LaneMark,
    ) -> None:
        super().__init__(context, batch=batch, checkpointer=checkpointer)
        self.lane_checkpointer = checkpointer
        self._lane = lane
        self._lane_mark = mark

    def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        failure = super().process(records, at_shard_end=at_shard_end)
        if failure is None and records:
            self.lane_checkpointer.done_through(records[-1])
        return failure

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        self._lane_mark.blocked(self._lane, records, attempts=attempts, failure=failure)


class AsyncLanePorts:
    """:class:`LanePorts` for an async processor: ``process_records`` awaited on the event loop; what blocks on I/O
    (the failure destination, the shard's mark) runs in the loop's executor."""

    def __init__(self, ports: LanePorts, *, closing: threading.Event, clock: Clock) -> None:
        self._ports = ports
        self._closing = closing
        self._clock = clock

    async def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        ports = self._ports
        given = ports.input_for(records, at_shard_end=at_shard_end)
        try:
            result = await ports.processor.process_records(given)  # type: ignore[misc]
        except (ShutdownError, ProcessorFailedError):
            raise
        except Exception as exc:
            failure = ports.judge(records, error=exc)
        else:
            failure = ports.judge(records, result=result)
        if failure is None and records:
            ports.lane_checkpointer.done_through(records[-1])
        return failure

    async def checkpoint(self, record: KinesisRecord) -> None:
        self._ports.checkpoint(record)  # in memory: marks records done

    async def record(
        self, records: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None
    ) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._ports.record(records, condition=condition, attempts=attempts, error=error)
        )

    async def wait(self, seconds: float) -> bool:
        end = self._clock.monotonic() + seconds
        while not self._closing.is_set() and (left := end - self._clock.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.05))
        return not self._closing.is_set()

    async def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._ports.blocked(records, attempts=attempts, failure=failure)
        )
