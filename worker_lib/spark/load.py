"""The Spark application's load as a worker metric, and where it is written.

Metric ``C`` (the code KCL uses for CPU, so the leader balances a Spark application against ordinary workers on
the same 0–100 scale): the **executor CPU of the source's shard reads per executor slot** — CPU seconds the
executors' Python processes spent reading (GetRecords, parsing, de-aggregation), summed over the reads of the
batches committed since the last sample, ÷ wall seconds ÷ the application's executor slots × 100. It is what a
worker's CPU metric measures (CPU used ÷ CPU available), counted where a Spark application's reading work is done,
so it grows with the records and shards the application holds, and a smaller application (fewer slots) reaches a
given figure with less work. docs/spark.md argues the choice against the micro-batch duty cycle (which it
replaces: at low traffic the duty cycle is mostly fixed per-batch time, the same for 1 shard and for 7).

Slots: the ``executor_slots`` option, else the most reads of one micro-batch seen running at the same time over the
last batches (a lower bound: an application holding fewer shards than it has slots looks as busy as its shards
are, and balancing then gives it more).

The sink is the WorkerMetricStats table in KCL's format (``wid``, ``lut``, ``sts``, ``opr``), written by
:class:`~worker_lib.workermetrics.stats_store.WorkerMetricsStore` as for any worker, on the same row the driver
heartbeats on (:mod:`worker_lib.spark.driver`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.spark.planning import BatchEnd, peak_concurrency

SLOT_WINDOW_BATCHES = 50


class ExecutorCpu:
    """Metric ``C``: executor CPU seconds of committed reads ÷ wall seconds between samples ÷ slots, × 100."""

    name = "spark-executor-cpu"
    code = "C"
    operating_range_max = 100.0

    def __init__(
        self,
        *,
        slots: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        own_cpu_seconds: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock
        self._fixed_slots = slots
        self._own_cpu_seconds = own_cpu_seconds
        self._own_cpu_last = own_cpu_seconds() if own_cpu_seconds is not None else 0.0
        self._lock = threading.Lock()
        self._cpu = 0.0
        self._peaks: deque[int] = deque(maxlen=SLOT_WINDOW_BATCHES)
        self._last: float | None = None
        self.last_sample: float | None = None  # what the last sample() returned (the CloudWatch CPU gauge)

    @property
    def slots(self) -> int:
        if self._fixed_slots is not None:
            return self._fixed_slots
        with self._lock:
            return max(self._peaks, default=1) or 1

    def add_batch(self, ends: Sequence[BatchEnd]) -> None:
        """A committed micro-batch's reads (each counted once: a replay's ends are the first reads')."""
        with self._lock:
            self._cpu += sum(max(0.0, end.cpu_seconds) for end in ends)
            if ends:
                self._peaks.append(peak_concurrency(ends))

    def sample(self) -> float | None:
        slots = self.slots
        with self._lock:
            now = self._clock.monotonic()
            last, self._last = self._last, now
            cpu, self._cpu = self._cpu, 0.0
            if self._own_cpu_seconds is not None:
                own = self._own_cpu_seconds()
                cpu += max(0.0, own - self._own_cpu_last)
                self._own_cpu_last = own
        if last is None or now <= last:
            return None if last is None else 0.0
        self.last_sample = min(100.0, 100.0 * cpu / (now - last) / slots)
        return self.last_sample
