"""The one backoff (worker_lib/core/backoff.py): its schedule, its jitter's bounds, and a retry loop's state on an
injected clock."""

from __future__ import annotations

import re
import threading

import pytest

from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import ConfigError


def test_the_schedule_doubles_from_the_base_up_to_the_cap_and_stays_there() -> None:
    # GIVEN polling's throttle backoff (500 ms doubling, at most 10 s) without jitter
    backoff = Backoff.of_ms(500, 10_000)
    # WHEN the waits after 1..8 failures in a row are asked for (and after "0", a caller's first)
    waits = [backoff.delay_s(n) for n in range(0, 9)]
    # THEN they are exact: base × 2^(n−1), capped
    assert waits == [0.5, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    # AND a run of failures long enough to overflow an exponent still waits the cap
    assert backoff.delay_s(10_000) == 10.0


def test_jitter_draws_each_wait_within_its_band_and_never_past_the_band_of_the_cap() -> None:
    # GIVEN a jittered schedule (±50 %) and a draw that returns each end of the band
    backoff = Backoff(base_s=1.0, max_s=10.0, jitter=0.5)
    # WHEN the lowest and the highest draws are made after 2 and after 20 failures
    low = backoff.delay_s(2, rng=lambda a, b: a)
    high = backoff.delay_s(20, rng=lambda a, b: b)
    # THEN the wait is the schedule's times a factor within 1 ± jitter
    assert (low, high) == (1.0, 15.0)
    # AND the real draw stays inside the band
    assert all(0.5 <= backoff.delay_s(1) <= 1.5 for _ in range(200))


@pytest.mark.parametrize(
    ("base_s", "max_s", "jitter", "says"),
    [(-1.0, 1.0, 0.0, "must not be negative"), (2.0, 1.0, 0.0, "at least its base"), (1.0, 2.0, 1.0, "[0, 1)")],
)
def test_a_schedule_that_makes_no_sense_is_one_config_error(
    base_s: float, max_s: float, jitter: float, says: str
) -> None:
    # GIVEN / WHEN a schedule with a negative base, a cap under its base, or a jitter of 100 %
    # THEN it is refused with one line saying what is wrong
    with pytest.raises(ConfigError, match=re.escape(says)):
        Backoff(base_s=base_s, max_s=max_s, jitter=jitter)


def test_a_retry_counts_failures_waits_on_the_clock_and_starts_over_after_a_success() -> None:
    # GIVEN a retry loop on a manual clock (0.2 s doubling to 2 s: the checkpointer's)
    clock = ManualClock()
    retry = Retry(backoff=Backoff(base_s=0.2, max_s=2.0), clock=clock)
    start = clock.monotonic()
    # WHEN three attempts fail, each waited out
    delays = [retry.failed() for _ in range(3)]
    assert retry.seconds_left() == pytest.approx(0.8)
    assert retry.wait()
    # THEN the waits doubled, the clock moved by the last one, and the next attempt may run now
    assert delays == [0.2, 0.4, 0.8]
    assert clock.monotonic() - start == pytest.approx(0.8)
    assert retry.seconds_left() == 0.0
    # AND after a success the next failure waits the base again
    retry.succeeded()
    assert retry.failed() == 0.2


def test_a_retry_with_a_stop_event_does_not_wait_once_stopped() -> None:
    # GIVEN a retry loop whose owner is stopping
    clock = ManualClock()
    stop = threading.Event()
    stop.set()
    retry = Retry(backoff=Backoff(base_s=5.0, max_s=30.0), clock=clock, stop=stop)
    start = clock.monotonic()
    # WHEN it fails and would wait 5 s
    waited = retry.failed_and_wait()
    # THEN it says it was stopped, and no time passed
    assert waited is False
    assert clock.monotonic() == start
