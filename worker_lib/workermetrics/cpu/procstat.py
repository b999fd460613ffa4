"""``/proc/stat``: host CPU on EC2 and plain Linux (docs/kcl-compatibility.md, "CPU providers")."""

from __future__ import annotations

import os
from pathlib import Path

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.workermetrics.cpu.base import DEFAULT_PROC_STAT, CpuMetricBase, busy_percent


class ProcStatCpu(CpuMetricBase):
    """Host CPU from the first (``cpu``) line of ``/proc/stat``.

    KCL's formula: busy = user + nice + system; total = busy + idle + iowait; value = (Δtotal − Δidle) / Δtotal.
    Only the first five fields are used (iowait counts as busy, as in KCL). 0 on the first call.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = DEFAULT_PROC_STAT,
        *,
        clock: Clock = SYSTEM_CLOCK,
        operating_range_max: float = 100.0,
    ) -> None:
        super().__init__(clock=clock, operating_range_max=operating_range_max)
        self._path = Path(path)
        self._previous: tuple[int, int] | None = None  # (total, idle)

    def _read(self) -> float:
        with self._path.open(encoding="ascii") as f:
            first = f.readline().split()
        if not first or first[0] != "cpu" or len(first) < 6:
            raise ValueError(f"{self._path}: first line is not an aggregate 'cpu' line")
        user, nice, system, idle, iowait = (int(v) for v in first[1:6])
        total = user + nice + system + idle + iowait
        previous, self._previous = self._previous, (total, idle)
        return busy_percent(previous, total, idle)

    def __repr__(self) -> str:
        return f"ProcStatCpu({str(self._path)!r})"
