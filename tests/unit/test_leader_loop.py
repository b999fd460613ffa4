"""The leader loop's own logic (lock handling, intervals, failures, deadlines) with in-memory seams.

The lock and the steps here are test doubles of *our* protocols, not of AWS; the DynamoDB lock itself is tested
against emulators in tests/integration/test_leader_lock.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from tests.support.leader_reports import assignment_report
from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import DependencyError
from worker_lib.leader.assignment_report import AssignmentReport
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.leader import Leader
from worker_lib.shardsync.syncer import ShardSyncResult

LOCK = LeaderLockConfig(lease_duration_ms=30_000, heartbeat_interval_ms=10_000, poll_interval_ms=1_000)


@dataclass
class MemoryLock:
    """A lock whose holder the test controls."""

    owner: str
    clock: ManualClock
    holder: str | None = None
    acquired_at: float | None = None
    heartbeats: int = 0
    releases: int = 0
    heartbeat_times: list[float] = field(default_factory=list)
    planned_release_ms: int | None = None

    def try_acquire(self) -> bool:
        if self.holder in (None, self.owner):
            self.holder, self.acquired_at = self.owner, self.clock.monotonic()
            return True
        return False

    def acquire(self, timeout_s: float) -> bool:
        return self.try_acquire()

    def heartbeat(self) -> bool:
        if self.holder != self.owner:
            return False
        self.heartbeats += 1
        self.heartbeat_times.append(self.clock.monotonic())
        self.acquired_at = self.clock.monotonic()
        return True

    def release(self) -> bool:
        if self.holder != self.owner:
            return False
        self.holder, self.acquired_at = None, None
        self.releases += 1
        return True

    def plan_release(self, wall_ms: int | None) -> None:
        self.planned_release_ms = wall_ms

    def holder_is_foreign(self) -> bool:
        return False

    def last_seen_holder(self) -> str | None:
        return self.holder

    def takeover_eta_s(self) -> float | None:
        return 0.0 if self.holder is None else None

    def is_leader(self) -> bool:
        return (
            self.holder == self.owner
            and self.acquired_at is not None
            and (self.clock.monotonic() < self.acquired_at + 29)
        )

    def current_leader(self) -> str | None:
        return self.holder


@dataclass
class CountingSync:
    runs: int = 0
    fail_with: Exception | None = None

    def sync_once(self) -> ShardSyncResult:
        self.runs += 1
        if self.fail_with is not None:
            raise self.fail_with
        return ShardSyncResult(shards_seen=self.runs, open_shards=self.runs, leases_before=0)


@dataclass
class RecordingAssignment:
    run_numbers: list[int] = field(default_factory=list)

    def run(self, *, run_number: int) -> AssignmentReport:
        self.run_numbers.append(run_number)
        return assignment_report(run_number)


def make_leader(
    clock: ManualClock, *, lock: MemoryLock | None = None, sync: CountingSync | None = None
) -> tuple[Leader, MemoryLock, CountingSync, RecordingAssignment]:
    lock = lock or MemoryLock("me", clock)
    sync = sync or CountingSync()
    assignment = RecordingAssignment()
    leader = Leader(
        lock=lock,
        shard_sync=sync,
        assignment=assignment,
        config=LeaderConfig(cycle_interval_ms=20_000, deadline_margin_ms=10_000),
        lock_config=LOCK,
        shard_sync_interval_ms=60_000,
        clock=clock,
    )
    return leader, lock, sync, assignment


def test_a_host_that_does_not_hold_the_lock_does_nothing() -> None:
    # GIVEN another host holds the lock
    clock = ManualClock()
    lock = MemoryLock("me", clock, holder="other")
    leader, _, sync, assignment = make_leader(clock, lock=lock)
    # WHEN a cycle runs
    report = leader.run_cycle()
    # THEN neither shard sync nor assignment ran, and the report names the holder
    assert not report.leader and report.current_leader == "other"
    assert sync.runs == 0 and assignment.run_numbers == []


def test_shard_sync_runs_at_its_own_interval_and_assignment_every_cycle() -> None:
    # GIVEN a leader with 20 s cycles and 60 s shard sync
    clock = ManualClock()
    leader, _, sync, assignment = make_leader(clock)
    # WHEN six cycles run 20 s apart
    for _ in range(6):
        leader.run_cycle()
        clock.advance(20)
    # THEN shard sync ran on cycles 1 and 4, assignment on every cycle with increasing run numbers
    assert sync.runs == 2
    assert assignment.run_numbers == [1, 2, 3, 4, 5, 6]


def test_three_consecutive_failed_cycles_release_leadership_once() -> None:
    # GIVEN a leader whose shard sync keeps failing (scenario 14)
    clock = ManualClock()
    sync = CountingSync(fail_with=DependencyError("ListShards: throttled"))
    leader, lock, _, _ = make_leader(clock, sync=sync)
    reports = []
    # WHEN three cycles run
    for _ in range(3):
        reports.append(leader.run_cycle())
        clock.advance(61)
    # THEN the first two are failures that keep the lock, the third releases it, once
    assert [r.error is not None for r in reports] == [True, True, True]
    assert [r.released for r in reports] == [False, False, True]
    assert lock.releases == 1 and lock.holder is None


def test_a_successful_cycle_resets_the_failure_count() -> None:
    # GIVEN two failures, then a success, then two failures
    clock = ManualClock()
    sync = CountingSync()
    leader, lock, _, _ = make_leader(clock, sync=sync)
    outcomes = [True, True, False, True, True]
    for fail in outcomes:
        sync.fail_with = DependencyError("boom") if fail else None
        leader.run_cycle()
        clock.advance(61)
    # THEN leadership was never released
    assert lock.releases == 0 and lock.holder == "me"


def test_an_unexpected_error_releases_at_once_and_propagates() -> None:
    # GIVEN a step with a bug
    clock = ManualClock()
    leader, lock, _, _ = make_leader(clock, sync=CountingSync(fail_with=KeyError("bug")))
    # WHEN a cycle runs THEN the error propagates and the lock is free
    with pytest.raises(KeyError):
        leader.run_cycle()
    assert lock.releases == 1 and lock.holder is None


def test_the_loop_heartbeats_between_cycles_and_stops_before_the_deadline() -> None:
    # GIVEN a host with 60 s left (a Lambda) and a 10 s deadline margin
    clock = ManualClock()
    leader, lock, _, assignment = make_leader(clock)
    deadline = clock.monotonic() + 60
    # WHEN the loop runs
    reports = leader.run(deadline_monotonic=deadline)
    # THEN it ran cycles at 0 s, 20 s and 40 s only (the next would start inside the margin)
    assert [r.cycle for r in reports] == [1, 2, 3]
    assert assignment.run_numbers == [1, 2, 3]
    # AND it heartbeated at least every 10 s while waiting, and released the lock at the end
    gaps = [b - a for a, b in zip([1000.0, *lock.heartbeat_times], lock.heartbeat_times, strict=False)]
    assert lock.heartbeats >= 4 and max(gaps) <= 10.25
    assert lock.releases == 1 and lock.holder is None
    assert clock.monotonic() <= deadline - 10 + 0.25


def test_the_loop_stops_when_asked_and_releases() -> None:
    # GIVEN a stop event set by the first cycle's callback
    clock = ManualClock()
    leader, lock, _, _ = make_leader(clock)
    stop = threading.Event()
    # WHEN the loop runs
    reports = leader.run(stop=stop, on_cycle=lambda _report: stop.set())
    # THEN exactly one cycle ran and the lock was released
    assert len(reports) == 1 and lock.releases == 1


def test_a_non_leader_polls_the_lock_and_takes_over_when_it_frees() -> None:
    # GIVEN another holder that releases after 5 s
    clock = ManualClock()
    lock = MemoryLock("me", clock, holder="other")
    leader, _, sync, _ = make_leader(clock, lock=lock)

    def on_cycle(report: object) -> None:
        if clock.monotonic() >= 1005:
            lock.holder = None if lock.holder == "other" else lock.holder

    # WHEN the loop runs for a bounded number of cycles
    reports = leader.run(max_cycles=8, on_cycle=on_cycle)
    # THEN it polled once a second and became leader within one poll of the release
    first_leader = next(r for r in reports if r.leader)
    assert first_leader.cycle <= 7
    assert sync.runs == 1


def test_run_once_releases_after_one_cycle() -> None:
    clock = ManualClock()
    leader, lock, _, _ = make_leader(clock)
    report = leader.run_once()
    assert report.leader and report.shard_sync is not None and report.shard_sync.shards_seen == 1
    assert report.assignment is not None and report.assignment.run_number == 1
    assert lock.releases == 1 and lock.holder is None
    assert report.to_dict()["shard_sync"]["shards_seen"] == 1
