"""Helpers for the heartbeat and fast-path tests (docs/failover.md): stand-in workers that beat on a shared
:class:`ManualClock`, sinks that are slow or fail, a worker-metrics store whose scans can be throttled, and a
recorder of the heartbeat writes a client sends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.awsrequest import AWSResponse, HTTPHeaders

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import ThrottledError
from worker_lib.core.models import Lease, WorkerMetricStats, WorkerState
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.heartbeat import HeartbeatSink
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


class SlowSink:
    """A heartbeat sink whose reply takes ``delay_s`` on the (manual) clock: the write lands, the reply is late."""

    def __init__(self, inner: HeartbeatSink, clock: ManualClock) -> None:
        self._inner = inner
        self._clock = clock
        self.delay_s = 0.0

    def heartbeat(self, worker_id: str, **beat: Any) -> WorkerMetricStats | None:
        row = self._inner.heartbeat(worker_id, **beat)
        self._clock.advance(self.delay_s)
        return row


class FlakySink:
    """A heartbeat sink that raises :class:`ThrottledError` while ``failing`` is set."""

    def __init__(self, inner: HeartbeatSink) -> None:
        self._inner = inner
        self.failing = False

    def heartbeat(self, worker_id: str, **beat: Any) -> WorkerMetricStats | None:
        if self.failing:
            raise ThrottledError("heartbeat throttled (injected)")
        return self._inner.heartbeat(worker_id, **beat)


class ThrottledRows:
    """The worker-metrics store as the leader's fast path reads it, with scans that fail while ``throttled``."""

    def __init__(self, inner: WorkerMetricsStore) -> None:
        self._inner = inner
        self.throttled = False
        self.scans = 0
        self.after_next_scan: Callable[[], None] | None = None
        """Run once, right after the next scan read the table (something that happens between the read and its use)."""

    def list_all(self, *, consistent: bool = False) -> list[WorkerMetricStats]:
        self.scans += 1
        if self.throttled:
            raise ThrottledError("worker-metrics scan throttled (injected)")
        rows = self._inner.list_all(consistent=consistent)
        then, self.after_next_scan = self.after_next_scan, None
        if then is not None:
            then()
        return rows

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        return self._inner.get(worker_id)

    def declare_gone(self, worker_id: str, counter: int) -> bool:
        return self._inner.declare_gone(worker_id, counter)

    def certify_declarations(self, worker_id: str) -> bool:
        return self._inner.certify_declarations(worker_id)


@dataclass
class StandInWorker:
    """A worker reduced to its writes: heartbeats on its own row and renewals of the leases it owns."""

    worker_id: str
    rows: WorkerMetricsStore
    leases: DynamoDBLeaseStore
    state: WorkerState = WorkerState.ACTIVE
    events: int = 0
    beating: bool = True
    renewing: bool = True
    beats: int = 0
    liveness: str | None = None  # what its beats say it runs in (``lvm``); None: an older worker
    done_requests: tuple[str, ...] = ()

    def beat(self) -> WorkerMetricStats | None:
        self.beats += 1
        return self.rows.heartbeat(
            self.worker_id,
            interval_ms=1_000,
            state=self.state,
            events=self.events,
            liveness=self.liveness,
            done_requests=self.done_requests,
        )

    def renew(self) -> int:
        """Renew every lease this worker owns (or checkpoint-owns); the number renewed."""
        renewed = 0
        for lease in self.leases.list_leases():
            if lease.actual_owner == self.worker_id and self.leases.renew_lease(lease, self.worker_id) is not None:
                renewed += 1
        return renewed

    def step(self) -> None:
        """One second of this worker's life: a beat (if beating) and renewals (if renewing)."""
        if self.beating:
            self.beat()
        if self.renewing:
            self.renew()


@dataclass
class Fleet:
    """Stand-in workers sharing one manual clock; :meth:`advance` moves time a second at a time, each worker
    doing what it does every second."""

    clock: ManualClock
    workers: dict[str, StandInWorker] = field(default_factory=dict)

    def add(self, worker: StandInWorker) -> StandInWorker:
        self.workers[worker.worker_id] = worker
        return worker

    def step(self) -> None:
        for worker in self.workers.values():
            worker.step()

    def advance(self, seconds: float, *, each_second: Callable[[], None] | None = None) -> None:
        whole = int(seconds)
        for _ in range(whole):
            self.clock.advance(1.0)
            self.step()
            if each_second is not None:
                each_second()
        if seconds > whole:
            self.clock.advance(seconds - whole)


class LivingClock(ManualClock):
    """A manual clock that runs ``on_second`` each time it crosses a whole second: the world (stand-in workers)
    moves while a component under test sleeps on this clock."""

    def __init__(self, *, monotonic: float = 1_000.0, wall: float = 1_700_000_000.0) -> None:
        super().__init__(monotonic=monotonic, wall=wall)
        self.on_second: Callable[[], None] | None = None
        self._in_hook = threading.Lock()

    def advance(self, seconds: float) -> None:
        before = int(self.monotonic())
        super().advance(seconds)
        crossed = int(self.monotonic()) - before
        hook = self.on_second
        if hook is None or crossed <= 0 or not self._in_hook.acquire(blocking=False):
            return
        try:
            for _ in range(crossed):
                hook()
        finally:
            self._in_hook.release()


class HeartbeatWrites:
    """Every UpdateItem a boto3 client sends, in order, as ``(table, wst or None, lease owner removed?)``."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[str, str | None, bool]] = []
        self._guard = threading.Lock()
        client.meta.events.register("provide-client-params.dynamodb.UpdateItem", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        values = params.get("ExpressionAttributeValues") or {}
        state = values.get(":wst", {}).get("S")
        expression = str(params.get("UpdateExpression", ""))
        removed = expression.split("REMOVE ", 1)[1].split(" ADD ", 1)[0] if "REMOVE " in expression else ""
        removes_owner = "#leaseOwner" in (name.strip() for name in removed.split(","))
        with self._guard:
            self.calls.append((str(params.get("TableName")), state, removes_owner))

    def states(self) -> list[str]:
        with self._guard:
            return [state for _, state, _ in self.calls if state is not None]

    def first_index(self, predicate: Callable[[tuple[str, str | None, bool]], bool]) -> int:
        with self._guard:
            return next((i for i, call in enumerate(self.calls) if predicate(call)), -1)

    def last_index(self, predicate: Callable[[tuple[str, str | None, bool]], bool]) -> int:
        with self._guard:
            return max((i for i, call in enumerate(self.calls) if predicate(call)), default=-1)


def owned_lease(store: DynamoDBLeaseStore, key: str, owner: str | None, *, counter: int = 1) -> Lease:
    """Create a lease owned by ``owner`` (or unowned) and return it as stored."""
    assert store.create_lease_if_absent(Lease(lease_key=key, lease_owner=owner, lease_counter=counter))
    lease = store.get_lease(key)
    assert lease is not None
    return lease


def w1_holder(
    leases: DynamoDBLeaseStore, clock: ManualClock, *, failover_ms: int
) -> tuple[LeaseHolder, list[tuple[str, str]]]:
    """Worker w1's lease holder (what its heartbeat fences), and the (lease key, reason) of each lease it reports
    lost, in order."""
    lost: list[tuple[str, str]] = []
    config = LeaseConfig(failover_time_ms=failover_ms)
    holder = LeaseHolder(leases, "w1", config=config, clock=clock, on_lost=lambda key, why: lost.append((key, why)))
    return holder, lost


class HeartbeatBlackout:
    """Makes a boto3 DynamoDB client's heartbeat writes (UpdateItem with a ``:wst`` value) fail as throttled while
    ``failing`` is set, without reaching the server; every other call goes through."""

    def __init__(self, client: Any) -> None:
        self.failing = False
        self.refused = 0
        client.meta.events.register("provide-client-params.dynamodb.UpdateItem", self._mark)
        client.meta.events.register_first("before-call.dynamodb.UpdateItem", self._refuse)

    def _mark(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if self.failing and ":wst" in (params.get("ExpressionAttributeValues") or {}):
            context["shardlease_test_refuse"] = True

    def _refuse(self, context: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]] | None:
        if not context.get("shardlease_test_refuse"):
            return None
        self.refused += 1
        error = {"Code": "ProvisionedThroughputExceededException", "Message": "heartbeat refused (injected)"}
        return AWSResponse("http://injected", 400, HTTPHeaders(), None), {
            "Error": error,
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }
