"""The Spark application's load as a worker metric, and where it is written.

Metric ``C`` (the code KCL uses for CPU, so the leader balances a Spark application against ordinary workers on
the same 0–100 scale): the **duty cycle of micro-batches** — the share of wall time during which a micro-batch
was planned and its shard reads had not yet finished. CPU of the driver host says nothing about a Spark job
(the work runs on executors, often other hosts); executor CPU is not visible to a Python source. The duty cycle
is what Spark itself uses to judge a streaming query's health (processing time vs trigger interval): near 100 %
the application has no spare time and more shards would only add latency; near 0 % it idles. docs/spark.md
discusses the limits (work after a shuffle is not counted).

The sink is the WorkerMetricStats table in KCL's format (``wid``, ``lut``, ``sts``, ``opr``), written by
:class:`~worker_lib.workermetrics.stats_store.WorkerMetricsStore` as for any worker, on the same row the driver
heartbeats on (:mod:`worker_lib.spark.driver`).
"""

from __future__ import annotations

import threading

from worker_lib.core.clock import SYSTEM_CLOCK, Clock


class BatchDutyCycle:
    """Metric ``C``: busy seconds reported by the driver ÷ wall seconds between samples, × 100.

    Busy time arrives when a batch is committed (it is only known then); :meth:`sample` spreads it over the time
    since the previous sample, so the reporter's 30 s window average is busy ÷ wall over that window.
    """

    name = "spark-batch-duty-cycle"
    code = "C"
    operating_range_max = 100.0

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = 0.0
        self._last: float | None = None

    def add_busy(self, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._busy += seconds

    def sample(self) -> float | None:
        with self._lock:
            now = self._clock.monotonic()
            last, self._last = self._last, now
            busy, self._busy = self._busy, 0.0
        if last is None or now <= last:
            return None if last is None else 0.0
        return min(100.0, 100.0 * busy / (now - last))
