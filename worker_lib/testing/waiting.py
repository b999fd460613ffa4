"""Waiting for something that happens on other threads or in other processes, bounded in time."""

from __future__ import annotations

from collections.abc import Callable

from worker_lib.core.clock import SYSTEM_CLOCK, Clock


def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float, step_s: float = 0.1, clock: Clock = SYSTEM_CLOCK
) -> bool:
    """Poll ``predicate`` every ``step_s`` until it holds or ``timeout_s`` passed; whether it held.

    It is asked once more at the deadline, so a wait that runs out still sees the latest state. Meant to be
    asserted: ``assert wait_until(lambda: len(seen) >= 50, timeout_s=60), len(seen)``.
    """
    deadline = clock.monotonic() + timeout_s
    while clock.monotonic() < deadline:
        if predicate():
            return True
        clock.sleep(step_s)
    return bool(predicate())
