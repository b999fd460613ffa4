"""The worker-metrics reporter: samples metrics in memory and writes this worker's item in
``<app>-WorkerMetricStats`` (docs/kcl-compatibility.md, "Worker-metrics table").

* Every ``sample_interval_ms`` (1 s) each metric is sampled; ``None`` (the source failed) adds no sample.
* Every ``report_interval_ms`` (30 s; the first after ``first_report_delay_ms`` = 2 s) the average of the samples
  taken since the previous report is appended to ``sts[code]`` — or −1 when the window had none, which tells
  the leader not to give this worker more leases — keeping the newest ``max_values`` (10), and the whole item
  (``wid``, ``lut`` = wall epoch seconds, ``sts``, ``opr[code] = [operating_range_max]``) is handed to the sink.
* With no metrics at all the item is still written (empty ``sts``/``opr``): the leader then treats the worker as
  a "default-metric" worker and balances it by throughput.
* A sink failure is logged in one line and the item is written again, with the newer values, at the next
  report; it never stops the reporter.

Drive it with :meth:`WorkerMetricsReporter.tick` (tests, simulations, a host's own loop), or call
:meth:`~WorkerMetricsReporter.start` for a daemon thread that ticks it; nothing runs before ``start()``.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.models import MAX_REPORTED_LAGS, LaneStats, WorkerMetricStats
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.cpu import WorkerMetric

log = logging.getLogger(__name__)

_V = TypeVar("_V")


def _worst(read: Callable[[], Mapping[str, _V]] | None, order: Callable[[tuple[str, _V]], Any]) -> dict[str, _V]:
    """The :data:`MAX_REPORTED_LAGS` first entries ``read`` gives by ``order``; none when it cannot be read (what
    cannot be read is simply not reported)."""
    if read is None:
        return {}
    try:
        entries = dict(read())
    except Exception:
        return {}
    return dict(sorted(entries.items(), key=order)[:MAX_REPORTED_LAGS])


NO_SAMPLES = -1.0
"""``sts`` value of a window in which a metric produced no sample (KCL)."""


@runtime_checkable
class WorkerMetricsSink(Protocol):
    """Where reports go: the WorkerMetricStats table store (or anything else that takes the item)."""

    def put(self, stats: WorkerMetricStats) -> None: ...


class WorkerMetricsReporter:
    """Samples ``metrics`` and reports their window averages for ``worker_id`` to ``sink``."""

    def __init__(
        self,
        worker_id: str,
        metrics: Sequence[WorkerMetric],
        sink: WorkerMetricsSink,
        *,
        config: WorkerMetricsConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        capacity: Callable[[], float | None] | None = None,
        lags: Callable[[], Mapping[str, int]] | None = None,
        lanes: Callable[[], Mapping[str, LaneStats]] | None = None,
    ) -> None:
        """``capacity``: read at each report, the CPUs the worker can spend on its leases (written as ``cap``;
        ``None`` or a failing callable writes nothing). ``lags``: read at each report, MillisBehindLatest per lease
        (written as ``lag``, the :data:`MAX_REPORTED_LAGS` worst). ``lanes``: read at each report, records in flight
        and the watermark's lag per lease processed in lanes (written as ``lanes``, the :data:`MAX_REPORTED_LAGS`
        worst watermark lags). A failing callable writes nothing."""
        if not worker_id:
            raise ValueError("worker_id must not be empty")
        codes = [m.code for m in metrics]
        if len(set(codes)) != len(codes):
            raise ValueError(f"metric codes must be unique, got {codes}")
        self.worker_id = worker_id
        self._metrics = tuple(metrics)
        self._capacity = capacity
        self._lags = lags
        self._lanes = lanes
        self._sink = sink
        self._config = config or WorkerMetricsConfig()
        self._clock = clock
        self._sample_s = self._config.sample_interval_ms / 1000
        self._report_s = self._config.report_interval_ms / 1000
        self._first_report_s = self._config.first_report_delay_ms / 1000
        self._lock = threading.Lock()
        self._window: dict[str, list[float]] = {m.code: [] for m in self._metrics}
        self._stats: dict[str, collections.deque[float]] = {
            m.code: collections.deque(maxlen=self._config.max_values) for m in self._metrics
        }
        self._next_sample: float | None = None
        self._next_report: float | None = None
        self._sink_failing = False
        self._sample_failing: set[str] = set()
        self.reports_written = 0
        self.report_failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- driving -------------------------------------------------------------------------------------------

    def tick(self) -> float:
        """Take a sample and/or write a report if one is due; return the seconds until the next is due.

        The schedule starts at the first call (or :meth:`start`): a sample at once, the first report
        ``first_report_delay_ms`` later, then one every ``report_interval_ms``. A tick that comes late takes one
        sample (not one per missed interval) and re-bases the schedule on the current time.
        """
        with self._lock:
            now = self._clock.monotonic()
            if self._next_sample is None or self._next_report is None:
                self._next_sample = now
                self._next_report = now + self._first_report_s
            if now >= self._next_sample:
                self._take_samples()
                self._next_sample += self._sample_s
                if self._next_sample <= now:
                    self._next_sample = now + self._sample_s
            if now >= self._next_report:
                self._report()
                self._next_report += self._report_s
                if self._next_report <= now:
                    self._next_report = now + self._report_s
            return max(0.0, min(self._next_sample, self._next_report) - now)

    def _take_samples(self) -> None:
        for metric in self._metrics:
            try:
                value = metric.sample()
            except Exception as exc:  # a custom metric must not stop the reporter
                if metric.code not in self._sample_failing:
                    self._sample_failing.add(metric.code)
                    log.warning("worker metric %s raised, no sample recorded: %s", metric.code, exc)
                continue
            self._sample_failing.discard(metric.code)
            if value is None or not math.isfinite(value):
                continue
            self._window[metric.code].append(float(value))

    def _report(self) -> None:
        for code, samples in self._window.items():
            # Two decimals are plenty for a utilisation and keep the item small: the leader scans every worker's
            # item once a second (docs/failover.md), and read units grow with bytes.
            self._stats[code].append(round(sum(samples) / len(samples), 2) if samples else NO_SAMPLES)
            samples.clear()
        item = self._item()
        try:
            self._sink.put(item)
        except Exception as exc:  # retried, with newer values, at the next report
            self.report_failures += 1
            if not self._sink_failing:
                log.warning(
                    "worker metrics write failed for %s (retrying at the next report): %s",
                    self.worker_id,
                    str(exc).replace("\n", " ") or type(exc).__name__,
                )
            self._sink_failing = True
            return
        if self._sink_failing:
            log.info("worker metrics write for %s succeeded again", self.worker_id)
        self._sink_failing = False
        self.reports_written += 1

    def _item(self) -> WorkerMetricStats:
        return WorkerMetricStats(
            worker_id=self.worker_id,
            last_update_epoch_s=int(self._clock.wall()),
            stats={code: tuple(values) for code, values in self._stats.items()},
            operating_range={m.code: (float(m.operating_range_max),) for m in self._metrics},
            capacity=self._current_capacity(),
            lag_ms=self._current_lags(),
            lanes=self._current_lanes(),
        )

    def _current_lags(self) -> dict[str, int]:
        worst = _worst(self._lags, lambda kv: (-kv[1], kv[0]))
        return {key: int(ms) for key, ms in worst.items()}

    def _current_lanes(self) -> dict[str, LaneStats]:
        return _worst(self._lanes, lambda kv: (-kv[1].watermark_lag_ms, -kv[1].in_flight, kv[0]))

    def _current_capacity(self) -> float | None:
        if self._capacity is None:
            return None
        try:
            value = self._capacity()
        except Exception:  # a capacity that cannot be read is simply not reported
            return None
        return float(value) if value is not None and math.isfinite(value) and value > 0 else None

    def snapshot(self) -> WorkerMetricStats:
        """The item as the last report built it (current ``lut``), without writing anything."""
        with self._lock:
            return self._item()

    # --- thread --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Run :meth:`tick` on a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("worker metrics reporter already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"worker-metrics-{self.worker_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.tick()
            except Exception:
                log.exception("worker metrics reporter tick failed; continuing")
                delay = self._sample_s
            self._stop.wait(min(delay, self._sample_s))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (if started) and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
