"""A Spark application's per-worker CloudWatch metrics: the series a worker publishes, from Spark's side.

A worker counts records as its processor returns; a Spark application's records are processed once Spark commits
the micro-batch that read them, so the driver counts them there, from the batch's recorded ends (a replayed batch
is committed once: its records count once). Published under ``{Application, WorkerId}`` with the worker id of the
source, through the publisher a worker uses (``publish_metrics`` / ``SHARDLEASE_METRICS``), so the dashboard's
per-worker graphs show a Spark application next to the workers:

* ``RecordsProcessed`` and ``BytesProcessed``: the committed batches' reads;
* ``MillisBehindLatest``: the largest lag of those reads;
* ``LeasesHeld``: the leases the driver holds, at each flush;
* ``WorkerCpuUtilization``: the load metric's last sample (executor CPU of the reads per slot, docs/spark.md);
* ``LeasesLost``: checkpoints refused because the lease was gone.

Flushed from the driver's calls (planning and commits), at most once per flush interval, and when the source stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.spark.planning import BatchEnd
from worker_lib.telemetry.names import WorkerMetric
from worker_lib.telemetry.publisher import MetricsPublisher


class SparkWorkerMetrics:
    def __init__(
        self,
        publisher: MetricsPublisher,
        *,
        flush_interval_ms: int,
        leases_held: Callable[[], int],
        cpu_percent: Callable[[], float | None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._publisher = publisher
        self._interval_s = flush_interval_ms / 1000
        self._leases_held = leases_held
        self._cpu_percent = cpu_percent
        self._clock = clock
        self._next_flush = clock.monotonic() + self._interval_s

    def committed(self, ends: Iterable[BatchEnd]) -> None:
        """A micro-batch Spark committed: its reads' records, bytes and lag."""
        lags: list[int] = []
        for end in ends:
            self._publisher.add(WorkerMetric.RECORDS_PROCESSED, end.records)
            self._publisher.add(WorkerMetric.BYTES_PROCESSED, end.bytes, unit="Bytes")
            if end.millis_behind_latest is not None:
                lags.append(end.millis_behind_latest)
        if lags:
            self._publisher.add(WorkerMetric.MILLIS_BEHIND_LATEST, max(lags), unit="Milliseconds", aggregation="max")
        self.tick()

    def lease_lost(self) -> None:
        self._publisher.add(WorkerMetric.LEASES_LOST, 1)

    def tick(self) -> None:
        """Flush if the interval has passed."""
        now = self._clock.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + self._interval_s
            self.flush()

    def flush(self) -> None:
        self._publisher.add(WorkerMetric.LEASES_HELD, self._leases_held(), aggregation="last")
        cpu = self._cpu_percent()
        if cpu is not None:
            self._publisher.add(WorkerMetric.CPU_UTILIZATION, cpu, unit="Percent", aggregation="last")
        self._publisher.flush()
