"""Counting every DynamoDB call of a run, per (role, table, operation, purpose), with botocore hooks.

The purpose of a call is read from the functions on the calling thread's stack (:data:`PURPOSES`, by qualified
name): the library is measured as it runs, without hooks of its own. A method renamed or moved in ``worker_lib``
must be renamed here too, or its calls are counted under whatever caller is next on the stack.
"""

from __future__ import annotations

import queue
import sys
import threading
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.tables.schema import CoordinatorAttr, coordinator_state_table_name, worker_metrics_table_name

from .sizes import READS, WRITES, item_size, read_units, write_units

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
    ("LeaseKeeper.discover", "discovery"),  # the index query; the reads of what it found are the line above
    ("LeaseHolder.take", "take"),
    ("LeaseKeeper._released", "handoff notice"),
)
TAKEOVER_POLL = "takeover poll"


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


def label(key: Key) -> str:
    role, table, op, purpose = key
    return f"{role} {table} {op} [{purpose}]"
