"""The leader's assignment step against a moto lease table (docs/kcl-compatibility.md scenarios 10 and 15, expiry,
writes).

Worker metrics come from an in-memory source here (the DynamoDB metrics store has its own tests), so each test
states exactly which workers the leader sees.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import SHARD_END, Lease, WorkerMetricStats
from worker_lib.leader.assigner import DECISION_LOGGER, LeaseAssigner
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables


@dataclass
class MemoryMetrics:
    workers: list[WorkerMetricStats] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def list_all(self) -> list[WorkerMetricStats]:
        return list(self.workers)

    def delete_if_unchanged(self, worker_id: str, last_update_epoch_s: float) -> bool:
        self.deleted.append(worker_id)
        self.workers = [w for w in self.workers if w.worker_id != worker_id]
        return True

    def delete_if_heartbeat_unchanged(self, worker_id: str, heartbeat_counter: int) -> bool:
        return self.delete_if_unchanged(worker_id, 0)


def cpu_worker(worker_id: str, cpu: float, clock: ManualClock, *, lut_offset: float = 0.0) -> WorkerMetricStats:
    return WorkerMetricStats(
        worker_id=worker_id,
        last_update_epoch_s=int(clock.wall() + lut_offset),
        stats={"C": (cpu, cpu)},
        operating_range={"C": (80.0,)},
    )


@pytest.fixture
def store(moto_aws: AwsConfig, app_name: str) -> DynamoDBLeaseStore:
    ddb: Any = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    return DynamoDBLeaseStore(app_name, client=ddb)


def owners(store: DynamoDBLeaseStore) -> dict[str, str | None]:
    return {lease.lease_key: lease.lease_owner for lease in store.list_leases()}


def test_unassigned_leases_are_assigned_and_expired_ones_only_after_a_full_lease_duration(
    store: DynamoDBLeaseStore,
) -> None:
    # GIVEN a new leader (run 1), one unassigned lease and one owned by a worker that has stopped renewing
    clock = ManualClock()
    metrics = MemoryMetrics([cpu_worker("take", 50, clock)])
    assert store.create_lease_if_absent(Lease(lease_key="unassigned"))
    assert store.create_lease_if_absent(Lease(lease_key="stale", lease_owner="dead", lease_counter=5))
    assigner = LeaseAssigner(
        store,
        metrics,
        config=AssignmentConfig(balancing_frequency=1),
        lease_config=LeaseConfig(failover_time_ms=10_000),
        clock=clock,
        seed=1,
    )
    # WHEN the first run happens
    first = assigner.run(run_number=1)
    # THEN only the unassigned lease is assigned: the stale one gets a full lease duration to prove it is alive
    assert owners(store) == {"unassigned": "take", "stale": "dead"}
    assert first.assigned == 1 and first.reassigned_expired == 0
    # WHEN 10 s pass without its counter moving and the leader runs again
    clock.advance(10.5)
    metrics.workers = [cpu_worker("take", 50, clock)]
    second = assigner.run(run_number=2)
    # THEN the expired lease is reassigned, with an owner-and-counter condition
    assert owners(store)["stale"] == "take"
    assert second.reassigned_expired == 1 and second.expired == 1


def test_a_lease_renewed_between_scan_and_write_is_not_taken(store: DynamoDBLeaseStore) -> None:
    # GIVEN a lease the leader will judge expired
    clock = ManualClock()
    metrics = MemoryMetrics([cpu_worker("take", 10, clock)])
    assert store.create_lease_if_absent(Lease(lease_key="l", lease_owner="slow", lease_counter=3))
    assigner = LeaseAssigner(store, metrics, lease_config=LeaseConfig(failover_time_ms=2_000), clock=clock, seed=1)
    assigner.run(run_number=1)
    clock.advance(3)
    metrics.workers = [cpu_worker("take", 10, clock)]

    # WHEN the owner renews right after the leader scanned (simulated by renewing inside list_leases)
    original = store.list_leases

    def scan_then_owner_renews(**kwargs: Any) -> list[Lease]:
        leases = original(**kwargs)
        current = store.get_lease("l")
        assert current is not None and store.renew_lease(current, "slow") is not None
        return leases

    store.list_leases = scan_then_owner_renews  # type: ignore[method-assign]
    report = assigner.run(run_number=2)
    store.list_leases = original  # type: ignore[method-assign]
    # THEN the conditional write loses: the live owner keeps its lease
    assert owners(store)["l"] == "slow" and report.write_conflicts == 1


def hot_and_idle(store: DynamoDBLeaseStore, clock: ManualClock) -> MemoryMetrics:
    """Leases l0–l3 held by a hot worker, ``yield`` (90 % CPU), and an idle one, ``take`` (10 %): their metrics."""
    for n in range(4):
        assert store.create_lease_if_absent(
            Lease(lease_key=f"l{n}", lease_owner="yield", lease_counter=1, throughput_kbps=10.0)
        )
    return MemoryMetrics([cpu_worker("yield", 90, clock), cpu_worker("take", 10, clock)])


def test_rebalancing_starts_a_graceful_handoff_and_an_overdue_one_is_forced(store: DynamoDBLeaseStore) -> None:
    # GIVEN (scenario 15) a hot worker holding leases and an idle one
    clock = ManualClock()
    metrics = hot_and_idle(store, clock)
    config = AssignmentConfig(balancing_frequency=1)
    lease_config = LeaseConfig(graceful_handoff_timeout_ms=30_000, failover_time_ms=10_000)
    assigner = LeaseAssigner(store, metrics, config=config, lease_config=lease_config, clock=clock, seed=3)
    # WHEN the leader runs
    report = assigner.run(run_number=1)
    # THEN leases move by graceful handoff: leaseOwner = take, checkpointOwner = yield, counter untouched
    moving = [lease for lease in store.list_leases() if lease.checkpoint_owner is not None]
    assert report.moved >= 1 and len(moving) == report.moved
    assert all(m.lease_owner == "take" and m.checkpoint_owner == "yield" and m.lease_counter == 1 for m in moving)
    # WHEN the old owner keeps renewing as checkpoint owner but never completes, and 30 s + 10 s pass
    forced = 0
    for step in range(9):
        clock.advance(5)
        for lease in store.list_leases():
            if lease.checkpoint_owner == "yield" or lease.lease_owner == "yield":
                store.renew_lease(lease, "yield")
        metrics.workers = [cpu_worker("yield", 50, clock), cpu_worker("take", 50, clock)]
        forced += assigner.run(run_number=2 + step).handoffs_forced
        # (not before the deadline: 30 s handoff timeout + 10 s lease duration)
        if clock.monotonic() - 1000 <= 40:
            assert forced == 0
    # THEN the leader forced each handoff once: no checkpoint owner left, the new owner holds them
    assert forced == len(moving)
    assert all(lease.checkpoint_owner is None for lease in store.list_leases())
    assert sum(1 for lease in store.list_leases() if lease.lease_owner == "take") == len(moving)


def test_finished_leases_are_never_assigned(store: DynamoDBLeaseStore) -> None:
    clock = ManualClock()
    assert store.create_lease_if_absent(Lease(lease_key="done", checkpoint=SHARD_END))
    assert store.create_lease_if_absent(Lease(lease_key="open"))
    assigner = LeaseAssigner(store, MemoryMetrics([cpu_worker("w", 10, clock)]), clock=clock, seed=1)
    report = assigner.run(run_number=1)
    assert owners(store) == {"done": None, "open": "w"}
    assert report.finished_leases == 1 and report.leases == 1


def test_nothing_is_assigned_to_inactive_workers_and_stale_entries_are_swept(store: DynamoDBLeaseStore) -> None:
    # GIVEN an inactive worker (no report for 2 days) and no active one
    clock = ManualClock()
    metrics = MemoryMetrics([cpu_worker("ghost", 10, clock, lut_offset=-2 * 86400)])
    assert store.create_lease_if_absent(Lease(lease_key="l"))
    assigner = LeaseAssigner(store, metrics, clock=clock, seed=1)
    # WHEN the leader runs
    report = assigner.run(run_number=1)
    # THEN the lease stays unassigned and the stale worker entry is deleted
    assert owners(store) == {"l": None}
    assert report.unassigned == 1 and metrics.deleted == ["ghost"]


def test_every_decision_is_one_structured_log_line(store: DynamoDBLeaseStore, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    for n in range(3):
        assert store.create_lease_if_absent(Lease(lease_key=f"l{n}"))
    assigner = LeaseAssigner(
        store, MemoryMetrics([cpu_worker("a", 10, clock), cpu_worker("b", 10, clock)]), clock=clock, seed=1
    )
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        assigner.run(run_number=1)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == DECISION_LOGGER]
    assert len(lines) == 3
    assert all(
        {"lease", "from", "to", "kind", "reason", "load_before", "load_after", "written"} <= set(x) for x in lines
    )
    assert all(x["written"] for x in lines)


def test_lease_config_graceful_handoff_can_be_disabled(store: DynamoDBLeaseStore) -> None:
    clock = ManualClock()
    metrics = hot_and_idle(store, clock)
    assigner = LeaseAssigner(
        store,
        metrics,
        config=AssignmentConfig(balancing_frequency=1),
        lease_config=LeaseConfig(graceful_handoff_enabled=False),
        clock=clock,
        seed=3,
    )
    report = assigner.run(run_number=1)
    assert report.moved >= 1
    assert all(lease.checkpoint_owner is None for lease in store.list_leases())


def test_a_worker_that_let_its_leases_expire_gets_nothing_until_it_reports_again(store: DynamoDBLeaseStore) -> None:
    # GIVEN "dead" stopped renewing its lease but its last metrics report is still fresh, and "live" is busy
    clock = ManualClock()
    metrics = MemoryMetrics([cpu_worker("dead", 5, clock), cpu_worker("live", 60, clock)])
    assert store.create_lease_if_absent(Lease(lease_key="a", lease_owner="dead", lease_counter=1))
    assigner = LeaseAssigner(store, metrics, lease_config=LeaseConfig(failover_time_ms=10_000), clock=clock, seed=1)
    assigner.run(run_number=1)
    clock.advance(11)
    # WHEN the lease expires it moves to "live" (never back to "dead")
    assigner.run(run_number=2)
    assert owners(store) == {"a": "live"}
    # AND WHEN a new lease appears while "dead" holds nothing and looks like an idle newcomer
    assert store.create_lease_if_absent(Lease(lease_key="b"))
    clock.advance(5)
    assigner.run(run_number=3)
    # THEN it goes to "live": "dead" is left out until it reports again
    assert owners(store)["b"] == "live"
    # WHEN "dead" reports again (it was alive after all) THEN it is back in the fleet
    metrics.workers = [cpu_worker("dead", 5, clock, lut_offset=1), cpu_worker("live", 60, clock)]
    assert store.create_lease_if_absent(Lease(lease_key="c"))
    assigner.run(run_number=4)
    assert owners(store)["c"] == "dead"
