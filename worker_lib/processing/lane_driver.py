"""The shard consumer's side of its lanes (processing/lanes.py): deal what was read, take in what lanes finished,
checkpoint the watermark, and settle the lanes before the lease moves. The consumer decides the transitions."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import SHARD_END, KinesisRecord
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.config import ConsumerConfig
from worker_lib.processing.delivery import Deliveries
from worker_lib.processing.failures import Delivered
from worker_lib.processing.lanes import LaneLoop, LaneResult, Lanes
from worker_lib.processing.processor import ShutdownError
from worker_lib.retrieval import RecordBatch
from worker_lib.telemetry.names import WorkerMetric

log = logging.getLogger(__name__)

DeliveredSink = Callable[[RecordBatch, Sequence[KinesisRecord]], None]  # records of a batch done: count them


class LaneDriver:
    """One consumer's lanes, as its PROCESSING step and its ending states use them."""

    def __init__(
        self,
        lanes: Lanes,
        *,
        lease_key: str,
        checkpointer: LeaseCheckpointer,
        deliveries: Deliveries,
        config: ConsumerConfig,
        delivered: DeliveredSink,
        clock: Clock,
    ) -> None:
        self.lanes = lanes
        self._lease_key = lease_key
        self._checkpointer = checkpointer
        self._deliveries = deliveries
        self._config = config
        self._delivered = delivered
        self._clock = clock
        self._next_write = 0.0
        self._settled = False
        self.read_to_end = False  # the shard's last batch was dealt

    @classmethod
    def open(
        cls,
        lease_key: str,
        *,
        config: ConsumerConfig,
        checkpointer: LeaseCheckpointer,
        deliveries: Deliveries,
        delivered: DeliveredSink,
        loop: LaneLoop | None,
        valid: Callable[[], bool],
        clock: Clock,
    ) -> LaneDriver:
        """The lanes of ``lease_key`` (``loop``: an async processor's event loop; None: threads; ``valid``: whether
        the lease may be processed now, never waiting)."""
        lanes = Lanes(
            parallelism=config.parallelism,
            key_of=config.key_of,
            context=deliveries.context,
            written=lambda: checkpointer.last_checkpoint,
            lease=checkpointer,
            loop=loop,
            clock=clock,
            valid=valid,
        )
        return cls(
            lanes,
            lease_key=lease_key,
            checkpointer=checkpointer,
            deliveries=deliveries,
            config=config,
            delivered=delivered,
            clock=clock,
        )

    @property
    def in_flight(self) -> int:
        return self.lanes.watermark.in_flight

    @property
    def full(self) -> bool:
        """Backpressure: the reader waits while this many records are not done."""
        return self.in_flight >= self._config.max_records_in_flight

    @property
    def lag_ms(self) -> int:
        return int(self.lanes.watermark.lag_s() * 1000)

    def deal(self, batch: RecordBatch) -> None:
        if batch.records:
            self.lanes.deal(batch)
        if batch.end_of_shard:
            self.read_to_end = True
        metrics = self._deliveries.context.failures.metrics
        metrics.add(WorkerMetric.RECORDS_IN_FLIGHT, self.in_flight, aggregation="max")
        metrics.add(WorkerMetric.WATERMARK_LAG, self.lag_ms, unit="Milliseconds", aggregation="max")

    def wait(self, seconds: float = 0.5) -> None:
        """Wait for a lane to finish, up to ``seconds`` or the next watermark write due, whichever comes first."""
        position = self.lanes.watermark.position
        written = self._checkpointer.last_checkpoint
        due_in = self._next_write - self._clock.monotonic() if position not in (None, written) else 0.5
        self.lanes.wait_for_progress(max(0.01, min(0.5, seconds, due_in)))

    def finished(self) -> LaneResult | None:
        """Count what lanes finished; the first delivery that ended otherwise than done (None: read on)."""
        self.lanes.resume()  # (the consumer's guard just passed: lanes left ready while the lease was not valid)
        ended: LaneResult | None = None
        for result in self.lanes.results():
            self._deliveries.count(result.stats)
            if result.delivered is Delivered.DONE:
                self._delivered(result.batch, result.records)
            elif ended is None and result.delivered is not Delivered.INTERRUPTED:
                ended = result  # (interrupted: only once the lanes were closed, the consumer is leaving already)
        return ended

    def write_watermark(self, *, due_only: bool) -> bool:
        """Checkpoint the watermark if it moved (and, with ``due_only``, the interval has passed); False if the
        lease turned out lost."""
        checkpointer = self._checkpointer
        position = self.lanes.watermark.position
        if position is None or checkpointer.largest_permitted == SHARD_END:
            return True
        checkpointer.largest_permitted = position  # also what the processor's own checkpoint() records
        now = self._clock.monotonic()
        if position == checkpointer.last_checkpoint or (due_only and now < self._next_write):
            return True
        self._next_write = now + self._config.lane_checkpoint_interval_ms / 1000
        try:
            checkpointer.checkpoint()
        except ShutdownError:
            return False
        except DependencyError as exc:
            log.warning("checkpointing the watermark of %s failed: %s", self._lease_key, exc)
        return True

    def settle(self, *, write: bool) -> None:
        """Before the lease moves: start no new delivery, let those in flight end (within the drain timeout), take
        in what they did and (``write``) checkpoint the watermark. Once."""
        if self._settled:
            return
        self._settled = True
        self.lanes.close()
        drain_ms = self._config.lane_drain_timeout_ms
        if not self.lanes.drain(drain_ms / 1000):
            log.warning(
                "lanes of %s still delivering after %d ms: the lease moves from the watermark",
                self._lease_key,
                drain_ms,
            )
        self.finished()
        if write:
            self.write_watermark(due_only=False)
