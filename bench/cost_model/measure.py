"""One configuration, measured: its own application and tables on the shared moto server, a fleet of in-process
workers, the leader on its schedule, a warm-up, then the counted window and the checks' raw material.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.mode import LivenessMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.processing.processor import FunctionProcessor
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import WorkerMetricsAttr, worker_metrics_table_name
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig

from .configs import CONFIG_ENV, CONFIG_MODE, LAMBDA_BUDGET_S, MANAGED_ENV
from .counting import Key, Recorder, Tally
from .scale import steady_row_bytes
from .schedule import Invocation, Schedule
from .sizes import item_size


@dataclass
class ConfigResult:
    name: str
    workers: int
    leases: int
    minutes: float
    tallies: dict[Key, Tally]
    invocations: list[Invocation]
    lease_item_bytes: list[int]
    worker_row_bytes: list[int]  # as measured at the end of the run
    worker_row_bytes_steady: list[int]  # the same rows at their steady size (steady_row_bytes)
    rows_with_notice: int  # rows that still held a notice's key list at the end (consumed by the next beat)
    held_at_start: int
    held_at_end: int
    mode: str  # the liveness mode configured for every worker and the leader
    heartbeat_ms: int  # the workers' beat interval in that mode (0: no heartbeat)
    throughput_interval_ms: int  # worker mode: a lease's throughput is rewritten at most this often
    stored_mode: str | None = None  # the LivenessMode item at the end ("worker", "lease, switching to worker", ...)
    row_modes: list[str | None] = field(default_factory=list)  # each worker row's ``lvm`` at the end
    window_s: tuple[float, float] = (0.0, 0.0)  # the measured window, monotonic seconds

    @property
    def invocations_in_window(self) -> int:
        """Leader invocations that ran during the window (each runs its own timed loops)."""
        start, end = self.window_s
        return sum(1 for i in self.invocations if i.started_s < end and i.started_s + i.duration_s > start)

    def per_minute(self, key: Key) -> tuple[float, float]:
        tally = self.tallies[key]
        return tally.calls / self.minutes, tally.units / self.minutes

    @property
    def billed_invocation_s(self) -> float:
        full = [i.duration_s for i in self.invocations if i.led and not i.cut_short]
        return sum(full) / len(full) if full else float("nan")


BASE_ENV: dict[str, str] = {
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "bench",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
    "SHARDLEASE_PER_WORKER_METRICS": "false",
}


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` (read by ``WorkerConfig.from_env`` and the handler), every KCL override unset
    unless given; the previous environment afterwards."""
    names = set(values) | MANAGED_ENV
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def scan_all(client: Any, table: str, *, consistent: bool = True) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": consistent}
    while True:
        response = client.scan(**kwargs)
        items.extend(response.get("Items", []))
        if "LastEvaluatedKey" not in response:
            return items
        kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]


def wait_until_held(fleet: list[Worker], shards: int, timeout_s: float) -> int:
    """Wait until the workers hold every lease between them (each at least one, if it can); the number held."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = [len(worker.held_leases) for worker in fleet]
        if sum(held) >= shards and (shards < len(fleet) or min(held) >= 1):
            return sum(held)
        if time.monotonic() >= deadline:
            print(f"  warning: only {sum(held)} of {shards} leases held after the warm-up", file=sys.stderr)
            return sum(held)
        time.sleep(0.5)


def worker_row_modes(admin: Any, app: str) -> list[str | None]:
    """Each worker row's ``lvm`` (the mode its worker says it runs in), read by the uncounted client."""
    rows = scan_all(admin, worker_metrics_table_name(app))
    return [row.get(WorkerMetricsAttr.LIVENESS_MODE, {}).get("S") for row in rows]


def wait_until_modes(admin: Any, app: str, mode: LivenessMode, workers: int, timeout_s: float) -> list[str | None]:
    """Wait until every worker row says it runs in ``mode`` (what the leader judges by); the rows' modes."""
    deadline = time.monotonic() + timeout_s
    while True:
        modes = worker_row_modes(admin, app)
        if len(modes) >= workers and all(m == mode.value for m in modes):
            return modes
        if time.monotonic() >= deadline:
            print(f"  warning: worker rows say {modes} after the warm-up, not all {mode.value}", file=sys.stderr)
            return modes
        time.sleep(0.5)


def run_config(name: str, endpoint: str, *, workers: int, shards: int, minutes: float, warmup_s: float) -> ConfigResult:
    app = f"cost-{name}-{uuid.uuid4().hex[:6]}"  # each configuration on its own application (and tables)
    stream = f"{app}-s"
    admin = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint))
    ensure_tables(app, admin)
    create_stream(aws.client("kinesis", AwsConfig(endpoint_url=endpoint)), stream, shards)
    mode = CONFIG_MODE[name]
    # Recorded before the fleet starts, as `shardlease liveness --set` does for a new application (else the first
    # leader records it and the workers, which renew until they know, follow at their next re-read within 60 s).
    modes = LivenessModeStore(CoordinatorStateStore(app, client=admin))
    modes.record_if_absent(mode, by="bench")
    recorder = Recorder(endpoint, app)
    env = {
        **BASE_ENV,
        "SHARDLEASE_APP": app,
        "SHARDLEASE_STREAM": stream,
        "SHARDLEASE_ENDPOINT_URL": endpoint,
        **CONFIG_ENV[name],
    }
    started = time.monotonic()
    print(
        f"[{name}] {workers} workers, {shards} shards, leader Lambda budget {LAMBDA_BUDGET_S[name]:.0f} s", flush=True
    )
    with environment(env):
        lease_config = LeaseConfig.from_env()
        heartbeat_ms = lease_config.heartbeat_interval_for(mode) if lease_config.heartbeat_enabled else 0
        fleet: list[Worker] = []
        schedule = Schedule(recorder, endpoint, LAMBDA_BUDGET_S[name])
        try:
            for n in range(workers):
                worker = Worker(
                    WorkerConfig.from_env(worker_id=f"cost-{name}-w{n}"),
                    lambda: FunctionProcessor(lambda records, checkpointer: None),
                    dynamodb=recorder.client("dynamodb", endpoint, "worker"),
                    kinesis=recorder.client("kinesis", endpoint, "worker"),
                )
                worker.start()
                fleet.append(worker)
            schedule.start()
            time.sleep(warmup_s)
            held_at_start = wait_until_held(fleet, shards, timeout_s=60.0)
            if heartbeat_ms:
                wait_until_modes(admin, app, mode, workers, timeout_s=lease_config.mode_check_interval_ms / 1000 + 10)
            print(f"[{name}] warm after {time.monotonic() - started:.0f} s; measuring {minutes:g} min", flush=True)
            recorder.active = True
            window_start = time.monotonic()
            time.sleep(minutes * 60)
            tallies = recorder.snapshot()
            window_end = time.monotonic()
            held_at_end = sum(len(worker.held_leases) for worker in fleet)
            lease_items = scan_all(admin, app)
            rows = scan_all(admin, worker_metrics_table_name(app))
            stored = modes.read()
        finally:
            schedule.close()
            for worker in fleet:
                worker.shutdown(timeout_s=10)
            recorder.close()
    print(f"[{name}] done in {time.monotonic() - started:.0f} s", flush=True)
    return ConfigResult(
        name=name,
        workers=workers,
        leases=shards,
        minutes=minutes,
        tallies=tallies,
        invocations=list(schedule.invocations),
        lease_item_bytes=[item_size(item) for item in lease_items],
        worker_row_bytes=[item_size(row) for row in rows],
        worker_row_bytes_steady=[steady_row_bytes(row) for row in rows],
        rows_with_notice=sum(WorkerMetricsAttr.ASSIGNED_KEYS in row for row in rows),
        held_at_start=held_at_start,
        held_at_end=held_at_end,
        mode=mode.value,
        heartbeat_ms=heartbeat_ms,
        throughput_interval_ms=lease_config.throughput_update_interval_ms,
        stored_mode=None if stored is None else stored.describe(),
        row_modes=[row.get(WorkerMetricsAttr.LIVENESS_MODE, {}).get("S") for row in rows],
        window_s=(window_start, window_end),
    )
