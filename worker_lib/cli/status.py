"""``shardlease status``: what the fleet looks like now, from the three tables (read-only).

Per worker: leases, CPU (latest ``sts.C``), throughput (sum of its leases' ``throughputKBps``), last report age;
per cluster (the worker-id prefix before the first ``-``, so ``a-1`` and ``a-2`` form cluster ``a``): workers
and leases; the current leader; unassigned leases; leases whose owner no longer reports (orphaned); and, with
``--watch``, expired leases (counter unchanged for the lease duration across refreshes, judged exactly as the
leader does with :class:`~worker_lib.assignment.snapshot.ExpiryTracker`; in ``worker`` liveness mode only for
leases of owners that do not heartbeat — the others are not renewed and are judged by their heartbeat). It shows
the liveness mode and, in ``worker`` mode, *foreign owners*: lease owners without a heartbeat (a KCL worker, or
heartbeats off), which cannot judge ``worker``-mode leases (docs/liveness-modes.md).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from worker_lib.assignment.snapshot import ExpiryTracker, is_active_worker
from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leader.state_store import CoordinatorStateStore, LeaseCapRecorder
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.schema import TableLayout
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


@dataclass(frozen=True, kw_only=True)
class WorkerRow:
    worker: str
    cluster: str
    leases: int
    throughput_kbps: float
    cpu: float | None
    report_age_s: float | None
    active: bool
    liveness: str | None = None  # what its heartbeat says it runs in; None: no heartbeat


@dataclass(frozen=True, kw_only=True)
class FleetStatus:
    app: str
    leader: str | None
    leases: int
    finished: int
    unassigned: list[str]
    orphaned: list[str]
    expired: list[str]
    handoffs: list[str]
    cap: int | None
    liveness_mode: str = "lease"
    foreign_owners: list[str] = field(default_factory=list)
    workers: list[WorkerRow] = field(default_factory=list)
    clusters: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cluster_of(worker_id: str, separator: str = "-") -> str:
    return worker_id.split(separator, 1)[0] if separator else worker_id


def collect(
    app: str,
    ddb: Any,
    *,
    clock: Clock = SYSTEM_CLOCK,
    separator: str = "-",
    report_interval_s: float = 30.0,
    tracker: ExpiryTracker | None = None,
) -> FleetStatus:
    leases = DynamoDBLeaseStore(app, client=ddb, clock=clock).list_leases()
    metrics = {m.worker_id: m for m in WorkerMetricsStore(app, client=ddb, clock=clock).list_all()}
    leader = DynamoDBLeaderLock(app, "shardlease-status", client=ddb, clock=clock).current_leader()
    state_store = CoordinatorStateStore(app, client=ddb, clock=clock)
    cap_item = state_store.get(LeaseCapRecorder.KEY)
    stored = LivenessModeStore(state_store, clock=clock).read()
    per_owner = stored is not None and stored.leader_judges_per_owner
    now = clock.wall()
    live = [lease for lease in leases if not lease.is_finished]
    expired = sorted(tracker.observe(live, clock.monotonic())) if tracker is not None else []
    beating = {worker_id for worker_id, m in metrics.items() if m.heartbeat is not None}
    if per_owner:  # heartbeating owners do not renew in worker mode: their counters say nothing
        expired = [k for k in expired if any(x.lease_key == k and x.actual_owner not in beating for x in live)]
    per_worker: dict[str, list[Any]] = defaultdict(list)
    for lease in live:
        if lease.actual_owner:
            per_worker[lease.actual_owner].append(lease)
    rows = []
    for worker in sorted(set(per_worker) | set(metrics)):
        stats = metrics.get(worker)
        cpu_values = [v for v in (stats.stats.get("C", ()) if stats else ()) if v >= 0]
        rows.append(
            WorkerRow(
                worker=worker,
                cluster=cluster_of(worker, separator),
                leases=len(per_worker.get(worker, [])),
                throughput_kbps=round(sum(x.throughput_kbps or 0.0 for x in per_worker.get(worker, [])), 3),
                cpu=cpu_values[-1] if cpu_values else None,
                report_age_s=round(now - stats.last_update_epoch_s, 1) if stats else None,
                active=stats is not None and is_active_worker(stats, now, report_interval_s),
                liveness=(stats.heartbeat.liveness or "lease") if stats and stats.heartbeat else None,
            )
        )
    active = {row.worker for row in rows if row.active}
    clusters: dict[str, dict[str, int]] = {}
    workers_per_cluster = Counter(row.cluster for row in rows)
    for row in rows:
        entry = clusters.setdefault(row.cluster, {"workers": workers_per_cluster[row.cluster], "leases": 0})
        entry["leases"] += row.leases
    cap = cap_item.get("cap") if cap_item else None
    return FleetStatus(
        app=app,
        leader=leader,
        leases=len(live),
        finished=len(leases) - len(live),
        unassigned=sorted(x.lease_key for x in live if not x.actual_owner),
        orphaned=sorted(x.lease_key for x in live if x.actual_owner and x.actual_owner not in active),
        expired=[key for key in expired if any(x.lease_key == key and x.actual_owner for x in live)],
        handoffs=sorted(x.lease_key for x in live if x.is_handoff_in_progress),
        cap=int(cap) if isinstance(cap, int) and cap >= 0 else None,
        liveness_mode=stored.describe() if stored is not None else "lease (none recorded yet)",
        foreign_owners=sorted(owner for owner in per_worker if owner not in beating) if per_owner else [],
        workers=rows,
        clusters=clusters,
    )


def render(status: FleetStatus, *, watch: bool = False) -> str:
    lines = [
        f"app {status.app}: leader {status.leader or '(none)'}; {status.leases} leases "
        f"({status.finished} finished awaiting cleanup); cap {status.cap if status.cap is not None else 'none'}; "
        f"liveness mode {status.liveness_mode}",
        f"{'worker':<28} {'cluster':<12} {'leases':>6} {'KB/s':>10} {'CPU %':>6} {'report':>8}",
    ]
    for row in status.workers:
        cpu = f"{row.cpu:.1f}" if row.cpu is not None else "-"
        age = f"{row.report_age_s:.0f}s ago" if row.report_age_s is not None else "never"
        flag = "" if row.active else "  (not reporting)"
        lines.append(
            f"{row.worker:<28} {row.cluster:<12} {row.leases:>6} {row.throughput_kbps:>10.1f} {cpu:>6} {age:>8}{flag}"
        )
    for cluster, entry in sorted(status.clusters.items()):
        lines.append(f"cluster {cluster}: {entry['workers']} workers, {entry['leases']} leases")
    lines.append(f"unassigned: {', '.join(status.unassigned) or 'none'}")
    lines.append(f"owner not reporting: {', '.join(status.orphaned) or 'none'}")
    if watch:
        lines.append(f"expired: {', '.join(status.expired) or 'none'}")
    if status.foreign_owners:
        lines.append(
            f"foreign owners (no heartbeat; cannot judge worker-mode leases): {', '.join(status.foreign_owners)}"
        )
    if status.handoffs:
        lines.append(f"graceful handoffs in progress: {', '.join(status.handoffs)}")
    return "\n".join(lines)


def run_status_cli(
    *,
    app: str,
    aws_config: AwsConfig,
    watch: bool,
    as_json: bool,
    interval_s: float = 5.0,
    clock: Clock = SYSTEM_CLOCK,
) -> int:
    ddb = aws.client("dynamodb", aws_config)
    for spec in TableLayout.from_env().specs():  # the lease table alone in KCL 3.5's single-table mode
        with aws.translated("dynamodb DescribeTable", spec.table_name(app)):
            ddb.describe_table(TableName=spec.table_name(app))
    tracker = ExpiryTracker(LeaseConfig.from_env().failover_time_ms / 1000) if watch else None
    while True:
        status = collect(app, ddb, clock=clock, tracker=tracker)
        text = json.dumps(status.to_dict(), sort_keys=True) if as_json else render(status, watch=watch)
        if watch and not as_json and sys.stdout.isatty():
            print("\x1b[2J\x1b[H", end="")
        print(text, flush=True)
        if not watch:
            return 0
        clock.sleep(interval_s)
