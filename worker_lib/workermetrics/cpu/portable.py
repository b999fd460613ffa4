"""psutil: the portable fallback (macOS, Windows, restricted containers) and the per-process share."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.workermetrics.cpu.base import CpuMetricBase, busy_percent

CpuTimes = Callable[[], Any]


class PsutilCpu(CpuMetricBase):
    """Host CPU through psutil's ``cpu_times()`` (Linux, macOS, Windows), busy = total − idle over the interval
    between calls; 0 on the first call. psutil is imported lazily: when it is not installed the provider logs
    one line and every sample is ``None``. ``cpu_times`` may be injected (tests)."""

    name = "cpu"

    def __init__(
        self, *, clock: Clock = SYSTEM_CLOCK, cpu_times: CpuTimes | None = None, operating_range_max: float = 100.0
    ) -> None:
        super().__init__(clock=clock, operating_range_max=operating_range_max)
        self._cpu_times = cpu_times
        self._previous: tuple[float, float] | None = None  # (total, idle) seconds

    @staticmethod
    def available() -> bool:
        """Whether psutil can be imported."""
        try:
            importlib.import_module("psutil")
        except ImportError:
            return False
        return True

    def _times(self) -> Any:
        if self._cpu_times is None:
            try:
                psutil = importlib.import_module("psutil")
            except ImportError as exc:
                raise OSError("psutil is not installed (pip install psutil)") from exc
            self._cpu_times = psutil.cpu_times
        return self._cpu_times()

    def _read(self) -> float:
        times = self._times()
        fields: dict[str, float] = dict(times._asdict())
        # On Linux guest time is already counted in user/nice (psutil's own convention).
        total = sum(v for k, v in fields.items() if k not in ("guest", "guest_nice"))
        idle = fields["idle"] + fields.get("iowait", 0.0)
        previous, self._previous = self._previous, (total, idle)
        return busy_percent(previous, total, idle)

    def __repr__(self) -> str:
        return "PsutilCpu()"


class ProcessCpu(CpuMetricBase):
    """This process's share of the host's CPUs (Δ user+system CPU time ÷ Δwall ÷ CPUs × 100).

    Not a KCL provider: for several workers on one host (the local demo, or packing small workers onto one
    instance) the host and cgroup figures are the same for every worker and cannot tell the leader which one is
    busy. ``SHARDLEASE_CPU_METRIC=process`` selects it.
    """

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        operating_range_max: float = 100.0,
        cpus: int | None = None,
        cpu_seconds: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(clock=clock, operating_range_max=operating_range_max)
        self._cpus = cpus or os.cpu_count() or 1
        self._cpu_seconds = cpu_seconds or (lambda: sum(os.times()[:2]))
        self._previous_sample: tuple[float, float] | None = None

    def _read(self) -> float:
        now, used = self._clock.monotonic(), self._cpu_seconds()
        previous, self._previous_sample = self._previous_sample, (now, used)
        if previous is None or now <= previous[0]:
            return 0.0
        return (used - previous[1]) / (now - previous[0]) / self._cpus * 100.0

    def __repr__(self) -> str:
        return f"ProcessCpu(cpus={self._cpus})"
