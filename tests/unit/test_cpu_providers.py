"""CPU providers (docs/kcl-compatibility.md, "CPU providers") against fixture files with the reference's worked
numbers, the ECS provider against a real local HTTP server serving recorded task-metadata JSON, and detection order."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.workermetrics.cpu import (
    ECS_METADATA_ENV,
    CgroupV1Cpu,
    CgroupV2Cpu,
    EcsCpu,
    ProcStatCpu,
    PsutilCpu,
    WorkerMetric,
    available_cpus,
    detect_cpu_metric,
    parse_cpu_list,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cpu"
LOGGER = "worker_lib.workermetrics.cpu.base"


def _install(src: str, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / src, dst)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


# --- cpu lists -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "count"), [("0-4,6", 6), ("0-7", 8), ("0", 1), ("0,2,4\n", 3), ("0-1,4-5", 4)])
def test_cpu_list_counts_ranges_and_singles(text: str, count: int) -> None:
    # GIVEN a kernel cpu list WHEN counted THEN ranges are inclusive and singles count one
    assert parse_cpu_list(text) == count


@pytest.mark.parametrize("text", ["", "3-1", "a-b"])
def test_cpu_list_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match=r"cpu|invalid literal"):
        parse_cpu_list(text)


# --- /proc/stat ------------------------------------------------------------------------------------------------


def test_proc_stat_reference_example_is_about_7_7_percent(tmp_path: Path) -> None:
    # GIVEN /proc/stat "cpu 20000 200 2000 1500000 1000"
    stat = tmp_path / "stat"
    _install("proc_stat.1", stat)
    metric = ProcStatCpu(stat, clock=ManualClock())
    # WHEN sampled the first time THEN 0 (no previous reading)
    assert metric.sample() == 0.0
    # WHEN the counters move to "cpu 30000 3000 30000 2000000 2000" and it is sampled again
    _install("proc_stat.2", stat)
    value = metric.sample()
    # THEN (Δtotal − Δidle) / Δtotal = 41800 / 541800 ≈ 7.7 %
    assert value == pytest.approx(41_800 / 541_800 * 100)
    assert round(value or 0, 1) == 7.7


def test_proc_stat_missing_file_logs_once_and_returns_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a /proc/stat path that does not exist
    metric = ProcStatCpu(tmp_path / "nope", clock=ManualClock())
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    # WHEN sampled three times THEN None each time and one warning line in all
    assert [metric.sample() for _ in range(3)] == [None, None, None]
    assert len(_warnings(caplog)) == 1
    assert "ProcStatCpu" in _warnings(caplog)[0].getMessage()


def test_proc_stat_bad_content_returns_none_then_recovers(tmp_path: Path) -> None:
    # GIVEN a stat file without an aggregate cpu line
    stat = tmp_path / "stat"
    _install("proc_stat.bad", stat)
    metric = ProcStatCpu(stat, clock=ManualClock())
    # WHEN sampled THEN None
    assert metric.sample() is None
    # WHEN the file becomes readable THEN the provider works again (first good reading is 0, then the delta)
    _install("proc_stat.1", stat)
    assert metric.sample() == 0.0
    _install("proc_stat.2", stat)
    assert metric.sample() == pytest.approx(7.715, abs=0.001)


# --- cgroup v2 -------------------------------------------------------------------------------------------------


def _cgroup_v2(root: Path, cpu_max: str) -> None:
    _install("cgroup_v2/cgroup.controllers", root / "cgroup.controllers")
    _install(f"cgroup_v2/cpu.max.{cpu_max}", root / "cpu.max")
    _install("cgroup_v2/cpuset.cpus.effective", root / "cpuset.cpus.effective")
    _install("cgroup_v2/cpu.stat.1", root / "cpu.stat")


def _cgroup_v2_used_over(root: Path, elapsed_s: float) -> CgroupV2Cpu:
    """The 2-CPU cgroup's metric after its first sample, with 0.5 CPU-seconds more used ``elapsed_s`` later
    (usage_usec 1 000 000, then 1 500 000): its next sample measures that interval."""
    _cgroup_v2(root, "quota")
    clock = ManualClock()
    metric = CgroupV2Cpu(root, clock=clock)
    metric.sample()
    clock.advance(elapsed_s)
    _install("cgroup_v2/cpu.stat.2", root / "cpu.stat")
    return metric


@pytest.mark.parametrize(("cpu_max", "expected"), [("quota", 25.0), ("unlimited", 6.25)])
def test_cgroup_v2_reference_examples(tmp_path: Path, cpu_max: str, expected: float) -> None:
    # GIVEN cpu.max "20000 10000" (2 CPUs) or "max 10000" with cpuset "0-7" (8 CPUs), usage_usec 1 000 000
    _cgroup_v2(tmp_path, cpu_max)
    clock = ManualClock()
    metric = CgroupV2Cpu(tmp_path, clock=clock)
    assert metric.sample() == 0.0
    # WHEN usage reaches 1 500 000 µs one second later (0.5 CPU-seconds used in 1 s)
    clock.advance(1.0)
    _install("cgroup_v2/cpu.stat.2", tmp_path / "cpu.stat")
    # THEN 0.5 / 2 = 25 % and 0.5 / 8 = 6.25 %
    assert metric.sample() == pytest.approx(expected)


def test_cgroup_v2_uses_actual_elapsed_wall_time(tmp_path: Path) -> None:
    # GIVEN the 2-CPU cgroup WHEN the same 0.5 CPU-seconds are used over 2 s THEN 12.5 %
    metric = _cgroup_v2_used_over(tmp_path, 2.0)
    assert metric.sample() == pytest.approx(12.5)


def test_cgroup_v2_bad_cpu_max_returns_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _cgroup_v2(tmp_path, "quota")
    (tmp_path / "cpu.max").write_text("garbage\n")
    metric = CgroupV2Cpu(tmp_path, clock=ManualClock())
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert metric.sample() is None
    assert metric.sample() is None
    assert len(_warnings(caplog)) == 1


def test_cgroup_v2_caps_at_100(tmp_path: Path) -> None:
    # GIVEN 2 CPUs WHEN 0.5 CPU-seconds are used in 0.1 s (5 cores' worth, impossible but seen with skew)
    metric = _cgroup_v2_used_over(tmp_path, 0.1)
    # THEN min(100, …)
    assert metric.sample() == 100.0


# --- cgroup v1 -------------------------------------------------------------------------------------------------


def _cgroup_v1(root: Path, quota: str, *, usage_dir: str = "cpu") -> None:
    _install(f"cgroup_v1/cpu.cfs_quota_us.{quota}", root / "cpu" / "cpu.cfs_quota_us")
    _install("cgroup_v1/cpu.cfs_period_us", root / "cpu" / "cpu.cfs_period_us")
    _install("cgroup_v1/cpuset.effective_cpus", root / "cpuset" / "cpuset.effective_cpus")
    _install("cgroup_v1/cpuacct.usage.1", root / usage_dir / "cpuacct.usage")


@pytest.mark.parametrize("usage_dir", ["cpu", "cpuacct"])
def test_cgroup_v1_unlimited_quota_counts_cpuset(tmp_path: Path, usage_dir: str) -> None:
    # GIVEN quota −1 and cpuset "0-4,6" (6 CPUs), usage 1 s; cpuacct.usage under cpu/ or (split mounts) cpuacct/
    _cgroup_v1(tmp_path, "unlimited", usage_dir=usage_dir)
    clock = ManualClock()
    metric = CgroupV1Cpu(tmp_path, clock=clock)
    assert metric.cpu_limit() == 6
    assert metric.sample() == 0.0
    # WHEN usage reaches 4 s one second later (3 cores busy)
    clock.advance(1.0)
    _install("cgroup_v1/cpuacct.usage.2", tmp_path / usage_dir / "cpuacct.usage")
    # THEN 3 / 6 = 50 %
    assert metric.sample() == pytest.approx(50.0)


def test_cgroup_v1_quota_over_period(tmp_path: Path) -> None:
    # GIVEN quota 150000 / period 100000 = 1.5 CPUs
    _cgroup_v1(tmp_path, "limited")
    clock = ManualClock()
    metric = CgroupV1Cpu(tmp_path, clock=clock)
    assert metric.cpu_limit() == 1.5
    metric.sample()
    # WHEN 3 CPU-seconds are used over 4 s (0.75 cores) THEN 50 %
    clock.advance(4.0)
    _install("cgroup_v1/cpuacct.usage.2", tmp_path / "cpu" / "cpuacct.usage")
    assert metric.sample() == pytest.approx(50.0)


def test_cgroup_v1_missing_files_return_none(tmp_path: Path) -> None:
    assert CgroupV1Cpu(tmp_path, clock=ManualClock()).sample() is None


# --- ECS task metadata v4, over real HTTP ---------------------------------------------------------------------


class MetadataServer:
    """A task-metadata endpoint on 127.0.0.1: each path serves its bodies in order (the last one repeats)."""

    def __init__(self) -> None:
        self.routes: dict[str, list[tuple[int, bytes]]] = {}
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                queue = outer.routes.get(self.path)
                status, body = (404, b'{"error": "not found"}') if not queue else queue[0]
                if queue and len(queue) > 1:
                    queue.pop(0)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        host, port = self._server.server_address[:2]
        self.uri = f"http://{host!s}:{port}/v4/8f03e41243824aea923aca126495f665-1234567890"
        self.prefix = "/v4/8f03e41243824aea923aca126495f665-1234567890"

    def serve(self, path: str, *fixtures: str, status: int = 200) -> None:
        self.routes[self.prefix + path] = [(status, (FIXTURES / "ecs" / f).read_bytes()) for f in fixtures]

    def serve_json(self, path: str, body: Any, status: int = 200) -> None:
        self.routes[self.prefix + path] = [(status, json.dumps(body).encode())]

    def __enter__(self) -> MetadataServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server


def test_ecs_two_samples_from_recorded_stats(metadata: MetadataServer) -> None:
    # GIVEN a task with 2 vCPUs whose two containers have 512 shares each (this one may use 1 CPU), and two
    # recorded stats responses one second apart on a 2-CPU host
    metadata.serve("/stats", "stats.1.json", "stats.2.json")
    metadata.serve("/task", "task.json")
    clock = ManualClock()
    metric = EcsCpu(metadata.uri, timeout=2.0, clock=clock)
    # WHEN sampled the first time THEN Docker's precpu_stats give the delta: 0.25e9 / 2e9 × 2 = 0.25 cores → 25 %
    assert metric.sample() == pytest.approx(25.0)
    # WHEN sampled again THEN against our previous reading: 0.5e9 / 2e9 × 2 = 0.5 cores of 1 → 50 %
    clock.advance(1.0)
    assert metric.sample() == pytest.approx(50.0)
    # AND the task limits were fetched once
    assert metadata.requests.count(metadata.prefix + "/task") == 1
    assert metadata.requests.count(metadata.prefix + "/stats") == 2


def test_ecs_without_task_limit_uses_online_cpus(metadata: MetadataServer) -> None:
    # GIVEN an EC2-launch task with no task CPU size and one container: the limit is the host's 2 online CPUs
    metadata.serve("/stats", "stats.1.json", "stats.2.json")
    metadata.serve("/task", "task_no_task_limit.json")
    metric = EcsCpu(metadata.uri, clock=ManualClock())
    # WHEN sampled twice THEN 0.25 / 2 and 0.5 / 2
    assert metric.sample() == pytest.approx(12.5)
    assert metric.sample() == pytest.approx(25.0)


def test_ecs_first_call_without_precpu_is_zero(metadata: MetadataServer) -> None:
    # GIVEN stats whose precpu_stats are empty (the agent's first read)
    first = json.loads((FIXTURES / "ecs" / "stats.1.json").read_text())
    first["precpu_stats"] = {"cpu_usage": {"total_usage": 0}, "system_cpu_usage": 0}
    metadata.serve_json("/stats", first)
    metadata.serve("/task", "task.json")
    # WHEN sampled THEN 0, as KCL's first reading
    assert EcsCpu(metadata.uri, clock=ManualClock()).sample() == 0.0


def test_ecs_http_error_logs_once_and_returns_none(metadata: MetadataServer, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN an endpoint whose /stats answers 500
    metadata.serve_json("/stats", {"error": "boom"}, status=500)
    metadata.serve("/task", "task.json")
    metric = EcsCpu(metadata.uri, clock=ManualClock())
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    # WHEN sampled three times THEN None each time and a single warning line
    assert [metric.sample() for _ in range(3)] == [None, None, None]
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert "EcsCpu" in warnings[0].getMessage() and "\n" not in warnings[0].getMessage()


def test_ecs_bad_json_returns_none(metadata: MetadataServer) -> None:
    metadata.routes[metadata.prefix + "/stats"] = [(200, b"not json")]
    metadata.serve("/task", "task.json")
    assert EcsCpu(metadata.uri, clock=ManualClock()).sample() is None


def test_ecs_unreachable_endpoint_returns_none() -> None:
    # GIVEN a port nobody listens on (bind then close to get one)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metric = EcsCpu(f"http://127.0.0.1:{port}/v4/x", timeout=0.5, clock=ManualClock())
    # WHEN sampled THEN None, no exception
    assert metric.sample() is None


def test_ecs_http_get_is_injectable() -> None:
    # GIVEN an injected http_get that raises something unexpected
    def broken(url: str, timeout: float) -> bytes:
        raise RuntimeError("proxy exploded")

    # WHEN sampled THEN None (a provider never raises into the worker)
    assert EcsCpu("http://169.254.170.2/v4/x", http_get=broken, clock=ManualClock()).sample() is None


# --- psutil ----------------------------------------------------------------------------------------------------


class _Times(NamedTuple):
    user: float
    nice: float
    system: float
    idle: float
    iowait: float


def test_psutil_provider_with_injected_times() -> None:
    # GIVEN cpu_times moving by 30 s busy and 70 s idle
    readings = iter([_Times(100, 0, 50, 800, 50), _Times(120, 0, 60, 860, 60)])
    metric = PsutilCpu(clock=ManualClock(), cpu_times=lambda: next(readings))
    # WHEN sampled twice THEN 0 then 30 / 100 = 30 %
    assert metric.sample() == 0.0
    assert metric.sample() == pytest.approx(30.0)


def test_psutil_absent_degrades_to_none(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN psutil cannot be imported
    monkeypatch.setitem(sys.modules, "psutil", None)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    metric = PsutilCpu(clock=ManualClock())
    # WHEN sampled THEN None with one warning naming psutil, and the provider reports itself unavailable
    assert PsutilCpu.available() is False
    assert metric.sample() is None
    assert metric.sample() is None
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "psutil" in warnings[0].getMessage()


def test_psutil_real_path() -> None:
    # GIVEN the real psutil (a runtime dependency, installed in the venv)
    metric = PsutilCpu(clock=ManualClock())
    # WHEN sampled twice THEN a first 0 and then a value in range
    assert metric.sample() == 0.0
    value = metric.sample()
    assert value is not None and 0.0 <= value <= 100.0


# --- protocol and detection -----------------------------------------------------------------------------------


def test_providers_and_custom_metrics_satisfy_the_protocol(tmp_path: Path) -> None:
    class QueueDepth:
        name = "queue depth"
        code = "Q"
        operating_range_max = 80.0

        def sample(self) -> float | None:
            return 42.0

    for metric in (ProcStatCpu(tmp_path), CgroupV1Cpu(tmp_path), CgroupV2Cpu(tmp_path), PsutilCpu(), QueueDepth()):
        assert isinstance(metric, WorkerMetric)
    cpu = ProcStatCpu(tmp_path)
    assert (cpu.name, cpu.code, cpu.operating_range_max) == ("cpu", "C", 100.0)


def _proc_stat(root: Path) -> Path:
    path = root / "proc" / "stat"
    _install("proc_stat.1", path)
    return path


def test_detection_prefers_ecs_when_the_env_var_is_set(tmp_path: Path, metadata: MetadataServer) -> None:
    # GIVEN the ECS variable, a cgroup v2 tree and /proc/stat all present
    metadata.serve("/stats", "stats.1.json", "stats.2.json")
    metadata.serve("/task", "task.json")
    _cgroup_v2(tmp_path / "cg", "quota")
    found = detect_cpu_metric(
        {ECS_METADATA_ENV: metadata.uri},
        cgroup_root=tmp_path / "cg",
        proc_stat=_proc_stat(tmp_path),
        clock=ManualClock(),
    )
    # THEN ECS wins, and its probe primed the baseline: the next sample is the 50 % delta
    assert isinstance(found, EcsCpu)
    assert found.sample() == pytest.approx(50.0)


def test_detection_falls_through_when_ecs_fails(tmp_path: Path, metadata: MetadataServer) -> None:
    # GIVEN the ECS variable set but the endpoint failing, and a cgroup v2 tree
    metadata.serve_json("/stats", {}, status=503)
    _cgroup_v2(tmp_path / "cg", "quota")
    found = detect_cpu_metric({ECS_METADATA_ENV: metadata.uri}, cgroup_root=tmp_path / "cg", clock=ManualClock())
    # THEN cgroup v2
    assert isinstance(found, CgroupV2Cpu)


def test_detection_cgroup_v2_when_controllers_file_exists(tmp_path: Path) -> None:
    _cgroup_v2(tmp_path / "cg", "unlimited")
    found = detect_cpu_metric({}, cgroup_root=tmp_path / "cg", proc_stat=_proc_stat(tmp_path), clock=ManualClock())
    assert isinstance(found, CgroupV2Cpu)


def test_detection_cgroup_v1_without_controllers_file(tmp_path: Path) -> None:
    _cgroup_v1(tmp_path / "cg", "unlimited")
    found = detect_cpu_metric({}, cgroup_root=tmp_path / "cg", proc_stat=_proc_stat(tmp_path), clock=ManualClock())
    assert isinstance(found, CgroupV1Cpu)


def test_detection_proc_stat_when_no_cgroup_files(tmp_path: Path) -> None:
    found = detect_cpu_metric({}, cgroup_root=tmp_path / "cg", proc_stat=_proc_stat(tmp_path), clock=ManualClock())
    assert isinstance(found, ProcStatCpu)


def test_detection_psutil_when_nothing_else(tmp_path: Path) -> None:
    found = detect_cpu_metric({}, cgroup_root=tmp_path / "cg", proc_stat=tmp_path / "none", clock=ManualClock())
    assert isinstance(found, PsutilCpu)


def test_detection_none_without_psutil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN no ECS, no cgroup files, no /proc/stat and no psutil
    monkeypatch.setitem(sys.modules, "psutil", None)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    found = detect_cpu_metric({}, cgroup_root=tmp_path / "cg", proc_stat=tmp_path / "none", clock=ManualClock())
    # THEN None (throughput-only balancing), said in one warning and no per-provider warnings from probing
    assert found is None
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "throughput" in warnings[0].getMessage()


def test_detection_on_this_host_finds_something() -> None:
    # GIVEN the real host (cgroup v1 hybrid per toolchain notes, or anything else) WHEN detected with defaults
    found = detect_cpu_metric({})
    # THEN some provider, whose samples are in range
    assert found is not None
    value = found.sample()
    assert value is not None and 0.0 <= value <= 100.0


# --- capacity --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cpu_max", "cpus"), [("quota", 2.0), ("unlimited", 8.0)])
def test_available_cpus_is_the_cgroup_limit_when_the_metric_reads_one(
    tmp_path: Path, cpu_max: str, cpus: float
) -> None:
    # GIVEN a cgroup v2 metric limited to 2 CPUs by quota, or unlimited on a cpuset of 8
    _cgroup_v2(tmp_path, cpu_max)
    # WHEN the worker's capacity is asked THEN it is that limit
    assert available_cpus(CgroupV2Cpu(tmp_path, clock=ManualClock())) == cpus


def test_available_cpus_falls_back_to_the_cpus_the_process_may_use(tmp_path: Path) -> None:
    # GIVEN no metric, or a cgroup metric whose files are gone
    expected = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
    # WHEN the worker's capacity is asked THEN it is the CPUs this process may run on
    assert available_cpus(None) == expected
    assert available_cpus(CgroupV2Cpu(tmp_path / "gone", clock=ManualClock())) == expected
