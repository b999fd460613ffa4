"""``shardlease liveness``: show the application's liveness mode, or ask for a switch (docs/liveness-modes.md).

``--set worker`` / ``--set lease`` writes the target beside the current mode, conditioned on the item as read; the
leader completes the switch when it is safe (at once towards ``worker``; towards ``lease`` once every live worker
says it renews). Asking for the mode already in force cancels a switch under way.
"""

from __future__ import annotations

import json
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig, default_owner
from worker_lib.core.errors import InvalidStateError
from worker_lib.leases.mode import LivenessMode, StoredMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


def liveness_summary(app: str, stored: StoredMode | None, rows: WorkerMetricsStore) -> dict[str, Any]:
    """The stored mode and what each heartbeating worker says it runs in (``lvm``)."""
    workers = {
        row.worker_id: (row.heartbeat.liveness or "lease")
        for row in rows.list_all()
        if row.heartbeat is not None and row.heartbeat.state.value != "STOPPED"
    }
    return {
        "app": app,
        "mode": None if stored is None else stored.mode.value,
        "target": None if stored is None or stored.target is None else stored.target.value,
        "workers": dict(sorted(workers.items())),
    }


def _render(summary: dict[str, Any]) -> str:
    if summary["mode"] is None:
        head = "liveness mode: none recorded yet (lease until a leader records one)"
    elif summary["target"] is None:
        head = f"liveness mode: {summary['mode']}"
    else:
        head = f"liveness mode: {summary['mode']}, switching to {summary['target']} (the leader completes it)"
    counts: dict[str, int] = {}
    for mode in summary["workers"].values():
        counts[mode] = counts.get(mode, 0) + 1
    detail = ", ".join(f"{n} in {mode} mode" for mode, n in sorted(counts.items())) or "no heartbeating workers"
    return f"{head}\nworkers: {detail}"


def run_liveness_cli(*, app: str, aws_config: AwsConfig, target: str | None, as_json: bool) -> int:
    client = aws.client("dynamodb", aws_config)
    modes = LivenessModeStore(CoordinatorStateStore(app, client=client))
    stored = modes.read()
    if target is not None:
        wanted = LivenessMode(target)
        by = f"cli:{default_owner()}"
        if stored is None:
            stored = modes.record_if_absent(wanted, by=by)
            if stored.mode is not wanted:
                raise InvalidStateError("the mode was recorded by someone else meanwhile; run the command again")
        elif not modes.request(wanted, expected=stored, by=by):
            raise InvalidStateError("the liveness mode changed meanwhile; run the command again")
        stored = modes.read()
    summary = liveness_summary(app, stored, WorkerMetricsStore(app, client=client))
    print(json.dumps(summary, sort_keys=True) if as_json else _render(summary))
    return 0
