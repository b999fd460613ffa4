"""Measure the DynamoDB calls and request units of both configurations, for the cost model in docs/deploy.md §5.

For each configuration (``--configs ours,kcl``, run one after the other on one moto server, production timings):
W in-process workers (``--workers``, 2) holding the L leases of an L-shard stream (``--shards``, 8), and the
leader through the real Lambda handler, one invocation started every 60 s in its own thread as EventBridge would
(``ours``: 80 s budget, 65 s term, so consecutive invocations overlap and hand over; ``kcl``: 60 s budget, 50 s
term). Configurations:

* ``ours`` — the code's defaults: worker heartbeat every second (an UpdateItem on the worker's own
  ``<app>-WorkerMetricStats`` row that also brings back the leader's assignment notice), GSI discovery as a 30 s
  safety net, the leader's liveness tick (an eventually consistent Scan of the worker rows every second), fast
  assignment passes, notices, gone-worker confirmation reads, expiry observations kept in ``CoordinatorState``,
  leader lock 10 s / 3 s heartbeat, the takeover wait of an overlapping invocation (lock polled every 0.25 s).
* ``kcl`` — KCL timings: the same code with :data:`KCL_ENV` for every worker and the leader (no heartbeat, no fast
  tick, GSI discovery every 9 975 ms per worker, lock 30 s / 10 s, no takeover wait, 50 s term): KCL 3.x's read
  pattern (leader scans every 20 s, per-worker GSI discovery), not KCL's Java code.

After a warm-up (all leases held), every DynamoDB call in ``--minutes`` is counted per (configuration, role,
table, operation, purpose) by botocore hooks (``before-parameter-build`` keeps the request, ``after-call`` sees the
parsed reply, also for conditional-check failures, which are charged like writes). Request units are estimated
from item sizes with DynamoDB's rules: reads ⌈bytes/4 KB⌉ per call (strongly consistent; half for eventually
consistent; at least one unit), Scan/Query on the summed size of the items returned by the call; writes ⌈item
size/1 KB⌉ (the item after the write: from ``ReturnValues``, the written item, or a consistent GetItem by an
uncounted client). Rates per lease, per worker and per minute are then extrapolated to 1 000 leases / 20 workers
and 10 000 leases / 100 workers with the formulas printed by the script (and in docs/deploy.md), with lease items,
GSI entries and expiry-observation items measured at those sizes on moto.

    .venv/bin/python bench/cost_model.py [--configs ours,kcl] [--workers 2] [--shards 8] [--minutes 2] [--json P]

The last line reads ``reads per minute at 1000 leases/20 workers: ours R1 (U1 units), KCL timings R2 (U2 units)``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import math
import os
import queue
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worker_lib import aws
from worker_lib.config import AwsConfig
from worker_lib.leader.state_store import CoordinatorStateStore, ExpiryObservationStore
from worker_lib.leases import serializer
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.local.emulators import start_moto
from worker_lib.local.streams import create_stream
from worker_lib.models import Checkpoint, Lease
from worker_lib.processing.processor import FunctionProcessor
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import (
    LEASE_OWNER_INDEX,
    CoordinatorAttr,
    LeaseAttr,
    WorkerMetricsAttr,
    coordinator_state_table_name,
    worker_metrics_table_name,
)
from worker_lib.worker import Worker, WorkerConfig

# --- configurations ------------------------------------------------------------------------------------------

KCL_ENV: dict[str, str] = {
    "SHARDLEASE_HEARTBEAT_INTERVAL_MS": "0",  # no worker heartbeat
    "SHARDLEASE_LEADER_FAST_TICK_MS": "0",  # no leader reads between full cycles
    "SHARDLEASE_DISCOVERY_INTERVAL_MS": "9975",  # KCL's GSI discovery interval
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "30000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "10000",
    "SHARDLEASE_LEADER_TAKEOVER_WAIT_MS": "0",
    "SHARDLEASE_LEADER_TERM_MS": "50000",
}
CONFIG_ENV: dict[str, dict[str, str]] = {"ours": {}, "kcl": KCL_ENV}
CONFIG_TITLE = {"ours": "ours", "kcl": "KCL timings"}
LAMBDA_BUDGET_S = {"ours": 80.0, "kcl": 60.0}  # the leader function's timeout per configuration
SCHEDULE_S = 60.0  # EventBridge rate(1 minute)

# --- prices (us-east-1, on-demand; the same as docs/deploy.md §5) --------------------------------------------

PRICE_PER_WRU = 0.625 / 1e6
PRICE_PER_RRU = 0.125 / 1e6
PRICE_PER_GB_S = 0.0000133334  # Lambda arm64
PRICE_PER_REQUEST = 0.20 / 1e6  # Lambda requests
LAMBDA_GB = 0.25  # 256 MB
MINUTES_PER_MONTH = 43_200  # 30 days

SCALES: tuple[tuple[int, int], ...] = ((1_000, 20), (10_000, 100))
PARALLEL_SCAN_THRESHOLD = 1_000  # worker_lib.leader.assigner: above this, the assignment scan uses 4 segments
MAX_NOTICE_KEYS = 100  # worker_lib.metrics.stats_store: a notice names at most this many lease keys
PAGE_BYTES = 1024 * 1024  # Scan/Query page limit
READ_BLOCK = 4096
WRITE_BLOCK = 1024

READS = {"GetItem", "Scan", "Query", "BatchGetItem"}
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}

# Purpose of a call, from the functions on the calling thread's stack (first match in this order).
PURPOSES: tuple[tuple[str, str], ...] = (
    ("DynamoDBLeaderLock.takeover_eta_s", "takeover poll"),
    ("DynamoDBLeaderLock.current_leader", "lock holder read"),
    ("DynamoDBLeaderLock.try_acquire", "lock acquire"),
    ("DynamoDBLeaderLock.release", "lock release"),
    ("DynamoDBLeaderLock.heartbeat", "lock heartbeat"),
    ("LeaseAssigner._restore_observations", "expiry obs. load"),
    ("LeaseAssigner._keep_observations", "expiry obs. save"),
    ("LivenessWatch.confirm_gone", "gone confirmation"),
    ("LeaseAssigner._notify", "assignment notice"),
    ("LeaseCapRecorder.record", "lease cap"),
    ("LeaseAssigner._sweep_stale_workers", "stale-row sweep"),
    ("ShardSyncer.sync_once", "shard sync"),
    ("FastPath.tick", "liveness tick"),
    ("LeaseAssigner.run", "full cycle"),
    ("HeartbeatLoop.beat", "heartbeat"),
    ("WorkerMetricsStore.put", "metrics report"),
    ("LeaseHolder.renew_all", "renewal"),
    ("LeaseHolder.checkpoint", "checkpoint"),
    ("LeaseDiscoverer.discover_keys", "notice discovery"),
    ("LeaseDiscoverer.discover", "discovery"),
    ("LeaseHolder.take", "take"),
)


# --- item sizes (DynamoDB's rules) -------------------------------------------------------------------------------


def number_size(raw: str) -> int:
    """A number: 1 byte per two significant digits, plus 1."""
    digits = raw.lstrip("+-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    return math.ceil(max(1, len(digits)) / 2) + 1


def value_size(value: Mapping[str, Any]) -> int:
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return number_size(str(raw))
    if kind == "B":
        return len(raw) if isinstance(raw, (bytes, bytearray)) else len(str(raw).encode())
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(x).encode()) for x in raw)
    if kind == "NS":
        return sum(number_size(str(x)) for x in raw)
    if kind == "BS":
        return sum(len(x) for x in raw)
    if kind == "L":
        return 3 + sum(value_size(x) + 1 for x in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in raw.items())
    return len(json.dumps(raw, default=str))


def item_size(item: Mapping[str, Any]) -> int:
    """DynamoDB's item size: attribute names (UTF-8) plus values."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def read_units(nbytes: int, *, consistent: bool) -> float:
    units = max(1, math.ceil(nbytes / READ_BLOCK))
    return float(units) if consistent else units / 2


def write_units(nbytes: int) -> float:
    return float(max(1, math.ceil(nbytes / WRITE_BLOCK)))


# --- counting ------------------------------------------------------------------------------------------------

Key = tuple[str, str, str, str]
"""(role, table, operation, purpose); reads carry their consistency in the operation ("Scan SC", "Query EC")."""


@dataclass
class Tally:
    calls: int = 0
    failed: int = 0  # conditional-check failures (charged as writes)
    units: float = 0.0
    items: int = 0  # items returned by reads
    read_bytes: int = 0  # their summed size
    write_bytes: int = 0  # summed size of the items written (as sized)


def _purpose() -> str:
    names: set[str] = set()
    frame = sys._getframe(2)
    while frame is not None:
        names.add(frame.f_code.co_qualname)
        frame = frame.f_back  # type: ignore[assignment]
    return next((purpose for qualname, purpose in PURPOSES if qualname in names), "other")


class Recorder:
    """Counts the calls of every client it instruments while ``active``; sizes writes on a background thread."""

    def __init__(self, endpoint: str, app: str) -> None:
        self.tables = {
            app: "lease",
            worker_metrics_table_name(app): "metrics",
            coordinator_state_table_name(app): "state",
        }
        self.active = False
        self.tallies: dict[Key, Tally] = {}
        self._lock = threading.Lock()
        self._sizing: queue.Queue[tuple[Key, str, dict[str, Any]] | None] = queue.Queue()
        self._sizer_client = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint))
        self._sizer = threading.Thread(target=self._size_writes, name="cost-sizer", daemon=True)
        self._sizer.start()

    def client(self, service: str, endpoint: str, role: str) -> Any:
        client = aws.client(service, AwsConfig(endpoint_url=endpoint))

        def keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
            context["cost_params"] = params
            context["cost_purpose"] = _purpose()

        def after_call(parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
            if self.active:
                self._record(service, role, model.name, context.get("cost_params") or {}, parsed, context)

        client.meta.events.register("before-parameter-build", keep_params)
        client.meta.events.register("after-call", after_call)
        return client

    def _tally(self, key: Key) -> Tally:
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = Tally()
        return tally

    def _record(
        self, service: str, role: str, op: str, params: dict[str, Any], parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        purpose = str(context.get("cost_purpose", "other"))
        if service != "dynamodb":
            with self._lock:
                self._tally((role, service, op, purpose)).calls += 1
            return
        table = self.tables.get(str(params.get("TableName", "")), "other")
        if op == "Query" and params.get("IndexName"):
            table += " GSI"
        if table == "state" and purpose == "other":
            purpose = str(params.get("Key", {}).get(CoordinatorAttr.KEY, {}).get("S", "other"))
        failed = "Error" in parsed
        if op in READS:
            consistent = bool(params.get("ConsistentRead")) and not params.get("IndexName")
            op_label = f"{op} {'SC' if consistent else 'EC'}"
            items = parsed.get("Items") or ([parsed["Item"]] if parsed.get("Item") else [])
            nbytes = sum(item_size(item) for item in items)
            with self._lock:
                tally = self._tally((role, table, op_label, purpose))
                tally.calls += 1
                tally.items += len(items)
                tally.read_bytes += nbytes
                tally.units += read_units(nbytes, consistent=consistent)
            return
        key = (role, table, op, purpose)
        with self._lock:
            tally = self._tally(key)
            tally.calls += 1
            tally.failed += int(failed)
        if op not in WRITES:
            return  # control plane (DescribeTable): no request units
        if op == "PutItem":
            self._add_write(key, item_size(params.get("Item", {})))
        elif op == "UpdateItem" and parsed.get("Attributes") and params.get("ReturnValues") == "ALL_NEW":
            self._add_write(key, item_size(parsed["Attributes"]))
        elif op == "UpdateItem":
            self._sizing.put((key, str(params["TableName"]), dict(params["Key"])))
        else:
            self._add_write(key, 0)  # DeleteItem: the minimum (our deletes are of items < 1 KB)

    def _add_write(self, key: Key, nbytes: int) -> None:
        with self._lock:
            tally = self._tally(key)
            tally.units += write_units(nbytes)
            tally.write_bytes += nbytes

    def _size_writes(self) -> None:
        while True:
            job = self._sizing.get()
            try:
                if job is None:
                    return
                key, table, item_key = job
                item = self._sizer_client.get_item(TableName=table, Key=item_key, ConsistentRead=True).get("Item")
                self._add_write(key, item_size(item) if item else 0)
            except Exception as exc:  # noqa: BLE001 - a sizing failure must not stop the count
                print(f"  (could not size a write: {exc})", file=sys.stderr)
                if job is not None:
                    self._add_write(job[0], 0)
            finally:
                self._sizing.task_done()

    def snapshot(self) -> dict[Key, Tally]:
        self.active = False
        self._sizing.join()
        with self._lock:
            return {key: Tally(**asdict(tally)) for key, tally in self.tallies.items()}

    def close(self) -> None:
        self._sizing.put(None)


# --- the leader Lambda, on a schedule ------------------------------------------------------------------------


@dataclass
class Invocation:
    started_s: float
    duration_s: float = 0.0
    led: bool = False
    cut_short: bool = False  # stopped by the bench at the end of the run (not billed as a full invocation)


def invoke_handler(n: int, recorder: Recorder, endpoint: str, budget_s: float, stop: threading.Event) -> Invocation:
    """One leader Lambda invocation: the handler module loaded from its file (as today), its cached clients
    replaced by counted ones, a context with ``budget_s`` left. ``stop`` ends the leader's loop early (only used
    after the measurement, to end the run)."""
    path = Path(__file__).resolve().parents[1] / "functions" / "leader" / "handler.py"
    spec = importlib.util.spec_from_file_location(f"bench_cost_leader_{n}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module._get_clients = lambda cfg: module._Clients(  # count the leader's calls
        aws_config=cfg,
        dynamodb=recorder.client("dynamodb", endpoint, "leader"),
        kinesis=recorder.client("kinesis", endpoint, "leader"),
    )
    real_build = module.build_leader

    def build_leader(**kwargs: Any) -> Any:
        parts = real_build(**kwargs)
        parts.leader.run = functools.partial(parts.leader.run, stop=stop)
        return parts

    module.build_leader = build_leader

    class Context:
        function_name = "bench-leader"
        memory_limit_in_mb = 256
        invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:bench-leader"

        def __init__(self) -> None:
            self.aws_request_id = str(uuid.uuid4())
            self.deadline = time.monotonic() + budget_s

        def get_remaining_time_in_millis(self) -> int:
            return max(0, int((self.deadline - time.monotonic()) * 1000))

    invocation = Invocation(started_s=time.monotonic())
    try:
        summary = module.handler({"source": "aws.events"}, Context())
        invocation.led = bool(summary.get("leader"))
    finally:
        invocation.duration_s = time.monotonic() - invocation.started_s
        invocation.cut_short = stop.is_set()
        sys.modules.pop(spec.name, None)
    return invocation


class Schedule:
    """Starts one invocation every :data:`SCHEDULE_S` seconds, each in its own thread (they may overlap)."""

    def __init__(self, recorder: Recorder, endpoint: str, budget_s: float) -> None:
        self.invocations: list[Invocation] = []
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start = functools.partial(invoke_handler, recorder=recorder, endpoint=endpoint, budget_s=budget_s)
        self._thread = threading.Thread(target=self._run, name="cost-schedule", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            thread = threading.Thread(target=self._invoke, args=(n,), name=f"cost-leader-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
            n += 1
            next_at += SCHEDULE_S
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def _invoke(self, n: int) -> None:
        try:
            self.invocations.append(self._start(n, stop=self.stop))
        except Exception as exc:  # noqa: BLE001 - report, keep the schedule going
            print(f"  leader invocation {n} raised: {exc!r}", file=sys.stderr)

    def close(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        self._thread.join(timeout_s)
        for thread in self._threads:
            thread.join(timeout_s)


# --- one configuration -------------------------------------------------------------------------------------


@dataclass
class ConfigResult:
    name: str
    workers: int
    leases: int
    minutes: float
    tallies: dict[Key, Tally]
    invocations: list[Invocation]
    lease_item_bytes: list[int]
    worker_row_bytes: list[int]
    worker_row_bytes_without_notice: list[int]
    held_at_start: int
    held_at_end: int

    def per_minute(self, key: Key) -> tuple[float, float]:
        tally = self.tallies[key]
        return tally.calls / self.minutes, tally.units / self.minutes

    @property
    def billed_invocation_s(self) -> float:
        full = [i.duration_s for i in self.invocations if i.led and not i.cut_short]
        return sum(full) / len(full) if full else float("nan")

