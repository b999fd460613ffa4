"""The worker heartbeat against moto (docs/failover.md): the heartbeat write and the leader's notice on the worker's
own worker-metrics row, the heartbeat loop with the lease holder's fence, and a real in-process Worker announcing its
departure and picking up a lease from a notice.

Store, loop and fence tests run on a :class:`ManualClock`; the Worker tests use real time (the worker's threads
sleep on the system clock), bounded by liveness bounds derived from their timings (tests/support/stalls.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.heartbeat import FlakySink, HeartbeatBlackout, HeartbeatWrites, SlowSink, owned_lease, w1_holder
from tests.support.recording import recording_worker, stream_with_leases
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.core.clock import SYSTEM_CLOCK, Clock, ManualClock
from worker_lib.core.models import WorkerHeartbeat, WorkerMetricStats, WorkerState
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.heartbeat import HeartbeatLoop
from worker_lib.leases.keeper import KeeperOptions, LeaseKeeper
from worker_lib.leases.mode import handoff_request
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.tables.schema import worker_metrics_table_name
from worker_lib.worker.config import DISCOVERY_SAFETY_NET_MS, KCL_DISCOVERY_INTERVAL_MS
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.stats_serializer import from_item
from worker_lib.workermetrics.stats_store import MAX_NOTICE_KEYS, WorkerMetricsStore

WALL = 1_800_000_000.0
FAILOVER_MS = 10_000
VALIDITY_S = (FAILOVER_MS - LeaseConfig().epsilon_ms) / 1000  # 9.975 s


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall=WALL)


@pytest.fixture
def rows(ddb: Any, app_name: str, clock: ManualClock) -> WorkerMetricsStore:
    return WorkerMetricsStore(app_name, client=ddb, clock=clock)


@pytest.fixture
def leases(ddb: Any, app_name: str) -> DynamoDBLeaseStore:
    return DynamoDBLeaseStore(app_name, client=ddb)


# ----------------------------------------------------------------------------------------------- the store


def test_a_heartbeat_creates_the_row_and_returns_what_was_there_before(
    rows: WorkerMetricsStore, ddb: Any, app_name: str, clock: ManualClock
) -> None:
    # GIVEN no row for w1
    clock.advance(0.5)
    assert rows.get("w1") is None
    # WHEN w1 beats
    returned = rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=2)
    # THEN nothing was there before; the row exists, with lut = now (so the leader can read it as a worker) and
    # every heartbeat attribute
    stored = rows.get("w1")
    assert returned is None and stored is not None
    assert stored.last_update_epoch_s == int(WALL)
    assert stored.heartbeat == WorkerHeartbeat(
        counter=1, wall_ms=int((WALL + 0.5) * 1000), interval_ms=1_000, state=WorkerState.ACTIVE, events=2
    )
    assert stored.assignment_version == 0 and stored.assigned_keys == ()
    # AND the raw item reads through the serializer (and the leader's scan) as the same row
    raw = ddb.get_item(TableName=worker_metrics_table_name(app_name), Key={"wid": {"S": "w1"}})["Item"]
    assert from_item(raw) == stored
    assert rows.list_all() == [stored]


def test_each_heartbeat_increments_the_counter_and_restamps_but_keeps_lut(
    rows: WorkerMetricsStore, clock: ManualClock
) -> None:
    # GIVEN a worker that beat once
    rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    # WHEN it beats twice more, a second apart, the last time announcing its departure
    clock.advance(1)
    second = rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    clock.advance(1)
    rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.DEPARTING, events=1)
    # THEN each beat returned the row as the previous beat left it
    assert second is not None and second.heartbeat is not None and second.heartbeat.counter == 1
    # AND the counter is 3, the stamp and the state are the last beat's, lut is still the first beat's
    third = rows.get("w1")
    assert third is not None and third.heartbeat is not None
    assert third.heartbeat.counter == 3
    assert third.heartbeat.wall_ms == int((WALL + 2) * 1000)
    assert third.heartbeat.state is WorkerState.DEPARTING and third.heartbeat.events == 1
    assert third.last_update_epoch_s == int(WALL)


def test_a_notice_is_written_on_an_existing_row_and_comes_back_with_the_next_heartbeat(
    rows: WorkerMetricsStore,
) -> None:
    # GIVEN a worker with a row
    rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    # WHEN the leader notifies it twice
    assert rows.notify_assigned("w1", ["shard-b", "shard-a", "shard-a"])
    first = rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    assert rows.notify_assigned("w1", ["shard-c"])
    second = rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    # THEN each heartbeat's reply carries the version (+1 per notice) and the keys of the latest notice
    assert first is not None and (first.assignment_version, first.assigned_keys) == (1, ("shard-a", "shard-b"))
    assert second is not None and (second.assignment_version, second.assigned_keys) == (2, ("shard-c",))
    # AND the beat consumed the key list (the item the leader scans every second stays small); the version stays
    row = rows.get("w1")
    assert row is not None and (row.assignment_version, row.assigned_keys) == (2, ())


def test_a_notice_to_a_worker_without_a_row_is_not_written(rows: WorkerMetricsStore) -> None:
    # GIVEN no row for w9 WHEN the leader notifies it THEN nothing is written (it discovers by the index instead)
    assert rows.notify_assigned("w9", ["shard-a"]) is False
    assert rows.get("w9") is None


def test_a_notice_of_too_many_keys_is_written_without_keys(rows: WorkerMetricsStore) -> None:
    rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)
    assert rows.notify_assigned("w1", [f"shard-{n:04d}" for n in range(MAX_NOTICE_KEYS + 1)])
    row = rows.get("w1")
    assert row is not None and row.assignment_version == 1 and row.assigned_keys == ()


def test_a_metrics_report_keeps_the_heartbeat_and_the_notice(rows: WorkerMetricsStore, clock: ManualClock) -> None:
    # GIVEN a worker that beat and was notified
    rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=4)
    assert rows.notify_assigned("w1", ["shard-a"])
    # WHEN it reports its metrics 30 s later
    clock.advance(30)
    rows.put(
        WorkerMetricStats(
            worker_id="w1",
            last_update_epoch_s=int(clock.wall()),
            stats={"C": (40.0,)},
            operating_range={"C": (80.0,)},
            capacity=2.0,
        )
    )
    # THEN the report's attributes are written (its capacity too), and the heartbeat and notice attributes survive
    row = rows.get("w1")
    assert row is not None
    assert row.last_update_epoch_s == int(WALL + 30) and row.stats == {"C": (40.0,)} and row.capacity == 2.0
    assert row.heartbeat is not None and row.heartbeat.counter == 1 and row.heartbeat.events == 4
    assert row.assignment_version == 1 and row.assigned_keys == ("shard-a",)
    # AND the next beat continues the counter on top of the report
    rows.heartbeat("w1", interval_ms=1_000, state=WorkerState.ACTIVE, events=4)
    after = rows.get("w1")
    assert after is not None and after.heartbeat is not None and after.heartbeat.counter == 2
    assert after.stats == {"C": (40.0,)} and after.capacity == 2.0


# ----------------------------------------------------------------------------------------------- loop and fence


@dataclass
class Rig:
    clock: ManualClock
    rows: WorkerMetricsStore
    leases: DynamoDBLeaseStore
    holder: LeaseHolder
    slow: SlowSink
    flaky: FlakySink
    loop: HeartbeatLoop
    notices: list[tuple[str, ...] | None] = field(default_factory=list)
    lost: list[tuple[str, str]] = field(default_factory=list)

    def take(self, key: str) -> None:
        assert self.holder.take(owned_lease(self.leases, key, "w1"))

    def take_and_beat(self, *keys: str) -> float:
        """Take ``keys``, then beat (the beat lands); when it was sent."""
        for key in keys:
            self.take(key)
        sent = self.clock.monotonic()
        assert self.loop.beat()
        return sent


@pytest.fixture
def rig(rows: WorkerMetricsStore, leases: DynamoDBLeaseStore, clock: ManualClock) -> Rig:
    notices: list[tuple[str, ...] | None] = []
    holder, lost = w1_holder(leases, clock, failover_ms=FAILOVER_MS)
    slow = SlowSink(rows, clock)
    flaky = FlakySink(slow)
    loop = HeartbeatLoop(flaky, "w1", interval_ms=1_000, fence=holder, on_notice=notices.append, clock=clock)
    return Rig(clock, rows, leases, holder, slow, flaky, loop, notices, lost)


def test_the_first_beat_establishes_and_only_learns_the_assignment_version(rig: Rig) -> None:
    # GIVEN a worker row that already carries a notice (from before this process started)
    rig.rows.put(WorkerMetricStats(worker_id="w1", last_update_epoch_s=int(WALL)))
    assert rig.rows.notify_assigned("w1", ["old"])
    assert not rig.loop.established.is_set()
    # WHEN the first beat succeeds
    assert rig.loop.beat()
    # THEN the loop is established, and the old notice is not passed on (start-up discovery covers it)
    assert rig.loop.established.is_set() and rig.loop.beats == 1
    assert rig.notices == []
    # WHEN nothing new is announced THEN later beats pass nothing on either
    assert rig.loop.beat()
    assert rig.notices == []


def test_a_notice_with_the_next_version_passes_its_keys_and_a_jump_asks_for_the_index(rig: Rig) -> None:
    # GIVEN an established loop
    assert rig.loop.beat()
    # WHEN the leader announces one batch THEN the next beat passes its keys on
    assert rig.rows.notify_assigned("w1", ["shard-2", "shard-1"])
    assert rig.loop.beat()
    assert rig.notices == [("shard-1", "shard-2")]
    # WHEN two notices land between beats (asv + 2) THEN the keys of the first are unknown: None (query the index)
    assert rig.rows.notify_assigned("w1", ["shard-3"])
    assert rig.rows.notify_assigned("w1", ["shard-4"])
    assert rig.loop.beat()
    assert rig.notices[-1] is None
    # WHEN a notice names too many leases (written without keys) THEN None as well
    assert rig.rows.notify_assigned("w1", [f"k{n}" for n in range(MAX_NOTICE_KEYS + 1)])
    assert rig.loop.beat()
    assert rig.notices == [("shard-1", "shard-2"), None, None]


def test_a_lease_is_valid_only_until_the_last_heartbeat_plus_the_validity(rig: Rig) -> None:
    # GIVEN a lease taken and a beat sent at t
    start = rig.take_and_beat("shard-a")
    # WHEN the lease is renewed at t + 5 (its own validity now runs to t + 14.975) and no beat follows
    rig.clock.advance(5)
    assert rig.holder.renew_all().renewed == ("shard-a",)
    # THEN it is valid just before t + validity and invalid just after: the heartbeat fence, not the lease, ends it
    rig.clock.advance(start + VALIDITY_S - 0.005 - rig.clock.monotonic())
    assert rig.holder.is_valid("shard-a")
    rig.clock.advance(0.01)
    assert not rig.holder.is_valid("shard-a")
    assert rig.holder.held_keys() == ["shard-a"]  # not dropped yet: only no longer valid


def test_without_any_heartbeat_only_the_lease_validity_applies(rig: Rig) -> None:
    # GIVEN a holder that never beat (heartbeats off), renewing at t + 5
    rig.take("shard-a")
    start = rig.clock.monotonic()
    rig.clock.advance(5)
    assert rig.holder.renew_all().renewed == ("shard-a",)
    # WHEN t + validity + a moment passed THEN the lease is still valid (renewed 5 s ago)
    rig.clock.advance(start + VALIDITY_S + 0.005 - rig.clock.monotonic())
    assert rig.holder.is_valid("shard-a")


def test_a_beat_after_the_fence_ran_out_drops_every_lease_for_good(rig: Rig) -> None:
    # GIVEN two leases and a beat at t; renewals keep the leases themselves valid
    rig.take_and_beat("shard-a", "shard-b")
    rig.clock.advance(5)
    assert len(rig.holder.renew_all().renewed) == 2
    # WHEN the next beat only succeeds after t + validity (the beats in between failed)
    rig.flaky.failing = True
    for _ in range(4):
        rig.clock.advance(1)
        assert not rig.loop.beat()
    assert rig.loop.failures == 4
    rig.clock.advance(1)
    rig.flaky.failing = False
    assert rig.loop.beat()
    # THEN every lease is dropped as lost: the leader may have judged the worker dead and moved them
    assert rig.holder.held_keys() == []
    assert sorted(key for key, _ in rig.lost) == ["shard-a", "shard-b"]
    assert all("heartbeat" in reason for _, reason in rig.lost)
    # AND they do not come back valid with the next successful beat
    rig.clock.advance(1)
    assert rig.loop.beat()
    assert not rig.holder.is_valid("shard-a") and not rig.holder.is_valid("shard-b")
    assert rig.holder.renew_all().renewed == ()


def test_a_beat_whose_reply_comes_after_the_fence_end_drops_every_lease(rig: Rig) -> None:
    # GIVEN two leases, a beat at t and renewals at t + 5
    rig.take_and_beat("shard-a", "shard-b")
    rig.clock.advance(5)
    assert len(rig.holder.renew_all().renewed) == 2
    # WHEN a beat is sent at t + 5 but its reply arrives at t + 10.5 (past the fence end t + 9.975)
    rig.slow.delay_s = 5.5
    assert rig.loop.beat()
    # THEN both leases are dropped, although that beat's own fence (t + 14.975) lies in the future
    assert rig.holder.held_keys() == []
    assert not rig.holder.is_valid("shard-a")
    assert sorted(key for key, _ in rig.lost) == ["shard-a", "shard-b"]


def test_a_slow_reply_before_the_fence_end_keeps_the_leases_and_extends_the_fence(rig: Rig) -> None:
    # GIVEN the same, but the reply arrives at t + 9.9 (before the fence end)
    start = rig.take_and_beat("shard-a")
    rig.clock.advance(5)
    assert rig.holder.renew_all().renewed == ("shard-a",)
    rig.slow.delay_s = 4.9
    assert rig.loop.beat()
    # THEN nothing is lost, and the lease is valid past the old fence, up to the new one (sent at t + 5)
    assert rig.lost == [] and rig.holder.held_keys() == ["shard-a"]
    rig.clock.advance(start + 10.5 - rig.clock.monotonic())
    assert rig.holder.is_valid("shard-a")


def test_fence_all_drops_everything_and_nothing_is_valid_until_the_next_beat(rig: Rig) -> None:
    # GIVEN two valid leases
    rig.take_and_beat("shard-a", "shard-b")
    assert rig.holder.is_valid("shard-a") and rig.holder.is_valid("shard-b")
    # WHEN the worker fences itself (it is leaving)
    rig.holder.fence_all("worker stopped")
    # THEN every lease is dropped as lost with that reason
    assert rig.holder.held_keys() == []
    assert sorted(rig.lost) == [("shard-a", "worker stopped"), ("shard-b", "worker stopped")]
    # AND a lease taken afterwards is not valid before another beat
    rig.take("shard-c")
    assert not rig.holder.is_valid("shard-c")


# ------------------------------------------------------------------- two processes under one worker id


def second_process(rig: Rig, superseded: list[str]) -> tuple[LeaseHolder, HeartbeatLoop]:
    """Another process's holder and heartbeat under the worker id w1, on the same row."""
    holder = LeaseHolder(rig.leases, "w1", config=LeaseConfig(failover_time_ms=FAILOVER_MS), clock=rig.clock)
    loop = HeartbeatLoop(
        rig.rows,
        "w1",
        interval_ms=1_000,
        fence=holder,
        on_notice=lambda keys: None,
        on_superseded=lambda: superseded.append("new"),
        clock=rig.clock,
    )
    return holder, loop


def test_a_newer_process_under_the_same_worker_id_waits_for_the_older_which_stands_down(rig: Rig) -> None:
    # GIVEN an older process w1 beating and holding a lease
    rig.take("shard-a")
    assert rig.loop.beat() and rig.holder.is_valid("shard-a")
    # WHEN a newer process starts under w1 half a second later (a restarted query whose old runner still leaves)
    rig.clock.advance(0.5)
    superseded: list[str] = []
    _, newer = second_process(rig, superseded)
    assert newer.beat()
    # THEN the newer one takes nothing yet: the older one beat lately and has not seen it
    assert not newer.established.is_set()
    # WHEN the older one beats again
    rig.clock.advance(0.5)
    assert rig.loop.beat() is False
    # THEN it has stood down: fenced (its lease dropped), no longer established, beating no more
    assert rig.loop.superseded.is_set() and not rig.loop.established.is_set()
    assert rig.holder.held_keys() == [] and ("shard-a", "a newer process runs under this worker id") in rig.lost
    written = rig.rows.get("w1")
    assert rig.loop.announce(WorkerState.STOPPED) is False  # its departure does not overwrite the newer one's row
    assert rig.rows.get("w1") == written
    # AND the newer one takes leases once the older one's next beat was due (two of its intervals and a margin)
    rig.clock.advance(1.0)
    assert newer.beat() and not newer.established.is_set()
    row = rig.rows.get("w1")
    assert row is not None and row.heartbeat is not None and row.heartbeat.session == newer.session
    rig.clock.advance(1.1)
    assert newer.beat() and newer.established.is_set() and not newer.superseded.is_set()
    # AND the older one's row entries never make the newer one stand down
    assert superseded == []


def test_a_process_after_a_stopped_or_silent_one_takes_leases_at_its_first_beat(rig: Rig) -> None:
    # GIVEN a process w1 that stopped (said STOPPED)
    assert rig.loop.beat()
    rig.holder.fence_all("worker stopped")
    assert rig.loop.announce(WorkerState.STOPPED)
    # WHEN a new process starts under w1 THEN its first beat establishes at once
    rig.clock.advance(0.5)
    _, after_stop = second_process(rig, [])
    assert after_stop.beat() and after_stop.established.is_set()
    # GIVEN a process w1 that went silent (killed) 4 s before another starts
    rig.clock.advance(4.0)
    _, after_silence = second_process(rig, [])
    # WHEN it beats THEN it does not wait either (the silent one's fence has run out: it can take nothing before a
    # beat of its own would show it the newer session)
    assert after_silence.beat() and after_silence.established.is_set()


# ------------------------------------------- orphaned hand-offs (issue 26: after a freeze, then a kill)


def held_then_handed_over(rig: Rig, key: str, to: str) -> None:
    """w1 takes ``key`` and beats; then the leader's rebalancing move of ``key`` from w1 to ``to`` in worker mode:
    leaseOwner = ``to``, checkpointOwner = w1, and the request on w1's item."""
    rig.take(key)
    assert rig.loop.beat()
    lease = rig.leases.get_lease(key)
    assert lease is not None and rig.leases.initiate_graceful_handoff(lease, to) is not None
    assert rig.rows.request_handoff("w1", [handoff_request(key, 30_000)])


def handoff_requests_of(rows: WorkerMetricsStore, worker_id: str) -> tuple[str, ...]:
    row = rows.get(worker_id)
    assert row is not None
    return row.handoff_requests


def restarted_w1(rig: Rig, *, in_use: Callable[[str], bool] | None = None) -> tuple[HeartbeatLoop, list[str]]:
    """A new process under the worker id w1 that holds nothing, with what it told new owners."""
    told: list[str] = []
    holder = LeaseHolder(
        rig.leases,
        "w1",
        config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        clock=rig.clock,
        on_release=lambda key, new_owner: told.append(f"{key}->{new_owner}"),
        in_use=in_use,
    )
    loop = HeartbeatLoop(rig.rows, "w1", interval_ms=1_000, fence=holder, on_notice=lambda _: None, clock=rig.clock)
    return loop, told


def test_a_handoff_from_a_killed_process_is_completed_by_the_next_process_under_its_id_at_its_first_beat(
    rig: Rig,
) -> None:
    # GIVEN w1 processing shard-a, and the leader moving shard-a to w3 (a worker that just came back from a freeze)
    held_then_handed_over(rig, "shard-a", "w3")
    # AND w1 is killed before it saw the request, and restarted under the same id 4 s later: the id beats again,
    # so the leader never judges w1 gone and would force the hand-off only after its 30 s timeout
    rig.clock.advance(4.0)
    restarted, told = restarted_w1(rig)
    # WHEN the new process beats
    assert restarted.beat() and restarted.established.is_set()
    # THEN the hand-off is complete in that beat: w3 owns shard-a outright, and the release callback (which the
    # worker turns into a notice to w3) names it
    after = rig.leases.get_lease("shard-a")
    assert after is not None and (after.lease_owner, after.checkpoint_owner) == ("w3", None)
    assert told == ["shard-a->w3"]
    # AND the next beat removes the request from w1's item
    rig.clock.advance(1.0)
    assert restarted.beat()
    assert handoff_requests_of(rig.rows, "w1") == ()


def test_an_orphaned_handoff_waits_for_our_consumer_to_wind_down_and_for_a_predecessor_to_stand_down(
    rig: Rig,
) -> None:
    # GIVEN w1 beating and holding shard-a, which the leader hands over to w2
    held_then_handed_over(rig, "shard-a", "w2")
    # WHEN a newer process under w1 beats while the older one beat lately
    rig.clock.advance(0.5)
    busy = {"shard-a"}
    newer, told = restarted_w1(rig, in_use=lambda key: key in busy)
    assert newer.beat() and not newer.established.is_set()
    # THEN it completes nothing: the older process may still be processing shard-a
    lease = rig.leases.get_lease("shard-a")
    assert lease is not None and lease.checkpoint_owner == "w1" and told == []
    # WHEN the older one stood down and the newer one is established, but its consumer of shard-a still runs
    rig.clock.advance(0.5)
    assert rig.loop.beat() is False and rig.loop.superseded.is_set()
    rig.clock.advance(2.1)
    assert newer.beat() and newer.established.is_set()
    # THEN the hand-off still waits, and the request stays on the item
    lease = rig.leases.get_lease("shard-a")
    assert lease is not None and lease.checkpoint_owner == "w1" and told == []
    assert handoff_requests_of(rig.rows, "w1") != ()
    # WHEN the consumer has ended THEN the next beat completes it
    busy.clear()
    rig.clock.advance(1.0)
    assert newer.beat()
    lease = rig.leases.get_lease("shard-a")
    assert lease is not None and (lease.lease_owner, lease.checkpoint_owner) == ("w2", None)
    assert told == ["shard-a->w2"]


def w1_keeper(leases: DynamoDBLeaseStore, rows: WorkerMetricsStore, *, failover_ms: int, clock: Clock) -> LeaseKeeper:
    """The lease keeper of a process under the worker id w1 (not started)."""
    return LeaseKeeper(
        leases,
        rows,
        "w1",
        config=LeaseConfig(failover_time_ms=failover_ms),
        options=KeeperOptions(discovery_interval_s=lambda _seen: 10.0),
        modes=None,
        who="w1",
        default_stream="s",
        clock=clock,
    )


def test_a_keeper_completing_an_orphaned_handoff_in_a_beat_notifies_the_new_owner_and_the_beat_returns(
    rig: Rig,
) -> None:
    # GIVEN a hand-off of shard-a from w1 to w3 asked of w1, which w1's current process does not hold, and w3's row
    held_then_handed_over(rig, "shard-a", "w3")
    rig.rows.put(WorkerMetricStats(worker_id="w3", last_update_epoch_s=int(WALL)))
    rig.clock.advance(4.0)
    keeper = w1_keeper(rig.leases, rig.rows, failover_ms=FAILOVER_MS, clock=rig.clock)
    assert keeper.heartbeat is not None
    # WHEN its heartbeat beats (the release it makes inside the beat notes an event for the leader: issue 26's
    # first fix deadlocked there, on the beat's own lock)
    beat = threading.Thread(target=keeper.heartbeat.beat, daemon=True)
    beat.start()
    beat.join(timeout=hang_bound_s(0))  # liveness: a beat is a few calls (a deadlock never returns)
    # THEN the beat returned, w3 owns shard-a outright and has the notice, and the next beat carries the event
    assert not beat.is_alive()
    after = rig.leases.get_lease("shard-a")
    assert after is not None and (after.lease_owner, after.checkpoint_owner) == ("w3", None)
    w3 = rig.rows.get("w3")
    assert w3 is not None and w3.assigned_keys == ("shard-a",)
    rig.clock.advance(1.0)
    assert keeper.heartbeat.beat()
    w1 = rig.rows.get("w1")
    assert w1 is not None and w1.heartbeat is not None and w1.heartbeat.events == 1


def test_a_keeper_waits_to_take_until_a_predecessor_that_beat_lately_must_have_stood_down(
    leases: DynamoDBLeaseStore, rows: WorkerMetricsStore
) -> None:
    # GIVEN an older process under w1 that beat a moment ago (a Spark query's runner still leaving)
    older = HeartbeatLoop(rows, "w1", interval_ms=1_000, fence=LeaseHolder(leases, "w1"), on_notice=lambda _: None)
    assert older.beat()
    # WHEN a new process's keeper starts beating (on the real clock: its heartbeat thread beats every second)
    keeper = w1_keeper(leases, rows, failover_ms=3_000, clock=SYSTEM_CLOCK)
    keeper.start_heartbeat(beat_now=True)
    try:
        # THEN it may not take leases at once: the older one may still hold some
        assert not keeper.may_take
        # AND waiting to take returns once it may (its own bound is 3 of its beats and a second; ours is liveness)
        started = time.monotonic()
        assert keeper.wait_to_take()
        assert time.monotonic() - started < hang_bound_s(3 * 1.0 + 1.0), stall_note(started)
    finally:
        assert keeper.heartbeat is not None
        keeper.heartbeat.stop()


def test_a_request_for_a_lease_no_longer_in_handoff_from_us_is_only_removed(rig: Rig) -> None:
    # GIVEN a hand-off of shard-a from w1 to w2 that the leader forced meanwhile (w2 owns it outright)
    held_then_handed_over(rig, "shard-a", "w2")
    forced = rig.leases.get_lease("shard-a")
    assert forced is not None and rig.leases.complete_handoff(forced, "w1") is not None
    counter = rig.leases.get_lease("shard-a")
    # WHEN a new process under w1 sees the request
    rig.clock.advance(4.0)
    restarted, told = restarted_w1(rig)
    assert restarted.beat()
    rig.clock.advance(1.0)
    assert restarted.beat()
    # THEN it writes nothing to the lease and tells nobody; the request is gone from its item
    assert rig.leases.get_lease("shard-a") == counter and told == []
    assert handoff_requests_of(rig.rows, "w1") == ()


# ----------------------------------------------------------------------------------------------- the Worker

FAST_LEASES = LeaseConfig(failover_time_ms=3_000)  # heartbeat every 1 s (a third of the failover time)
BEAT_S = FAST_LEASES.failover_time_ms / 3 / 1000
# Liveness bounds (tests/support/stalls.py): a worker's first beats and its start-up discovery, a lease taken on a
# notice (a beat and a coordinator step), a graceful shutdown (the recording worker's 10 s shutdown timeout at most)
BEATS_BOUND_S = hang_bound_s(2 * BEAT_S)
SHUTDOWN_BOUND_S = hang_bound_s(BEAT_S)


def start_worker(app: str, stream: str, ddb: Any, kinesis: Any, workers: list[Worker], **config: Any) -> Worker:
    worker = recording_worker(
        app, stream, ddb=ddb, kinesis=kinesis, lease=FAST_LEASES, report_worker_metrics=False, **config
    )
    workers.append(worker)
    worker.start()
    return worker


def beat_count(rows: WorkerMetricsStore, worker_id: str) -> int:
    row = rows.get(worker_id)
    return row.heartbeat.counter if row is not None and row.heartbeat is not None else 0


def test_the_discovery_interval_is_a_safety_net_once_notices_arrive_and_kcls_otherwise() -> None:
    # GIVEN the default configuration, with and without heartbeats, and one with the interval set
    default = WorkerConfig(app="app", stream="s")
    off = WorkerConfig(app="app", stream="s", lease=LeaseConfig(heartbeat_interval_ms=0))
    fixed = WorkerConfig(app="app", stream="s", discovery_interval_ms=5_000)
    # THEN KCL's pace until the leader is known to send notices (an older leader never does), the safety net after
    assert default.discovery_interval_s(notices_seen=False) * 1000 == KCL_DISCOVERY_INTERVAL_MS == 9_975
    assert default.discovery_interval_s(notices_seen=True) * 1000 == DISCOVERY_SAFETY_NET_MS == 60_000
    # AND without heartbeats nothing brings notices back: always KCL's pace; a set value always wins
    assert off.discovery_interval_s(notices_seen=True) * 1000 == KCL_DISCOVERY_INTERVAL_MS
    assert fixed.discovery_interval_s(notices_seen=False) == fixed.discovery_interval_s(notices_seen=True) == 5.0


def test_shutdown_announces_departing_then_stopped_and_gives_the_leases_up(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a worker holding both leases of a 2-shard stream, every UpdateItem of its client recorded
    stream, store, keys = stream_with_leases(app_name, ddb, kinesis, 2, owner="w1")
    writes = HeartbeatWrites(ddb)
    worker = start_worker(app_name, stream, ddb, kinesis, workers)
    eventually(lambda: sorted(worker.held_leases) == sorted(keys), bound_s=BEATS_BOUND_S, what="w1 holds both leases")
    # WHEN it shuts down
    assert worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
    # THEN its heartbeats said ACTIVE, then DEPARTING before it gave any lease up, then STOPPED last
    states = writes.states()
    assert states[0] == "ACTIVE" and states[-1] == "STOPPED"
    departing = writes.first_index(lambda call: call[1] == "DEPARTING")
    stopped = writes.last_index(lambda call: call[1] == "STOPPED")
    evictions = [i for i, call in enumerate(writes.calls) if call[0] == app_name and call[2]]
    assert len(evictions) == len(keys)
    assert 0 <= departing < min(evictions) and max(evictions) < stopped
    assert "ACTIVE" not in states[states.index("DEPARTING") :]
    # AND the row says STOPPED, with one event per lease given up
    rows = WorkerMetricsStore(app_name, client=ddb)
    row = rows.get("w1")
    assert row is not None and row.heartbeat is not None
    assert row.heartbeat.state is WorkerState.STOPPED and row.heartbeat.events == len(keys)
    # AND the leases are free at once
    assert all(lease.lease_owner is None for lease in store.list_leases())
    # AND no beat follows the STOPPED one (a beat and a half let pass: not a bound)
    counter = row.heartbeat.counter
    time.sleep(1.5 * BEAT_S)
    assert beat_count(rows, "w1") == counter


def test_a_notified_lease_is_taken_within_a_beat_despite_a_30_s_discovery_interval(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a running worker with the default 30 s safety-net discovery, two unowned leases
    stream, store, keys = stream_with_leases(app_name, ddb, kinesis, 2)
    notified_key, quiet_key = sorted(keys)
    rows = WorkerMetricsStore(app_name, client=ddb)
    worker = start_worker(app_name, stream, ddb, kinesis, workers)
    assert worker.config.discovery_interval_ms is None  # KCL's pace until a notice arrives, 30 s after
    # (its start-up discovery has run once it beat twice: the first beat established it)
    eventually(lambda: beat_count(rows, "w1") >= 2, bound_s=BEATS_BOUND_S, what="w1 beat twice")
    assert worker.held_leases == []
    # WHEN the leader assigns both, but notifies the worker of only one
    for key in (quiet_key, notified_key):
        lease = store.get_lease(key)
        assert lease is not None and store.assign_lease(lease, "w1") is not None
    started = time.monotonic()
    assert rows.notify_assigned("w1", [notified_key])
    # THEN the notified lease is taken on the notice (about one beat and a coordinator step: a figure, printed; the
    # bound is liveness), not by a discovery: the other lease, assigned at the same time, is not taken with it
    taken_s = eventually(
        lambda: notified_key in worker.held_leases, bound_s=BEATS_BOUND_S, what="the notified lease taken", step_s=0.05
    )
    assert quiet_key not in worker.held_leases, stall_note(started)
    print(f"figure: a notified lease taken {taken_s:.2f} s after the notice")
    # AND the other waits for the next discovery (KCL's 9.975 s pace): it is not held a beat later either
    time.sleep(1.2 * BEAT_S)  # a beat lets pass: not a bound
    assert worker.held_leases == [notified_key], stall_note(started)


def test_no_lease_is_taken_before_the_first_heartbeat_succeeded(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a lease assigned to w1 and w1's heartbeat writes failing (throttled)
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    assigned = store.get_lease(key)
    assert assigned is not None
    blackout = HeartbeatBlackout(ddb)
    blackout.failing = True
    # WHEN the worker starts and its heartbeats keep failing for 2 s
    worker = start_worker(app_name, stream, ddb, kinesis, workers)
    eventually(lambda: blackout.refused >= 2, bound_s=BEATS_BOUND_S, what="two heartbeats refused")
    # THEN it has not taken (nor renewed) the lease: its counter is untouched
    assert worker.held_leases == []
    current = store.get_lease(key)
    assert current is not None and current.lease_counter == assigned.lease_counter
    # WHEN the heartbeat gets through THEN it takes the lease
    blackout.failing = False
    eventually(lambda: worker.held_leases == [key], bound_s=BEATS_BOUND_S, what="the lease taken after a beat")


def test_giving_up_a_lease_in_handoff_reports_its_new_owner(leases: DynamoDBLeaseStore, clock: ManualClock) -> None:
    # GIVEN w1 holds a lease the leader is handing over to w2 (w1 saw the handoff at its last renewal)
    released: list[tuple[str, str | None]] = []
    holder = LeaseHolder(
        leases,
        "w1",
        config=LeaseConfig(failover_time_ms=FAILOVER_MS),
        clock=clock,
        on_release=lambda key, new_owner: released.append((key, new_owner)),
    )
    assert holder.take(owned_lease(leases, "shard-a", "w1"))
    current = leases.get_lease("shard-a")
    assert current is not None and leases.initiate_graceful_handoff(current, "w2") is not None
    assert holder.renew_all().handoffs == ("shard-a",)
    # WHEN w1 gives the lease up (shutdown, or its consumer crashed)
    assert holder.evict("shard-a")
    # THEN the handoff is complete in the table: w2 owns the lease outright ...
    after = leases.get_lease("shard-a")
    assert after is not None and after.lease_owner == "w2" and after.checkpoint_owner is None
    # ... and the release callback names w2, so that the worker notifies it (as complete_handoff does)
    assert released == [("shard-a", "w2")]
