"""Per-lease throughput, as KCL 3.x measures it (docs/kcl-compatibility.md, "Throughput per lease").

Consumer threads call :meth:`ThroughputRecorder.record` with the bytes delivered to the record processor; the
renewer calls :meth:`ThroughputRecorder.renewal_value` once per renewal and writes the result as the lease's
``throughputKBps``. Each call closes a *window*:

    window KBps = bytes recorded in the window / 1024 / window seconds
    ema         = α × window KBps + (1 − α) × ema          (α = 0.5; an empty window counts as 0 KBps)

The window nominally lasts one renewer interval (3308 ms by default); its actual length is measured on the
injected clock from the end of the previous window, so a late renewal does not inflate the figure. A reading
taken less than ``min_window_fraction`` of an interval after the previous one (two renewals back to back)
returns the current EMA and leaves the window open, rather than dividing by a tiny duration.

The EMA starts from the value stored on the lease when a new owner takes it (:meth:`seed`), so the leader's
view does not drop to 0 and climb back after every move; without a stored value the first window's figure is
the starting point. The recorder matches the ``ThroughputTracker`` protocol of :mod:`worker_lib.worker.worker`.

Thread-safe: one lock guards the per-lease table; ``record`` does O(1) work under it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from worker_lib.core.clock import SYSTEM_CLOCK, Clock

DEFAULT_WINDOW_MS = 3_308
"""KCL's renewer interval: failover (10 000 ms) / 3 − 25 ms."""

DEFAULT_ALPHA = 0.5


@dataclass
class _LeaseWindow:
    window_start: float  # monotonic seconds
    nbytes: int = 0
    ema: float | None = None


class ThroughputRecorder:
    """Bytes in, KBps (EMA α 0.5) out, per lease.

    window_ms: the renewer interval the windows follow (3308 ms); used only to judge a window too short.
    alpha: weight of the newest window in the EMA (KCL 0.5).
    min_window_fraction: a renewal reading sooner than this fraction of ``window_ms`` after the previous one
      does not close the window (0.1).
    """

    def __init__(
        self,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        alpha: float = DEFAULT_ALPHA,
        min_window_fraction: float = 0.1,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if window_ms <= 0:
            raise ValueError(f"window_ms must be positive, got {window_ms}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0 <= min_window_fraction < 1:
            raise ValueError(f"min_window_fraction must be in [0, 1), got {min_window_fraction}")
        self._window_s = window_ms / 1000
        self._alpha = alpha
        self._min_window_s = self._window_s * min_window_fraction
        self._clock = clock
        self._leases: dict[str, _LeaseWindow] = {}
        self._lock = threading.Lock()

    def _entry(self, lease_key: str, now: float) -> _LeaseWindow:
        entry = self._leases.get(lease_key)
        if entry is None:
            entry = self._leases[lease_key] = _LeaseWindow(window_start=now)
        return entry

    def seed(self, lease_key: str, kbps: float | None) -> None:
        """Start tracking a lease this worker has just taken; ``kbps`` is the lease's stored ``throughputKBps``
        (``None`` when the lease has none). A fresh window starts now; bytes already recorded are kept."""
        now = self._clock.monotonic()
        valid = kbps is not None and math.isfinite(kbps) and kbps >= 0
        with self._lock:
            entry = self._entry(lease_key, now)
            entry.ema = float(kbps) if valid and kbps is not None else None
            entry.window_start = now

    def record(self, lease_key: str, nbytes: int) -> None:
        """Count ``nbytes`` delivered to the processor for ``lease_key`` (negative counts are ignored)."""
        if nbytes <= 0:
            return
        with self._lock:
            entry = self._leases.get(lease_key)
            if entry is None:
                entry = self._entry(lease_key, self._clock.monotonic())
            entry.nbytes += nbytes

    def renewal_value(self, lease_key: str) -> float | None:
        """Close the lease's current window and return the smoothed KBps to write with this renewal.

        ``None`` for a lease never seen before (its first window starts now): nothing is known yet, and KCL
        writes no throughput rather than a made-up 0.
        """
        now = self._clock.monotonic()
        with self._lock:
            entry = self._leases.get(lease_key)
            if entry is None:
                self._leases[lease_key] = _LeaseWindow(window_start=now)
                return None
            elapsed = now - entry.window_start
            if elapsed < self._min_window_s or elapsed <= 0:
                return entry.ema
            window_kbps = entry.nbytes / 1024 / elapsed
            entry.ema = window_kbps if entry.ema is None else self._alpha * window_kbps + (1 - self._alpha) * entry.ema
            entry.nbytes = 0
            entry.window_start = now
            return entry.ema

    def current(self, lease_key: str) -> float | None:
        """The last smoothed value without closing a window (for status displays)."""
        with self._lock:
            entry = self._leases.get(lease_key)
            return None if entry is None else entry.ema

    def forget(self, lease_key: str) -> None:
        """Stop tracking a lease this worker no longer holds."""
        with self._lock:
            self._leases.pop(lease_key, None)

    def tracked(self) -> list[str]:
        with self._lock:
            return sorted(self._leases)
