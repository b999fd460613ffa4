"""`shardlease status` against a moto server: per worker and per cluster, leader, unassigned and orphaned leases."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support.processes import CLI_BOUND_S, run_command
from worker_lib.assignment.snapshot import ExpiryTracker
from worker_lib.cli.status import collect, render
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import SHARD_END, LaneStats, Lease, WorkerMetricStats
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


def setup_fleet(ddb: Any, app: str, clock: ManualClock) -> None:
    store = DynamoDBLeaseStore(app, client=ddb)
    metrics = WorkerMetricsStore(app, client=ddb)
    owners = ["a/1", "a/1", "a/2", "b/1", "b/1", "b/1", "gone/1", None]
    for n, owner in enumerate(owners):
        assert store.create_lease_if_absent(
            Lease(lease_key=f"shard-{n}", lease_owner=owner, lease_counter=1, throughput_kbps=10.0 * (n + 1))
        )
    assert store.create_lease_if_absent(Lease(lease_key="done", checkpoint=SHARD_END))
    for worker, cpu in (("a/1", 40.0), ("a/2", 20.0), ("b/1", 70.0)):
        metrics.put(
            WorkerMetricStats(
                worker_id=worker,
                last_update_epoch_s=int(clock.wall()),
                stats={"C": (cpu - 5, cpu)},
                operating_range={"C": (100.0,)},
            )
        )
    assert DynamoDBLeaderLock(app, "leader-x", client=ddb, clock=clock).try_acquire()


@pytest.fixture
def fleet(moto_aws: AwsConfig, app_name: str) -> tuple[Any, ManualClock]:
    """The tables holding :func:`setup_fleet`'s fleet, on a clock at the real time."""
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    clock = ManualClock(wall=float(time.time()))
    setup_fleet(ddb, app_name, clock)
    return ddb, clock


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
    assert (rows["a/1"].leases, rows["a/2"].leases, rows["b/1"].leases) == (2, 1, 3)
    assert rows["b/1"].cpu == 70.0 and rows["a/1"].throughput_kbps == 30.0
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
    result = run_command([*cmd, "--json"], timeout_s=CLI_BOUND_S)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["leader"] == "leader-x"
    text = run_command(cmd, timeout_s=CLI_BOUND_S)
    assert "cluster a: 2 workers, 3 leases" in text.stdout
    missing = run_command([*cmd[:-4], "--app", "no-such-app", "--endpoint-url", moto_endpoint], timeout_s=CLI_BOUND_S)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "create-tables" in missing.stderr


def test_status_shows_load_against_the_mean_lag_per_shard_worst_first_and_the_leaders_decisions(
    fleet: tuple[Any, ManualClock], app_name: str
) -> None:
    from worker_lib.assignment.plan import Decision
    from worker_lib.tables.state_store import CoordinatorStateStore, DecisionRecorder

    # GIVEN the fleet, with lags reported by the owners (and a stale one by a former owner), and two decisions
    ddb, clock = fleet
    metrics = WorkerMetricsStore(app_name, client=ddb)
    for worker, cpu, lags in (("a/1", 40.0, {"shard-0": 1_500, "shard-1": 90_000}), ("b/1", 70.0, {"shard-3": 12})):
        metrics.put(
            WorkerMetricStats(worker_id=worker, last_update_epoch_s=int(clock.wall()), stats={"C": (cpu,)}, lag_ms=lags)
        )
    metrics.put(
        WorkerMetricStats(
            worker_id="a/2", last_update_epoch_s=int(clock.wall()), stats={"C": (20.0,)}, lag_ms={"shard-3": 99_999}
        )
    )
    DecisionRecorder(CoordinatorStateStore(app_name, client=ddb), clock=clock).record(
        [
            Decision(
                lease_key="shard-7", from_worker=None, to_worker="a/2", kind="assign", reason="unassigned", metric="C"
            ),
            Decision(
                lease_key="shard-4",
                from_worker="b/1",
                to_worker="a/2",
                kind="rebalance",
                reason="b/1 at 1.6x",
                metric="C",
            ),
        ]
    )
    # WHEN status is collected and rendered
    status = collect(app_name, ddb, clock=clock)
    text = render(status)
    # THEN lags are per shard, worst first, and only the owner's count
    assert [(lag.lease, lag.millis_behind) for lag in status.lags] == [
        ("shard-1", 90_000),
        ("shard-0", 1_500),
        ("shard-3", 12),
    ]
    # AND load is CPU against the fleet mean (40, 20, 70 → mean 43.3)
    rows = {row.worker: row for row in status.workers}
    assert status.load_metric == "cpu"
    assert (rows["a/1"].load_vs_mean, rows["a/2"].load_vs_mean, rows["b/1"].load_vs_mean) == (0.92, 0.46, 1.62)
    # AND the leader's decisions, newest first, with their reasons
    assert [d["lease"] for d in status.decisions] == ["shard-4", "shard-7"]
    assert "rebalance" in text and "b/1 -> a/2: b/1 at 1.6x" in text and "90,000 ms" in text
    # AND JSON floats are rounded
    assert all(len(str(row.cpu).split(".")[-1]) <= 1 for row in status.workers if row.cpu is not None)


def test_watch_reports_a_lease_whose_counter_stood_still_for_half_the_duration_as_expiring(
    fleet: tuple[Any, ManualClock], app_name: str
) -> None:
    ddb, clock = fleet
    tracker = ExpiryTracker(10.0)
    collect(app_name, ddb, clock=clock, tracker=tracker)
    clock.advance(6)
    status = collect(app_name, ddb, clock=clock, tracker=tracker)
    assert "shard-0" in status.expiring and status.expired == []


def test_watch_piped_as_json_is_one_object_per_line_and_a_closed_pipe_ends_it_without_a_word(
    moto_endpoint: str, moto_aws: AwsConfig, app_name: str
) -> None:
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    setup_fleet(ddb, app_name, ManualClock(wall=float(time.time())))
    cmd = [sys.executable, "-m", "worker_lib.cli", "status", "--app", app_name, "--endpoint-url", moto_endpoint]
    # WHEN `status --watch --json | head -2` runs
    proc = subprocess.Popen(
        [*cmd, "--watch", "--json", "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    proc.stdout.close()  # the reader goes away
    code = proc.wait(timeout=CLI_BOUND_S)  # liveness: a closed pipe ends it at its next frame
    # THEN each line is one JSON frame, and the closed pipe ends it as every command does: 1, nothing on stderr
    frames = [json.loads(line) for line in lines]
    assert all(frame["leader"] == "leader-x" and frame["time"] for frame in frames)
    assert code == 1 and proc.stderr.read() == b""


def test_watch_ends_on_ctrl_c_with_one_line(moto_endpoint: str, moto_aws: AwsConfig, app_name: str) -> None:
    import signal

    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    cmd = [sys.executable, "-m", "worker_lib.cli", "status", "--app", app_name, "--endpoint-url", moto_endpoint]
    proc = subprocess.Popen(
        [*cmd, "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"--- ")  # piped text frames are headed by their time
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=CLI_BOUND_S) == 130  # the shell's convention for SIGINT, as every shardlease command
    assert proc.stderr.read().decode().strip().splitlines() == ["shardlease status: interrupted"]


def test_the_leaders_desired_workers_are_stored_continued_by_a_new_leader_and_shown(
    fleet: tuple[Any, ManualClock], app_name: str
) -> None:
    from worker_lib.leader.sizing import FleetSizer
    from worker_lib.scaling.config import ScalingConfig
    from worker_lib.tables.state_store import CoordinatorStateStore

    # GIVEN three workers at 90 % CPU and 40 leases, sized by a leader
    ddb, clock = fleet
    workers = [
        WorkerMetricStats(worker_id=w, last_update_epoch_s=int(clock.wall()), stats={"C": (cpu,)})
        for w, cpu in (("a/1", 90.0), ("a/2", 95.0), ("b/1", 85.0))
    ]
    leases = [Lease(lease_key=f"shard-{n}") for n in range(40)]
    state = CoordinatorStateStore(app_name, client=ddb)
    first = FleetSizer(state, ScalingConfig()).size(
        workers=workers, leases=leases, max_lag_ms=None, now_epoch_s=clock.wall()
    )
    # THEN it asks for ⌈2.7 / 0.595⌉ = 5 and says why
    assert first.desired == 5 and first.reason.startswith("scale out")
    # WHEN a new leader sizes the same fleet, now lightly loaded, a minute later
    clock.advance(60)
    light = [
        WorkerMetricStats(worker_id=w.worker_id, last_update_epoch_s=int(clock.wall()), stats={"C": (10.0,)})
        for w in workers
    ]
    sizer = FleetSizer(state, ScalingConfig())
    second = sizer.size(workers=light, leases=leases, max_lag_ms=None, now_epoch_s=clock.wall())
    # THEN it continues from the stored decision: the scale-in cool-down holds the number
    assert second.desired == 5 and "cool-down" in second.reason
    # AND status shows the number, the reason and its age
    text = render(collect(app_name, ddb, clock=clock))
    assert "desired workers 5" in text and "scale out: cpu demand 2.70 workers" in text


def test_status_shows_records_in_flight_and_watermark_lag_beside_the_lag_of_a_shard_in_lanes_the_owners_only(
    fleet: tuple[Any, ManualClock], app_name: str
) -> None:
    # GIVEN a/1 reading shard-0 and shard-1 (in lanes), a/2 reading shard-2 (in lanes, idle) and still reporting the
    # lanes of shard-1, which it no longer owns
    ddb, clock = fleet
    metrics = WorkerMetricsStore(app_name, client=ddb)
    now = int(clock.wall())
    metrics.put(
        WorkerMetricStats(
            worker_id="a/1",
            last_update_epoch_s=now,
            lag_ms={"shard-0": 1_500, "shard-1": 90_000},
            lanes={"shard-1": LaneStats(in_flight=1_200, watermark_lag_ms=3_400)},
        )
    )
    metrics.put(
        WorkerMetricStats(
            worker_id="a/2",
            last_update_epoch_s=now,
            lag_ms={"shard-2": 5},
            lanes={
                "shard-1": LaneStats(in_flight=7, watermark_lag_ms=99_000),
                "shard-2": LaneStats(in_flight=0, watermark_lag_ms=0),
            },
        )
    )
    # WHEN status is collected and rendered
    status = collect(app_name, ddb, clock=clock)
    text = render(status)
    # THEN each shard in lanes carries its owner's figures, a shard without lanes none
    assert [(lag.lease, lag.in_flight, lag.watermark_lag_ms) for lag in status.lags] == [
        ("shard-1", 1_200, 3_400),
        ("shard-0", None, None),
        ("shard-2", 0, 0),
    ]
    assert "in flight 1,200, watermark lag 3.4 s" in text and "in flight 0, watermark lag 0.0 s" in text
    assert "99.0 s" not in text and text.count("in flight") == 2
    # WHEN a/1 reports again without lanes (its lease left them), and a/2 with neither lags nor lanes
    metrics.put(WorkerMetricStats(worker_id="a/1", last_update_epoch_s=now, lag_ms={"shard-1": 80_000}))
    metrics.put(WorkerMetricStats(worker_id="a/2", last_update_epoch_s=now))
    # THEN the stored items hold none of the old lanes (nor a/2's old lag), and status shows none
    rows = {row.worker_id: row for row in metrics.list_all(consistent=True)}
    assert (rows["a/1"].lag_ms, rows["a/1"].lanes) == ({"shard-1": 80_000}, {})
    assert (rows["a/2"].lag_ms, rows["a/2"].lanes) == ({}, {})
    assert [(lag.lease, lag.in_flight) for lag in collect(app_name, ddb, clock=clock).lags] == [("shard-1", None)]
