"""Measure the DynamoDB calls and request units of both liveness modes, for the cost model in docs/deploy.md §5.

For each configuration (``--liveness lease|worker|both`` or ``lease,worker``, default both; ``--configs kcl`` adds
the KCL-timings baseline), run one after the other on one moto server at production timings, each on its own
application: W in-process workers (``--workers``, 2) holding the L leases of an L-shard stream (``--shards``, 8),
and the leader through the real Lambda handler, one invocation started every 60 s in its own thread as EventBridge
would (``lease``/``worker``: 80 s budget, 65 s term, so consecutive invocations overlap and hand over; ``kcl``: 60 s
budget, 50 s term). Configurations:

* ``lease`` — liveness mode ``lease``, the code's defaults (``SHARDLEASE_LIVENESS_MODE=lease``): every held lease
  renewed every 3.308 s; a worker heartbeat every second (an UpdateItem on the worker's own
  ``<app>-WorkerMetricStats`` row that returns the row as it was and removes the notice's key list, so it brings
  back the leader's assignment notice and consumes it in one step); GSI discovery as a 60 s safety net once a notice
  was seen; the mode re-read once a minute per worker; the leader's liveness tick (an eventually consistent Scan of
  the worker rows every second), fast assignment passes, notices, gone-worker confirmation reads, expiry
  observations kept in ``CoordinatorState``, the mode read at every full cycle, leader lock 10 s / 3 s heartbeat,
  the takeover wait of an overlapping invocation (one lock read every 0.5 s).
* ``worker`` — liveness mode ``worker`` (``SHARDLEASE_LIVENESS_MODE=worker`` for every worker and the leader; the
  bench records the mode before the fleet starts, as ``shardlease liveness --set worker`` does for a new
  application): no renewals — the heartbeat, every 2 s, is the only liveness write; a lease's ``throughputKBps`` is
  written only when it changed by more than a fifth (and 1 KBps), at most once a minute; hand-off requests go on the
  old owner's row; the leader judges heartbeating owners per owner. Everything else as ``lease``.
* ``kcl`` (not in the default run) — KCL timings in ``lease`` mode: the same code with
  :data:`kcl3_timings.KCL_ENV` (shared with bench/failover.py) for every worker and the leader (no heartbeat, no fast
  tick, GSI discovery every 9 975 ms per worker, lock 30 s / 10 s, no takeover wait; the 60 s Lambda timeout less the
  10 s margin makes a 50 s term): KCL 3.x's read pattern (leader scans every 20 s, per-worker GSI discovery), not
  KCL's Java code.

Lease-table scans are eventually consistent in all (as KCL 3.x's ``DynamoDBLeaseRefresher``, whose scans set no
``consistentRead``). No records flow: checkpoints are the user's rate, the same in both modes, and left out.

After a warm-up (``--warmup``, 70 s: past the first invocation, which leads its whole term without waiting for a
predecessor — every later one starts with the hand-over — all leases held and every worker row saying the mode it
runs in), every DynamoDB call in ``--minutes`` is counted per (configuration, role, table, operation, purpose) by
botocore hooks (``before-parameter-build`` keeps the request, ``after-call`` sees the parsed reply, also for
conditional-check failures, which are charged like writes). Request units are estimated from item sizes with
DynamoDB's rules: reads ⌈bytes/4 KB⌉ per call (strongly consistent; half for eventually consistent; at least one
unit), Scan/Query on the summed size of the items returned by the call; writes ⌈item size/1 KB⌉, for an UpdateItem
the larger of the item before and after the write (after: from ``ReturnValues=ALL_NEW``, or a consistent GetItem by
an uncounted client; before: from ``ReturnValues=ALL_OLD``, as the heartbeat returns). The window is then checked:
in ``worker`` mode no renewal at all and a heartbeat every 2 s per worker (1 s in ``lease``), and, read at the end,
the stored ``LivenessMode`` item and every worker row's ``lvm`` say the configuration's mode; a failed check fails
the run.

Rates per lease, per worker and per minute are extrapolated to every combination of 100 / 1 000 / 10 000 leases and
20 / 100 workers with the formulas printed by the script (and in docs/deploy.md), with lease items, GSI entries and
expiry-observation items measured at those sizes on moto, and worker rows as measured at the end of the run,
completed to their steady size (full metric histories, KCL-style 36-character worker ids, 7-digit counters).
Throughput updates (``worker`` mode) follow the traffic: none were measured without records, and steady traffic
keeps them rare; the worst case — every lease's throughput moving by more than a fifth every minute — adds one write
per lease per minute, and that ratio is printed beside the measured one.

Reads: ``worker`` mode must read no more than ``lease`` mode at every scale. The two configurations run one after
the other, so the leader's timed loops (liveness tick, takeover polls, cycles) can land one call more or less in the
window: a difference is flagged when some call reads more in ``worker`` mode than one more call per timed source in
the window explains (a call ``lease`` mode does not make at all is never explained so).

    .venv/bin/python bench/cost_model.py [--liveness lease|worker|both] [--configs kcl] [--workers 2] [--shards 8]
        [--minutes 2] [--warmup 70] [--json P]

The last two lines read ``writes per minute at 10000 leases/100 workers: lease A, worker B, ratio R×`` and
``writes per minute at 1000 leases/20 workers: lease A, worker B, ratio R×`` (A, B: calls per minute, whole;
R = A/B). Exit status 1 when R < 10 at 1 000/20 or < 50 at 10 000/100, when ``worker`` mode reads more than ``lease``
mode at some scale, or when a check of the window failed (each said on its own line before the last two).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import queue
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kcl3_timings import KCL_ENV

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import Checkpoint, Lease
from worker_lib.leases import serializer
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.mode import LivenessMode
from worker_lib.leases.mode_store import LivenessModeStore
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
from worker_lib.tables.state_store import CoordinatorStateStore, ExpiryObservationStore
from worker_lib.testing.emulators import start_moto
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig

# --- configurations ------------------------------------------------------------------------------------------

MODE_ENV = "SHARDLEASE_LIVENESS_MODE"
CONFIG_MODE = {"lease": LivenessMode.LEASE, "worker": LivenessMode.WORKER, "kcl": LivenessMode.LEASE}
CONFIG_ENV: dict[str, dict[str, str]] = {
    "lease": {MODE_ENV: LivenessMode.LEASE.value},
    "worker": {MODE_ENV: LivenessMode.WORKER.value},
    "kcl": {**KCL_ENV, MODE_ENV: LivenessMode.LEASE.value},
}
CONFIG_TITLE = {"lease": "lease mode", "worker": "worker mode", "kcl": "KCL timings"}
CONFIG_ALIASES = {"ours": "lease"}  # the name of the lease-mode configuration before liveness modes existed
LAMBDA_BUDGET_S = {"lease": 80.0, "worker": 80.0, "kcl": 60.0}  # the leader function's timeout per configuration
SCHEDULE_S = 60.0  # EventBridge rate(1 minute)
# Settings the bench controls: unset in every configuration unless it gives them (``environment``).
MANAGED_ENV = frozenset(
    {
        *KCL_ENV,
        MODE_ENV,
        "SHARDLEASE_LIVENESS_MODE_CHECK_MS",
        "SHARDLEASE_THROUGHPUT_UPDATE_INTERVAL_MS",
        "SHARDLEASE_FAILOVER_TIME_MS",
    }
)

# --- prices (us-east-1, on-demand; the same as docs/deploy.md §5) --------------------------------------------

PRICE_PER_WRU = 0.625 / 1e6
PRICE_PER_RRU = 0.125 / 1e6
PRICE_PER_GB_S = 0.0000133334  # Lambda arm64
PRICE_PER_REQUEST = 0.20 / 1e6  # Lambda requests
LAMBDA_GB = 0.25  # 256 MB
MINUTES_PER_MONTH = 43_200  # 30 days

SCALES: tuple[tuple[int, int], ...] = tuple((n, w) for n in (100, 1_000, 10_000) for w in (20, 100))
HEADLINE = (1_000, 20)  # the last line's scale
TARGET_RATIO = {(1_000, 20): 10.0, (10_000, 100): 50.0}  # lease ÷ worker writes per minute, at least
DETAIL_SCALES = ((1_000, 20), (10_000, 100))  # scales printed call by call (all scales are in the totals and JSON)
PARALLEL_SCAN_THRESHOLD = 1_000  # worker_lib.leader.assigner: above this, the assignment scan uses 4 segments
MAX_NOTICE_KEYS = 100  # worker_lib.workermetrics.stats_store: a notice names at most this many lease keys
PAGE_BYTES = 1024 * 1024  # Scan/Query page limit
READ_BLOCK = 4096
WRITE_BLOCK = 1024

READS = {"GetItem", "Scan", "Query", "BatchGetItem"}
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}

# Purpose of a call, from the functions on the calling thread's stack (first match in this order). A lock read by
# an acquire attempt while ``Leader.run`` is in a takeover wait is a "takeover poll" (see ``_purpose``).
PURPOSES: tuple[tuple[str, str], ...] = (
    ("DynamoDBLeaderLock.takeover_eta_s", "takeover ETA"),
    ("DynamoDBLeaderLock.current_leader", "lock holder read"),
    ("DynamoDBLeaderLock.try_acquire", "lock acquire"),
    ("DynamoDBLeaderLock.release", "lock release"),
    ("DynamoDBLeaderLock.heartbeat", "lock heartbeat"),
    ("KeptObservations.restore", "expiry obs. load"),
    ("KeptObservations.keep", "expiry obs. save"),
    # Liveness modes (docs/liveness-modes.md): the mode item, hand-off requests, throughput updates.
    ("LivenessModeStore.record_if_absent", "mode record"),
    ("LeaderModeKeeper.after_run", "mode switch"),
    ("LeaderModeKeeper.begin_run", "mode read"),
    ("ModeFollower.poll", "mode read"),
    ("ModeFollower.start", "mode read"),
    ("Worker._check_liveness_mode", "mode read"),
    ("WorkerMetricsStore.request_handoff", "handoff request"),
    ("LeaseHolder.handoff_requests", "handoff request read"),
    ("LeaseHolder.refresh_throughput", "throughput update"),
    ("DynamoDBLeaseStore.update_throughput", "throughput update"),
    ("LivenessWatch.confirm_gone", "gone confirmation"),
    ("LeaseAssigner._notify", "assignment notice"),
    ("LeaseCapRecorder.record", "lease cap"),
    ("WorkerRowSweeper.sweep_stale", "stale-row sweep"),
    ("WorkerRowSweeper.sweep_stopped", "stopped-row sweep"),
    ("DynamoDBLeaseStore.assign_lease", "assignment"),
    ("DynamoDBLeaseStore.initiate_graceful_handoff", "handoff"),
    ("DynamoDBLeaseStore.create_lease_if_absent", "lease creation"),
    ("DynamoDBLeaseStore.delete_lease", "lease deletion"),
    ("ShardSyncer.sync_once", "shard sync"),
    ("FastPath.tick", "liveness tick"),
    ("LivenessWatch.scan", "liveness tick"),  # the tick's read runs on its own thread
    ("LeaseAssigner.run", "full cycle"),
    ("HeartbeatLoop.beat", "heartbeat"),
    ("WorkerMetricsStore.put", "metrics report"),
    ("LeaseHolder.renew_all", "renewal"),
    ("DynamoDBLeaseStore.renew_lease", "renewal"),
    ("DynamoDBLeaseStore.evict_lease", "give up"),
    ("LeaseHolder.checkpoint", "checkpoint"),
    ("LeaseDiscoverer.discover_keys", "notice discovery"),
    ("LeaseDiscoverer.discover", "discovery"),
    ("LeaseHolder.take", "take"),
    ("Worker._on_release", "handoff notice"),
)
TAKEOVER_POLL = "takeover poll"


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


def _purpose(operation: str) -> str:
    names: set[str] = set()
    waiting = False  # Leader.run's local ``waiting_until``: set while an invocation waits for a hand-over
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        names.add(frame.f_code.co_qualname)
        if frame.f_code.co_qualname == "Leader.run":
            waiting = frame.f_locals.get("waiting_until") is not None
        frame = frame.f_back
    purpose = next((purpose for qualname, purpose in PURPOSES if qualname in names), "other")
    if purpose == "lock acquire" and waiting and operation in READS:
        return TAKEOVER_POLL
    return purpose


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
        # (key, table, item key, size of the item before the write if known): sized after the write
        self._sizing: queue.Queue[tuple[Key, str, dict[str, Any], int] | None] = queue.Queue()
        self._sizer_client = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint))
        self._sizer = threading.Thread(target=self._size_writes, name="cost-sizer", daemon=True)
        self._sizer.start()

    def client(self, service: str, endpoint: str, role: str) -> Any:
        client = aws.client(service, AwsConfig(endpoint_url=endpoint))

        def keep_params(params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
            context["cost_params"] = params
            context["cost_purpose"] = _purpose(model.name)

        def after_call(parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
            if self.active:
                self._record(
                    service,
                    role,
                    model.name,
                    params=context.get("cost_params") or {},
                    parsed=parsed,
                    purpose=str(context.get("cost_purpose", "other")),
                )

        client.meta.events.register("before-parameter-build", keep_params)
        client.meta.events.register("after-call", after_call)
        return client

    def _tally(self, key: Key) -> Tally:
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = Tally()
        return tally

    def _record(
        self, service: str, role: str, op: str, *, params: dict[str, Any], parsed: dict[str, Any], purpose: str
    ) -> None:
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
        returned = parsed.get("Attributes")
        if op == "PutItem":
            self._add_write(key, item_size(params.get("Item", {})))
        elif op == "UpdateItem" and returned and params.get("ReturnValues") == "ALL_NEW":
            self._add_write(key, item_size(returned))
        elif op == "UpdateItem":
            # Charged on the larger of the item before and after: the heartbeat returns the item before (ALL_OLD),
            # which holds the notice's key list it removes; the item after is read back.
            before = item_size(returned) if returned and params.get("ReturnValues") == "ALL_OLD" else 0
            self._sizing.put((key, str(params["TableName"]), dict(params["Key"]), before))
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
                key, table, item_key, before = job
                item = self._sizer_client.get_item(TableName=table, Key=item_key, ConsistentRead=True).get("Item")
                self._add_write(key, max(before, item_size(item) if item else 0))
            except Exception as exc:  # a sizing failure must not stop the count
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
    """One leader Lambda invocation: the packaged handler's :func:`~worker_lib.leader.lambda_handler.invoke` with
    counted clients (a cold container each time, as when the module was loaded afresh), a context with
    ``budget_s`` left. ``stop`` ends the leader's loop early (only used after the measurement, to end the run)."""
    from worker_lib.leader import lambda_handler
    from worker_lib.leader.factory import ClientCache, LeaderClients

    def counted_clients(cfg: AwsConfig) -> LeaderClients:  # count the leader's calls
        return LeaderClients(
            aws_config=cfg,
            dynamodb=recorder.client("dynamodb", endpoint, "leader"),
            kinesis=recorder.client("kinesis", endpoint, "leader"),
        )

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
        summary = lambda_handler.invoke(Context(), clients=ClientCache(counted_clients), stop=stop)
        invocation.led = bool(summary.get("leader"))
    finally:
        invocation.duration_s = time.monotonic() - invocation.started_s
        invocation.cut_short = stop.is_set()
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
        except Exception as exc:  # report, keep the schedule going
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


# --- item sizes at scale -------------------------------------------------------------------------------------

WORKER_ID_CHARS = 36  # a KCL-style UUID worker id, as the lease owners of measure_scale_inputs
COUNTER_DIGITS = 7  # hbc/evc after months of beats (2.6 million a month at one a second)


def steady_row_bytes(row: Mapping[str, Any]) -> int:
    """A worker row measured after a few minutes, at the size it keeps for good: without a notice's key list (the
    next beat removes it), every metric history full (``max_values`` window averages: the row measured holds only
    the reports of its first minutes; each missing value counted as the row's largest), a 36-character worker id,
    and 7-digit heartbeat and event counters; no hand-off requests either (the beat after one removes it)."""
    transient = (WorkerMetricsAttr.ASSIGNED_KEYS, WorkerMetricsAttr.HANDOFF_REQUESTS)  # removed by the next beat
    steady = {k: v for k, v in row.items() if k not in transient}
    steady[WorkerMetricsAttr.WORKER_ID] = {"S": "x" * WORKER_ID_CHARS}
    for name in (WorkerMetricsAttr.HEARTBEAT_COUNTER, WorkerMetricsAttr.EVENT_COUNTER):
        if name in steady:
            steady[name] = {"N": "1" * COUNTER_DIGITS}
    stats = steady.get(WorkerMetricsAttr.STATS, {}).get("M")
    if stats:
        full = WorkerMetricsConfig().max_values
        padded: dict[str, Any] = {}
        for code, history in stats.items():
            values = list(history.get("L", []))
            largest = max(values, key=value_size) if values else {"N": "99.99"}
            padded[code] = {"L": values + [largest] * max(0, full - len(values))}
        steady[WorkerMetricsAttr.STATS] = {"M": padded}
    return item_size(steady)


@dataclass
class ScaleInputs:
    """Measured on moto with realistic items (KCL-style UUID worker ids, 56-digit checkpoints, hash ranges)."""

    lease_bytes: float  # mean lease item
    gsi_entry_bytes: float  # mean GSI (KEYS_ONLY) entry returned by the discovery Query
    scan_pages_1000: int  # lease-table Scan pages at 1 000 leases
    scan_units_1000: float  # RRU of one eventually consistent lease-table Scan at 1 000 leases (as the leader's)
    gsi_units_1000_20: float  # RRU of one discovery Query at 1 000 leases / 20 workers (50 keys)
    observation_bytes: dict[int, int] = field(default_factory=dict)  # expiry-observation item at L leases


def measure_scale_inputs(endpoint: str) -> ScaleInputs:
    admin = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint))
    app = f"cost-scale-{uuid.uuid4().hex[:6]}"
    ensure_tables(app, admin)
    rng = random.Random(7)
    owners = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(20)]
    width = 2**128 // 1000
    leases = [
        Lease(
            lease_key=f"shardId-{n:012d}",
            lease_counter=rng.randint(10**5, 10**7),
            lease_owner=owners[n % len(owners)],
            checkpoint=Checkpoint(sequence=str(rng.randint(10**55, 10**56 - 1))),
            starting_hash_key=str(n * width),
            ending_hash_key=str((n + 1) * width - 1),
            throughput_kbps=round(rng.uniform(0, 1000), 6),
        )
        for n in range(1000)
    ]
    items = [serializer.to_item(lease) for lease in leases]
    for start in range(0, len(items), 25):
        batch = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        admin.batch_write_item(RequestItems={app: batch})
    pages, scan_units, scanned = 0, 0.0, 0
    kwargs: dict[str, Any] = {"TableName": app}  # eventually consistent, as DynamoDBLeaseStore's scans
    while True:
        response = admin.scan(**kwargs)
        nbytes = sum(item_size(item) for item in response["Items"])
        pages += 1
        scanned += nbytes
        scan_units += read_units(nbytes, consistent=False)
        if "LastEvaluatedKey" not in response:
            break
        kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
    response = admin.query(
        TableName=app,
        IndexName=LEASE_OWNER_INDEX.name,
        KeyConditionExpression="#o = :o",
        ExpressionAttributeNames={"#o": LeaseAttr.LEASE_OWNER},
        ExpressionAttributeValues={":o": {"S": owners[0]}},
    )
    entries = response["Items"]
    gsi_bytes = sum(item_size(item) for item in entries)
    observations = ExpiryObservationStore(CoordinatorStateStore(app, client=admin), max_clock_skew_ms=1000)
    sizes: dict[int, int] = {}
    now = time.time()
    for total in sorted({n for n, _ in SCALES}):
        observed = [(f"shardId-{n:012d}", rng.randint(10**5, 10**7), now - rng.uniform(0, 20)) for n in range(total)]
        observations.save(observed)
        item = admin.get_item(
            TableName=coordinator_state_table_name(app),
            Key={CoordinatorAttr.KEY: {"S": ExpiryObservationStore.KEY}},
            ConsistentRead=True,
        )["Item"]
        sizes[total] = item_size(item)
    return ScaleInputs(
        lease_bytes=scanned / len(items),
        gsi_entry_bytes=gsi_bytes / max(1, len(entries)),
        scan_pages_1000=pages,
        scan_units_1000=scan_units,
        gsi_units_1000_20=read_units(gsi_bytes, consistent=False),
        observation_bytes=sizes,
    )


# --- extrapolation -------------------------------------------------------------------------------------------


def verb(key: Key) -> str:
    return key[2].split()[0]


def consistent(key: Key) -> bool:
    return key[2].endswith(" SC")


def rule(key: Key) -> str:
    """How a call's rate and units scale with L leases and W workers (see :data:`FORMULAS`)."""
    role, table, _, purpose = key
    kind = verb(key)
    if table in ("kinesis", "other") or kind not in READS | WRITES:
        return "not DynamoDB data" if table == "kinesis" else "per minute"
    if role == "worker":
        if table == "lease GSI":
            return "GSI query"
        if table == "lease":
            return "per lease"
        return "row write" if table == "metrics" and kind in WRITES else "per worker"
    if table == "lease":
        return "lease scan" if kind == "Scan" else "per lease"
    if table == "metrics":
        if kind == "Scan":
            return "row scan"
        return "row write" if kind in WRITES else "per worker"
    if table == "state" and purpose.startswith("expiry obs"):
        return "observations"
    return "per minute"


FORMULAS = """\
Extrapolation to L leases / W workers (L0, W0 = measured; c = calls/min measured; u = RRU or WRU per call measured):
  per lease     calls = c·L/L0,  units/call = u (lease writes: ⌈b_l/1 KB⌉ WRU)  (renewals, throughput updates)
  per worker    calls = c·W/W0,  units/call = u  (a worker's mode re-read: one consistent GetItem a minute)
  row write     calls = c·W/W0,  WRU/call = ⌈b_w/1 KB⌉  (heartbeat, metrics report, hand-off request: a worker's row)
  GSI query     calls = c·W/W0,  RRU/call = ½·⌈(L/W)·b_k/4 KB⌉  (eventually consistent, KEYS_ONLY entries)
  lease scan    calls = c·s·⌈L·b_l/(s·1 MB)⌉,  RRU/scan = ½·s·⌈L·b_l/(s·4 KB)⌉ (eventually consistent, as KCL's);
                s = 4 segments for the assignment scan when L > 1 000, else 1 (shard sync always 1)
  row scan      calls = c,  RRU/call = ½·⌈W·b_w/4 KB⌉  (eventually consistent Scan of the worker rows)
  observations  calls = c,  PutItem ⌈o(L)/1 KB⌉ WRU, GetItem ⌈o(L)/4 KB⌉ RRU  (o(L): expiry-observation item)
  per minute    calls = c,  units = measured  (leader lock, lease-cap and mode items, takeover polls: independent
                of L, W)
  b_l: lease item, b_k: GSI entry, o(L): measured at scale on moto; b_w: the config's largest worker row measured
  at the end of the run, at its steady size (full metric histories, 36-character worker id, 7-digit counters; no
  notice list or hand-off requests: the beat after either removes it).
Throughput updates (worker mode) follow the traffic: as measured (none without records; rare under steady traffic),
  and in the worst case L·60 000/T calls of ⌈b_l/1 KB⌉ WRU (every lease's throughput moving by more than a fifth
  every T = throughput update interval, 60 s), in place of the measured ones.
Monthly: units/min × 43 200 min × price; Lambda: 43 200 invocations × billed s × 0.25 GB × $/GB-s + requests."""


def notice_list_bytes(keys: int) -> int:
    """The ``asl`` attribute naming ``keys`` lease keys of 20 characters (``shardId-000000000123``)."""
    return len(WorkerMetricsAttr.ASSIGNED_KEYS) + 3 + keys * (20 + 1)


def worker_row_bytes(result: ConfigResult) -> int:
    """``b_w``: the largest row of the run at its steady size; the same at every scale (a row holds only its own
    worker's figures, and no notice list between a notice and the beat that consumes it)."""
    return max(result.worker_row_bytes_steady or [0])


def notice_burst_wru(result: ConfigResult, leases: int, workers: int) -> float:
    """The one-off cost, per worker, of a notice naming its whole share at once (a fleet that started together,
    at most ``MAX_NOTICE_KEYS`` keys): the notice's UpdateItem and the beat that consumes it, each charged on the row
    with the list."""
    keys = min(leases // max(1, workers), MAX_NOTICE_KEYS)
    return 2 * write_units(worker_row_bytes(result) + notice_list_bytes(keys))


@dataclass(frozen=True)
class Scaled:
    calls: float
    units: float


def extrapolate(result: ConfigResult, key: Key, leases: int, workers: int, inputs: ScaleInputs) -> Scaled:
    calls, units = result.per_minute(key)
    per_call = units / calls if calls else 0.0
    kind = rule(key)
    lease_ratio, worker_ratio = leases / result.leases, workers / result.workers
    if kind == "per lease":
        if verb(key) in WRITES:
            per_call = write_units(int(inputs.lease_bytes))
        return Scaled(calls * lease_ratio, calls * lease_ratio * per_call)
    if kind == "per worker":
        return Scaled(calls * worker_ratio, calls * worker_ratio * per_call)
    if kind == "row write":  # heartbeat, metrics report (and a stopped-row delete): the worker's row
        return Scaled(calls * worker_ratio, calls * worker_ratio * write_units(worker_row_bytes(result)))
    if kind == "GSI query":
        entries = leases / workers * inputs.gsi_entry_bytes
        return Scaled(calls * worker_ratio, calls * worker_ratio * read_units(math.ceil(entries), consistent=False))
    if kind == "lease scan":
        segments = 4 if leases > PARALLEL_SCAN_THRESHOLD and key[3] != "shard sync" else 1
        segment_bytes = leases * inputs.lease_bytes / segments
        pages = segments * max(1, math.ceil(segment_bytes / PAGE_BYTES))
        scan_units = segments * read_units(math.ceil(segment_bytes), consistent=consistent(key))
        return Scaled(calls * pages, calls * scan_units)
    if kind == "row scan":
        nbytes = workers * worker_row_bytes(result)
        return Scaled(calls, calls * read_units(nbytes, consistent=consistent(key)))
    if kind == "observations":
        size = inputs.observation_bytes[leases]
        per_obs = write_units(size) if verb(key) in WRITES else read_units(size, consistent=consistent(key))
        return Scaled(calls, calls * per_obs)
    return Scaled(calls, units)


@dataclass
class Totals:
    read_calls: float = 0.0
    read_units: float = 0.0
    write_calls: float = 0.0
    write_units: float = 0.0

    def add(self, key: Key, calls: float, units: float) -> None:
        if verb(key) in READS:
            self.read_calls += calls
            self.read_units += units
        elif verb(key) in WRITES:
            self.write_calls += calls
            self.write_units += units

    @property
    def dynamodb_month(self) -> float:
        return (self.read_units * PRICE_PER_RRU + self.write_units * PRICE_PER_WRU) * MINUTES_PER_MONTH


def lambda_month(result: ConfigResult) -> float:
    return MINUTES_PER_MONTH * (result.billed_invocation_s * LAMBDA_GB * PRICE_PER_GB_S + PRICE_PER_REQUEST)


def scaled_totals(result: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> Totals:
    totals = Totals()
    for key in result.tallies:
        if rule(key) != "not DynamoDB data":
            scaled = extrapolate(result, key, leases, workers, inputs)
            totals.add(key, scaled.calls, scaled.units)
    return totals


def measured_totals(result: ConfigResult) -> Totals:
    totals = Totals()
    for key in result.tallies:
        totals.add(key, *result.per_minute(key))
    return totals


THROUGHPUT = "throughput update"


def worst_case_totals(result: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> Totals:
    """``worker`` mode with every lease's throughput rewritten as often as allowed (its value moving by more than a
    fifth every interval), in place of the throughput updates measured; other configurations as scaled."""
    totals = Totals()
    for key in result.tallies:
        if rule(key) != "not DynamoDB data" and key[3] != THROUGHPUT:
            scaled = extrapolate(result, key, leases, workers, inputs)
            totals.add(key, scaled.calls, scaled.units)
    if result.mode == LivenessMode.WORKER.value and result.heartbeat_ms:
        calls = leases * 60_000 / result.throughput_interval_ms
        totals.write_calls += calls
        totals.write_units += calls * write_units(int(inputs.lease_bytes))
    return totals


def timed_sources(result: ConfigResult, key: Key) -> int:
    """The timed loops that make ``key``'s calls: one per worker (per lease for a lease's calls), one per leader
    invocation that ran in the window."""
    kind = rule(key)
    if kind == "per lease":
        return result.leases
    if key[0] == "worker" or kind in ("per worker", "row write", "GSI query"):
        return result.workers
    return max(1, result.invocations_in_window)


def granularity(result: ConfigResult, key: Key, leases: int, workers: int, inputs: ScaleInputs) -> Scaled:
    """What one more call per timed source in the window would add at scale: the difference two runs of the same
    code can show, since their loops start at slightly different moments against the window's edges."""
    calls, _ = result.per_minute(key)
    if not calls:
        return Scaled(0.0, 0.0)
    scaled = extrapolate(result, key, leases, workers, inputs)  # linear in the measured calls
    factor = timed_sources(result, key) / result.minutes / calls
    return Scaled(scaled.calls * factor, scaled.units * factor)


@dataclass(frozen=True)
class ReadExcess:
    """A call that reads more in ``worker`` mode than in ``lease`` mode, at one scale."""

    key: Key
    lease: Scaled
    worker: Scaled
    allowance: Scaled

    @property
    def explained(self) -> bool:
        tiny = 1e-9
        return (
            self.worker.calls - self.lease.calls <= self.allowance.calls + tiny
            and self.worker.units - self.lease.units <= self.allowance.units + tiny
        )


@dataclass(frozen=True)
class Comparison:
    """``lease`` against ``worker`` mode at one scale."""

    leases: int
    workers: int
    lease: Totals
    worker: Totals
    worker_worst: Totals  # throughput of every lease rewritten every interval
    excesses: tuple[ReadExcess, ...]  # calls that read more in worker mode

    @property
    def ratio(self) -> float:
        return self.lease.write_calls / self.worker.write_calls if self.worker.write_calls else math.inf

    @property
    def unit_ratio(self) -> float:
        return self.lease.write_units / self.worker.write_units if self.worker.write_units else math.inf

    @property
    def worst_ratio(self) -> float:
        return self.lease.write_calls / self.worker_worst.write_calls if self.worker_worst.write_calls else math.inf

    @property
    def reads_more(self) -> bool:
        """Worker mode reads more calls or units in total (before asking whether the window's granularity explains
        it)."""
        tiny = 1e-9
        return (
            self.worker.read_calls > self.lease.read_calls + tiny
            or self.worker.read_units > self.lease.read_units + tiny
        )

    @property
    def unexplained(self) -> tuple[ReadExcess, ...]:
        return tuple(e for e in self.excesses if not e.explained)

    @property
    def reads_fail(self) -> bool:
        return self.reads_more and bool(self.unexplained)

    def reads_verdict(self) -> str:
        lt, wt = self.lease, self.worker
        figures = (
            f"worker mode {wt.read_calls:.1f} reads/min ({wt.read_units:.1f} RRU), lease mode {lt.read_calls:.1f} "
            f"({lt.read_units:.1f} RRU)"
        )
        if not self.reads_more:
            return f"reads OK: {figures}"
        if not self.unexplained:
            return (
                f"reads OK: {figures}; the difference is within one call per timed source in the window: "
                + ", ".join(f"{e.key[3]} +{e.worker.calls - e.lease.calls:.1f}" for e in self.excesses)
            )
        return f"READS HIGHER in worker mode: {figures}; " + "; ".join(
            f"{label(e.key)} {e.worker.calls:.1f} calls/{e.worker.units:.1f} RRU against {e.lease.calls:.1f}/"
            f"{e.lease.units:.1f} (one call more per timed source: +{e.allowance.calls:.1f}/+{e.allowance.units:.1f})"
            for e in self.unexplained
        )


def compare(lease: ConfigResult, worker: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> Comparison:
    excesses = []
    for key in ordered_keys([lease, worker]):
        if verb(key) not in READS:
            continue
        in_lease = key in lease.tallies
        l_scaled = extrapolate(lease, key, leases, workers, inputs) if in_lease else Scaled(0.0, 0.0)
        w_scaled = extrapolate(worker, key, leases, workers, inputs) if key in worker.tallies else Scaled(0.0, 0.0)
        if w_scaled.calls > l_scaled.calls or w_scaled.units > l_scaled.units:
            # A call lease mode does not make at all is never explained by the window's granularity.
            allowance = granularity(lease, key, leases, workers, inputs) if in_lease else Scaled(0.0, 0.0)
            excesses.append(ReadExcess(key, l_scaled, w_scaled, allowance))
    return Comparison(
        leases=leases,
        workers=workers,
        lease=scaled_totals(lease, leases, workers, inputs),
        worker=scaled_totals(worker, leases, workers, inputs),
        worker_worst=worst_case_totals(worker, leases, workers, inputs),
        excesses=tuple(excesses),
    )


def calls_of(result: ConfigResult, *, role: str, op: str, purpose: str) -> int:
    return sum(t.calls for k, t in result.tallies.items() if k[0] == role and verb(k) == op and k[3] == purpose)


def window_checks(result: ConfigResult) -> tuple[list[str], list[str]]:
    """What the window shows about the mode the configuration ran in: (lines to print, failures)."""
    title = CONFIG_TITLE[result.name]
    lines: list[str] = []
    failures: list[str] = []
    renewals = calls_of(result, role="worker", op="UpdateItem", purpose="renewal")
    beats = calls_of(result, role="worker", op="UpdateItem", purpose="heartbeat")
    throughput = calls_of(result, role="worker", op="UpdateItem", purpose=THROUGHPUT)
    per_lease = renewals / result.leases / result.minutes
    per_worker = beats / result.workers / result.minutes
    lines.append(
        f"{title:<12} stored mode {result.stored_mode!r}; worker rows say {result.row_modes}; renewals "
        f"{renewals} ({per_lease:.2f} per lease per min); heartbeats {beats} ({per_worker:.2f} per worker per min"
        + (f", one every {60 / per_worker:.2f} s" if per_worker else "")
        + f"); throughput updates {throughput}"
    )
    if result.stored_mode != result.mode:
        failures.append(f"{title}: the LivenessMode item says {result.stored_mode!r}, not {result.mode!r}")
    if result.mode == LivenessMode.WORKER.value and renewals:
        failures.append(f"{title}: {renewals} renewal UpdateItems in the window (none expected in worker mode)")
    if result.heartbeat_ms:
        expected = 60_000 / result.heartbeat_ms
        # A beat more or less per worker at the window's edges, and 5 % for the loop's drift.
        tolerance = 1 / result.minutes + 0.05 * expected
        if abs(per_worker - expected) > tolerance:
            failures.append(
                f"{title}: {per_worker:.2f} heartbeats per worker per minute, expected {expected:.0f} (one every "
                f"{result.heartbeat_ms / 1000:g} s)"
            )
        if len(result.row_modes) < result.workers or any(m != result.mode for m in result.row_modes):
            failures.append(f"{title}: worker rows say {result.row_modes}, not all {result.mode!r}")
    return lines, failures


def headline(comparison: Comparison) -> str:
    """The run's summary line at one scale (the last line of the output at 1 000/20)."""
    return (
        f"writes per minute at {comparison.leases} leases/{comparison.workers} workers: lease "
        f"{round(comparison.lease.write_calls)}, worker {round(comparison.worker.write_calls)}, ratio "
        f"{comparison.ratio:.1f}×"
    )


# --- report --------------------------------------------------------------------------------------------------


def label(key: Key) -> str:
    role, table, op, purpose = key
    return f"{role} {table} {op} [{purpose}]"


def rate(result: ConfigResult, key: Key) -> str:
    calls, _ = result.per_minute(key)
    kind = rule(key)
    if kind == "per lease":
        return f"{calls / result.leases:.2f}/lease"
    if kind in ("per worker", "row write", "GSI query"):
        return f"{calls / result.workers:.2f}/worker"
    return f"{calls:.2f}/min"


def ordered_keys(results: list[ConfigResult], *, dynamodb: bool = True) -> list[Key]:
    keys = {key for result in results for key in result.tallies}
    keys = {key for key in keys if (rule(key) != "not DynamoDB data") == dynamodb}
    return sorted(keys, key=lambda k: (k[0] != "leader", k[1], k[2], k[3]))


def print_report(results: list[ConfigResult], inputs: ScaleInputs) -> None:
    names = [CONFIG_TITLE[r.name] for r in results]
    print()
    print("== measured, per minute (calls, request units = RRU for reads / WRU for writes, rate per lease/worker) ==")
    header = f"{'role table operation [purpose]':<58} {'scaling':<12}"
    for name in names:
        header += f" | {name + ' calls':>17} {'units':>7} {'rate':>14}"
    print(header)
    for key in ordered_keys(results):
        line = f"{label(key):<58} {rule(key):<12}"
        for result in results:
            if key in result.tallies:
                calls, units = result.per_minute(key)
                failed = result.tallies[key].failed
                mark = f"({failed} cond.fail)" if failed else ""
                line += f" | {mark + f'{calls:.1f}':>17} {units:>7.1f} {rate(result, key):>14}"
            else:
                line += f" | {'—':>17} {'—':>7} {'':>14}"
        print(line)
    for result in results:
        t = measured_totals(result)
        print(
            f"{CONFIG_TITLE[result.name]:<12} measured total: reads {t.read_calls:.1f} calls/min = {t.read_units:.1f} "
            f"RRU/min; writes {t.write_calls:.1f} calls/min = {t.write_units:.1f} WRU/min "
            f"({result.workers} workers, {result.leases} leases; held {result.held_at_start} at start, "
            f"{result.held_at_end} at end; {result.minutes:g} min)"
        )
    for result in results:
        kinesis = {key: result.per_minute(key)[0] for key in ordered_keys([result], dynamodb=False)}
        parts = ", ".join(f"{k[0]} {k[2]} {v:.1f}" for k, v in kinesis.items())
        print(f"{CONFIG_TITLE[result.name]:<12} Kinesis calls/min (no per-call charge): {parts}")
        durations = ", ".join(
            f"{i.duration_s:.1f}{'' if i.led else ' (not leader)'}{' (cut short)' if i.cut_short else ''}"
            for i in sorted(result.invocations, key=lambda i: i.started_s)
        )
        print(f"{CONFIG_TITLE[result.name]:<12} leader invocations (s): {durations}")

    print()
    print("== sizes ==")
    for result in results:
        print(
            f"{CONFIG_TITLE[result.name]:<12} lease items "
            f"{min(result.lease_item_bytes)}–{max(result.lease_item_bytes)} B; worker rows "
            f"{min(result.worker_row_bytes)}–{max(result.worker_row_bytes)} B as measured "
            f"({result.rows_with_notice} holding a notice list at the end); b_w at steady size "
            f"{worker_row_bytes(result)} B"
        )
    print(
        f"at scale: lease item b_l = {inputs.lease_bytes:.0f} B (lease Scan at 1 000 leases: {inputs.scan_pages_1000}"
        f" page(s), {inputs.scan_units_1000:.0f} RRU); GSI entry b_k = {inputs.gsi_entry_bytes:.0f} B (discovery "
        f"Query at 1 000/20: {inputs.gsi_units_1000_20:g} RRU); expiry-observation item o(L) = "
        + ", ".join(f"{size} B at L = {total}" for total, size in inputs.observation_bytes.items())
    )
    for result in results:
        scans = ", ".join(
            f"{w} × {worker_row_bytes(result)} B = {w * worker_row_bytes(result)} B → "
            f"{read_units(w * worker_row_bytes(result), consistent=False):g} RRU at W = {w}"
            for w in sorted({w for _, w in SCALES})
        )
        print(f"{CONFIG_TITLE[result.name]:<12} worker-row Scan (EC): {scans}")
        if any(key[3] == "heartbeat" for key in result.tallies):
            bursts = ", ".join(
                f"{notice_burst_wru(result, n, w):g} WRU per worker at {n}/{w}" for n, w in DETAIL_SCALES
            )
            print(
                f"{CONFIG_TITLE[result.name]:<12} one-off, per change: a notice naming a worker's whole share "
                f"(L/W keys, ≤ {MAX_NOTICE_KEYS}) and the beat that consumes it: {bursts}"
            )
    print()
    print(FORMULAS)

    for leases, workers in DETAIL_SCALES:
        print()
        print(f"== extrapolated to {leases} leases / {workers} workers, per minute ==")
        header = f"{'role table operation [purpose]':<58}"
        for name in names:
            header += f" | {name + ' calls':>17} {'units':>9}"
        print(header)
        for key in ordered_keys(results):
            cells = []
            for result in results:
                if key in result.tallies:
                    s = extrapolate(result, key, leases, workers, inputs)
                    cells.append(f" | {s.calls:>17.1f} {s.units:>9.1f}")
                else:
                    cells.append(f" | {'—':>17} {'—':>9}")
            print(f"{label(key):<58}" + "".join(cells))

    print()
    print(
        "== totals per scale, per minute (on-demand, us-east-1: $0.125 per million RRU, $0.625 per million WRU; "
        "Lambda arm64 256 MB $0.0000133334 per GB-s + $0.20 per million requests; 30-day month) =="
    )
    by_name = {r.name: r for r in results}
    for leases, workers in SCALES:
        print()
        print(f"-- {leases} leases / {workers} workers --")
        print(
            f"{'config':<14} {'reads/min':>10} {'RRU/min':>9} {'writes/min':>11} {'WRU/min':>9} "
            f"{'reads $/mo':>11} {'writes $/mo':>12} {'Lambda $/mo':>12} {'total $/mo':>11}"
        )
        for result in results:
            t = scaled_totals(result, leases, workers, inputs)
            lam = lambda_month(result)
            print(
                f"{CONFIG_TITLE[result.name]:<14} {t.read_calls:>10.0f} {t.read_units:>9.0f} {t.write_calls:>11.0f} "
                f"{t.write_units:>9.0f} {t.read_units * PRICE_PER_RRU * MINUTES_PER_MONTH:>11.2f} "
                f"{t.write_units * PRICE_PER_WRU * MINUTES_PER_MONTH:>12.2f} {lam:>12.2f} "
                f"{t.dynamodb_month + lam:>11.2f}"
            )
        if "lease" in by_name and "worker" in by_name:
            c = compare(by_name["lease"], by_name["worker"], leases, workers, inputs)
            w = c.worker_worst
            worst_month = w.dynamodb_month + lambda_month(by_name["worker"])
            print(
                f"{'worker, worst':<14} {w.read_calls:>10.0f} {w.read_units:>9.0f} {w.write_calls:>11.0f} "
                f"{w.write_units:>9.0f} {w.read_units * PRICE_PER_RRU * MINUTES_PER_MONTH:>11.2f} "
                f"{w.write_units * PRICE_PER_WRU * MINUTES_PER_MONTH:>12.2f} {lambda_month(by_name['worker']):>12.2f} "
                f"{worst_month:>11.2f}   (worst case: every lease's throughput rewritten every minute)"
            )
            month = {
                name: scaled_totals(r, leases, workers, inputs).dynamodb_month + lambda_month(r)
                for name, r in by_name.items()
            }
            print(
                f"lease ÷ worker: writes {c.ratio:.1f}×, WRU {c.unit_ratio:.1f}×, total $ "
                f"{month['lease'] / month['worker']:.1f}×; worst case writes {c.worst_ratio:.1f}×"
            )
            print(c.reads_verdict())
    for result in results:
        print(
            f"{CONFIG_TITLE[result.name]:<12} Lambda: {result.billed_invocation_s:.1f} s billed per invocation "
            f"(mean of full invocations), {MINUTES_PER_MONTH} invocations per month"
        )


def scaled_summary(result: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> dict[str, Any]:
    totals = scaled_totals(result, leases, workers, inputs)
    lam = lambda_month(result)
    summary: dict[str, Any] = {**asdict(totals), "dynamodb_month": totals.dynamodb_month, "total_month": 0.0}
    summary["total_month"] = totals.dynamodb_month + lam
    if result.mode == LivenessMode.WORKER.value and result.heartbeat_ms:
        worst = worst_case_totals(result, leases, workers, inputs)
        summary["worst_case"] = {**asdict(worst), "dynamodb_month": worst.dynamodb_month}
    return summary


def comparison_summary(c: Comparison) -> dict[str, Any]:
    return {
        "lease_writes": c.lease.write_calls,
        "worker_writes": c.worker.write_calls,
        "ratio": c.ratio,
        "unit_ratio": c.unit_ratio,
        "worst_case_worker_writes": c.worker_worst.write_calls,
        "worst_case_ratio": c.worst_ratio,
        "lease_reads": c.lease.read_calls,
        "lease_read_units": c.lease.read_units,
        "worker_reads": c.worker.read_calls,
        "worker_read_units": c.worker.read_units,
        "reads_more": c.reads_more,
        "reads_fail": c.reads_fail,
        "read_excesses": [
            {
                "key": list(e.key),
                "lease": asdict(e.lease),
                "worker": asdict(e.worker),
                "allowance": asdict(e.allowance),
                "explained": e.explained,
            }
            for e in c.excesses
        ],
        "target_ratio": TARGET_RATIO.get((c.leases, c.workers)),
    }


def dump_json(
    path: str,
    results: list[ConfigResult],
    inputs: ScaleInputs,
    meta: Mapping[str, Any],
    *,
    comparisons: list[Comparison],
    failures: list[str],
) -> None:
    def tallies(result: ConfigResult) -> list[dict[str, Any]]:
        return [
            {"key": list(key), "rule": rule(key), **asdict(tally)}
            for key, tally in sorted(result.tallies.items(), key=lambda kv: kv[0])
        ]

    payload = {
        "meta": dict(meta),
        "scale_inputs": asdict(inputs),
        "configs": {
            r.name: {
                **{k: v for k, v in asdict(r).items() if k != "tallies"},
                "tallies": tallies(r),
                "billed_invocation_s": r.billed_invocation_s,
                "lambda_month": lambda_month(r),
                "scaled": {f"{n}/{w}": scaled_summary(r, n, w, inputs) for n, w in SCALES},
            }
            for r in results
        },
        "comparison": {f"{c.leases}/{c.workers}": comparison_summary(c) for c in comparisons},
        "failures": failures,
    }
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")


def chosen_configs(liveness: str | None, configs: str | None) -> list[str]:
    """``--liveness`` (lease, worker, both or lease,worker) and ``--configs`` (lease, worker, kcl; ``ours`` = lease)
    together; neither given: both modes. In measuring order: lease, worker, kcl."""
    chosen: set[str] = set()
    for given in (liveness or "").replace("|", ",").split(","):
        mode = given.strip()
        if mode == "both":
            chosen |= {"lease", "worker"}
        elif mode in ("lease", "worker"):
            chosen.add(mode)
        elif mode:
            raise ValueError(f"unknown liveness mode {mode!r}: use lease, worker, both (or lease,worker)")
    for given in (configs or "").split(","):
        name = CONFIG_ALIASES.get(given.strip(), given.strip())
        if name:
            if name not in CONFIG_ENV:
                raise ValueError(f"unknown configuration {name!r}: use lease, worker, kcl")
            chosen.add(name)
    if not chosen:
        chosen = {"lease", "worker"}
    return [name for name in CONFIG_ENV if name in chosen]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--liveness",
        help=(
            "the liveness mode(s) to measure, side by side in one run: lease, worker, both (= lease,worker; the "
            "default unless --configs names some)"
        ),
    )
    parser.add_argument(
        "--configs", help="comma-separated, added to --liveness: lease, worker, kcl (KCL timings, lease mode)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=2.0, help="measured minutes per configuration")
    parser.add_argument(
        "--warmup",
        type=float,
        default=70.0,
        help=(
            "seconds before counting: past the first invocation (a term without a predecessor), all leases held, and "
            "past the workers' first throughput check (60 s), which writes once each lease taken with none stored"
        ),
    )
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()
    try:
        configs = chosen_configs(args.liveness, args.configs)
    except ValueError as exc:
        parser.error(str(exc))
    first_check_s = LeaseConfig().throughput_update_interval_ms / 1000
    if "worker" in configs and args.warmup <= first_check_s:
        print(
            f"note: a warm-up of {args.warmup:g} s ends before the workers' first throughput check ({first_check_s:g} "
            "s), which writes each lease taken with no throughput stored once: the window may count those writes"
        )
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(
        f"run {started:%Y-%m-%d %H:%M} UTC; configurations {', '.join(configs)}; load average before "
        f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} on {os.cpu_count()} CPUs"
    )
    moto = start_moto()
    try:
        results = [
            run_config(
                name,
                moto.endpoint_url,
                workers=args.workers,
                shards=args.shards,
                minutes=args.minutes,
                warmup_s=args.warmup,
            )
            for name in configs
        ]
        inputs = measure_scale_inputs(moto.endpoint_url)
    finally:
        moto.stop()
    load_after = os.getloadavg()
    print_report(results, inputs)
    elapsed = datetime.datetime.now(datetime.timezone.utc) - started
    print(
        f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
        f"run took {elapsed.total_seconds() / 60:.1f} min"
    )

    print()
    print("== checks of the measured window ==")
    failures: list[str] = []
    for result in results:
        lines, failed = window_checks(result)
        for line in lines:
            print(line)
        failures += failed
    by_name = {r.name: r for r in results}
    comparisons: list[Comparison] = []
    if "lease" in by_name and "worker" in by_name:
        comparisons = [compare(by_name["lease"], by_name["worker"], n, w, inputs) for n, w in SCALES]
        print()
        print("== lease ÷ worker mode, per minute ==")
        print(
            f"{'scale':<11} {'lease writes':>12} {'worker writes':>13} {'ratio':>7} {'target':>7} "
            f"{'worst case':>11} {'lease reads (RRU)':>18} {'worker reads (RRU)':>19}  reads"
        )
        for c in comparisons:
            target = TARGET_RATIO.get((c.leases, c.workers))
            reads = "HIGHER" if c.reads_fail else ("within granularity" if c.reads_more else "not higher")
            print(
                f"{f'{c.leases}/{c.workers}':<11} {c.lease.write_calls:>12.0f} {c.worker.write_calls:>13.0f} "
                f"{c.ratio:>6.1f}× {'' if target is None else f'≥ {target:g}×':>7} {c.worst_ratio:>10.1f}× "
                f"{f'{c.lease.read_calls:.0f} ({c.lease.read_units:.0f})':>18} "
                f"{f'{c.worker.read_calls:.0f} ({c.worker.read_units:.0f})':>19}  {reads}"
            )
            if target is not None and c.ratio < target:
                failures.append(
                    f"ratio {c.ratio:.1f}× at {c.leases} leases/{c.workers} workers is below the target {target:g}×"
                )
            if c.reads_fail:
                failures.append(f"at {c.leases} leases/{c.workers} workers: {c.reads_verdict()}")
        measured = calls_of(by_name["worker"], role="worker", op="UpdateItem", purpose=THROUGHPUT)
        print(
            "worst case: every lease's throughput rewritten every minute, in place of the throughput updates "
            f"measured ({measured} in the window, without records; steady traffic rewrites it rarely)"
        )
    if args.json:
        meta = {"started": started.isoformat(), "load_before": load_before, "load_after": load_after, **vars(args)}
        dump_json(args.json, results, inputs, meta, comparisons=comparisons, failures=failures)
    print()
    for failure in failures:
        print(f"FAILED: {failure}")
    if not comparisons:
        print("(the writes ratio needs both liveness modes: run with --liveness both)")
        return 1 if failures else 0
    by_scale = {(c.leases, c.workers): c for c in comparisons}
    print(headline(by_scale[(10_000, 100)]))
    print(headline(by_scale[HEADLINE]))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
