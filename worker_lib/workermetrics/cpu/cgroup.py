"""cgroup v1 and v2: a container's CPU allowance on EKS and other hosts (docs/kcl-compatibility.md, "CPU providers")."""

from __future__ import annotations

import os
from pathlib import Path

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.workermetrics.cpu.base import (
    DEFAULT_CGROUP_ROOT,
    CpuMetricBase,
    parse_cpu_list,
    read_text,
)

# --- cgroups (EKS and other containers) -----------------------------------------------------------------------


class _CgroupCpu(CpuMetricBase):
    """Δ(cpu time used) / Δwall ÷ (CPUs allowed); 0 on the first call. Δwall comes from the injected clock."""

    def __init__(
        self,
        root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT,
        *,
        clock: Clock = SYSTEM_CLOCK,
        operating_range_max: float = 100.0,
    ) -> None:
        super().__init__(clock=clock, operating_range_max=operating_range_max)
        self._root = Path(root)
        self._previous: tuple[float, float] | None = None  # (cpu seconds used, monotonic seconds)

    def _usage_seconds(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def cpu_limit(self) -> float:
        """The number of CPUs (cores' worth of time per second) this cgroup may use."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _read(self) -> float:
        used = self._usage_seconds()
        limit = self.cpu_limit()
        if limit <= 0:
            raise ValueError(f"non-positive CPU limit {limit}")
        now = self._clock.monotonic()
        previous, self._previous = self._previous, (used, now)
        if previous is None:
            return 0.0
        elapsed = now - previous[1]
        if elapsed <= 0:
            return 0.0
        cores = max(0.0, used - previous[0]) / elapsed
        return cores / limit * 100.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._root)!r})"


class CgroupV2Cpu(_CgroupCpu):
    """cgroup v2 (unified hierarchy, e.g. Amazon Linux 2023 nodes): ``cpu.stat`` ``usage_usec``, ``cpu.max``
    ("quota period" or "max period"; with "max" the CPUs of ``cpuset.cpus.effective``)."""

    def _usage_seconds(self) -> float:
        for line in read_text(self._root / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value.strip()) / 1_000_000
        raise ValueError(f"{self._root / 'cpu.stat'}: no usage_usec line")

    def cpu_limit(self) -> float:
        fields = read_text(self._root / "cpu.max").split()
        if len(fields) != 2:
            raise ValueError(f"{self._root / 'cpu.max'}: expected 'quota period', got {' '.join(fields)!r}")
        quota, period = fields
        if quota == "max":
            return float(parse_cpu_list(read_text(self._root / "cpuset.cpus.effective")))
        return int(quota) / int(period)


class CgroupV1Cpu(_CgroupCpu):
    """cgroup v1 (e.g. Amazon Linux 2 nodes): ``cpu/cpuacct.usage`` (ns; ``cpuacct/cpuacct.usage`` where the
    controllers are mounted apart), ``cpu/cpu.cfs_quota_us`` / ``cpu/cpu.cfs_period_us``; quota −1 → the CPUs of
    ``cpuset/cpuset.effective_cpus``."""

    def _usage_path(self) -> Path:
        primary = self._root / "cpu" / "cpuacct.usage"
        if primary.exists():
            return primary
        return self._root / "cpuacct" / "cpuacct.usage"

    def _usage_seconds(self) -> float:
        return int(read_text(self._usage_path())) / 1_000_000_000

    def cpu_limit(self) -> float:
        quota = int(read_text(self._root / "cpu" / "cpu.cfs_quota_us"))
        if quota < 0:
            return float(parse_cpu_list(read_text(self._root / "cpuset" / "cpuset.effective_cpus")))
        period = int(read_text(self._root / "cpu" / "cpu.cfs_period_us"))
        return quota / period
