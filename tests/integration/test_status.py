"""`shardlease status` against a moto server: per worker and per cluster, leader, unassigned and orphaned leases."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from worker_lib.assignment.snapshot import ExpiryTracker
from worker_lib.cli.status import collect
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import SHARD_END, Lease, WorkerMetricStats
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


def setup_fleet(ddb: Any, app: str, clock: ManualClock) -> None:
    store = DynamoDBLeaseStore(app, client=ddb)
    metrics = WorkerMetricsStore(app, client=ddb)
    owners = ["a-1", "a-1", "a-2", "b-1", "b-1", "b-1", "gone-1", None]
    for n, owner in enumerate(owners):
        assert store.create_lease_if_absent(
            Lease(lease_key=f"shard-{n}", lease_owner=owner, lease_counter=1, throughput_kbps=10.0 * (n + 1))
        )
    assert store.create_lease_if_absent(Lease(lease_key="done", checkpoint=SHARD_END))
    for worker, cpu in (("a-1", 40.0), ("a-2", 20.0), ("b-1", 70.0)):
        metrics.put(
            WorkerMetricStats(
                worker_id=worker,
                last_update_epoch_s=int(clock.wall()),
                stats={"C": (cpu - 5, cpu)},
                operating_range={"C": (100.0,)},
            )
        )
    assert DynamoDBLeaderLock(app, "leader-x", client=ddb, clock=clock).try_acquire()


def test_status_groups_by_worker_and_cluster_and_flags_problems(moto_aws: AwsConfig, app_name: str) -> None:
    # GIVEN clusters a (2 workers) and b (1 worker), a worker that stopped reporting, an unassigned lease
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    clock = ManualClock(wall=float(time.time()))
    setup_fleet(ddb, app_name, clock)
    # WHEN status is collected
    status = collect(app_name, ddb, clock=clock)
    # THEN workers, clusters, leader and problems are reported
    rows = {row.worker: row for row in status.workers}
    assert (rows["a-1"].leases, rows["a-2"].leases, rows["b-1"].leases) == (2, 1, 3)
    assert rows["b-1"].cpu == 70.0 and rows["a-1"].throughput_kbps == 30.0
    assert status.clusters == {
        "a": {"workers": 2, "leases": 3},
        "b": {"workers": 1, "leases": 3},
        "gone": {"workers": 1, "leases": 1},
    }
    assert status.leader == "leader-x" and status.unassigned == ["shard-7"] and status.orphaned == ["shard-6"]
    assert status.leases == 8 and status.finished == 1
    # AND with watching, a lease whose counter stands still for the lease duration is reported expired
    tracker = ExpiryTracker(10.0)
    collect(app_name, ddb, clock=clock, tracker=tracker)
    clock.advance(11)
    watched = collect(app_name, ddb, clock=clock, tracker=tracker)
    assert "shard-0" in watched.expired


def test_status_cli_prints_json_and_errors_in_one_line(moto_endpoint: str, moto_aws: AwsConfig, app_name: str) -> None:
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    setup_fleet(ddb, app_name, ManualClock(wall=float(time.time())))
    cmd = [sys.executable, "-m", "worker_lib.cli", "status", "--app", app_name, "--endpoint-url", moto_endpoint]
    result = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["leader"] == "leader-x"
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert "cluster a: 2 workers, 3 leases" in text.stdout
    missing = subprocess.run(
        [*cmd[:-4], "--app", "no-such-app", "--endpoint-url", moto_endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "create-tables" in missing.stderr
