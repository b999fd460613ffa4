"""The demo's live view: one row per worker process (leases, CPU, throughput), as plain lines or rich tables."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from worker_lib.core.errors import ShardleaseError
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tools.demo.fleet import DemoState, Fleet
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


@dataclass
class ViewRow:
    worker: str
    pid: int
    status: str
    leases: int
    cpu: float | None
    kbps: float


def fleet_rows(fleet: Fleet, store: DynamoDBLeaseStore, metrics: dict[str, float]) -> tuple[list[ViewRow], list[Any]]:
    leases = store.list_leases()
    per_owner: dict[str, list[Any]] = defaultdict(list)
    for lease in leases:
        if lease.actual_owner and not lease.is_finished:
            per_owner[lease.actual_owner].append(lease)
    rows = []
    for worker in fleet.workers:
        status = "killed" if fleet.killed_at(worker) else ("running" if worker.alive() else "exited")
        held = per_owner.get(worker.name, [])
        rows.append(
            ViewRow(
                worker=worker.name,
                pid=worker.pid,
                status=status,
                leases=len(held),
                cpu=metrics.get(worker.name),
                kbps=sum(lease.throughput_kbps or 0.0 for lease in held),
            )
        )
    return rows, leases


def read_worker_cpu(ddb: Any, app: str) -> dict[str, float]:
    """Latest CPU report per worker (the last real value of ``sts.C``), for the live view."""
    out: dict[str, float] = {}
    with contextlib.suppress(ShardleaseError):
        for stats in WorkerMetricsStore(app, client=ddb).list_all():
            latest = stats.latest("C")
            if latest is not None:
                out[stats.worker_id] = latest
    return out


def render_plain(fleet: Fleet, rows: list[ViewRow], leases: list[Any], state: DemoState, elapsed: float) -> str:
    parts = [f"[{elapsed:5.1f}s] produced {state.produced_count()}"]
    for row in rows:
        cpu = f"{row.cpu:4.1f}%" if row.cpu is not None else "  -  "
        parts.append(f"{row.worker}:{row.status[:4]} leases={row.leases} cpu={cpu} {row.kbps:6.1f}KB/s")
    return " | ".join(parts)


def render_rich(fleet: Fleet, rows: list[ViewRow], leases: list[Any], state: DemoState, elapsed: float) -> Any:
    from rich.console import Group
    from rich.table import Table

    workers = Table(title=f"workers — t={elapsed:.0f}s, {state.produced_count()} records produced", expand=True)
    for column in ("worker", "pid", "status", "leases", "CPU %", "KB/s"):
        workers.add_column(column)
    for row in rows:
        workers.add_row(
            row.worker,
            str(row.pid),
            row.status,
            str(row.leases),
            f"{row.cpu:.1f}" if row.cpu is not None else "-",
            f"{row.kbps:.1f}",
        )
    shards = Table(title="shards", expand=True)
    for column in ("lease", "owner", "KB/s", "checkpoint", "produced"):
        shards.add_column(column)
    per_shard = state.produced_per_shard()
    for lease in sorted(leases, key=lambda x: x.lease_key):
        shards.add_row(
            lease.lease_key,
            lease.actual_owner or "-",
            f"{lease.throughput_kbps or 0:.1f}",
            "SHARD_END" if lease.is_finished else ("…" + str(lease.checkpoint)[-8:]),
            str(per_shard.get(lease.lease_key, 0)),
        )
    decisions = Table(title="leader decisions (latest)", expand=True, show_header=False)
    decisions.add_column("decision")
    with state.lock:
        for line in list(state.decisions)[-6:]:
            decisions.add_row(line)
        events = [text for _, text in state.events[-4:]]
    timeline = Table(title="events", expand=True, show_header=False)
    timeline.add_column("event")
    for text in events:
        timeline.add_row(text)
    return Group(workers, shards, decisions, timeline)
