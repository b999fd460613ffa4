"""The whole leader (lock + shard sync + assignment) on moto: docs/kcl-compatibility.md "Scenarios" scenarios 10
and 14."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.tables import create_foreign_table
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.errors import TableSchemaError
from worker_lib.core.models import Lease, WorkerMetricStats
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.factory import build_leader, preflight
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream
from worker_lib.workermetrics.stats_store import WorkerMetricsStore


@pytest.fixture
def env(moto_aws: AwsConfig, app_name: str) -> dict[str, Any]:
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb)
    create_stream(kinesis, f"{app_name}-s", 2)
    return {"ddb": ddb, "kinesis": kinesis, "app": app_name, "stream": f"{app_name}-s"}


def leader_for(env: dict[str, Any], clock: ManualClock, *, stream: str | None = None) -> Any:
    return build_leader(
        app=env["app"],
        stream=stream or env["stream"],
        aws_config=AwsConfig(),
        shard_sync=ShardSyncConfig(initial_position=InitialPosition.TRIM_HORIZON),
        owner="leader-b",
        leader_config=LeaderConfig(cycle_interval_ms=20_000),
        lock_config=LeaderLockConfig(),
        dynamodb=env["ddb"],
        kinesis=env["kinesis"],
        clock=clock,
    )


def test_scenario_10_not_leader_then_leader_assigns_unassigned_then_expired(env: dict[str, Any]) -> None:
    clock = ManualClock(wall=1_800_000_000.0)
    parts = leader_for(env, clock)
    store = parts.lease_store
    # GIVEN another host holds the lock, a live worker reports metrics, one lease is owned by a dead worker
    other = DynamoDBLeaderLock(env["app"], "leader-a", client=env["ddb"], clock=clock)
    assert other.try_acquire()
    stale_key = sorted(s["ShardId"] for s in env["kinesis"].list_shards(StreamName=env["stream"])["Shards"])[0]
    assert store.create_lease_if_absent(Lease(lease_key=stale_key, lease_owner="dead", lease_counter=4))
    metrics = WorkerMetricsStore(env["app"], client=env["ddb"])

    def report() -> None:
        metrics.put(
            WorkerMetricStats(
                worker_id="take",
                last_update_epoch_s=int(clock.wall()),
                stats={"C": (20.0,)},
                operating_range={"C": (100.0,)},
            )
        )

    report()
    # WHEN run 1 happens while not leader THEN nothing is written
    first = parts.leader.run_cycle()
    assert not first.leader and first.current_leader == "leader-a"
    assert store.is_empty() is False and len(store.list_leases()) == 1
    # WHEN the other host releases and run 2 happens
    assert other.release()
    clock.advance(20)
    report()
    second = parts.leader.run_cycle()
    # THEN shard sync created the other shard's lease and only unassigned leases were assigned
    owners = {lease.lease_key: lease.lease_owner for lease in store.list_leases()}
    assert second.leader and len(second.shard_sync.created) == 1
    assert owners[stale_key] == "dead" and sum(o == "take" for o in owners.values()) == 1
    # WHEN run 3 happens after the stale lease's counter stood still for the lease duration
    clock.advance(20)
    report()
    third = parts.leader.run_cycle()
    # THEN the expired lease is reassigned
    assert third.assignment.reassigned_expired == 1
    stale = store.get_lease(stale_key)
    assert stale is not None and stale.lease_owner == "take"


def test_scenario_14_three_failed_cycles_release_leadership_once(env: dict[str, Any]) -> None:
    # GIVEN a leader whose shard sync fails every cycle (its stream does not exist)
    clock = ManualClock()
    parts = leader_for(env, clock, stream="no-such-stream")
    observer = DynamoDBLeaderLock(env["app"], "observer", client=env["ddb"], clock=clock)
    reports = []
    # WHEN three cycles run a shard-sync interval apart
    for _ in range(3):
        reports.append(parts.leader.run_cycle())
        assert reports[-1].error and "stream" in reports[-1].error
        clock.advance(61)
    # THEN leadership was held for two failed cycles and released after the third, once
    assert [r.released for r in reports] == [False, False, True]
    assert observer.current_leader() is None and observer.try_acquire()


def test_the_leader_start_check_refuses_a_table_with_other_keys(env: dict[str, Any]) -> None:
    # GIVEN the CoordinatorState table replaced by one keyed on another attribute
    ddb, table = env["ddb"], f"{env['app']}-CoordinatorState"
    create_foreign_table(ddb, table, replace=True)
    parts = leader_for(env, ManualClock())
    # WHEN a host checks before leading THEN one line names the table and the key the lock needs
    with pytest.raises(TableSchemaError, match=rf"^table {table} exists with key .* needs hash key 'key' only$"):
        preflight(parts, app=env["app"], stream=env["stream"])
