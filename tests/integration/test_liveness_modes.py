"""Liveness modes against moto (docs/liveness-modes.md): in ``worker`` mode the leader judges a heartbeating
worker's leases by its heartbeat alone, asks for hand-offs on the old owner's item and forces them only after the
request's timeout plus the failover time, reports owners that do not heartbeat; the mode is recorded by the first
leader, refused when a process is configured for the other, and switched in either direction in a safe order.

The leader is the real assignment step with its fast path; workers are stand-ins whose heartbeats and renewals are
real writes, on the leader's manual clock (tests/support/heartbeat.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.heartbeat import Fleet, StandInWorker, ThrottledRows, owned_lease
from tests.support.recording import owners
from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.snapshot import ExpiryTracker
from worker_lib.cli.main import main as cli_main
from worker_lib.cli.status import collect, render
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ThrottledError
from worker_lib.core.models import Lease
from worker_lib.leader.assigner import LeaseAssigner
from worker_lib.leader.assignment_report import AssignmentReport
from worker_lib.leader.factory import build_leader, preflight
from worker_lib.leader.fast_path import FastPath, LivenessWatch
from worker_lib.leader.mode_keeper import LeaderModeKeeper
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.mode import LivenessMode, LivenessModeMismatchError, StoredMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.state_store import CoordinatorStateStore, ExpiryObservationStore
from worker_lib.testing.streams import create_stream
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

WALL = 1_800_000_000.0
FAILOVER_MS = 10_000
HANDOFF_TIMEOUT_MS = 30_000


@dataclass
class World:
    clock: ManualClock
    leases: DynamoDBLeaseStore
    rows: WorkerMetricsStore
    modes: LivenessModeStore
    assigner: LeaseAssigner
    fast: FastPath
    fleet: Fleet

    def worker(self, worker_id: str, *, renewing: bool, liveness: str | None = None) -> StandInWorker:
        stand_in = StandInWorker(worker_id, self.rows, self.leases, renewing=renewing, liveness=liveness)
        return self.fleet.add(stand_in)

    def full_run(self, run_number: int = 2) -> AssignmentReport:
        report = self.assigner.run(run_number=run_number)
        self.fast.note_full_cycle()
        return report

    def live(self, seconds: int, *, full_every: int = 20) -> list[AssignmentReport]:
        """``seconds`` of fleet life: workers act each second, the fast path ticks, full runs every 20 s."""
        reports: list[AssignmentReport] = []
        for second in range(1, seconds + 1):
            self.fleet.advance(1)
            tick = self.fast.tick(run_number=2)
            if tick is not None:
                reports.append(tick)
            if second % full_every == 0:
                reports.append(self.full_run())
        return reports


def make_world(ddb: Any, app: str, *, setting: str, balancing_frequency: int = 3) -> World:
    clock = ManualClock(wall=WALL)
    leases = DynamoDBLeaseStore(app, client=ddb, clock=clock)
    rows = WorkerMetricsStore(app, client=ddb, clock=clock)
    watch = LivenessWatch(ThrottledRows(rows), failover_ms=FAILOVER_MS, max_clock_skew_ms=1_000, clock=clock)
    modes = LivenessModeStore(CoordinatorStateStore(app, client=ddb, clock=clock), clock=clock)
    assigner = LeaseAssigner(
        leases,
        rows,
        config=AssignmentConfig(balancing_frequency=balancing_frequency),
        lease_config=LeaseConfig(failover_time_ms=FAILOVER_MS, graceful_handoff_timeout_ms=HANDOFF_TIMEOUT_MS),
        liveness=watch,
        notifier=rows,
        modes=LeaderModeKeeper(modes, setting=setting),
        clock=clock,
        seed=1,
    )
    fast = FastPath(watch, assigner, max_backoff_s=20, clock=clock)
    return World(clock, leases, rows, modes, assigner, fast, Fleet(clock))


def two_workers(world: World, *, renewing: bool, liveness: str | None = None) -> tuple[StandInWorker, StandInWorker]:
    a = world.worker("A", renewing=renewing, liveness=liveness)
    b = world.worker("B", renewing=renewing, liveness=liveness)
    for key, owner in (("a0", "A"), ("a1", "A"), ("b0", "B"), ("b1", "B")):
        owned_lease(world.leases, key, owner)
    world.fleet.step()
    return a, b


def with_a_kcl_owner(ddb: Any, app: str) -> World:
    """Worker mode, worker B beating in worker mode and owning b0, and k0 owned by a KCL worker (kcl-java-1) that
    has no heartbeat row."""
    world = make_world(ddb, app, setting="worker")
    world.worker("B", renewing=False, liveness="worker")
    owned_lease(world.leases, "k0", "kcl-java-1")
    owned_lease(world.leases, "b0", "B")
    world.fleet.step()
    return world


BEFORE = {"a0": "A", "a1": "A", "b0": "B", "b1": "B"}


# ------------------------------------------------------------------------------------------- judging per owner


def test_in_worker_mode_beating_workers_keep_leases_they_never_renew(ddb: Any, app_name: str) -> None:
    # GIVEN an application in worker mode (the first leader records it) and two workers that beat but never renew
    world = make_world(ddb, app_name, setting="worker")
    two_workers(world, renewing=False, liveness="worker")
    first = world.full_run(run_number=1)
    assert world.modes.read() == StoredMode(mode=LivenessMode.WORKER) and first.liveness_mode == "worker"
    # WHEN a minute passes: three full runs and sixty fast ticks, lease counters never moving
    reports = world.live(60)
    # THEN no lease ever counted as expired and nothing moved
    assert all(r.expired == 0 and r.reassigned_expired == 0 for r in [first, *reports])
    assert owners(world.leases) == BEFORE
    assert {lease.lease_counter for lease in world.leases.list_leases()} == {1}


def test_in_lease_mode_the_same_workers_leases_expire(ddb: Any, app_name: str) -> None:
    # GIVEN the same fleet in lease mode: beating, not renewing
    world = make_world(ddb, app_name, setting="lease")
    two_workers(world, renewing=False)
    world.full_run(run_number=1)
    # WHEN more than the failover time passes
    reports = world.live(21)
    # THEN the leader counts their leases as expired (KCL's rule: a counter standing still)
    assert max(r.expired for r in reports) == 4


def test_in_worker_mode_a_silent_workers_leases_move_after_the_failover_time(ddb: Any, app_name: str) -> None:
    # GIVEN worker mode, A and B beating, neither renewing
    world = make_world(ddb, app_name, setting="worker")
    a, _ = two_workers(world, renewing=False, liveness="worker")
    world.full_run(run_number=1)
    world.live(3)
    # WHEN A dies
    a.beating = False
    early = world.live(9)
    # THEN nothing moves within the failover time, and everything A held moves to B just after it
    assert owners(world.leases) == BEFORE and not any(r.reassigned_expired for r in early)
    late = world.live(3)
    assert sum(r.reassigned_expired for r in late) == 2
    assert owners(world.leases) == {"a0": "B", "a1": "B", "b0": "B", "b1": "B"}


def test_a_foreign_owner_is_reported_and_judged_by_its_lease_counter(ddb: Any, app_name: str) -> None:
    # GIVEN worker mode, worker B beating, and a lease owned by a KCL worker that has no heartbeat row
    world = with_a_kcl_owner(ddb, app_name)
    # WHEN the leader runs while the KCL worker renews its lease every 3 s
    report = world.full_run(run_number=1)
    kcl = StandInWorker("kcl-java-1", world.rows, world.leases, beating=False)
    for _ in range(7):
        world.fleet.advance(3)
        kcl.renew()
        world.fast.tick(run_number=2)
    renewing = world.full_run()
    # THEN it is reported as a foreign owner and keeps its lease while it renews
    assert report.foreign_owners == ("kcl-java-1",) and renewing.foreign_owners == ("kcl-java-1",)
    assert owners(world.leases)["k0"] == "kcl-java-1" and renewing.expired == 0
    # WHEN it stops renewing for longer than the failover time
    world.live(11, full_every=11)
    # THEN its lease expires by counter and moves to B
    assert owners(world.leases)["k0"] == "B"


# ------------------------------------------------------------------------------------------- hand-offs


def test_a_handoff_is_requested_on_the_old_owners_item_and_forced_only_after_timeout_plus_failover(
    ddb: Any, app_name: str
) -> None:
    # GIVEN worker mode, A holding four busy leases, B holding nothing; every full run balances
    world = make_world(ddb, app_name, setting="worker", balancing_frequency=1)
    world.worker("A", renewing=False, liveness="worker")
    world.worker("B", renewing=False, liveness="worker")
    for n in range(4):
        assert world.leases.create_lease_if_absent(
            Lease(lease_key=f"a{n}", lease_owner="A", lease_counter=1, throughput_kbps=100.0)
        )
    world.fleet.step()
    # WHEN the leader balances
    report = world.full_run(run_number=1)
    # THEN it starts graceful hand-offs and asks A for each on A's own item, with the timeout it will force after
    moving = sorted(lease.lease_key for lease in world.leases.list_leases() if lease.checkpoint_owner == "A")
    assert report.moved == len(moving) >= 1
    row = world.rows.get("A")
    assert row is not None and row.handoff_requests == tuple(sorted(f"{HANDOFF_TIMEOUT_MS}:{k}" for k in moving))
    # WHEN A never lets go (it keeps beating): up to timeout + failover after the request nothing is forced …
    deadline_s = (HANDOFF_TIMEOUT_MS + FAILOVER_MS) / 1000
    before = world.live(int(deadline_s) - 1, full_every=5)
    assert sum(r.handoffs_forced for r in before) == 0
    assert all(world.leases.get_lease(k).checkpoint_owner == "A" for k in moving)  # type: ignore[union-attr]
    # … and just after it the leader forces them: B owns them outright
    after = world.live(6, full_every=5)
    assert sum(r.handoffs_forced for r in after) == len(moving)
    assert {k: owners(world.leases)[k] for k in moving} == dict.fromkeys(moving, "B")


def test_a_handoff_whose_request_could_not_be_written_is_not_dated_until_it_is(ddb: Any, app_name: str) -> None:
    # GIVEN worker mode and a hand-off in progress from A to B that this leader never requested (a new term)
    world = make_world(ddb, app_name, setting="worker")
    a = world.worker("A", renewing=False, liveness="worker")
    world.worker("B", renewing=False, liveness="worker")
    lease = owned_lease(world.leases, "a0", "A")
    assert world.leases.initiate_graceful_handoff(lease, "B") is not None
    world.fleet.step()
    # WHEN the first full run sees it
    world.full_run(run_number=1)
    # THEN A is asked now (the deadline runs from this request), and A's beat that handled it removes it again
    row = world.rows.get("A")
    assert row is not None and row.handoff_requests == (f"{HANDOFF_TIMEOUT_MS}:a0",)
    a.done_requests = row.handoff_requests
    a.beat()
    row = world.rows.get("A")
    assert row is not None and row.handoff_requests == ()


# ------------------------------------------------------------------------------------------- the stored mode


@pytest.mark.parametrize(("setting", "recorded"), [("lease", "lease"), ("worker", "worker"), ("auto", "lease")])
def test_the_first_leader_records_its_configured_mode(ddb: Any, app_name: str, setting: str, recorded: str) -> None:
    # GIVEN no mode stored
    world = make_world(ddb, app_name, setting=setting)
    assert world.modes.read() is None
    # WHEN the leader runs for the first time
    world.full_run(run_number=1)
    # THEN its configured mode is recorded (auto records lease), and a leader configured otherwise keeps it
    assert world.modes.read() == StoredMode(mode=LivenessMode(recorded))
    other = make_world(ddb, app_name, setting="worker" if recorded == "lease" else "lease")
    other.full_run(run_number=1)
    assert world.modes.read() == StoredMode(mode=LivenessMode(recorded))


def test_a_leader_configured_for_the_other_mode_refuses_to_start(ddb: Any, moto_aws: AwsConfig, app_name: str) -> None:
    # GIVEN an application recorded in worker mode, with its stream
    kinesis = aws.client("kinesis", moto_aws)
    create_stream(kinesis, app_name, 1)
    LivenessModeStore(CoordinatorStateStore(app_name, client=ddb)).record_if_absent(LivenessMode.WORKER, by="test")

    def leader(setting: str) -> Callable[[], None]:
        parts = build_leader(
            app=app_name,
            stream=app_name,
            dynamodb=ddb,
            kinesis=kinesis,
            lease_config=LeaseConfig(liveness_mode=setting),
        )
        return lambda: preflight(parts, app=app_name, stream=app_name)

    # WHEN a leader configured for lease mode starts
    # THEN it refuses with one message naming both modes and what to do
    with pytest.raises(LivenessModeMismatchError) as refused:
        leader("lease")()
    message = str(refused.value)
    assert "'lease'" in message and "'worker'" in message and "SHARDLEASE_LIVENESS_MODE" in message
    assert "\n" not in message
    # AND leaders configured for worker or auto start
    leader("worker")()
    leader("auto")()


def test_a_corrupt_mode_item_fails_the_run_instead_of_being_guessed(ddb: Any, app_name: str) -> None:
    # GIVEN a LivenessMode item with a mode nobody knows
    world = make_world(ddb, app_name, setting="worker")
    CoordinatorStateStore(app_name, client=ddb).put("LivenessMode", {"mode": "sometimes"})
    # WHEN the leader runs
    # THEN the run fails as an infrastructure failure (counted by the leader loop), naming the item
    from worker_lib.core.errors import DependencyError

    with pytest.raises(DependencyError, match="LivenessMode"):
        world.full_run(run_number=1)


# ------------------------------------------------------------------------------------------- switching


def test_a_switch_to_worker_mode_is_completed_by_the_next_full_run(ddb: Any, app_name: str) -> None:
    # GIVEN lease mode with two renewing workers
    world = make_world(ddb, app_name, setting="auto")
    two_workers(world, renewing=True, liveness="lease")
    world.full_run(run_number=1)
    stored = world.modes.read()
    assert stored == StoredMode(mode=LivenessMode.LEASE)
    # WHEN an operator asks for worker mode
    assert world.modes.request(LivenessMode.WORKER, expected=stored, by="test")
    assert world.modes.read() == StoredMode(mode=LivenessMode.LEASE, target=LivenessMode.WORKER)
    # THEN the next full run judges per owner and completes the switch
    report = world.full_run()
    assert report.liveness_mode == "lease, switching to worker"
    assert world.modes.read() == StoredMode(mode=LivenessMode.WORKER)
    # AND once the workers stop renewing, nothing expires
    for worker in world.fleet.workers.values():
        worker.renewing, worker.liveness = False, "worker"
    assert all(r.expired == 0 for r in world.live(45))
    assert owners(world.leases) == BEFORE


def test_a_switch_back_to_lease_mode_waits_until_every_live_worker_renews(ddb: Any, app_name: str) -> None:
    # GIVEN worker mode with two workers that do not renew; their counters stand still for a minute
    world = make_world(ddb, app_name, setting="auto")
    world.modes.record_if_absent(LivenessMode.WORKER, by="test")
    a, b = two_workers(world, renewing=False, liveness="worker")
    world.full_run(run_number=1)
    world.live(60)
    # WHEN an operator asks for lease mode, and only A has started renewing
    stored = world.modes.read()
    assert stored is not None and world.modes.request(LivenessMode.LEASE, expected=stored, by="test")
    a.renewing, a.liveness = True, "lease"
    world.live(20)
    # THEN the switch is not completed: B still says worker
    assert world.modes.read() == StoredMode(mode=LivenessMode.WORKER, target=LivenessMode.LEASE)
    # WHEN B renews too
    b.renewing, b.liveness = True, "lease"
    world.live(20)
    # THEN the switch completes …
    assert world.modes.read() == StoredMode(mode=LivenessMode.LEASE)
    # … and no lease whose counter stood still during worker mode was expired by it (the leader forgot those
    # observations), and none expires while the workers renew
    assert all(r.expired == 0 for r in world.live(30))
    assert owners(world.leases) == BEFORE


def test_the_cli_shows_and_requests_the_mode(ddb: Any, moto_aws: AwsConfig, app_name: str, capsys: Any) -> None:
    # GIVEN an application with nothing recorded and one worker beating in worker mode
    rows = WorkerMetricsStore(app_name, client=ddb)
    rows.heartbeat("w1", interval_ms=2_000, state=StandInWorker.state, events=0, liveness="worker")
    flags = ["--app", app_name, "--endpoint-url", str(moto_aws.endpoint_url)]
    # WHEN the mode is shown
    assert cli_main(["liveness", *flags]) == 0
    # THEN it says none is recorded yet
    assert "none recorded yet" in capsys.readouterr().out
    # WHEN worker mode is set on an empty record, then lease is asked for
    assert cli_main(["liveness", *flags, "--set", "worker"]) == 0
    assert cli_main(["liveness", *flags, "--set", "lease", "--json"]) == 0
    # THEN the first records worker, the second leaves a switch for the leader to complete
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"app": app_name, "mode": "worker", "target": "lease", "workers": {"w1": "worker"}}
    # AND a bad value is one usage line
    with pytest.raises(SystemExit) as usage:
        cli_main(["liveness", *flags, "--set", "sometimes"])
    assert usage.value.code == 2


def test_status_shows_the_mode_each_workers_mode_and_foreign_owners(ddb: Any, app_name: str) -> None:
    # GIVEN worker mode, worker B beating in worker mode, and a lease owned by a KCL worker without a heartbeat
    world = with_a_kcl_owner(ddb, app_name)
    world.full_run(run_number=1)
    # WHEN an operator looks at the fleet, watching long enough for counters to stand still
    tracker = ExpiryTracker(FAILOVER_MS / 1000)
    collect(app_name, ddb, clock=world.clock, tracker=tracker)
    world.clock.advance(11)
    status = collect(app_name, ddb, clock=world.clock, tracker=tracker)
    # THEN it shows the mode, B's mode, the foreign owner, and as expired only the foreign owner's lease (B's lease
    # is not renewed in worker mode; its heartbeat vouches for it)
    assert status.liveness_mode == "worker"
    assert {row.worker: row.liveness for row in status.workers} == {"B": "worker", "kcl-java-1": None}
    assert status.foreign_owners == ["kcl-java-1"] and status.expired == ["k0"]
    text = render(status, watch=True)
    assert "liveness mode worker" in text and "foreign owners (no heartbeat" in text and "kcl-java-1" in text


class FailingReads:
    """The ``LivenessModeRecords`` seam over the real store, whose reads fail as throttled while ``failing``."""

    def __init__(self, inner: LivenessModeStore) -> None:
        self._inner = inner
        self.failing = False

    def read(self) -> StoredMode | None:
        if self.failing:
            raise ThrottledError("CoordinatorState read throttled (injected)")
        return self._inner.read()

    def record_if_absent(self, mode: LivenessMode, *, by: str) -> StoredMode:
        return self._inner.record_if_absent(mode, by=by)

    def complete(self, expected: StoredMode, *, by: str) -> bool:
        return self._inner.complete(expected, by=by)


def test_a_fast_pass_before_the_mode_was_read_in_a_term_judges_per_owner(ddb: Any, app_name: str) -> None:
    # GIVEN worker mode, two beating workers that never renew, and a leader that kept its expiry observations
    # (counters standing still for 30 s) in CoordinatorState
    world = make_world(ddb, app_name, setting="worker")
    state = CoordinatorStateStore(app_name, client=ddb, clock=world.clock)
    kept = ExpiryObservationStore(state, max_clock_skew_ms=1_000)
    first = LeaseAssigner(
        world.leases,
        world.rows,
        lease_config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        notifier=world.rows,
        modes=LeaderModeKeeper(world.modes, setting="worker"),
        observations=kept,
        clock=world.clock,
    )
    _, b = two_workers(world, renewing=False, liveness="worker")
    first.run(run_number=1)
    world.fleet.advance(30)
    first.run(run_number=2)
    # WHEN the next leader's first read of the mode fails (after it restored those observations) …
    reads = FailingReads(world.modes)
    reads.failing = True
    watch = LivenessWatch(world.rows, failover_ms=FAILOVER_MS, max_clock_skew_ms=1_000, clock=world.clock)
    second = LeaseAssigner(
        world.leases,
        world.rows,
        lease_config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        liveness=watch,
        notifier=world.rows,
        modes=LeaderModeKeeper(reads, setting="worker"),
        observations=kept,
        clock=world.clock,
        seed=1,
    )
    fast = FastPath(watch, second, max_backoff_s=20, clock=world.clock)
    with pytest.raises(ThrottledError):
        second.run(run_number=1)
    fast.tick(run_number=1)
    # … and a fast pass runs before its next full run (B reports an event)
    b.events += 1
    world.fleet.advance(1)
    report = fast.tick(run_number=1)
    # THEN the pass judged the beating owners by their heartbeats, not by the restored counters: nothing expired
    assert report is not None and report.fast
    assert report.expired == 0 and owners(world.leases) == BEFORE
