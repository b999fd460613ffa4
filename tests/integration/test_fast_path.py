"""The leader's fast path against moto (docs/failover.md): a gone worker's leases move within a tick of its failover
time, a stopped one's at once, a departing one gets nothing and keeps what it holds, the confirmation read and the
counter condition protect a worker that is alive after all, throttled reads back off without stopping full cycles,
expiry observations outlive a leader, and a Lambda invocation waits for a lock that is about to be handed over.

Workers are stand-ins (:class:`~tests.support.heartbeat.StandInWorker`): their heartbeats and renewals are real
writes, on the leader's :class:`ManualClock`. Only the Lambda takeover tests run on real time (a few seconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.heartbeat import Fleet, LivingClock, StandInWorker, ThrottledRows, owned_lease
from tests.support.recording import owners
from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.models import Lease, WorkerMetricStats, WorkerState
from worker_lib.leader.assigner import LeaseAssigner
from worker_lib.leader.assignment_report import AssignmentReport
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.factory import build_leader
from worker_lib.leader.fast_path import FastPath, LivenessWatch
from worker_lib.leader.leader import TAKEOVER_POLL_S, CycleReport, Leader
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.tables.state_store import CoordinatorStateStore, ExpiryObservationStore
from worker_lib.testing.streams import create_stream
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

WALL = 1_800_000_000.0
FAILOVER_MS = 10_000
SKEW_MS = 1_000


@dataclass
class World:
    """One leader's assignment step with its fast path, and stand-in workers, on one manual clock."""

    clock: ManualClock
    leases: DynamoDBLeaseStore
    rows: WorkerMetricsStore
    watch_rows: ThrottledRows
    watch: LivenessWatch
    assigner: LeaseAssigner
    fast: FastPath
    fleet: Fleet

    def worker(self, worker_id: str) -> StandInWorker:
        return self.fleet.add(StandInWorker(worker_id, self.rows, self.leases))

    def full_run(self, run_number: int = 1) -> AssignmentReport:
        report = self.assigner.run(run_number=run_number)
        self.fast.note_full_cycle()
        return report

    def notice(self, worker_id: str) -> tuple[int, tuple[str, ...]]:
        row = self.rows.get(worker_id)
        assert row is not None
        return row.assignment_version, row.assigned_keys

    def tick_each_second(self, seconds: int) -> list[AssignmentReport]:
        """Advance ``seconds`` one at a time (workers act each second), ticking the fast path after each."""
        passes: list[AssignmentReport] = []
        for _ in range(seconds):
            self.fleet.advance(1)
            report = self.fast.tick(run_number=1)
            if report is not None:
                passes.append(report)
        return passes


def make_world(ddb: Any, app: str, *, balancing_frequency: int = 3) -> World:
    clock = ManualClock(wall=WALL)
    leases = DynamoDBLeaseStore(app, client=ddb, clock=clock)
    rows = WorkerMetricsStore(app, client=ddb, clock=clock)
    watch_rows = ThrottledRows(rows)
    watch = LivenessWatch(watch_rows, failover_ms=FAILOVER_MS, max_clock_skew_ms=SKEW_MS, clock=clock)
    assigner = LeaseAssigner(
        leases,
        rows,
        config=AssignmentConfig(balancing_frequency=balancing_frequency),
        lease_config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        liveness=watch,
        notifier=rows,
        clock=clock,
        seed=1,
    )
    fast = FastPath(watch, assigner, max_backoff_s=20, clock=clock)
    return World(clock, leases, rows, watch_rows, watch, assigner, fast, Fleet(clock))


@pytest.fixture
def world(ddb: Any, app_name: str) -> World:
    return make_world(ddb, app_name)


def two_workers_with_two_leases_each(world: World) -> tuple[StandInWorker, StandInWorker]:
    a, b = world.worker("A"), world.worker("B")
    for key in ("a0", "a1"):
        owned_lease(world.leases, key, "A")
    for key in ("b0", "b1"):
        owned_lease(world.leases, key, "B")
    world.fleet.step()
    return a, b


BEFORE = {"a0": "A", "a1": "A", "b0": "B", "b1": "B"}


# ----------------------------------------------------------------------------------------------- (a) (b) gone


def test_a_silent_workers_leases_move_to_a_live_one_after_the_failover_time_and_not_before(world: World) -> None:
    # GIVEN workers A and B heartbeating and renewing two leases each; the leader's full run 1 saw them
    a, _ = two_workers_with_two_leases_each(world)
    world.full_run()
    assert owners(world.leases) == BEFORE
    asv_before, _ = world.notice("B")
    # WHEN A lives 3 more seconds (the fast path's reads see its counter move), then dies: no beat, no renewal
    assert world.tick_each_second(3) == []
    a.beating = a.renewing = False
    # THEN for the whole failover time after its last beat, no fast pass runs and nothing moves
    assert world.tick_each_second(10) == []
    assert owners(world.leases) == BEFORE
    # WHEN a tick comes just after the failover time
    world.fleet.advance(0.5)
    report = world.fast.tick(run_number=1)
    # THEN a fast pass moves A's leases to B (per-lease expiry alone would not: their counters moved since the
    # leader's last lease scan) ...
    assert report is not None and report.fast and not report.balancing_ran
    assert report.workers_gone == ("A",) and report.reassigned_expired == 2
    assert owners(world.leases) == {"a0": "B", "a1": "B", "b0": "B", "b1": "B"}
    # ... and B is told which leases it received (its next heartbeat brings the notice back)
    assert report.notices == 1
    assert world.notice("B") == (asv_before + 1, ("a0", "a1"))
    # AND the next tick does not run another pass for the same departure
    assert world.tick_each_second(1) == []


def test_a_stopped_workers_leases_move_at_the_next_tick(world: World) -> None:
    # GIVEN A and B with two leases each, seen by a full run
    a, _ = two_workers_with_two_leases_each(world)
    world.full_run()
    assert world.tick_each_second(1) == []
    # WHEN A announces STOPPED (it fenced itself first) and stops
    a.state = WorkerState.STOPPED
    a.renewing = False
    a.beat()
    a.beating = False
    report = world.fast.tick(run_number=1)
    # THEN the very next tick moves its leases to B, without waiting for any failover time
    assert report is not None and report.workers_gone == ("A",)
    assert owners(world.leases) == {"a0": "B", "a1": "B", "b0": "B", "b1": "B"}
    assert world.notice("B")[1] == ("a0", "a1")


def test_a_new_leader_judges_a_worker_that_died_before_it_took_over_by_its_stamp(world: World) -> None:
    # GIVEN A's last beat was 12 s ago (before this leader existed) and B is alive; A's leases unchanged since
    a, _ = two_workers_with_two_leases_each(world)
    a.beating = a.renewing = False
    world.fleet.advance(12)
    # WHEN the new leader's first full run reads the tables
    report = world.full_run()
    # THEN A is gone at once (12 s − 1 s skew > 10 s): its leases move in this first run, although the leader has
    # watched their counters for no time at all
    assert report.workers_gone == ("A",) and report.reassigned_expired == 2
    assert owners(world.leases) == {"a0": "B", "a1": "B", "b0": "B", "b1": "B"}


# ----------------------------------------------------------------------------------------------- (c) departing


def departing_world(
    ddb: Any, app: str, state: WorkerState, *, a_cpu: float, a_leases: int, b_cpu: float, b_leases: int, free: int
) -> tuple[World, StandInWorker]:
    """A (in ``state``) and B reporting CPU and holding 100 KBps leases, ``free`` unassigned leases; full runs
    balance every time."""
    world = make_world(ddb, app, balancing_frequency=1)
    a, b = world.worker("A"), world.worker("B")
    for worker, count in ((a, a_leases), (b, b_leases)):
        for n in range(count):
            assert world.leases.create_lease_if_absent(
                Lease(
                    lease_key=f"{worker.worker_id.lower()}{n}",
                    lease_owner=worker.worker_id,
                    lease_counter=1,
                    throughput_kbps=100.0,
                )
            )
    for n in range(free):
        owned_lease(world.leases, f"free{n}", None)
    a.state = state
    world.fleet.step()
    for worker, cpu in ((a, a_cpu), (b, b_cpu)):
        world.rows.put(
            WorkerMetricStats(
                worker_id=worker.worker_id,
                last_update_epoch_s=int(world.clock.wall()),
                stats={"C": (cpu, cpu)},
                operating_range={"C": (80.0,)},
            )
        )
    return world, a


@pytest.mark.parametrize("state", [WorkerState.ACTIVE, WorkerState.DEPARTING])
def test_a_departing_worker_receives_no_lease(ddb: Any, app_name: str, state: WorkerState) -> None:
    # GIVEN an idle A (10 % CPU, no lease) and a busy B (70 %, two leases), two unassigned leases
    world, _ = departing_world(ddb, app_name, state, a_cpu=10, a_leases=0, b_cpu=70, b_leases=2, free=2)
    # WHEN the leader's full run happens
    report = world.full_run()
    free = {owners(world.leases)[key] for key in ("free0", "free1")}
    if state is WorkerState.ACTIVE:
        # THEN (control) the idle A, active, receives unassigned leases
        assert "A" in free
    else:
        # THEN the departing A receives nothing: both go to the busier B, and A is never notified
        assert report.workers_departing == ("A",)
        assert free == {"B"}
        assert world.notice("A")[0] == 0


@pytest.mark.parametrize("state", [WorkerState.ACTIVE, WorkerState.DEPARTING])
def test_a_departing_workers_leases_are_not_moved_until_it_gives_them_up(
    ddb: Any, app_name: str, state: WorkerState
) -> None:
    # GIVEN a hot A (90 % CPU, four leases) and an idle B (10 %, none)
    world, a = departing_world(ddb, app_name, state, a_cpu=90, a_leases=4, b_cpu=10, b_leases=0, free=0)
    # WHEN the leader's full (balancing) run happens
    report = world.full_run()
    moving = [lease.lease_key for lease in world.leases.list_leases() if lease.lease_owner == "B"]
    if state is WorkerState.ACTIVE:
        # THEN (control) an active A gives leases to B by graceful handoff
        assert report.moved >= 1 and moving
        return
    # THEN none of a departing A's leases is moved or handed off
    assert report.workers_departing == ("A",) and report.workers_gone == () and report.moved == 0
    assert all(lease.lease_owner == "A" and lease.checkpoint_owner is None for lease in world.leases.list_leases())
    # WHEN A gives one lease up and says so (evc + 1), and a new lease appears
    given_up = world.leases.get_lease("a0")
    assert given_up is not None and world.leases.evict_lease(given_up, "A") is not None
    a.events += 1
    owned_lease(world.leases, "new", None)
    world.fleet.advance(1)
    fast = world.fast.tick(run_number=2)
    # THEN a fast pass runs at once and gives both to B; A's other leases stay with A
    assert fast is not None and fast.fast and fast.workers_departing == ("A",)
    assert owners(world.leases) == {"a0": "B", "a1": "A", "a2": "A", "a3": "A", "new": "B"}
    assert world.notice("B")[1] == ("a0", "new")
    assert world.notice("A")[0] == 0


def test_a_worker_that_departs_between_the_ticks_read_and_its_pass_gets_its_leases_back_from_nobody(
    ddb: Any, app_name: str
) -> None:
    # GIVEN an idle A (10 % CPU, two leases) and a busy B (70 %, two leases); the fast path has seen them
    world, a = departing_world(ddb, app_name, WorkerState.ACTIVE, a_cpu=10, a_leases=2, b_cpu=70, b_leases=2, free=0)
    assert world.fast.tick(run_number=1) is None
    # AND A then says something changed (evc + 1): the next tick will run a pass
    a.events += 1
    world.fleet.advance(1)

    def depart() -> None:
        a.state = WorkerState.DEPARTING
        a.beat()
        for key in ("a0", "a1"):
            lease = world.leases.get_lease(key)
            assert lease is not None and world.leases.evict_lease(lease, "A") is not None

    # WHEN A says DEPARTING and gives both leases up just after the tick read its row (still ACTIVE there)
    world.watch_rows.after_next_scan = depart
    report = world.fast.tick(run_number=1)
    # THEN the pass reads the rows again after its lease scan: the departing A gets nothing back, B gets both
    assert report is not None and report.fast and report.workers_departing == ("A",)
    assert owners(world.leases) == {"a0": "B", "a1": "B", "b0": "B", "b1": "B"}
    assert world.notice("A")[0] == 0


# ----------------------------------------------------------------------------------------------- (d) (e) safety


def silent_but_renewing(world: World) -> StandInWorker:
    """A whose heartbeat writes stop (say, throttled) while its lease renewals still land: gone by its heartbeat,
    never expired by its leases' counters."""
    a, _ = two_workers_with_two_leases_each(world)
    world.full_run()
    a.beating = False
    assert world.tick_each_second(10) == []
    world.fleet.advance(0.5)
    return a


def test_nothing_moves_when_the_confirmation_read_shows_a_new_heartbeat(world: World) -> None:
    # GIVEN A silent for longer than the failover time as far as the fast path's scan can tell
    a = silent_but_renewing(world)
    asv_before, _ = world.notice("B")
    # WHEN A's beat lands after the pass read the worker rows (after its lease scan), just before the confirmation
    # read
    original = world.rows.list_all
    scans: list[bool] = []

    def scan_then_a_beats(**kwargs: Any) -> list[WorkerMetricStats]:
        scanned = original(**kwargs)
        scans.append(True)
        if len(scans) == 2:  # the tick's own read first, then the pass's
            a.beat()
        return scanned

    world.rows.list_all = scan_then_a_beats  # type: ignore[method-assign]
    report = world.fast.tick(run_number=1)
    world.rows.list_all = original  # type: ignore[method-assign]
    # THEN the pass ran (the scan said gone) but the consistent read overruled it: nothing moved, nobody notified
    assert report is not None and report.workers_gone == ("A",)
    assert report.reassigned_expired == 0 and report.write_conflicts == 0
    assert owners(world.leases) == BEFORE
    assert world.notice("B")[0] == asv_before


def test_a_lease_renewed_between_the_scan_and_the_write_is_not_taken(world: World) -> None:
    # GIVEN A gone by its heartbeat (confirmed), whose lease a0 is renewed right after the leader's lease scan
    silent_but_renewing(world)
    original = world.leases.list_leases

    def scan_then_a0_renewed(**kwargs: Any) -> list[Lease]:
        scanned = original(**kwargs)
        current = world.leases.get_lease("a0")
        assert current is not None and world.leases.renew_lease(current, "A") is not None
        return scanned

    world.leases.list_leases = scan_then_a0_renewed  # type: ignore[method-assign]
    report = world.fast.tick(run_number=1)
    world.leases.list_leases = original  # type: ignore[method-assign]
    # THEN the write for a0 loses its counter condition, a1 moves, and B is notified of a1 only
    assert report is not None and report.workers_gone == ("A",)
    assert report.write_conflicts == 1
    assert owners(world.leases) == {"a0": "A", "a1": "B", "b0": "B", "b1": "B"}
    assert world.notice("B")[1] == ("a1",)


# ----------------------------------------------------------------------------------------------- (f) throttling


def test_a_throttled_fast_path_backs_off_and_full_cycles_still_assign(ddb: Any, app_name: str, world: World) -> None:
    # GIVEN A and B, a leader (lock + assignment + fast path) that ran a full cycle
    a, _ = two_workers_with_two_leases_each(world)
    leader = Leader(
        lock=DynamoDBLeaderLock(app_name, "leader", client=ddb, clock=world.clock),
        shard_sync=None,
        assignment=world.assigner,
        config=LeaderConfig(cycle_interval_ms=20_000),
        fast_tick=world.fast,
        clock=world.clock,
    )
    assert leader.run_cycle().leader
    # WHEN A stops, a new lease appears, and the fast path's worker-metrics scans are throttled
    a.state = WorkerState.STOPPED
    a.beat()
    a.beating = a.renewing = False
    owned_lease(world.leases, "new", None)
    world.watch_rows.throttled = True
    world.fleet.advance(1)
    # THEN a tick returns nothing, and the next read waits for a doubling back-off (1 s, then 2 s)
    assert world.fast.tick(run_number=1) is None
    assert world.watch_rows.scans == 1
    assert world.fast.tick(run_number=1) is None
    assert world.watch_rows.scans == 1  # backing off: no read
    world.fleet.advance(1)
    assert world.fast.tick(run_number=1) is None
    assert world.watch_rows.scans == 2
    world.fleet.advance(1)
    assert world.fast.tick(run_number=1) is None
    assert world.watch_rows.scans == 2  # 2 s back-off now
    assert owners(world.leases)["a0"] == "A"
    # WHEN the leader's full cycle runs meanwhile
    world.fleet.advance(1)
    cycle = leader.run_cycle()
    # THEN it assigns as usual: A's leases and the new lease go to B
    assert cycle.leader and cycle.error is None
    assert owners(world.leases) == {"a0": "B", "a1": "B", "b0": "B", "b1": "B", "new": "B"}
    # WHEN the throttling ends and the back-off has passed THEN the fast path reads again (nothing left to do)
    world.watch_rows.throttled = False
    world.fleet.advance(2)
    assert world.fast.tick(run_number=1) is None
    assert world.watch_rows.scans == 3


# ----------------------------------------------------------------------------------------------- (g) observations


def observing_assigner(
    ddb: Any, app: str, clock: ManualClock, *, keep: bool
) -> tuple[LeaseAssigner, ExpiryObservationStore]:
    observations = ExpiryObservationStore(
        CoordinatorStateStore(app, client=ddb, clock=clock), max_clock_skew_ms=SKEW_MS
    )
    assigner = LeaseAssigner(
        DynamoDBLeaseStore(app, client=ddb, clock=clock),
        WorkerMetricsStore(app, client=ddb, clock=clock),
        lease_config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        observations=observations if keep else None,
        clock=clock,
        seed=1,
    )
    return assigner, observations


def test_expiry_observations_outlive_a_leader(ddb: Any, app_name: str) -> None:
    # GIVEN two leases of a dead worker (no heartbeat, counter 3); leader 1's full run observes them at W
    leases = DynamoDBLeaseStore(app_name, client=ddb)
    for key in ("d0", "d1"):
        owned_lease(leases, key, "dead", counter=3)
    clock1 = ManualClock(monotonic=1_000.0, wall=WALL)
    leader1, kept = observing_assigner(ddb, app_name, clock1, keep=True)
    leader1.run(run_number=1)
    assert sorted((key, counter) for key, counter, _ in kept.load()) == [("d0", 3), ("d1", 3)]
    assert all(since == pytest.approx(WALL) for _, _, since in kept.load())
    # AND d1 is renewed afterwards (its owner was alive after all)
    d1 = leases.get_lease("d1")
    assert d1 is not None and leases.renew_lease(d1, "dead") is not None
    # WHEN 8 s later a new leader (another host: another monotonic origin) and, for comparison, a leader that keeps
    # no observations take over, with a live worker B to assign to
    clock2 = ManualClock(monotonic=50.0, wall=WALL + 8)
    clock3 = ManualClock(monotonic=500.0, wall=WALL + 8)
    b_rows = WorkerMetricsStore(app_name, client=ddb, clock=clock2)
    b_rows.heartbeat("B", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    leader2, _ = observing_assigner(ddb, app_name, clock2, keep=True)
    fresh, _ = observing_assigner(ddb, app_name, clock3, keep=False)
    assert fresh.run(run_number=1).reassigned_expired == 0
    assert leader2.run(run_number=1).reassigned_expired == 0
    # AND 3.5 s more pass (d0 unchanged for 11.5 s; the restored date counts from W + 1 s skew: 10.5 s)
    for clock in (clock2, clock3):
        clock.advance(3.5)
    # THEN the fresh leader, which has watched d0 for only 3.5 s, does not move it ...
    assert fresh.run(run_number=2).reassigned_expired == 0
    assert owners(leases) == {"d0": "dead", "d1": "dead"}
    # ... while the leader that restored the observations judges d0 expired and moves it; d1 (renewed) stays
    second = leader2.run(run_number=2)
    assert second.reassigned_expired == 1
    assert owners(leases) == {"d0": "B", "d1": "dead"}


# ----------------------------------------------------------------------------------------------- build_leader


def test_the_leaders_loop_ticks_between_cycles_and_moves_a_dead_workers_leases_within_a_tick(
    ddb: Any, moto_aws: AwsConfig, app_name: str
) -> None:
    # GIVEN the leader as the hosts build it, with 20 s cycles and a 1 s fast tick, over a 4-shard stream, and two
    # stand-in workers that act each second of the leader's (manual) clock
    kinesis = aws.client("kinesis", moto_aws)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 4)
    clock = LivingClock(wall=WALL)
    parts = build_leader(
        app=app_name,
        stream=stream,
        aws_config=AwsConfig(),
        shard_sync=ShardSyncConfig(initial_position=InitialPosition.TRIM_HORIZON),
        owner="leader",
        leader_config=LeaderConfig(cycle_interval_ms=20_000),
        lock_config=LeaderLockConfig(),
        lease_config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        dynamodb=ddb,
        kinesis=kinesis,
        clock=clock,
    )
    rows = WorkerMetricsStore(app_name, client=ddb, clock=clock)
    fleet = Fleet(clock)
    a = fleet.add(StandInWorker("A", rows, parts.lease_store))
    fleet.add(StandInWorker("B", rows, parts.lease_store))
    fleet.step()
    clock.on_second = fleet.step
    died_at: list[float] = []
    fast_reports: list[tuple[float, CycleReport]] = []
    stop = threading.Event()

    def on_cycle(report: CycleReport) -> None:
        if not report.fast and not died_at:
            # WHEN A dies right after the first full cycle assigned the leases
            held = [lease.lease_key for lease in parts.lease_store.list_leases() if lease.lease_owner == "A"]
            assert held, "precondition: the first cycle gave A some leases"
            a.beating = a.renewing = False
            died_at.append(clock.monotonic())
        elif report.fast:
            fast_reports.append((clock.monotonic(), report))
            stop.set()

    reports = parts.leader.run(stop=stop, max_cycles=2, on_cycle=on_cycle)
    # THEN a fast pass moved A's leases within about a tick of the failover time, long before the next full cycle
    assert len(reports) == 1 and reports[0].leader
    assert len(fast_reports) == 1
    at, fast = fast_reports[0]
    assert FAILOVER_MS / 1000 < at - died_at[0] <= FAILOVER_MS / 1000 + 2.5
    assert fast.assignment is not None
    assert fast.assignment.workers_gone == ("A",) and fast.assignment.reassigned_expired >= 1
    assert all(lease.lease_owner == "B" for lease in parts.lease_store.list_leases())


# ----------------------------------------------------------------------------------------------- (h) takeover
# On one manual clock shared by the holder and the contender: the contender's polls and waits advance it, the holder's
# release happens when the clock passes its time. What each test asserts about time is then exact.


class ScheduledClock(ManualClock):
    """A manual clock that runs each scheduled action once, when the clock reaches its time."""

    def __init__(self) -> None:
        super().__init__(monotonic=1_000.0, wall=WALL)
        self._due: list[tuple[float, Callable[[], None]]] = []

    def at(self, monotonic: float, action: Callable[[], None]) -> None:
        self._due.append((monotonic, action))

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        now = self.monotonic()
        due = [action for at, action in self._due if at <= now]
        self._due = [(at, action) for at, action in self._due if at > now]
        for action in due:
            action()


def holder_lock(
    ddb: Any, app: str, clock: ManualClock, *, release_in_s: float, config: LeaderLockConfig | None = None
) -> DynamoDBLeaderLock:
    holder = DynamoDBLeaderLock(app, "invocation-1", config=config or LeaderLockConfig(), client=ddb, clock=clock)
    holder.plan_release(int((clock.wall() + release_in_s) * 1000))
    assert holder.try_acquire()
    return holder


def contender(ddb: Any, app: str, clock: ManualClock, *, lock_config: LeaderLockConfig | None = None) -> Leader:
    lock_config = lock_config or LeaderLockConfig()
    return Leader(
        lock=DynamoDBLeaderLock(app, "invocation-2", config=lock_config, client=ddb, clock=clock),
        shard_sync=None,
        config=LeaderConfig(cycle_interval_ms=1_000, deadline_margin_ms=1_000),
        lock_config=lock_config,
        clock=clock,
    )


def test_an_invocation_waits_for_a_lock_released_soon_and_takes_over(ddb: Any, app_name: str) -> None:
    # GIVEN a holder that announced it releases in 1.5 s, and does
    clock = ScheduledClock()
    holder = holder_lock(ddb, app_name, clock, release_in_s=1.5)
    started = clock.monotonic()
    released_at: list[float] = []

    def release() -> None:
        assert holder.release()
        released_at.append(clock.monotonic())

    clock.at(started + 1.5, release)
    # WHEN the next invocation (8 s left, 1 s margin) finds the lock held
    led_at: list[float] = []
    stop = threading.Event()

    def on_cycle(report: CycleReport) -> None:
        if report.leader:
            led_at.append(clock.monotonic())
            stop.set()

    reports = contender(ddb, app_name, clock).run(
        stop=stop, deadline_monotonic=started + 8, exit_when_held=True, on_cycle=on_cycle
    )
    # THEN it did not exit after its first read: it waited, and led right after the release (within two polls)
    assert not reports[0].leader and reports[0].current_leader == "invocation-1"
    assert reports[-1].leader and len(led_at) == 1 and len(released_at) == 1
    assert released_at[0] <= led_at[0] <= released_at[0] + 2 * TAKEOVER_POLL_S
    assert led_at[0] - started < 3.0


def test_an_invocation_exits_after_one_read_when_the_release_is_far_away(ddb: Any, app_name: str) -> None:
    # GIVEN a holder with a 30 s lock that releases in 25 s (beyond the 20 s takeover wait)
    clock = ScheduledClock()
    holder_lock(
        ddb,
        app_name,
        clock,
        release_in_s=25,
        config=LeaderLockConfig(lease_duration_ms=30_000, heartbeat_interval_ms=10_000),
    )
    # WHEN an invocation with a whole minute left finds the lock held
    started = clock.monotonic()
    reports = contender(ddb, app_name, clock).run(deadline_monotonic=started + 61, exit_when_held=True)
    # THEN it exits after one read, without waiting at all
    assert [r.leader for r in reports] == [False]
    assert clock.monotonic() == started


def test_an_invocation_near_its_own_deadline_does_not_wait(ddb: Any, app_name: str) -> None:
    # GIVEN a holder that releases in 3 s, and an invocation with only 4.5 s left (1 s margin): it could lead for
    # at most 0.5 s after waiting 3 s
    clock = ScheduledClock()
    holder_lock(ddb, app_name, clock, release_in_s=3.0)
    started = clock.monotonic()
    reports = contender(ddb, app_name, clock).run(deadline_monotonic=started + 4.5, exit_when_held=True)
    # THEN it exits after one read instead of waiting
    assert [r.leader for r in reports] == [False]
    assert clock.monotonic() == started


def test_an_invocation_waiting_for_a_release_that_never_comes_takes_over_when_the_lock_expires(
    ddb: Any, app_name: str
) -> None:
    # GIVEN a holder of a 3 s lock (0.5 s skew bound) that announced its release in 1 s and then died
    config = LeaderLockConfig(lease_duration_ms=3_000, heartbeat_interval_ms=1_000, max_clock_skew_ms=500)
    clock = ScheduledClock()
    holder_lock(ddb, app_name, clock, release_in_s=1.0, config=config)
    # WHEN an invocation with 30 s left finds the lock held (the lock expires for it 3.5 s after the acquire)
    started = clock.monotonic()
    expires_s = (config.lease_duration_ms + config.max_clock_skew_ms) / 1000
    stop = threading.Event()
    led_at: list[float] = []

    def on_cycle(report: CycleReport) -> None:
        if report.leader:
            led_at.append(clock.monotonic())
            stop.set()

    reports = contender(ddb, app_name, clock, lock_config=config).run(
        stop=stop, deadline_monotonic=started + 30, exit_when_held=True, on_cycle=on_cycle
    )
    # THEN it keeps waiting past the missed release and takes over once the lock expired (not before), within two
    # polls, well within its budget
    assert not reports[0].leader
    assert reports[-1].leader, f"exited after {clock.monotonic() - started:.1f} s without taking over"
    assert expires_s <= led_at[0] - started <= expires_s + 2 * TAKEOVER_POLL_S
