"""Worker liveness on the leader, pure (docs/failover.md): the heartbeat tracker, expiry observations that outlive a
leader, the snapshot's balancing override and the heartbeat attributes of worker-metrics items; and the leader's
state between runs — hand-off deadlines and requests (worker_lib/leader/handoffs.py), kept observations, worker-row
sweeps and suspects (worker_lib/leader/housekeeping.py) — against fakes of the tables.

Times come from a :class:`ManualClock` (monotonic 1000 s, wall 1.7e9 s); the tracker is given a 10 s failover time
and a 1 s clock-skew bound unless a test says otherwise.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from typing import Any

import pytest

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.heartbeats import HeartbeatTracker, LivenessView
from worker_lib.assignment.snapshot import AssignmentSnapshot, ExpiryTracker
from worker_lib.assignment.variance import VarianceDecider
from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease, WorkerHeartbeat, WorkerMetricStats, WorkerState
from worker_lib.leader.handoffs import HandoffTracker
from worker_lib.leader.housekeeping import KeptObservations, Suspects, WorkerRowSweeper
from worker_lib.leases.config import LeaseConfig
from worker_lib.workermetrics.stats_serializer import from_item, heartbeat_of

FAILOVER_S = 10.0
SKEW_S = 1.0


# ----------------------------------------------------------------------------------------------- helpers


def tracker() -> HeartbeatTracker:
    return HeartbeatTracker(failover_s=FAILOVER_S, max_clock_skew_s=SKEW_S)


def row(
    worker_id: str,
    counter: int,
    *,
    wall_ms: int,
    state: WorkerState = WorkerState.ACTIVE,
    events: int = 0,
) -> WorkerMetricStats:
    """A worker-metrics row with heartbeat attributes, as the leader reads it."""
    return WorkerMetricStats(
        worker_id=worker_id,
        last_update_epoch_s=wall_ms // 1000,
        heartbeat=WorkerHeartbeat(counter=counter, wall_ms=wall_ms, interval_ms=1_000, state=state, events=events),
    )


def now_ms(clock: ManualClock, offset_s: float = 0.0) -> int:
    return int((clock.wall() + offset_s) * 1000)


def observe(t: HeartbeatTracker, clock: ManualClock, *rows: WorkerMetricStats) -> LivenessView:
    return t.observe(rows, clock.monotonic(), clock.wall())


# ----------------------------------------------------------------------------------------------- HeartbeatTracker


def test_a_worker_whose_counter_moves_is_never_gone() -> None:
    # GIVEN a worker that beats every second
    clock = ManualClock()
    t = tracker()
    # WHEN the leader reads its row every second for a minute
    for counter in range(1, 61):
        view = observe(t, clock, row("a", counter, wall_ms=now_ms(clock)))
        # THEN it is heartbeating, never gone or departing, and its silence never exceeds a second
        assert view.heartbeating == {"a"}
        assert view.gone == frozenset() and view.departing == frozenset()
        silent = t.seconds_silent("a", clock.monotonic())
        assert silent is not None and silent <= 1.0
        clock.advance(1.0)


def test_a_counter_unchanged_for_longer_than_the_failover_time_is_gone_but_not_at_exactly_that_time() -> None:
    # GIVEN a worker first seen with a fresh beat (hbt = now), whose counter then stops
    clock = ManualClock()
    t = tracker()
    assert observe(t, clock, row("a", 7, wall_ms=now_ms(clock))).gone == frozenset()
    stale = row("a", 7, wall_ms=now_ms(clock))
    # WHEN exactly the failover time passed THEN it is not gone yet
    clock.advance(FAILOVER_S)
    view = observe(t, clock, stale)
    assert view.gone == frozenset() and view.excluded == frozenset()
    # WHEN a moment more passed THEN it is gone (and excluded from assignment)
    clock.advance(0.01)
    view = observe(t, clock, stale)
    assert view.gone == {"a"} and view.excluded == {"a"}
    assert t.is_gone(stale, clock.monotonic())


def test_a_counter_that_moves_again_is_dated_anew() -> None:
    # GIVEN a worker silent for 9 s
    clock = ManualClock()
    t = tracker()
    observe(t, clock, row("a", 1, wall_ms=now_ms(clock)))
    clock.advance(9)
    observe(t, clock, row("a", 1, wall_ms=now_ms(clock, -9)))
    # WHEN its counter moves, and 9 s more pass without a change
    observe(t, clock, row("a", 2, wall_ms=now_ms(clock)))
    clock.advance(9)
    view = observe(t, clock, row("a", 2, wall_ms=now_ms(clock, -9)))
    # THEN it is not gone: the silence is counted from the new value (9 s), not from the first one (18 s)
    assert view.gone == frozenset()
    assert t.seconds_silent("a", clock.monotonic()) == pytest.approx(9.0)


def test_a_stopped_worker_is_gone_at_once() -> None:
    # GIVEN a worker whose latest (fresh) beat says STOPPED
    clock = ManualClock()
    t = tracker()
    stopped = row("a", 3, wall_ms=now_ms(clock), state=WorkerState.STOPPED)
    # WHEN the leader sees it for the first time
    view = observe(t, clock, stopped)
    # THEN it is gone without waiting for the failover time
    assert view.gone == {"a"} and view.departing == frozenset() and view.heartbeating == {"a"}


def test_a_departing_worker_is_departing_not_gone_until_it_falls_silent() -> None:
    # GIVEN a worker that announced DEPARTING and keeps beating
    clock = ManualClock()
    t = tracker()
    for counter in range(1, 6):
        view = observe(t, clock, row("a", counter, wall_ms=now_ms(clock), state=WorkerState.DEPARTING))
        # THEN it is departing (excluded from assignment), not gone: its leases stay with it
        assert view.departing == {"a"} and view.gone == frozenset() and view.excluded == {"a"}
        clock.advance(1)
    # WHEN it stops beating for longer than the failover time (it died while shutting down)
    last = row("a", 5, wall_ms=now_ms(clock, -1), state=WorkerState.DEPARTING)
    clock.advance(FAILOVER_S)
    view = observe(t, clock, last)
    # THEN it is gone, and no longer listed as departing
    assert view.gone == {"a"} and view.departing == frozenset()


def test_first_sight_dates_the_counter_by_the_workers_stamp_plus_the_skew_bound() -> None:
    # GIVEN a new leader that sees two silent workers for the first time: a's last beat is 20 s old, b's 5 s old
    clock = ManualClock()
    t = tracker()
    a = row("a", 4, wall_ms=now_ms(clock, -20))
    b = row("b", 9, wall_ms=now_ms(clock, -5))
    # WHEN it observes them
    view = observe(t, clock, a, b)
    # THEN a is gone at once (20 s − 1 s skew > 10 s); b is not (5 s − 1 s = 4 s silent as far as we can tell)
    assert view.gone == {"a"}
    assert t.seconds_silent("b", clock.monotonic()) == pytest.approx(4.0)
    # WHEN the remainder (10 − 4 = 6 s) passed exactly THEN b is still not gone
    clock.advance(6)
    assert observe(t, clock, a, b).gone == {"a"}
    # WHEN a moment more passed THEN b is gone too
    clock.advance(0.01)
    assert observe(t, clock, a, b).gone == {"a", "b"}


def test_a_stamp_in_the_future_is_dated_now() -> None:
    # GIVEN a worker whose wall clock runs 30 s ahead of the leader's
    clock = ManualClock()
    t = tracker()
    ahead = row("a", 1, wall_ms=now_ms(clock, 30))
    # WHEN the leader sees it for the first time
    view = observe(t, clock, ahead)
    # THEN its value is dated now (never later): silent for 0 s, gone only after a full failover time
    assert view.gone == frozenset()
    assert t.seconds_silent("a", clock.monotonic()) == pytest.approx(0.0)
    clock.advance(FAILOVER_S)
    assert observe(t, clock, ahead).gone == frozenset()
    clock.advance(0.01)
    assert observe(t, clock, ahead).gone == {"a"}


def test_a_worker_without_heartbeat_attributes_is_ignored() -> None:
    # GIVEN a KCL worker (metrics only) next to a heartbeating one, with an old report
    clock = ManualClock()
    t = tracker()
    kcl = WorkerMetricStats(worker_id="kcl", last_update_epoch_s=int(clock.wall()) - 600)
    beating = row("a", 1, wall_ms=now_ms(clock))
    # WHEN the leader observes both, long after
    observe(t, clock, kcl, beating)
    clock.advance(60)
    view = observe(t, clock, kcl, row("a", 2, wall_ms=now_ms(clock)))
    # THEN the KCL worker is nowhere in the view (judged per lease only), and never confirmed gone
    assert view.heartbeating == {"a"} and set(view.events) == {"a"}
    assert "kcl" not in view.gone | view.departing
    assert not t.is_gone(kcl, clock.monotonic())
    assert not t.still_gone(kcl, clock.monotonic(), clock.wall())
    assert t.seconds_silent("kcl", clock.monotonic()) is None


def test_the_view_reports_each_workers_event_counter() -> None:
    clock = ManualClock()
    t = tracker()
    view = observe(t, clock, row("a", 1, wall_ms=now_ms(clock), events=3), row("b", 1, wall_ms=now_ms(clock)))
    assert view.events == {"a": 3, "b": 0}


def test_the_confirmation_read_overrules_a_stale_scan() -> None:
    # GIVEN a worker gone by the leader's scan (counter unchanged for 11 s)
    clock = ManualClock()
    t = tracker()
    scanned = row("a", 5, wall_ms=now_ms(clock))
    observe(t, clock, scanned)
    clock.advance(11)
    assert observe(t, clock, scanned).gone == {"a"}
    # WHEN the consistent confirmation read shows the same counter THEN it is confirmed gone
    assert t.still_gone(scanned, clock.monotonic(), clock.wall())
    # WHEN it shows no row at all THEN it is not confirmed (its leases are judged per lease instead)
    assert not t.still_gone(None, clock.monotonic(), clock.wall())
    # WHEN it shows a new counter (the worker beat after all) THEN it is not confirmed, and no longer gone
    fresh = row("a", 6, wall_ms=now_ms(clock))
    assert not t.still_gone(fresh, clock.monotonic(), clock.wall())
    assert observe(t, clock, fresh).gone == frozenset()


def test_workers_that_vanish_from_the_table_are_forgotten() -> None:
    # GIVEN a worker silent for 9 s
    clock = ManualClock()
    t = tracker()
    silent = row("a", 5, wall_ms=now_ms(clock))
    observe(t, clock, silent, row("b", 1, wall_ms=now_ms(clock)))
    clock.advance(9)
    observe(t, clock, silent, row("b", 2, wall_ms=now_ms(clock)))
    assert t.seconds_silent("a", clock.monotonic()) == pytest.approx(9.0)
    # WHEN a read no longer contains it
    observe(t, clock, row("b", 3, wall_ms=now_ms(clock)))
    # THEN its observation is dropped
    assert t.seconds_silent("a", clock.monotonic()) is None
    # AND when it reappears with the same counter and a fresh stamp it is dated anew (first sight), not gone
    clock.advance(2)
    back = row("a", 5, wall_ms=now_ms(clock))
    assert observe(t, clock, back, row("b", 4, wall_ms=now_ms(clock))).gone == frozenset()


@pytest.mark.parametrize(("failover_s", "skew_s"), [(0.0, 1.0), (-1.0, 1.0), (10.0, -0.5)])
def test_the_tracker_refuses_meaningless_bounds(failover_s: float, skew_s: float) -> None:
    with pytest.raises(ValueError, match="must"):
        HeartbeatTracker(failover_s=failover_s, max_clock_skew_s=skew_s)


# ----------------------------------------------------------------------------------------------- ExpiryTracker


def owned(key: str, counter: int, owner: str = "w") -> Lease:
    return Lease(lease_key=key, lease_owner=owner, lease_counter=counter)


def test_observations_round_trip_through_export_and_restore_shifted_by_the_skew() -> None:
    # GIVEN leader 1 first sees lease l (counter 5) and an unowned lease u, then exports 4 s later
    clock1 = ManualClock(monotonic=1_000.0, wall=1_700_000_000.0)
    first = ExpiryTracker(FAILOVER_S)
    first.observe([owned("l", 5), Lease(lease_key="u")], clock1.monotonic())
    clock1.advance(4)
    entries = first.export(clock1.monotonic(), clock1.wall())
    # THEN the export dates l on the wall clock at its observation, and leaves out the never-owned lease
    assert [(key, counter) for key, counter, _ in entries] == [("l", 5)]
    assert entries[0][2] == pytest.approx(1_700_000_000.0)
    # WHEN leader 2 (another monotonic origin) restores them 6 s after the observation, with a 1 s skew bound
    clock2 = ManualClock(monotonic=50.0, wall=1_700_000_006.0)
    second = ExpiryTracker(FAILOVER_S)
    second.restore(entries, clock2.monotonic(), clock2.wall(), SKEW_S)
    # THEN l counts as standing still since 5 s ago (6 s − 1 s skew): expired after 5 s more, not at exactly 5 s
    assert second.observe([owned("l", 5)], clock2.monotonic()) == frozenset()
    assert second.last_increment("l") == pytest.approx(45.0)
    clock2.advance(5)
    assert second.observe([owned("l", 5)], clock2.monotonic()) == frozenset()
    clock2.advance(0.01)
    assert second.observe([owned("l", 5)], clock2.monotonic()) == {"l"}


def test_a_fresh_tracker_without_restored_observations_needs_a_full_failover_time() -> None:
    # GIVEN the same situation as above, without the previous leader's observations
    clock = ManualClock(monotonic=50.0, wall=1_700_000_006.0)
    fresh = ExpiryTracker(FAILOVER_S)
    fresh.observe([owned("l", 5)], clock.monotonic())
    # WHEN 5.01 s pass THEN nothing is expired (it must watch for 10 s itself)
    clock.advance(5.01)
    assert fresh.observe([owned("l", 5)], clock.monotonic()) == frozenset()


def test_a_restored_observation_counts_only_if_the_counter_is_unchanged() -> None:
    # GIVEN an observation of l at counter 5, 20 s old
    clock = ManualClock(monotonic=50.0, wall=1_700_000_020.0)
    restored = ExpiryTracker(FAILOVER_S)
    restored.restore([("l", 5, 1_700_000_000.0), ("m", 3, 1_700_000_000.0)], clock.monotonic(), clock.wall(), SKEW_S)
    # WHEN the new leader's first scan shows l at counter 6 (renewed since) and m unchanged
    expired = restored.observe([owned("l", 6), owned("m", 3)], clock.monotonic())
    # THEN l is dated now (not expired), m is expired at once (19 s > 10 s)
    assert expired == {"m"}
    assert restored.last_increment("l") == clock.monotonic()


def test_a_restored_observation_is_never_dated_later_than_now() -> None:
    # GIVEN an observation whose wall date lies in the new leader's future (the old leader's clock ran ahead)
    clock = ManualClock(monotonic=50.0, wall=1_700_000_000.0)
    t = ExpiryTracker(FAILOVER_S)
    t.restore([("l", 5, 1_700_000_100.0)], clock.monotonic(), clock.wall(), SKEW_S)
    # WHEN restored THEN it is dated now, not 100 s from now: it expires after exactly a full failover time
    t.observe([owned("l", 5)], clock.monotonic())
    assert t.last_increment("l") == clock.monotonic()
    clock.advance(FAILOVER_S + 0.01)
    assert t.observe([owned("l", 5)], clock.monotonic()) == {"l"}


def test_reset_discards_restored_observations() -> None:
    # GIVEN a tracker seeded with a 30 s old observation
    clock = ManualClock(monotonic=50.0, wall=1_700_000_030.0)
    t = ExpiryTracker(FAILOVER_S)
    t.restore([("l", 5, 1_700_000_000.0)], clock.monotonic(), clock.wall(), SKEW_S)
    # WHEN it is reset before its first scan
    t.reset()
    # THEN the scan is a first sight: not expired, dated now
    assert t.observe([owned("l", 5)], clock.monotonic()) == frozenset()
    assert t.last_increment("l") == clock.monotonic()


# ----------------------------------------------------------------------------------------------- balance override

NOW = 1_700_000_000.0


def cpu_worker(worker_id: str, cpu: float) -> WorkerMetricStats:
    return WorkerMetricStats(
        worker_id=worker_id, last_update_epoch_s=int(NOW), stats={"C": (cpu, cpu)}, operating_range={"C": (80.0,)}
    )


def hot_fleet_snapshot(*, run: int, balance: bool | None, extra: tuple[Lease, ...] = ()) -> AssignmentSnapshot:
    """Scenario 6's imbalance (a 90 % worker holding four leases, a 50 % worker holding none) plus ``extra``."""
    leases = tuple(
        Lease(lease_key=f"hot{i}", lease_owner="yield", lease_counter=1, throughput_kbps=tp)
        for i, tp in enumerate((100.0, 200.0, 300.0, 400.0))
    )
    return AssignmentSnapshot(
        leases=leases + extra,
        workers=(cpu_worker("yield", 90), cpu_worker("take", 50)),
        now_epoch_s=NOW,
        expired_lease_keys=frozenset({"gone-owner"}),
        run_number=run,
        balance=balance,
    )


DECIDER = VarianceDecider(AssignmentConfig(balancing_frequency=3, rebalance_threshold_pct=10, dampening_pct=80))


def test_without_an_override_balancing_follows_the_run_number() -> None:
    # GIVEN the imbalanced fleet WHEN run 1 (a balancing run) and run 2 (not one, frequency 3) decide
    balancing = DECIDER.decide(hot_fleet_snapshot(run=1, balance=None), rng=random.Random(1))
    quiet = DECIDER.decide(hot_fleet_snapshot(run=2, balance=None), rng=random.Random(1))
    # THEN run 1 moves leases from the hot worker, run 2 moves nothing
    assert balancing.balancing_ran and balancing.moved >= 1
    assert not quiet.balancing_ran and quiet.decisions == ()


def test_a_fast_snapshot_with_balance_false_only_places_leases_that_need_an_owner() -> None:
    # GIVEN the imbalanced fleet on a run that would balance, plus an unassigned lease and an expired one
    extra = (Lease(lease_key="free"), Lease(lease_key="gone-owner", lease_owner="dead", lease_counter=9))
    snapshot = hot_fleet_snapshot(run=1, balance=False, extra=extra)
    # WHEN the decider runs
    plan = DECIDER.decide(snapshot, rng=random.Random(1))
    # THEN balancing did not run: only the unassigned and the expired lease are placed, nothing is rebalanced
    assert not snapshot.is_balancing_run(3) and not plan.balancing_ran
    assert sorted(d.lease_key for d in plan.decisions) == ["free", "gone-owner"]
    assert {d.kind for d in plan.decisions} == {"assign", "reassign_expired"}
    assert plan.moved == 0


def test_balance_true_forces_balancing_on_a_run_that_would_not_balance() -> None:
    snapshot = hot_fleet_snapshot(run=2, balance=True)
    plan = DECIDER.decide(snapshot, rng=random.Random(1))
    assert snapshot.is_balancing_run(3) and plan.balancing_ran and plan.moved >= 1


# ----------------------------------------------------------------------------------------------- serializer

FULL_ITEM: dict[str, Any] = {
    "wid": {"S": "w1"},
    "lut": {"N": "1700000000"},
    "hbc": {"N": "42"},
    "hbt": {"N": "1700000001234"},
    "hbi": {"N": "1000"},
    "wst": {"S": "DEPARTING"},
    "evc": {"N": "3"},
    "asv": {"N": "7"},
    "asl": {"L": [{"S": "shardId-1"}, {"S": "shardId-2"}]},
}


def test_the_heartbeat_and_notice_attributes_are_read() -> None:
    # GIVEN an item with every liveness attribute WHEN it is read
    stats = from_item(FULL_ITEM)
    # THEN the heartbeat, the state and the notice are there
    assert stats.heartbeat == WorkerHeartbeat(
        counter=42, wall_ms=1_700_000_001_234, interval_ms=1_000, state=WorkerState.DEPARTING, events=3
    )
    assert heartbeat_of(FULL_ITEM) == stats.heartbeat
    assert stats.state is WorkerState.DEPARTING
    assert stats.assignment_version == 7 and stats.assigned_keys == ("shardId-1", "shardId-2")


def test_an_item_without_liveness_attributes_has_no_heartbeat() -> None:
    stats = from_item({"wid": {"S": "kcl"}, "lut": {"N": "1700000000"}})
    assert stats.heartbeat is None and stats.state is WorkerState.ACTIVE
    assert stats.assignment_version == 0 and stats.assigned_keys == ()


def test_a_string_set_of_keys_is_read_sorted() -> None:
    item = {**FULL_ITEM, "asl": {"SS": ["b", "a"]}}
    assert from_item(item).assigned_keys == ("a", "b")


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("hbc", {"S": "42"}),
        ("hbc", {"N": "1.5"}),
        ("hbc", {"N": "NaN"}),
        ("hbc", None),
        ("hbt", {"N": "Infinity"}),
        ("hbt", None),
        ("hbi", {"N": "0"}),
        ("hbi", {"N": "-1000"}),
        ("hbi", {"BOOL": True}),
        ("hbi", None),
    ],
)
def test_a_malformed_heartbeat_attribute_reads_as_no_heartbeat(attr: str, value: dict[str, Any] | None) -> None:
    # GIVEN an otherwise valid item with one malformed (or missing) heartbeat attribute
    item = dict(FULL_ITEM)
    if value is None:
        del item[attr]
    else:
        item[attr] = value
    # WHEN it is read THEN it is not corrupt: the worker simply does not heartbeat (judged per lease)
    stats = from_item(item)
    assert stats.heartbeat is None and heartbeat_of(item) is None
    assert stats.worker_id == "w1" and stats.state is WorkerState.ACTIVE


@pytest.mark.parametrize("value", [{"S": "7"}, {"N": "7.5"}, {"N": "NaN"}, {"L": []}])
def test_a_malformed_assignment_version_reads_as_zero(value: dict[str, Any]) -> None:
    stats = from_item({**FULL_ITEM, "asv": value})
    assert stats.assignment_version == 0
    assert stats.heartbeat is not None  # the rest of the item is read as usual


@pytest.mark.parametrize("value", [{"S": "shardId-1"}, {"N": "1"}, {"L": [{"N": "1"}, {"S": "ok"}]}])
def test_malformed_notice_keys_are_skipped(value: dict[str, Any]) -> None:
    keys = from_item({**FULL_ITEM, "asl": value}).assigned_keys
    assert keys == (("ok",) if value.get("L") else ())


def test_an_unknown_state_reads_as_active_and_a_malformed_event_counter_as_zero() -> None:
    beat = heartbeat_of({**FULL_ITEM, "wst": {"S": "SLEEPING"}, "evc": {"S": "x"}})
    assert beat is not None and beat.state is WorkerState.ACTIVE and beat.events == 0 and beat.counter == 42


# ----------------------------------------------------------------------------------------------- the leader's hand-offs

HANDOFF_CONFIG = LeaseConfig(failover_time_ms=10_000, graceful_handoff_timeout_ms=30_000)  # forced after 40 s


class FakeLeases:
    """The one write the hand-off tracker makes: completing a hand-off (as the store would: owner kept, no
    checkpoint owner, counter + 1)."""

    def __init__(self) -> None:
        self.completed: list[tuple[str, str]] = []

    def complete_handoff(self, lease: Lease, old_owner: str) -> Lease | None:
        self.completed.append((lease.lease_key, old_owner))
        return Lease(lease_key=lease.lease_key, lease_owner=lease.lease_owner, lease_counter=lease.lease_counter + 1)


class FakeRequests:
    """Hand-off requests on the old owners' items: ``answers`` are returned (or raised) in turn."""

    def __init__(self, *answers: bool | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, list[str]]] = []

    def request_handoff(self, worker_id: str, elements: Sequence[str]) -> bool:
        self.requests.append((worker_id, list(elements)))
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def moving(key: str = "l", *, to: str = "take", from_: str = "yield") -> Lease:
    return Lease(lease_key=key, lease_owner=to, checkpoint_owner=from_, lease_counter=7)


def handoffs(
    clock: ManualClock, requests: FakeRequests | None = None, leases: FakeLeases | None = None
) -> tuple[HandoffTracker, FakeLeases, list[logging.LogRecord]]:
    """A tracker whose decision log is collected into the returned list."""
    decisions = logging.getLogger(f"test.decisions.{random.random()}")
    decisions.propagate = False
    collected = Collected()
    decisions.addHandler(collected)
    decisions.setLevel(logging.INFO)
    store = leases or FakeLeases()
    tracker_ = HandoffTracker(store, requests, config=HANDOFF_CONFIG, clock=clock, decisions=decisions)
    return tracker_, store, collected.records


def test_a_handoff_is_forced_only_after_the_timeout_plus_the_failover_time_and_logged_as_a_decision() -> None:
    # GIVEN a hand-off the leader started (lease mode: no request, dated at once)
    clock = ManualClock()
    tracker_, store, decisions = handoffs(clock)
    tracker_.started([("l", "take", "yield")], requested_from=None)
    # WHEN 40 s pass THEN it is not forced yet; a moment later it is, once, with one decision line
    clock.advance(40)
    assert tracker_.force_overdue([moving()], clock.monotonic()) == []
    clock.advance(0.01)
    forced = tracker_.force_overdue([moving()], clock.monotonic())
    assert [lease.lease_key for lease in forced] == ["l"] and store.completed == [("l", "yield")]
    (line,) = [json.loads(r.getMessage()) for r in decisions]
    assert line == {
        "from": "yield",
        "kind": "force_handoff",
        "lease": "l",
        "reason": "graceful handoff not completed within 40 s",
        "to": "take",
        "written": True,
    }


def test_a_handoff_first_seen_in_a_new_term_gets_a_full_deadline_from_that_sighting() -> None:
    # GIVEN a hand-off dated long ago, then a new term (reset)
    clock = ManualClock()
    tracker_, store, _ = handoffs(clock)
    tracker_.started([("l", "take", "yield")], requested_from=None)
    clock.advance(100)
    tracker_.reset()
    # WHEN the new term sees it THEN it is dated now and forced only 40 s later
    assert tracker_.force_overdue([moving()], clock.monotonic()) == []
    clock.advance(40.01)
    assert len(tracker_.force_overdue([moving()], clock.monotonic())) == 1 and len(store.completed) == 1


def test_in_worker_mode_a_handoff_is_requested_on_the_old_owners_item_and_dated_when_the_request_lands() -> None:
    # GIVEN worker mode ("yield" heartbeats): the first request fails, the second has no item, the third lands
    clock = ManualClock()
    requests = FakeRequests(DependencyError("throttled"), False, True)
    tracker_, store, _ = handoffs(clock, requests)
    beating = frozenset({"yield"})
    tracker_.started([("l", "take", "yield")], requested_from=beating)
    assert requests.requests == [("yield", ["30000:l"])]
    # WHEN later runs see the hand-off THEN each asks again until a request lands, and none forces before it did
    for _ in range(2):
        clock.advance(50)
        assert tracker_.force_overdue([moving()], clock.monotonic(), requested_from=beating) == []
    assert len(requests.requests) == 3
    clock.advance(40)
    assert tracker_.force_overdue([moving()], clock.monotonic(), requested_from=beating) == []
    clock.advance(0.01)
    assert len(tracker_.force_overdue([moving()], clock.monotonic(), requested_from=beating)) == 1
    assert store.completed == [("l", "yield")] and len(requests.requests) == 3


# ------------------------------------------------------------------------------------------- the leader's housekeeping


class FakeObservations:
    skew_s = SKEW_S

    def __init__(self, entries: list[tuple[str, int, float]] | None = None, *, fail: bool = False) -> None:
        self.entries = entries or []
        self.fail = fail
        self.saved: list[list[tuple[str, int, float]]] = []

    def load(self) -> list[tuple[str, int, float]]:
        if self.fail:
            raise DependencyError("unreachable")
        return list(self.entries)

    def save(self, entries: list[tuple[str, int, float]]) -> bool:
        if self.fail:
            raise DependencyError("unreachable")
        self.saved.append(entries)
        return True


def test_kept_observations_restore_save_and_forget_and_a_failing_store_only_costs_time() -> None:
    # GIVEN the previous leader's 20 s old observation of l
    clock = ManualClock(monotonic=50.0, wall=1_700_000_020.0)
    expiry = ExpiryTracker(FAILOVER_S)
    store = FakeObservations([("l", 5, 1_700_000_000.0)])
    kept = KeptObservations(expiry, store, clock=clock)
    # WHEN restored THEN l is expired at the first scan; keeping saves what the tracker knows
    kept.restore()
    assert expiry.observe([owned("l", 5)], clock.monotonic()) == {"l"}
    kept.keep(clock.monotonic(), clock.wall())
    assert [key for key, _, _ in store.saved[-1]] == ["l"]
    # WHEN forgotten (a switch back to lease mode) THEN the tracker starts over and the stored item says so
    kept.forget(clock.monotonic(), clock.wall())
    assert store.saved[-1] == [] and expiry.observe([owned("l", 5)], clock.monotonic()) == frozenset()
    # AND a store that fails (or none at all) raises nothing
    failing = KeptObservations(ExpiryTracker(FAILOVER_S), FakeObservations(fail=True), clock=clock)
    failing.restore()
    failing.keep(clock.monotonic(), clock.wall())
    KeptObservations(ExpiryTracker(FAILOVER_S), None, clock=clock).restore()


class FakeRows:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_if_unchanged(self, worker_id: str, last_update_epoch_s: float) -> bool:
        self.deleted.append(worker_id)
        return True

    def delete_if_heartbeat_unchanged(self, worker_id: str, heartbeat_counter: int) -> bool:
        self.deleted.append(worker_id)
        return True


def test_the_sweeper_deletes_day_old_rows_at_most_hourly_and_stopped_workers_rows_once_they_own_nothing() -> None:
    clock = ManualClock()
    rows = FakeRows()
    sweeper = WorkerRowSweeper(rows)
    old = WorkerMetricStats(worker_id="old", last_update_epoch_s=int(clock.wall()) - 2 * 86_400)
    # GIVEN a day-old row: deleted at the first sweep, not looked at again within the hour
    sweeper.sweep_stale([old], clock.wall(), clock.monotonic())
    clock.advance(3_599)
    sweeper.sweep_stale([old], clock.wall(), clock.monotonic())
    assert rows.deleted == ["old"]
    clock.advance(1)
    sweeper.sweep_stale([old], clock.wall(), clock.monotonic())
    assert rows.deleted == ["old", "old"]
    # GIVEN two stopped workers, one still the checkpoint owner of a lease: only the other's row goes
    stopped = [row(w, 3, wall_ms=now_ms(clock), state=WorkerState.STOPPED) for w in ("gone", "handing")]
    sweeper.sweep_stopped(stopped, [moving(from_="handing")])
    assert rows.deleted[2:] == ["gone"]


def test_a_suspect_is_left_out_until_it_reports_again_or_its_heartbeat_says_it_lives() -> None:
    # GIVEN "dead" owns one lease, expired, and still reports fresh metrics
    suspects = Suspects(AssignmentConfig())
    dead, live = cpu_worker("dead", 5), cpu_worker("live", 60)
    snapshot = AssignmentSnapshot(
        leases=(Lease(lease_key="a", lease_owner="dead", lease_counter=1),),
        workers=(dead, live),
        now_epoch_s=NOW,
        expired_lease_keys=frozenset({"a"}),
        run_number=2,
    )
    suspects.remember(snapshot, [dead, live])
    # THEN it is left out while its report is the one seen then
    assert [w.worker_id for w in suspects.without_silent([dead, live])] == ["live"]
    # WHEN its heartbeat says it lives, or it reports again THEN it is back
    assert [w.worker_id for w in suspects.without_silent([dead, live], alive=frozenset({"dead"}))] == ["dead", "live"]
    suspects.remember(snapshot, [dead, live])
    newer = WorkerMetricStats(
        worker_id="dead", last_update_epoch_s=int(NOW) + 1, stats={"C": (5, 5)}, operating_range={"C": (80.0,)}
    )
    assert [w.worker_id for w in suspects.without_silent([newer, live])] == ["dead", "live"]
    # AND a new term forgets every suspect
    suspects.remember(snapshot, [dead, live])
    suspects.clear()
    assert len(suspects.without_silent([dead, live])) == 2
