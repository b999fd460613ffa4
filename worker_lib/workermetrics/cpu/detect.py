"""Which provider this host gets: ``SHARDLEASE_CPU_METRIC`` and KCL's detection order."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.env import env_str, environ
from worker_lib.core.errors import ConfigError
from worker_lib.workermetrics.cpu.base import (
    DEFAULT_CGROUP_ROOT,
    DEFAULT_PROC_STAT,
    ECS_METADATA_ENV,
    CpuMetricBase,
    HttpGet,
    WorkerMetric,
    log,
)
from worker_lib.workermetrics.cpu.cgroup import CgroupV1Cpu, CgroupV2Cpu
from worker_lib.workermetrics.cpu.ecs import EcsCpu
from worker_lib.workermetrics.cpu.portable import ProcessCpu, PsutilCpu
from worker_lib.workermetrics.cpu.procstat import ProcStatCpu

CPU_METRIC_CHOICES = ("auto", "process", "none")


def cpu_metric_from_env(env: Mapping[str, str] | None = None, *, clock: Clock = SYSTEM_CLOCK) -> WorkerMetric | None:
    """``SHARDLEASE_CPU_METRIC``: ``auto`` (default: KCL's detection order), ``process`` or ``none``."""
    e = environ(env)
    return cpu_metric_for(env_str(e, "SHARDLEASE_CPU_METRIC", "auto").lower(), env=e, clock=clock)


def cpu_metric_for(
    choice: str, *, env: Mapping[str, str] | None = None, clock: Clock = SYSTEM_CLOCK
) -> WorkerMetric | None:
    """The provider a ``SHARDLEASE_CPU_METRIC`` choice names; ``env`` is only asked where the host runs (ECS)."""
    if choice == "none":
        return None
    if choice == "process":
        metric = ProcessCpu(clock=clock)
        metric.probe()
        return metric
    if choice != "auto":
        raise ConfigError(f"invalid SHARDLEASE_CPU_METRIC {choice!r}: expected auto, process or none")
    return detect_cpu_metric(env, clock=clock)


def available_cpus(metric: object | None = None) -> float:
    """The CPUs this worker can use: its cgroup's limit when ``metric`` reads one (cgroup providers), else the
    CPUs the process may run on. Reported as the worker's capacity (``cap``, docs/assignment.md)."""
    limit = getattr(metric, "cpu_limit", None)
    if callable(limit):
        try:
            value = float(limit())
            if math.isfinite(value) and value > 0:
                return value
        except (OSError, ValueError):
            pass
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return float(os.cpu_count() or 1)


# --- detection ------------------------------------------------------------------------------------------------


def detect_cpu_metric(
    env: Mapping[str, str] | None = None,
    *,
    cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT,
    proc_stat: str | os.PathLike[str] = DEFAULT_PROC_STAT,
    clock: Clock = SYSTEM_CLOCK,
    http_get: HttpGet | None = None,
    ecs_timeout: float = 2.0,
    use_psutil: bool = True,
    operating_range_max: float = 100.0,
) -> WorkerMetric | None:
    """The CPU provider for this host, in KCL's order, or ``None`` when none works (throughput-only balancing).

    ECS when ``ECS_CONTAINER_METADATA_URI_V4`` is set → cgroup v2 when ``<cgroup_root>/cgroup.controllers``
    exists → cgroup v1 → ``/proc/stat`` → psutil. Each candidate is probed with one reading (which also primes
    its baseline); a candidate whose probe fails is skipped silently and the next one is tried.
    """
    root = Path(cgroup_root)
    candidates: list[CpuMetricBase] = []
    ecs_uri = env_str(environ(env), ECS_METADATA_ENV)
    if ecs_uri:
        candidates.append(
            EcsCpu(
                ecs_uri, http_get=http_get, timeout=ecs_timeout, clock=clock, operating_range_max=operating_range_max
            )
        )
    if (root / "cgroup.controllers").exists():
        candidates.append(CgroupV2Cpu(root, clock=clock, operating_range_max=operating_range_max))
    else:
        candidates.append(CgroupV1Cpu(root, clock=clock, operating_range_max=operating_range_max))
    candidates.append(ProcStatCpu(proc_stat, clock=clock, operating_range_max=operating_range_max))
    if use_psutil:
        candidates.append(PsutilCpu(clock=clock, operating_range_max=operating_range_max))
    for candidate in candidates:
        if candidate.probe():
            log.info("cpu metric provider: %r", candidate)
            return candidate
        log.debug("cpu metric provider %r not usable here", candidate)
    log.warning("no CPU metric provider works on this host; the leader will balance this worker by throughput")
    return None
