"""ECS task metadata v4: a container's share of the task's CPU limit (docs/kcl-compatibility.md, "CPU providers")."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.workermetrics.cpu.base import (
    CpuMetricBase,
    HttpGet,
    one_line,
)


def _urllib_get(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # URL from the ECS agent's env var
        body: bytes = response.read()
        return body


class EcsCpu(CpuMetricBase):
    """The container's CPU from the ECS task metadata endpoint v4.

    ``<uri>/stats`` (Docker stats of this container) gives ``cpu_stats.cpu_usage.total_usage``,
    ``cpu_stats.system_cpu_usage`` and ``online_cpus``; cores used = Δtotal / Δsystem × online CPUs.
    ``<uri>/task`` gives the task CPU limit (``Limits.CPU``, vCPUs) and each container's CPU shares
    (``Containers[].Limits.CPU``); this container (matched by the stats' ``id`` = ``DockerId``) may use
    its shares / Σ shares × task limit. Without a task limit (EC2 launch type with no task size) the limit is
    the host's online CPUs; a container without shares, or one not found in the task, gets the whole task limit.

    The first call compares with the ``precpu_stats`` Docker includes when they are valid, else returns 0.
    The task limits are fetched once and re-read every ``limits_refresh_s`` (they do not change while a task
    runs); ``http_get`` is injectable (default: urllib with ``timeout`` seconds).
    """

    def __init__(
        self,
        metadata_uri: str,
        *,
        http_get: HttpGet | None = None,
        timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        operating_range_max: float = 100.0,
        limits_refresh_s: float = 300.0,
    ) -> None:
        super().__init__(clock=clock, operating_range_max=operating_range_max)
        if not metadata_uri:
            raise ValueError("metadata_uri must not be empty")
        self._uri = metadata_uri.rstrip("/")
        self._get: HttpGet = http_get or _urllib_get
        self._timeout = timeout
        self._limits_refresh_s = limits_refresh_s
        self._limit: tuple[float, float] | None = None  # (CPUs, fetched at monotonic)
        self._previous: tuple[float, float] | None = None  # (total_usage, system_cpu_usage)

    def _json(self, path: str) -> dict[str, Any]:
        url = f"{self._uri}{path}"
        try:
            body = self._get(url, self._timeout)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise OSError(f"GET {url}: {one_line(exc)}") from exc
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError(f"GET {url}: expected a JSON object")
        return data

    @staticmethod
    def _usage(stats: Mapping[str, Any]) -> tuple[float, float]:
        return float(stats["cpu_usage"]["total_usage"]), float(stats["system_cpu_usage"])

    @staticmethod
    def _online_cpus(cpu_stats: Mapping[str, Any]) -> float:
        online = cpu_stats.get("online_cpus")
        if online:
            return float(online)
        per_cpu = cpu_stats.get("cpu_usage", {}).get("percpu_usage") or []
        if per_cpu:
            return float(len(per_cpu))
        raise ValueError("stats give neither online_cpus nor percpu_usage")

    def container_cpu_limit(self, container_id: str | None, online_cpus: float) -> float:
        """CPUs guaranteed to this container: shares / Σ shares × task limit (fetched and cached)."""
        now = self._clock.monotonic()
        if self._limit is not None and now - self._limit[1] < self._limits_refresh_s:
            return self._limit[0]
        task = self._json("/task")
        task_limit = float((task.get("Limits") or {}).get("CPU") or 0) or online_cpus
        containers = [c for c in task.get("Containers") or [] if isinstance(c, dict)]
        shares = {str(c.get("DockerId")): float((c.get("Limits") or {}).get("CPU") or 0) for c in containers}
        mine = shares.get(container_id or "")
        if mine is None and len(shares) == 1:
            mine = next(iter(shares.values()))
        total = sum(shares.values())
        limit = mine / total * task_limit if mine and total > 0 else task_limit
        self._limit = (limit, now)
        return limit

    def _read(self) -> float:
        stats = self._json("/stats")
        cpu_stats = stats["cpu_stats"]
        total, system = self._usage(cpu_stats)
        online = self._online_cpus(cpu_stats)
        limit = self.container_cpu_limit(stats.get("id"), online)
        if limit <= 0:
            raise ValueError(f"non-positive CPU limit {limit}")
        previous = self._previous
        if previous is None:
            pre = stats.get("precpu_stats") or {}
            try:
                candidate = self._usage(pre)
            except (KeyError, TypeError, ValueError):
                candidate = None
            previous = candidate if candidate is not None and 0 < candidate[1] < system else None
        self._previous = (total, system)
        if previous is None:
            return 0.0
        d_total, d_system = total - previous[0], system - previous[1]
        if d_system <= 0:
            return 0.0
        cores = max(0.0, d_total) / d_system * online
        return cores / limit * 100.0

    def __repr__(self) -> str:
        return f"EcsCpu({self._uri!r})"
