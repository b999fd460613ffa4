"""CPU utilisation providers for worker metrics (docs/kcl-compatibility.md, "CPU providers").

Every provider returns the CPU utilisation of *this worker's compute allowance* as a percentage 0–100 and
follows KCL 3.x's formulas:

* :class:`EcsCpu` — ECS task metadata v4: ``cores = Δcpu_usage.total_usage / Δsystem_cpu_usage × online_cpus``;
  ``limit = container CPU shares / Σ shares in the task × task CPU limit``; ``min(100, cores / limit × 100)``.
* :class:`CgroupV2Cpu` — ``Δusage_usec`` of ``cpu.stat`` over Δwall, divided by ``cpu.max`` (quota / period, or
  the number of CPUs in ``cpuset.cpus.effective`` when the quota is ``max``).
* :class:`CgroupV1Cpu` — ``Δcpuacct.usage`` (ns) over Δwall, divided by ``cpu.cfs_quota_us / cpu.cfs_period_us``
  (or the CPUs in ``cpuset.effective_cpus`` when the quota is −1).
* :class:`ProcStatCpu` — first line of ``/proc/stat``: ``(Δtotal − Δidle) / Δtotal × 100``.
* :class:`PsutilCpu` — the portable fallback (macOS, Windows, restricted containers).

A provider that needs a previous reading returns 0 on its first call, as KCL does. A provider that fails (file
missing, content it cannot parse, an HTTP error) logs one line the first time, returns ``None`` — the reporter
records no sample — and tries again at the next call; it never raises into the worker.

:func:`detect_cpu_metric` chooses in KCL's order: ECS (``ECS_CONTAINER_METADATA_URI_V4`` set) → cgroup v2 (when
``<root>/cgroup.controllers`` exists) → cgroup v1 → ``/proc/stat`` → psutil → ``None`` (the worker then reports
no metric and the leader balances it by throughput alone).

Custom metrics: any object with ``name``, ``code``, ``operating_range_max`` and ``sample()`` satisfies
:class:`WorkerMetric` and can be handed to the reporter next to (or instead of) a CPU provider.

All paths and roots are injectable, and time comes from the injected :class:`~worker_lib.core.clock.Clock`.
Nothing here starts a thread or opens a connection at import time.
"""

from __future__ import annotations

from worker_lib.workermetrics.cpu.base import (
    CPU_METRIC_CODE,
    DEFAULT_CGROUP_ROOT,
    DEFAULT_PROC_STAT,
    ECS_METADATA_ENV,
    HttpGet,
    WorkerMetric,
    parse_cpu_list,
)
from worker_lib.workermetrics.cpu.cgroup import CgroupV1Cpu, CgroupV2Cpu
from worker_lib.workermetrics.cpu.detect import available_cpus, cpu_metric_from_env, detect_cpu_metric
from worker_lib.workermetrics.cpu.ecs import EcsCpu
from worker_lib.workermetrics.cpu.portable import CpuTimes, ProcessCpu, PsutilCpu
from worker_lib.workermetrics.cpu.procstat import ProcStatCpu

__all__ = [
    "CPU_METRIC_CODE",
    "DEFAULT_CGROUP_ROOT",
    "DEFAULT_PROC_STAT",
    "ECS_METADATA_ENV",
    "CgroupV1Cpu",
    "CgroupV2Cpu",
    "CpuTimes",
    "EcsCpu",
    "HttpGet",
    "ProcStatCpu",
    "ProcessCpu",
    "PsutilCpu",
    "WorkerMetric",
    "available_cpus",
    "cpu_metric_from_env",
    "detect_cpu_metric",
    "parse_cpu_list",
]
