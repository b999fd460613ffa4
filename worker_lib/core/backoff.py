"""The one backoff every retry loop uses: capped exponential, with optional jitter, on the injected clock.

:class:`Backoff` is the schedule (a frozen value: ``base_s × 2^(n−1)`` for the n-th failure in a row, capped at
``max_s``, multiplied by a random factor within ``1 ± jitter``); :class:`Retry` is one loop's state (failures in a
row, when the next attempt may run) and waits through the :class:`~worker_lib.core.clock.Clock`, optionally
waking early on a stop event.

Jitter spreads retries of many callers that failed together (a throttled table, a registration that every worker
tries at start). Loops that only one caller runs on one resource — one shard's reads, one batch's retries — keep
``jitter=0`` so that their schedule is exact and a fake-clock test can assert it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import ConfigError

_MAX_EXPONENT = 30  # 2^30 × any sensible base is past every cap: no overflow, no float infinity


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """A capped exponential schedule.

    base_s: the wait after the first failure. max_s: the cap. jitter: the fraction of each wait drawn at random
    (0.2: × U(0.8, 1.2)); 0 makes the schedule exact.
    """

    base_s: float
    max_s: float
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s < 0:
            raise ConfigError(f"backoff base {self.base_s} s must not be negative")
        if self.max_s < self.base_s:
            raise ConfigError(f"backoff cap {self.max_s} s must be at least its base {self.base_s} s")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"backoff jitter {self.jitter} must be within [0, 1)")

    @classmethod
    def of_ms(cls, base_ms: int, max_ms: int, *, jitter: float = 0.0) -> Backoff:
        """The schedule of a configuration's ``*_ms`` pair."""
        return cls(base_s=base_ms / 1000, max_s=max_ms / 1000, jitter=jitter)

    def delay_s(self, failures: int, *, rng: Callable[[float, float], float] = random.uniform) -> float:
        """The wait after the ``failures``-th failure in a row (1 for the first; values below 1 count as 1)."""
        exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
        delay = min(self.base_s * (1 << exponent), self.max_s)
        if self.jitter:
            delay *= rng(1 - self.jitter, 1 + self.jitter)
        return delay


@dataclass(kw_only=True)
class Retry:
    """One retry loop's state under a :class:`Backoff`: count a failure, wait its delay, reset on success.

    stop: where given, :meth:`wait` wakes as soon as it is set (a worker shutting down does not wait a backoff out).
    Not thread-safe: a loop belongs to one thread.
    """

    backoff: Backoff
    clock: Clock = SYSTEM_CLOCK
    stop: threading.Event | None = None
    failures: int = field(default=0, init=False)
    next_at: float = field(default=float("-inf"), init=False)

    def failed(self) -> float:
        """Count a failure; returns the delay before the next attempt (also kept as :attr:`next_at`)."""
        self.failures += 1
        delay = self.backoff.delay_s(self.failures)
        self.next_at = max(self.next_at, self.clock.monotonic() + delay)
        return delay

    def succeeded(self) -> None:
        """The loop got through: the next failure starts from the base again."""
        self.failures = 0

    def seconds_left(self) -> float:
        """How long until the next attempt may run (0 when it may run now)."""
        return max(0.0, self.next_at - self.clock.monotonic())

    def wait(self, seconds: float | None = None, *, tick_s: float = 0.1) -> bool:
        """Wait ``seconds`` (default: until :attr:`next_at`); False if ``stop`` was set meanwhile."""
        left = self.seconds_left() if seconds is None else seconds
        if self.stop is None:
            self.clock.sleep(left)
            return True
        end = self.clock.monotonic() + left
        while not self.stop.is_set() and (remaining := end - self.clock.monotonic()) > 0:
            self.clock.sleep(min(remaining, tick_s))
        return not self.stop.is_set()

    def failed_and_wait(self) -> bool:
        """:meth:`failed` then :meth:`wait`: False if stopped meanwhile."""
        return self.wait(self.failed())
