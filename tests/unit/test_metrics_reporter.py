"""Worker-metrics reporter (docs/kcl-compatibility.md): 1 s samples in memory, a report after 2 s and every
30 s, −1 for an empty window, the last 10 values, KCL's item format, sink failures survived."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator

import pytest

from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core.clock import ManualClock, SystemClock
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import MAX_REPORTED_LAGS, LaneStats, WorkerMetricStats
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.reporter import NO_SAMPLES, WorkerMetricsReporter, WorkerMetricsSink

LOGGER = "worker_lib.workermetrics.reporter"


class ScriptedMetric:
    """A custom metric whose samples are scripted (``None`` = the source had nothing)."""

    def __init__(self, values: Iterable[float | None], *, code: str = "C", operating_range_max: float = 100.0) -> None:
        self.name = f"scripted-{code}"
        self.code = code
        self.operating_range_max = operating_range_max
        self._values: Iterator[float | None] = iter(values)
        self.calls = 0

    def sample(self) -> float | None:
        self.calls += 1
        return next(self._values, None)


class ListSink:
    def __init__(self) -> None:
        self.items: list[WorkerMetricStats] = []
        self.fail_next = 0
        self.attempts = 0
        self.event = threading.Event()

    def put(self, stats: WorkerMetricStats) -> None:
        self.attempts += 1
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("ProvisionedThroughputExceededException: slow down")
        self.items.append(stats)
        self.event.set()


def _run(reporter: WorkerMetricsReporter, clock: ManualClock, seconds: int) -> None:
    """Tick once per second for ``seconds`` seconds (ticks at t+1 … t+seconds)."""
    for _ in range(seconds):
        clock.advance(1.0)
        reporter.tick()


def test_sink_protocol_is_structural() -> None:
    assert isinstance(ListSink(), WorkerMetricsSink)


def test_config_defaults_and_env() -> None:
    # GIVEN no environment WHEN defaults are taken THEN KCL's 1 s / 30 s / 2 s / 10 values
    assert WorkerMetricsConfig.from_env({}) == WorkerMetricsConfig(
        sample_interval_ms=1000, report_interval_ms=30_000, first_report_delay_ms=2000, max_values=10
    )
    # AND the environment overrides them
    cfg = WorkerMetricsConfig.from_env(
        {
            "SHARDLEASE_WORKER_METRICS_SAMPLE_INTERVAL_MS": "500",
            "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "10000",
            "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS": "0",
            "SHARDLEASE_WORKER_METRICS_MAX_VALUES": "5",
        }
    )
    assert (cfg.sample_interval_ms, cfg.report_interval_ms, cfg.first_report_delay_ms, cfg.max_values) == (
        500,
        10_000,
        0,
        5,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sample_interval_ms": 0},
        {"report_interval_ms": 500},
        {"first_report_delay_ms": -1},
        {"max_values": 0},
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="must"):
        WorkerMetricsConfig(**kwargs)


def test_config_env_rejects_non_numbers() -> None:
    with pytest.raises(ConfigError, match="SHARDLEASE_WORKER_METRICS_MAX_VALUES"):
        WorkerMetricsConfig.from_env({"SHARDLEASE_WORKER_METRICS_MAX_VALUES": "ten"})


def test_first_report_after_two_seconds_then_every_thirty() -> None:
    # GIVEN a reporter with a CPU metric reading 10, 20, 30, then 50 forever
    clock = ManualClock(monotonic=100.0, wall=1_700_000_000.0)
    cpu = ScriptedMetric([10.0, 20.0, 30.0] + [50.0] * 1000)
    sink = ListSink()
    reporter = WorkerMetricsReporter("w-1", [cpu], sink, config=WorkerMetricsConfig(), clock=clock)
    # WHEN ticked at t=0 and t=1
    assert reporter.tick() == pytest.approx(1.0)
    _run(reporter, clock, 1)
    # THEN nothing is written yet
    assert sink.items == []
    # WHEN t=2
    _run(reporter, clock, 1)
    # THEN the first report averages the samples at 0, 1, 2: sts C = [20], opr C = [100], lut = wall seconds
    assert sink.items == [
        WorkerMetricStats(
            worker_id="w-1",
            last_update_epoch_s=1_700_000_002,
            stats={"C": (20.0,)},
            operating_range={"C": (100.0,)},
        )
    ]
    # WHEN 29 more seconds pass THEN no second report; at 30 s after the first, the next one
    _run(reporter, clock, 29)
    assert len(sink.items) == 1
    _run(reporter, clock, 1)
    assert len(sink.items) == 2
    assert sink.items[1].stats == {"C": (20.0, 50.0)}
    assert sink.items[1].last_update_epoch_s == 1_700_000_032
    # AND exactly one sample per second was taken (t = 0 … 32)
    assert cpu.calls == 33


def test_window_without_samples_is_minus_one() -> None:
    # GIVEN a metric that works for the first report, then fails for a whole window, then recovers
    clock = ManualClock()
    values: list[float | None] = [40.0, 40.0, 40.0] + [None] * 30 + [60.0] * 30
    cpu = ScriptedMetric(values)
    sink = ListSink()
    reporter = WorkerMetricsReporter("w", [cpu], sink, clock=clock)
    reporter.tick()
    # WHEN three reports are made
    _run(reporter, clock, 2 + 30 + 30)
    # THEN the failed window is −1 and the leader would skip the worker only while it is last
    assert [item.stats["C"] for item in sink.items] == [(40.0,), (40.0, NO_SAMPLES), (40.0, NO_SAMPLES, 60.0)]
    assert sink.items[1].has_failed_metric() and not sink.items[2].has_failed_metric()


def test_partial_window_averages_only_real_samples() -> None:
    # GIVEN a window where half the samples are missing WHEN reported THEN the mean of those present
    clock = ManualClock()
    cpu = ScriptedMetric([10.0, None, 30.0])
    sink = ListSink()
    reporter = WorkerMetricsReporter("w", [cpu], sink, clock=clock)
    reporter.tick()
    _run(reporter, clock, 2)
    assert sink.items[0].stats["C"] == (20.0,)


def test_keeps_only_the_last_ten_values() -> None:
    # GIVEN a metric whose value in window k is k (the first window, 3 samples, is 0)
    clock = ManualClock()
    values: list[float | None] = [0.0] * 3
    for k in range(1, 12):
        values += [float(k)] * 30
    sink = ListSink()
    reporter = WorkerMetricsReporter("w", [ScriptedMetric(values)], sink, clock=clock)
    reporter.tick()
    # WHEN 12 reports have been made
    _run(reporter, clock, 2 + 11 * 30)
    assert len(sink.items) == 12
    # THEN sts holds windows 2 … 11, newest last
    assert sink.items[-1].stats["C"] == tuple(float(k) for k in range(2, 12))
    assert all(len(item.stats["C"]) <= 10 for item in sink.items)


def test_several_metrics_and_operating_ranges() -> None:
    # GIVEN CPU (range 80) and a custom memory metric (range 90)
    clock = ManualClock()
    sink = ListSink()
    metrics = [
        ScriptedMetric([30.0] * 10, code="C", operating_range_max=80.0),
        ScriptedMetric([70.0] * 10, code="M", operating_range_max=90.0),
    ]
    reporter = WorkerMetricsReporter("w", metrics, sink, clock=clock)
    reporter.tick()
    _run(reporter, clock, 2)
    # THEN each metric has its own sts and opr list
    assert sink.items[0].stats == {"C": (30.0,), "M": (70.0,)}
    assert sink.items[0].operating_range == {"C": (80.0,), "M": (90.0,)}


def test_no_metrics_still_reports_a_default_metric_worker() -> None:
    # GIVEN no metric provider at all (throughput-only balancing)
    clock = ManualClock()
    sink = ListSink()
    reporter = WorkerMetricsReporter("w", [], sink, clock=clock)
    reporter.tick()
    _run(reporter, clock, 2)
    # THEN the item is written with empty sts/opr, so the leader sees a live default-metric worker
    assert len(sink.items) == 1
    assert sink.items[0].is_default_metric_worker


def test_duplicate_codes_are_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        WorkerMetricsReporter("w", [ScriptedMetric([]), ScriptedMetric([])], ListSink(), clock=ManualClock())


def test_sink_failure_is_logged_once_and_retried_next_report(caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a sink that fails twice in a row
    clock = ManualClock()
    sink = ListSink()
    sink.fail_next = 2
    reporter = WorkerMetricsReporter("w-9", [ScriptedMetric([25.0] * 100)], sink, clock=clock)
    caplog.set_level(logging.INFO, logger=LOGGER)
    reporter.tick()
    # WHEN the first two reports fail
    _run(reporter, clock, 2 + 30)
    # THEN nothing was written, the failures were counted, and one warning line was logged
    assert sink.attempts == 2 and sink.items == []
    assert reporter.report_failures == 2
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "w-9" in warnings[0].getMessage() and "\n" not in warnings[0].getMessage()
    # WHEN the next report succeeds THEN it carries every window, including those whose writes failed
    _run(reporter, clock, 30)
    assert len(sink.items) == 1
    assert sink.items[0].stats["C"] == (25.0, 25.0, 25.0)
    assert reporter.reports_written == 1


def test_failing_custom_metric_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    class Exploding:
        name = "exploding"
        code = "X"
        operating_range_max = 100.0

        def sample(self) -> float | None:
            raise RuntimeError("kaboom")

    clock = ManualClock()
    sink = ListSink()
    reporter = WorkerMetricsReporter("w", [Exploding(), ScriptedMetric([5.0] * 10)], sink, clock=clock)
    caplog.set_level(logging.INFO, logger=LOGGER)
    reporter.tick()
    _run(reporter, clock, 2)
    # THEN the exploding metric reports −1, CPU reports normally, and the failure is one warning line
    assert sink.items[0].stats == {"X": (NO_SAMPLES,), "C": (5.0,)}
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_late_tick_takes_one_sample_and_rebases() -> None:
    # GIVEN a reporter that is not ticked for 10 s after its first report
    clock = ManualClock()
    cpu = ScriptedMetric([1.0] * 100)
    sink = ListSink()
    reporter = WorkerMetricsReporter("w", [cpu], sink, clock=clock)
    reporter.tick()
    _run(reporter, clock, 2)
    calls = cpu.calls
    clock.advance(10.0)
    # WHEN ticked THEN one sample (not ten) and the next sample is due one interval later
    assert reporter.tick() == pytest.approx(1.0)
    assert cpu.calls == calls + 1


def test_no_thread_until_start() -> None:
    # GIVEN a reporter just built WHEN nothing is started THEN no thread runs
    before = threading.active_count()
    reporter = WorkerMetricsReporter("w", [], ListSink(), clock=ManualClock())
    assert not reporter.running
    assert threading.active_count() == before
    reporter.stop()  # stopping a reporter never started is harmless


def test_start_and_stop_run_a_daemon_thread() -> None:
    # GIVEN short intervals on the real clock and a sink that fails once
    config = WorkerMetricsConfig(sample_interval_ms=10, report_interval_ms=50, first_report_delay_ms=20)
    sink = ListSink()
    sink.fail_next = 1
    reporter = WorkerMetricsReporter("w", [ScriptedMetric([12.0] * 10_000)], sink, config=config, clock=SystemClock())
    # WHEN started
    reporter.start()
    try:
        assert reporter.running
        with pytest.raises(RuntimeError, match="already started"):
            reporter.start()
        # THEN a report arrives despite the failing first write (the thread survived it)
        eventually(
            sink.event.is_set,
            bound_s=hang_bound_s((config.first_report_delay_ms + 2 * config.report_interval_ms) / 1000),
            what="a report after the failed first write",
        )
    finally:
        reporter.stop()
    # AND after stop the thread is gone (bool(): mypy keeps the narrowing from the assert above)
    assert not bool(reporter.running)
    assert sink.items[0].stats["C"][-1] == 12.0
    assert sink.attempts >= 2


def test_capacity_is_read_at_each_report_and_left_out_when_it_cannot_be_read() -> None:
    # GIVEN a reporter whose capacity (executor slots) grows from 1 to 2, then cannot be read
    clock = ManualClock()
    sink = ListSink()
    readings: list[object] = [1, 2.0, RuntimeError("no slots"), None]

    def slots() -> float | None:
        value = readings.pop(0)
        if isinstance(value, Exception):
            raise value
        return None if value is None else float(value)  # type: ignore[arg-type]

    reporter = WorkerMetricsReporter(
        "spark-a",
        [ScriptedMetric([5.0] * 200)],
        sink,
        clock=clock,
        capacity=slots,
        config=WorkerMetricsConfig(report_interval_ms=1000, first_report_delay_ms=1000),
    )
    reporter.tick()
    # WHEN four reports are written
    _run(reporter, clock, 4)
    # THEN each carries the capacity of its moment, and none when it could not be read
    assert [item.capacity for item in sink.items] == [1.0, 2.0, None, None]
    # AND a reporter without a capacity writes none
    plain = ListSink()
    other = WorkerMetricsReporter("w", [], plain, clock=clock, config=WorkerMetricsConfig(first_report_delay_ms=1000))
    other.tick()
    _run(other, clock, 1)
    assert plain.items[0].capacity is None


def test_lanes_are_read_at_each_report_the_worst_watermark_lags_kept_and_left_out_when_unreadable() -> None:
    # GIVEN a worker with more leases in lanes than a report carries, then lanes that cannot be read, then none
    clock = ManualClock()
    sink = ListSink()
    many = {f"shard-{n:03d}": LaneStats(in_flight=n, watermark_lag_ms=10 * n) for n in range(MAX_REPORTED_LAGS + 5)}
    tied = {
        "b": LaneStats(in_flight=1, watermark_lag_ms=50),
        "a": LaneStats(in_flight=1, watermark_lag_ms=50),
        "c": LaneStats(in_flight=9, watermark_lag_ms=50),
    }
    readings: list[dict[str, LaneStats] | Exception] = [many, tied, RuntimeError("consumer gone"), {}]

    def lanes() -> dict[str, LaneStats]:
        value = readings.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    reporter = WorkerMetricsReporter(
        "w1",
        [ScriptedMetric([5.0] * 200)],
        sink,
        clock=clock,
        lanes=lanes,
        config=WorkerMetricsConfig(report_interval_ms=1000, first_report_delay_ms=1000),
    )
    reporter.tick()
    # WHEN four reports are written
    _run(reporter, clock, 4)
    # THEN the first carries the worst watermark lags only, as read
    first = sink.items[0].lanes
    assert len(first) == MAX_REPORTED_LAGS
    assert first == {key: lane for key, lane in many.items() if lane.in_flight >= 5}
    # AND ties go to the most records in flight, then to the lease key
    assert list(sink.items[1].lanes) == ["c", "a", "b"]
    # AND lanes that cannot be read, or none, write none
    assert [item.lanes for item in sink.items[2:]] == [{}, {}]
    # AND a reporter without lanes writes none
    assert WorkerMetricsReporter("w", [], ListSink(), clock=clock).snapshot().lanes == {}
