"""``shardlease status``: what the fleet looks like now, from the tables (read-only).

Per worker: leases, CPU (latest ``sts.C``), throughput (sum of its leases' ``throughputKBps``), its load against the
fleet mean (CPU where reported, else throughput: what the leader acts on), last report age; per cluster (the
worker-id prefix before the first ``/``, so ``eu-a/host:1`` and ``eu-a/host:2`` form cluster ``eu-a``; ids without
one are in cluster ``-``): workers and leases; the current leader; per shard, how far behind the tip its last batch
was (``MillisBehindLatest`` from each worker's report), worst first, and for a shard processed in lanes its records
in flight and its watermark's lag; the leader's latest decisions with their reasons; unassigned leases; leases whose
owner no longer reports (orphaned); and, with ``--watch``, leases whose counter has stood still for half the lease
duration (expiring) and expired leases (counter unchanged for the lease duration across refreshes, judged exactly
as the leader does with
:class:`~worker_lib.assignment.snapshot.ExpiryTracker`; in ``worker`` liveness mode only for leases of owners that
do not heartbeat — the others are not renewed and are judged by their heartbeat). It shows the liveness mode and, in
``worker`` mode, *foreign owners*: lease owners without a heartbeat (a KCL worker, or heartbeats off), which cannot
judge ``worker``-mode leases (docs/liveness-modes.md).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TextIO

from worker_lib.assignment.snapshot import ExpiryTracker, is_active_worker, owners_lags
from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.scaling.desired import DesiredWorkers
from worker_lib.tables.coordinator_items import DESIRED_WORKERS_KEY
from worker_lib.tables.schema import TableLayout
from worker_lib.tables.state_store import CoordinatorStateStore, DecisionRecorder, LeaseCapRecorder
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

CLUSTER_SEPARATOR = "/"
"""A worker id ``<cluster>/<rest>`` belongs to ``<cluster>`` (``SHARDLEASE_WORKER_ID=eu-a/$HOSTNAME``)."""

NO_CLUSTER = "-"


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
    load_vs_mean: float | None = None  # CPU (else throughput) ÷ the fleet mean of the same


@dataclass(frozen=True, kw_only=True)
class ShardLag:
    lease: str
    owner: str
    millis_behind: int
    in_flight: int | None = None  # with lanes: records read and not yet done
    watermark_lag_ms: int | None = None  # with lanes: how long the first record not yet done has waited


@dataclass(frozen=True, kw_only=True)
class BlockedShard:
    """A shard held up by its processor's failures (the lease's failure marker, docs/failures.md)."""

    lease: str
    state: str  # retrying | stopped
    for_s: float  # since the first failure
    attempts: int
    error: str
    at: str  # the first record that fails
    worker: str


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
    load_metric: str = "throughput"  # what load_vs_mean compares: "cpu" when every active worker reports CPU
    lags: list[ShardLag] = field(default_factory=list)  # worst first
    expiring: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the leader's latest, newest first
    blocked: list[BlockedShard] = field(default_factory=list)  # held up by failures, longest first
    desired: dict[str, Any] | None = None  # the leader's DesiredWorkers item (docs/autoscaling.md), if any
    time: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cluster_of(worker_id: str, separator: str = CLUSTER_SEPARATOR) -> str:
    """The cluster a worker id names (its prefix before ``separator``), or ``-`` when it names none."""
    prefix, found, _ = worker_id.partition(separator)
    return prefix if found and prefix else NO_CLUSTER


def collect(
    app: str,
    ddb: Any,
    *,
    clock: Clock = SYSTEM_CLOCK,
    separator: str = CLUSTER_SEPARATOR,
    report_interval_s: float = 30.0,
    tracker: ExpiryTracker | None = None,
) -> FleetStatus:
    leases = DynamoDBLeaseStore(app, client=ddb, clock=clock).list_leases()
    metrics = {m.worker_id: m for m in WorkerMetricsStore(app, client=ddb, clock=clock).list_all()}
    leader = DynamoDBLeaderLock(app, "shardlease-status", client=ddb, clock=clock).current_leader()
    state_store = CoordinatorStateStore(app, client=ddb, clock=clock)
    cap_item = state_store.get(LeaseCapRecorder.KEY)
    desired_item = state_store.get(DESIRED_WORKERS_KEY)
    desired = DesiredWorkers.from_attrs(desired_item) if desired_item else None
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
        cpu = stats.latest("C") if stats else None
        rows.append(
            WorkerRow(
                worker=worker,
                cluster=cluster_of(worker, separator),
                leases=len(per_worker.get(worker, [])),
                throughput_kbps=round(sum(x.throughput_kbps or 0.0 for x in per_worker.get(worker, [])), 3),
                cpu=round(cpu, 1) if cpu is not None else None,
                report_age_s=round(now - stats.last_update_epoch_s, 1) if stats else None,
                active=stats is not None and is_active_worker(stats, now, report_interval_s),
                liveness=(stats.heartbeat.liveness or "lease") if stats and stats.heartbeat else None,
            )
        )
    rows, load_metric = _with_loads(rows)
    active = {row.worker for row in rows if row.active}
    clusters: dict[str, dict[str, int]] = {}
    workers_per_cluster = Counter(row.cluster for row in rows)
    for row in rows:
        entry = clusters.setdefault(row.cluster, {"workers": workers_per_cluster[row.cluster], "leases": 0})
        entry["leases"] += row.leases
    cap = cap_item.get("cap") if cap_item else None
    owner_of = {lease.lease_key: lease.actual_owner for lease in live}
    # As for lags, only the owner's report counts: a former owner's is stale
    lanes = {key: lane for m in metrics.values() for key, lane in m.lanes.items() if owner_of.get(key) == m.worker_id}
    lags = sorted(
        (
            ShardLag(
                lease=key,
                owner=owner,
                millis_behind=ms,
                in_flight=lanes[key].in_flight if key in lanes else None,
                watermark_lag_ms=lanes[key].watermark_lag_ms if key in lanes else None,
            )
            for key, owner, ms in owners_lags(live, metrics.values())
        ),
        key=lambda lag: (-lag.millis_behind, lag.lease),
    )
    expiring: list[str] = []
    if tracker is not None:
        half = tracker.failover_s / 2
        now_mono = clock.monotonic()
        expiring = sorted(
            key
            for key, last in tracker.last_increments().items()
            if key not in expired and owner_of.get(key) and now_mono - last > half
        )
    blocked = sorted(
        (
            BlockedShard(
                lease=lease.lease_key,
                state=block.state,
                for_s=round(max(0.0, now - block.since), 1),
                attempts=block.attempts,
                error=block.error,
                at=str(block.at),
                worker=block.worker,
            )
            for lease in live
            if (block := lease.block) is not None
        ),
        key=lambda shard: (-shard.for_s, shard.lease),
    )
    return FleetStatus(
        app=app,
        leader=leader,
        blocked=blocked,
        leases=len(live),
        finished=len(leases) - len(live),
        unassigned=sorted(x.lease_key for x in live if not x.actual_owner and not x.is_stopped),
        orphaned=sorted(x.lease_key for x in live if x.actual_owner and x.actual_owner not in active),
        expired=[key for key in expired if any(x.lease_key == key and x.actual_owner for x in live)],
        handoffs=sorted(x.lease_key for x in live if x.is_handoff_in_progress),
        cap=int(cap) if isinstance(cap, int) and cap >= 0 else None,
        liveness_mode=stored.describe() if stored is not None else "lease (none recorded yet)",
        foreign_owners=sorted(owner for owner in per_worker if owner not in beating) if per_owner else [],
        workers=rows,
        clusters=clusters,
        load_metric=load_metric,
        lags=lags,
        expiring=expiring,
        decisions=DecisionRecorder.read(state_store),
        desired=(
            {**desired.to_attrs(), "remove": list(desired_item.get("remove") or [])}
            if desired is not None and desired_item is not None
            else None
        ),
        time=datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
    )


def _with_loads(rows: list[WorkerRow]) -> tuple[list[WorkerRow], str]:
    """Each row with its load against the fleet mean: CPU when every active worker reports one (what the
    leader balances on), else throughput."""
    active = [row for row in rows if row.active]
    use_cpu = bool(active) and all(row.cpu is not None for row in active)
    values = {row.worker: (row.cpu if use_cpu else row.throughput_kbps) for row in active}
    present = [v for v in values.values() if v is not None]
    mean = sum(present) / len(present) if present else 0.0
    out = []
    for row in rows:
        value = values.get(row.worker)
        ratio = round(value / mean, 2) if value is not None and mean > 0 else None
        out.append(replace(row, load_vs_mean=ratio))
    return out, "cpu" if use_cpu else "throughput"


BAR_WIDTH = 20
"""A load bar is this many cells; the fleet mean fills half of it."""


def load_bar(ratio: float | None) -> str:
    """``████████░░░░ 1.12×``-style: the mean fills half the bar, twice the mean or more fills it all."""
    if ratio is None:
        return " " * BAR_WIDTH + "   -  "
    filled = max(0, min(BAR_WIDTH, round(ratio * BAR_WIDTH / 2)))
    return "█" * filled + "░" * (BAR_WIDTH - filled) + f" {ratio:4.2f}×"


def _age(at_ms: Any, now: datetime) -> str:
    if not isinstance(at_ms, int | float):
        return "?"
    seconds = max(0.0, now.timestamp() - at_ms / 1000)
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def _lanes(lag: ShardLag) -> str:
    """``  in flight 120, watermark lag 3.2 s`` for a shard processed in lanes; nothing for one without."""
    if lag.in_flight is None or lag.watermark_lag_ms is None:
        return ""
    return f"  in flight {lag.in_flight:,}, watermark lag {lag.watermark_lag_ms / 1000:,.1f} s"


def render(status: FleetStatus, *, watch: bool = False, lag_rows: int = 10, decision_rows: int = 5) -> str:
    now = datetime.fromisoformat(status.time) if status.time else datetime.now(timezone.utc)
    lines = [
        f"app {status.app} at {status.time or '-'}: leader {status.leader or '(none)'}; {status.leases} leases "
        f"({status.finished} finished awaiting cleanup); cap {status.cap if status.cap is not None else 'none'}; "
        f"liveness mode {status.liveness_mode}",
        f"{'worker':<28} {'cluster':<10} {'leases':>6} {'KB/s':>9} {'CPU %':>6} "
        f"{'load vs mean (' + status.load_metric + ')':<27} {'report':>8}",
    ]
    for row in status.workers:
        cpu = f"{row.cpu:.1f}" if row.cpu is not None else "-"
        age = f"{row.report_age_s:.0f}s ago" if row.report_age_s is not None else "never"
        flag = "" if row.active else "  (not reporting)"
        lines.append(
            f"{row.worker:<28} {row.cluster:<10} {row.leases:>6} {row.throughput_kbps:>9.1f} {cpu:>6} "
            f"{load_bar(row.load_vs_mean):<27} {age:>8}{flag}"
        )
    for cluster, entry in sorted(status.clusters.items()):
        lines.append(f"cluster {cluster}: {entry['workers']} workers, {entry['leases']} leases")
    if status.desired is not None:
        d = status.desired
        running = sum(1 for row in status.workers if row.active)
        remove = f"; least loaded, to remove first: {', '.join(d['remove'])}" if d.get("remove") else ""
        lines.append(
            f"desired workers {d['desired']} ({running} reporting; since {_age(1000 * d['changedAt'], now)}): "
            f"{d['reason']}{remove}"
        )
    else:
        lines.append("desired workers: not computed yet (the leader computes it each full cycle)")
    if status.lags:
        lines.append(f"lag (MillisBehindLatest, worst {min(lag_rows, len(status.lags))} of {len(status.lags)}):")
        lines += [
            f"  {lag.lease:<44} {lag.millis_behind:>10,} ms  {lag.owner}{_lanes(lag)}" for lag in status.lags[:lag_rows]
        ]
    else:
        lines.append("lag: none reported yet")
    stopped = [b for b in status.blocked if b.state == "stopped"]
    if status.blocked:
        lines.append(f"blocked by processor failures ({len(stopped)} stopped; docs/failures.md):")
        lines += [
            f"  {b.lease:<44} {b.state.upper() if b.state == 'stopped' else b.state:<8} {b.for_s:>7.0f} s  "
            f"{b.attempts} attempts, {b.error} at {b.at} ({b.worker})"
            for b in status.blocked
        ]
        if stopped:
            lines.append("  resume a stopped shard: shardlease resume-shard --app APP --shard LEASE_KEY")
    else:
        lines.append("blocked by processor failures: none")
    lines.append(f"unassigned: {', '.join(status.unassigned) or 'none'}")
    lines.append(f"owner not reporting: {', '.join(status.orphaned) or 'none'}")
    if watch:
        lines.append(f"expiring (counter still for half the lease duration): {', '.join(status.expiring) or 'none'}")
        lines.append(f"expired: {', '.join(status.expired) or 'none'}")
    if status.foreign_owners:
        lines.append(
            f"foreign owners (no heartbeat; cannot judge worker-mode leases): {', '.join(status.foreign_owners)}"
        )
    if status.handoffs:
        lines.append(f"graceful handoffs in progress: {', '.join(status.handoffs)}")
    if status.decisions:
        lines.append("leader's latest decisions:")
        for d in status.decisions[:decision_rows]:
            lines.append(
                f"  {_age(d.get('at'), now):>8}  {d.get('kind', '?'):<16} {d.get('lease', '?')}  "
                f"{d.get('from') or '-'} -> {d.get('to', '?')}: {d.get('reason', '')}"
            )
    return "\n".join(lines)


class Screen:
    """Where frames go. On a terminal each frame is drawn over the last one in place (cursor home, every line
    cleared to its end, the rest of the screen cleared), so nothing flickers or scrolls; piped, frames follow each
    other, each text frame under a ``--- time ---`` line and each JSON frame as one line (JSON Lines)."""

    def __init__(self, out: TextIO, *, as_json: bool, interactive: bool) -> None:
        self._out = out
        self._json = as_json
        self._interactive = interactive and not as_json
        self._frames = 0

    def show(self, status: FleetStatus, *, watch: bool) -> None:
        if self._json:
            self._out.write(json.dumps(status.to_dict(), sort_keys=True) + "\n")
        elif self._interactive and watch:
            text = render(status, watch=True)
            prefix = "\x1b[2J\x1b[H" if self._frames == 0 else "\x1b[H"
            self._out.write(prefix + "".join(f"{line}\x1b[K\n" for line in text.splitlines()) + "\x1b[J")
        else:
            if watch:
                self._out.write(f"--- {status.time} ---\n")
            self._out.write(render(status, watch=watch) + "\n")
        self._out.flush()
        self._frames += 1


def run_status_cli(
    *,
    app: str,
    aws_config: AwsConfig,
    watch: bool,
    as_json: bool,
    interval_s: float = 5.0,
    clock: Clock = SYSTEM_CLOCK,
) -> int:
    """``shardlease status``: one frame, or with ``watch`` a frame every ``interval_s`` until Ctrl-C or a closed
    pipe."""
    ddb = aws.client("dynamodb", aws_config)
    for spec in TableLayout.from_env().specs():  # the lease table alone in KCL 3.5's single-table mode
        with aws.translated("dynamodb DescribeTable", spec.table_name(app)):
            ddb.describe_table(TableName=spec.table_name(app))
    tracker = ExpiryTracker(LeaseConfig.from_env().failover_time_ms / 1000) if watch else None
    screen = Screen(sys.stdout, as_json=as_json, interactive=sys.stdout.isatty())
    # Ctrl-C and a closed pipe end the loop in the CLI's one way (worker_lib/cli/main.py): one line and 130, or
    # quietly and 1.
    while True:
        screen.show(collect(app, ddb, clock=clock, tracker=tracker), watch=watch)
        if not watch:
            return 0
        clock.sleep(interval_s)


def resume_shard(*, app: str, lease_key: str, aws_config: AwsConfig) -> int:
    """``shardlease resume-shard``: remove a shard's failure marker, so that the leader assigns it again and it is
    read from its checkpoint (the failing record first: fix the processor, or choose another policy, before)."""
    store = DynamoDBLeaseStore(app, client=aws.client("dynamodb", aws_config))
    lease = store.get_lease(lease_key)
    if lease is None:
        print(f"shardlease: no lease {lease_key!r} in {app}", file=sys.stderr)
        return 2
    if store.resume_shard(lease_key) is None:
        print(f"lease {lease_key} is not blocked: nothing to resume")
        return 0
    block = lease.block
    where = f" at {block.at}" if block is not None else ""
    print(f"lease {lease_key} resumed{where}: the leader assigns it at its next cycle")
    return 0
