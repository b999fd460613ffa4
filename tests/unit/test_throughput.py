"""Per-lease throughput recorder (docs/kcl-compatibility.md): KBps per renewal window, EMA α 0.5, seeded from
the stored lease value, thread-safe."""

from __future__ import annotations

import threading

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.workermetrics.throughput import DEFAULT_WINDOW_MS, ThroughputRecorder

WINDOW_S = DEFAULT_WINDOW_MS / 1000


def seeded(stored: float | None, key: str = "s") -> tuple[ManualClock, ThroughputRecorder]:
    """A recorder on a manual clock tracking ``key``, seeded with ``stored`` (the lease's throughputKBps)."""
    clock = ManualClock()
    rec = ThroughputRecorder(clock=clock)
    rec.seed(key, stored)
    return clock, rec


def at_1000_kbps() -> tuple[ManualClock, ThroughputRecorder]:
    """Lease ``s``, seeded with nothing, after a first window of 3308 KiB in 3.308 s: 1000 KBps."""
    clock, rec = seeded(None)
    rec.record("s", 3308 * 1024)
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(1000.0)
    return clock, rec


def test_default_window_is_kcls_renewer_interval() -> None:
    # GIVEN / WHEN / THEN the default window is KCL's renewer interval
    assert DEFAULT_WINDOW_MS == 3_308


def test_first_window_without_seed_is_the_window_rate() -> None:
    # GIVEN a lease seeded with no stored throughput
    clock, rec = seeded(None, "shardId-0")
    # WHEN 3308 KiB are delivered during one 3.308 s window
    rec.record("shardId-0", 3308 * 1024)
    clock.advance(WINDOW_S)
    # THEN the renewal writes 1000 KBps (bytes / 1024 / window seconds)
    assert rec.renewal_value("shardId-0") == pytest.approx(1000.0)


def test_ema_alpha_half_and_empty_windows_count_zero() -> None:
    # GIVEN a lease at 1000 KBps after its first window
    clock, rec = at_1000_kbps()
    # WHEN the next window carries 500 KBps THEN 0.5 × 500 + 0.5 × 1000 = 750
    rec.record("s", 1654 * 1024)
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(750.0)
    # WHEN two windows carry nothing THEN 375, then 187.5
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(375.0)
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(187.5)


def test_new_owner_seeds_the_ema_with_the_stored_value() -> None:
    # GIVEN a lease taken over with throughputKBps 800 stored by the previous owner
    clock, rec = seeded(800.0)
    assert rec.current("s") == 800.0
    # WHEN the first window carries 400 KBps THEN 0.5 × 400 + 0.5 × 800 = 600 (no drop to 400)
    rec.record("s", int(400 * 1024 * WINDOW_S))
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(600.0, rel=1e-6)


def test_seeded_lease_with_empty_first_window_halves() -> None:
    # GIVEN a seeded lease WHEN nothing arrives in a window THEN the empty window counts 0: 800 → 400
    clock, rec = seeded(800.0)
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(400.0)


def test_window_length_is_the_actual_elapsed_time() -> None:
    # GIVEN a renewal that comes late (6.616 s instead of 3.308 s)
    clock, rec = seeded(None)
    rec.record("s", 3308 * 1024)
    clock.advance(2 * WINDOW_S)
    # THEN the bytes are spread over the real elapsed time: 500 KBps, not 1000
    assert rec.renewal_value("s") == pytest.approx(500.0)


def test_back_to_back_reading_does_not_close_the_window() -> None:
    # GIVEN a lease at 1000 KBps
    clock, rec = at_1000_kbps()
    # WHEN another reading comes 10 ms later with a few bytes
    rec.record("s", 100 * 1024)
    clock.advance(0.01)
    # THEN it returns the current EMA (no division by 10 ms) and keeps the bytes for the full window
    assert rec.renewal_value("s") == pytest.approx(1000.0)
    clock.advance(WINDOW_S - 0.01)
    assert rec.renewal_value("s") == pytest.approx(0.5 * 100 / WINDOW_S + 500.0)


def test_unknown_lease_has_no_value_then_starts_measuring() -> None:
    # GIVEN a lease the recorder has never seen WHEN the renewer asks THEN None (write nothing)
    clock = ManualClock()
    rec = ThroughputRecorder(clock=clock)
    assert rec.renewal_value("s") is None
    # AND its first window starts then
    rec.record("s", 3308 * 1024)
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == pytest.approx(1000.0)


def test_forget_drops_the_lease() -> None:
    # GIVEN two seeded leases WHEN one (and one never seen) is forgotten THEN only the other is tracked
    _, rec = seeded(10.0, "a")
    rec.seed("b", 20.0)
    rec.forget("a")
    rec.forget("missing")
    assert rec.tracked() == ["b"]
    assert rec.current("a") is None


@pytest.mark.parametrize("stored", [float("nan"), float("inf"), -1.0])
def test_invalid_stored_values_are_not_used_as_seed(stored: float) -> None:
    # GIVEN / WHEN a lease is seeded with a value that is no throughput THEN it has none
    _, rec = seeded(stored)
    assert rec.current("s") is None


def test_record_ignores_non_positive_counts() -> None:
    # GIVEN a lease WHEN nothing positive is recorded in a window THEN it carried nothing
    clock, rec = seeded(None)
    rec.record("s", 0)
    rec.record("s", -5)
    clock.advance(WINDOW_S)
    assert rec.renewal_value("s") == 0.0


@pytest.mark.parametrize("kwargs", [{"window_ms": 0}, {"alpha": 0.0}, {"alpha": 1.5}, {"min_window_fraction": 1.0}])
def test_invalid_parameters_are_rejected(kwargs: dict[str, float]) -> None:
    # GIVEN / WHEN a recorder is made with an impossible parameter THEN it refuses
    with pytest.raises(ValueError, match="must be"):
        ThroughputRecorder(**kwargs)  # type: ignore[arg-type]


def test_concurrent_recording_loses_no_bytes() -> None:
    # GIVEN 8 consumer threads recording into 4 leases while the renewer closes windows
    clock = ManualClock()
    rec = ThroughputRecorder(clock=clock, alpha=1.0, min_window_fraction=0.0)
    keys = [f"shardId-{i}" for i in range(4)]
    for key in keys:
        rec.seed(key, None)
    per_thread = 5_000
    start = threading.Barrier(9)
    totals = dict.fromkeys(keys, 0.0)

    def consumer(key: str) -> None:
        start.wait()
        for _ in range(per_thread):
            rec.record(key, 1024)

    threads = [threading.Thread(target=consumer, args=(keys[i % 4],)) for i in range(8)]
    for t in threads:
        t.start()
    start.wait()
    # WHEN the renewer reads repeatedly with alpha 1 (value = last window) over 1 s windows
    while any(t.is_alive() for t in threads):
        clock.advance(1.0)
        for key in keys:
            totals[key] += rec.renewal_value(key) or 0.0
    for t in threads:
        t.join()
    clock.advance(1.0)
    for key in keys:
        totals[key] += rec.renewal_value(key) or 0.0
    # THEN every KiB recorded appears in exactly one window (2 threads × 5000 KiB per lease)
    assert totals == dict.fromkeys(keys, pytest.approx(2 * per_thread))
