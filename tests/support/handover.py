"""Support for the hand-over chaos tests (tests/chaos/test_handover_chaos.py).

* :class:`HangingShutdownProcessor` — the chaos journal processor whose ``shutdown_requested`` journals its
  ``SHUTDOWN`` line and then hangs for ``$SHARDLEASE_HANDOVER_HANG_S`` seconds (0: does not hang), so a worker
  announces its departure and then never finishes it;
* :class:`InProcessLeader` — the production leader loop on a thread of the test process, on a DynamoDB client of
  its own (where faults are injected), in the liveness mode given, keeping every cycle report with its time;
* :class:`OwnerLog` — polls the lease table from a thread and keeps every owner change it saw (to tell whether the
  leader gave a departing worker anything);
* :func:`throttle_worker_rows_scans` — answers the Scans of ``<app>-WorkerMetricStats`` made by one DynamoDB client
  with ProvisionedThroughputExceededException: only the leader's fast-path reads (``LivenessWatch.read``), or every
  Scan of that table; counts each API call with its time and origin.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from botocore.awsrequest import AWSResponse, HTTPHeaders

from tests.support.chaos import ChaosProcessor, RawBody
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.factory import LeaderParts, build_leader
from worker_lib.leader.leader import CycleReport
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.processing.processor import ShutdownRequestedInput
from worker_lib.shardsync.config import ShardSyncConfig

HANGING_PROCESSOR = "tests.support.handover:HangingShutdownProcessor"
HANG_ENV = "SHARDLEASE_HANDOVER_HANG_S"


# --- the processor (runs inside `shardlease worker`) --------------------------------------------------------------


class HangingShutdownProcessor(ChaosProcessor):
    """:class:`~tests.support.chaos.ChaosProcessor`, except that ``shutdown_requested`` hangs (after journaling
    ``SHUTDOWN``) for ``$SHARDLEASE_HANDOVER_HANG_S`` seconds before it checkpoints."""

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self._append([self._line(input.shard_id, "SHUTDOWN")])
        hang_s = float(os.environ.get(HANG_ENV, "0") or "0")
        if hang_s > 0:
            time.sleep(hang_s)  # a flush that never returns: the worker said DEPARTING and now hangs
        input.checkpointer.checkpoint()


class InProcessLeader:
    """:func:`~worker_lib.leader.factory.build_leader` run on a thread (as ``shardlease leader`` runs it), on its own
    DynamoDB client ``self.ddb`` (``aws.max_attempts`` as given: botocore retries that many times after the first
    attempt). ``reports`` holds (monotonic time, report) for every cycle and fast pass."""

    def __init__(
        self,
        *,
        app: str,
        stream: str,
        aws_config: AwsConfig,
        kinesis: Any,
        owner: str,
        cycle_ms: int,
        lock: LeaderLockConfig,
        failover_ms: int,
        liveness: str = "lease",
    ) -> None:
        self.owner = owner
        self.cycle_s = cycle_ms / 1000
        self.ddb = aws.client("dynamodb", aws_config)
        self.parts: LeaderParts = build_leader(
            app=app,
            stream=stream,
            aws_config=aws_config,
            shard_sync=ShardSyncConfig(initial_position=InitialPosition.TRIM_HORIZON, interval_ms=1000),
            owner=owner,
            leader_config=LeaderConfig(cycle_interval_ms=cycle_ms),
            lock_config=lock,
            assignment=AssignmentConfig(worker_report_interval_s=1.0),
            lease_config=LeaseConfig(failover_time_ms=failover_ms, liveness_mode=liveness),
            dynamodb=self.ddb,
            kinesis=kinesis,
        )
        self.reports: list[tuple[float, CycleReport]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"leader-{owner}", daemon=True)

    def _run(self) -> None:
        self.parts.leader.run(stop=self._stop, on_cycle=lambda r: self.reports.append((time.monotonic(), r)))

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the loop (it finishes the cycle in flight and releases the lock); False if it did not finish within
        ``timeout_s`` — by default the liveness bound of one cycle interval."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(hang_bound_s(self.cycle_s) if timeout_s is None else timeout_s)
        return not self._thread.is_alive()

    def between(self, start: float, end: float) -> list[CycleReport]:
        return [r for t, r in self.reports if start <= t <= end]

    def full_cycle_times(self, start: float, end: float) -> list[float]:
        return [t for t, r in self.reports if start <= t <= end and r.leader and not r.fast]


# --- lease owners -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnerChange:
    t: float  # monotonic time of the poll that saw it
    lease_key: str
    before: str | None
    after: str | None


class OwnerLog:
    """Polls ``store.list_leases()`` every ``step_s`` from a thread and keeps each ``leaseOwner`` change."""

    def __init__(self, store: DynamoDBLeaseStore, *, step_s: float = 0.25) -> None:
        self._store = store
        self._step_s = step_s
        self.changes: list[OwnerChange] = []
        self.owners: dict[str, str | None] = {}
        self.polls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owner-log", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                leases = self._store.list_leases()
            except Exception:
                self.errors += 1
            else:
                now = time.monotonic()
                for lease in leases:
                    before = self.owners.get(lease.lease_key)
                    if lease.lease_key in self.owners and before != lease.lease_owner:
                        self.changes.append(OwnerChange(now, lease.lease_key, before, lease.lease_owner))
                    self.owners[lease.lease_key] = lease.lease_owner
                self.polls += 1
            self._stop.wait(self._step_s)

    def owned_by(self, worker_id: str) -> set[str]:
        return {key for key, owner in dict(self.owners).items() if owner == worker_id}

    def given_to(self, worker_id: str, *, after: float) -> list[OwnerChange]:
        """Changes that made ``worker_id`` the owner of a lease, seen after ``after``."""
        return [c for c in self.changes if c.after == worker_id and c.t > after]

    def __enter__(self) -> OwnerLog:
        self._thread.start()
        eventually(lambda: self.polls > 0, bound_s=hang_bound_s(self._step_s), what="the lease table could not be read")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=hang_bound_s(self._step_s))


# --- throttling the leader's reads of the worker rows -----------------------------------------------------------------


def _from_fast_read(frame: FrameType | None) -> bool:
    """Whether the call stack holds the leader's fast-path read (``LivenessWatch.read`` in leader/fast_path.py)."""
    suffix = os.path.join("leader", "fast_path.py")
    while frame is not None:
        if frame.f_code.co_name == "read" and frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


@dataclass
class ScanThrottle:
    """Scans of one table through one client: API calls by origin (monotonic times, each call counted once however
    often botocore retries it), and attempts answered with throttling while ``active`` is set."""

    table: str
    fast_only: bool
    active: threading.Event = field(default_factory=threading.Event)
    fast_calls: list[float] = field(default_factory=list)
    other_calls: list[float] = field(default_factory=list)
    throttled: int = 0

    def fast_between(self, start: float, end: float) -> list[float]:
        return [t for t in self.fast_calls if start <= t <= end]

    def other_between(self, start: float, end: float) -> list[float]:
        return [t for t in self.other_calls if start <= t <= end]


def _table_of(body: Any) -> str | None:
    if not body:
        return None
    try:
        request = json.loads(body)
    except (TypeError, ValueError):
        return None
    table = request.get("TableName") if isinstance(request, dict) else None
    return str(table) if table is not None else None


@contextmanager
def throttle_worker_rows_scans(client: Any, table: str, *, fast_only: bool) -> Iterator[ScanThrottle]:
    """While ``throttle.active`` is set, answer Scans of ``table`` made through ``client`` with
    ProvisionedThroughputExceededException (HTTP 400; botocore retries within its budget, then raises) — only
    those from the leader's fast path if ``fast_only``, else every one. Calls are counted whether active or not."""
    throttle = ScanThrottle(table=table, fast_only=fast_only)

    def before_call(params: Any, **_: Any) -> None:
        if not isinstance(params, dict) or params.get("TableName") != table:
            return
        calls = throttle.fast_calls if _from_fast_read(inspect.currentframe()) else throttle.other_calls
        calls.append(time.monotonic())

    def before_send(request: Any, **_: Any) -> AWSResponse | None:
        if not throttle.active.is_set() or _table_of(request.body) != table:
            return None
        if fast_only and not _from_fast_read(inspect.currentframe()):
            return None
        throttle.throttled += 1
        code = "ProvisionedThroughputExceededException"
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": f"injected {code}"})
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/x-amz-json-1.0"
        return AWSResponse(request.url, 400, headers, RawBody(body.encode()))

    uid = f"handover-throttle-{id(throttle)}"
    client.meta.events.register_first("before-parameter-build.dynamodb.Scan", before_call, unique_id=uid + "-call")
    client.meta.events.register_first("before-send.dynamodb.Scan", before_send, unique_id=uid + "-send")
    try:
        yield throttle
    finally:
        throttle.active.clear()
        with contextlib.suppress(Exception):
            client.meta.events.unregister("before-parameter-build.dynamodb.Scan", unique_id=uid + "-call")
            client.meta.events.unregister("before-send.dynamodb.Scan", unique_id=uid + "-send")
