"""What every CPU provider shares: the :class:`WorkerMetric` protocol, the failure-logging base and parsers."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from worker_lib.core.clock import Clock

log = logging.getLogger(__name__)

CPU_METRIC_CODE = "C"
"""Short name of the CPU metric in ``sts`` / ``opr`` (KCL)."""

ECS_METADATA_ENV = "ECS_CONTAINER_METADATA_URI_V4"
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_PROC_STAT = "/proc/stat"

HttpGet = Callable[[str, float], bytes]
"""``(url, timeout_s) -> body``; raises on any failure (HTTP status ≥ 400 included)."""


@runtime_checkable
class WorkerMetric(Protocol):
    """One worker metric as the reporter sees it.

    name: human-readable name ("cpu").
    code: the short key used in the WorkerMetricStats item (``C`` CPU, ``M`` memory, ``NI``/``NO`` network).
    operating_range_max: the utilisation this worker should stay under; the first value of ``opr[code]``
      (KCL default 100).
    sample(): the current value 0–100, or ``None`` when no value could be read this time.
    """

    @property
    def name(self) -> str: ...

    @property
    def code(self) -> str: ...

    @property
    def operating_range_max(self) -> float: ...

    def sample(self) -> float | None: ...


class _FailureLog:
    """Logs the first failure of a provider at WARNING and later ones at DEBUG, so a broken source costs one
    line, not one per second. A success re-arms it."""

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._failing = False

    def failed(self, reason: str) -> None:
        if not self._failing:
            self._failing = True
            log.warning("cpu metric %s unavailable, no sample recorded: %s", self._provider, reason)
        else:
            log.debug("cpu metric %s still unavailable: %s", self._provider, reason)

    def ok(self) -> None:
        if self._failing:
            log.info("cpu metric %s available again", self._provider)
        self._failing = False


class CpuMetricBase:
    """Shared bookkeeping: name, code, operating range, one-line failure logging, thread safety."""

    name = "cpu"
    code = CPU_METRIC_CODE

    def __init__(self, *, clock: Clock, operating_range_max: float) -> None:
        if not 0 < operating_range_max <= 100:
            raise ValueError(f"operating_range_max must be in (0, 100], got {operating_range_max}")
        self._clock = clock
        self.operating_range_max = float(operating_range_max)
        self._failures = _FailureLog(type(self).__name__)
        self._lock = threading.Lock()

    def sample(self) -> float | None:
        with self._lock:
            try:
                value = clamp(self._read())
            except Exception as exc:  # a provider never raises into the worker
                self._failures.failed(one_line(exc))
                return None
            self._failures.ok()
            return value

    def probe(self) -> bool:
        """Take a first reading without logging a failure (used by :func:`detect_cpu_metric`)."""
        with self._lock:
            try:
                self._read()
            except Exception:
                return False
            return True

    def _read(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text


def busy_percent(previous: tuple[float, float] | None, total: float, idle: float) -> float:
    """The busy share (%) of the time between two cumulative ``(total, idle)`` readings of a CPU-time counter
    (/proc/stat, psutil); 0 for the first reading, or when the counter did not advance."""
    if previous is None:
        return 0.0
    d_total, d_idle = total - previous[0], idle - previous[1]
    if d_total <= 0:
        return 0.0
    return (d_total - d_idle) / d_total * 100.0


def clamp(value: float) -> float:
    if math.isnan(value):
        raise ValueError("NaN")
    return min(100.0, max(0.0, value))


def parse_cpu_list(text: str) -> int:
    """Count the CPUs in a kernel cpu list such as ``"0-4,6"`` (= 6)."""
    count = 0
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            first, last = int(lo), int(hi)
            if last < first:
                raise ValueError(f"bad cpu range {part!r}")
            count += last - first + 1
        else:
            int(part)
            count += 1
    if count == 0:
        raise ValueError(f"empty cpu list {text!r}")
    return count


def read_text(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace").strip()
