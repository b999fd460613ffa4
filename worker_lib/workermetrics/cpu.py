"""CPU utilisation providers for worker metrics (docs/kcl-compat.md, "CPU providers").

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

import importlib
import json
import logging
import math
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.env import env_str, environ
from worker_lib.core.errors import ConfigError

log = logging.getLogger("shardlease.metrics.cpu")

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


class _CpuMetricBase:
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
                value = _clamp(self._read())
            except Exception as exc:  # a provider never raises into the worker
                self._failures.failed(_one_line(exc))
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ") or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text


def _clamp(value: float) -> float:
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


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace").strip()


# --- /proc/stat (EC2, plain Linux) ----------------------------------------------------------------------------


class ProcStatCpu(_CpuMetricBase):
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
        if previous is None:
            return 0.0
        d_total, d_idle = total - previous[0], idle - previous[1]
        if d_total <= 0:
            return 0.0
        return (d_total - d_idle) / d_total * 100.0

    def __repr__(self) -> str:
        return f"ProcStatCpu({str(self._path)!r})"


# --- cgroups (EKS and other containers) -----------------------------------------------------------------------


class _CgroupCpu(_CpuMetricBase):
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
        for line in _read_text(self._root / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value.strip()) / 1_000_000
        raise ValueError(f"{self._root / 'cpu.stat'}: no usage_usec line")

    def cpu_limit(self) -> float:
        fields = _read_text(self._root / "cpu.max").split()
        if len(fields) != 2:
            raise ValueError(f"{self._root / 'cpu.max'}: expected 'quota period', got {' '.join(fields)!r}")
        quota, period = fields
        if quota == "max":
            return float(parse_cpu_list(_read_text(self._root / "cpuset.cpus.effective")))
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
        return int(_read_text(self._usage_path())) / 1_000_000_000

    def cpu_limit(self) -> float:
        quota = int(_read_text(self._root / "cpu" / "cpu.cfs_quota_us"))
        if quota < 0:
            return float(parse_cpu_list(_read_text(self._root / "cpuset" / "cpuset.effective_cpus")))
        period = int(_read_text(self._root / "cpu" / "cpu.cfs_period_us"))
        return quota / period


# --- ECS task metadata v4 -------------------------------------------------------------------------------------


def _urllib_get(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # URL from the ECS agent's env var
        body: bytes = response.read()
        return body


class EcsCpu(_CpuMetricBase):
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
            raise OSError(f"GET {url}: {_one_line(exc)}") from exc
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


# --- psutil (portable fallback) -------------------------------------------------------------------------------


CpuTimes = Callable[[], Any]


class PsutilCpu(_CpuMetricBase):
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
        if previous is None:
            return 0.0
        d_total, d_idle = total - previous[0], idle - previous[1]
        if d_total <= 0:
            return 0.0
        return (d_total - d_idle) / d_total * 100.0

    def __repr__(self) -> str:
        return "PsutilCpu()"


class ProcessCpu(_CpuMetricBase):
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


def cpu_metric_from_env(env: Mapping[str, str] | None = None, *, clock: Clock = SYSTEM_CLOCK) -> WorkerMetric | None:
    """``SHARDLEASE_CPU_METRIC``: ``auto`` (default: KCL's detection order), ``process`` or ``none``."""
    e = environ(env)
    choice = env_str(e, "SHARDLEASE_CPU_METRIC", "auto").lower()
    if choice == "none":
        return None
    if choice == "process":
        metric = ProcessCpu(clock=clock)
        metric.probe()
        return metric
    if choice != "auto":
        raise ConfigError(f"invalid SHARDLEASE_CPU_METRIC {choice!r}: expected auto, process or none")
    return detect_cpu_metric(e, clock=clock)


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
    candidates: list[_CpuMetricBase] = []
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
