"""Time, injected.

Every component that needs the time takes a :class:`Clock`. Two readings are offered and they are not
interchangeable:

* ``monotonic()`` — seconds on a clock that never jumps; used for every *duration* (lease expiry by counter
  observation, lock validity, renewal deadlines). Only comparable within one process.
* ``wall()`` — seconds since the Unix epoch; used only where a value is *stored* for other hosts to read
  (``lut`` in worker metrics, the leader lock's expiry), and so relies on hosts' clocks agreeing to within a
  bound (see docs/leader-lock.md, "Clock assumptions").

``time.time()`` and ``time.monotonic()`` are called nowhere else in the package.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (origin arbitrary)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch."""

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (returns at once for ``seconds <= 0``)."""


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wall_millis(self) -> int:
        return int(self.wall() * 1000)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it. For deterministic tests and simulation.

    Thread-safe, so that a test can advance it while components run in threads.
    """

    def __init__(self, *, monotonic: float = 1_000.0, wall: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._monotonic = monotonic
        self._wall = wall

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._monotonic += seconds
            self._wall += seconds

    def skew_wall(self, seconds: float) -> None:
        """Shift only the wall reading (simulates a host whose clock is off); monotonic is unaffected."""
        with self._lock:
            self._wall += seconds


def wait_for(event: threading.Event, seconds: float, clock: Clock) -> bool:
    """Wait up to ``seconds`` on ``clock`` for ``event``; whether it is set. The real clock waits on the event
    itself; any other (a test's) moves its time by ``seconds`` and gives other threads a moment."""
    if isinstance(clock, SystemClock):
        return event.wait(max(0.0, seconds))
    if event.is_set():
        return True
    clock.sleep(seconds)
    return event.wait(0.002)


def wall_millis(clock: Clock) -> int:
    """The wall reading of ``clock`` in whole milliseconds."""
    return int(clock.wall() * 1000)


SYSTEM_CLOCK = SystemClock()
