"""The leader's certificate (``hbg``, docs/failover.md) against moto, on a ManualClock: a worker whose heartbeat
fence ran out keeps its leases unless the leader declared it gone, so a slow machine — late timers, beats that land
while their replies time out — never costs a lease; and a worker the leader did declare gone drops them all.

The leader side is the real :class:`LivenessWatch` reading the same table on the same clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.heartbeat import FlakySink, SlowSink, ThrottledRows, owned_lease, w1_holder
from tests.support.stalls import hang_bound_s
from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import WorkerMetricStats
from worker_lib.leader.fast_path import LivenessWatch
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.heartbeat import HeartbeatLoop, HeartbeatSink
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

WALL = 1_800_000_000.0
FAILOVER_MS = 10_000
SKEW_MS = 500
VALIDITY_S = (FAILOVER_MS - LeaseConfig().epsilon_ms) / 1000


class LandedTimeoutSink:
    """Every beat lands in the table, and then its reply times out (raises), while ``failing`` is set."""

    def __init__(self, inner: HeartbeatSink) -> None:
        self._inner = inner
        self.failing = False

    def heartbeat(self, worker_id: str, **beat: Any) -> WorkerMetricStats | None:
        row = self._inner.heartbeat(worker_id, **beat)
        if self.failing:
            raise DependencyError("heartbeat reply timed out (injected; the write landed)")
        return row


class BeatBeforeDeclaring(ThrottledRows):
    """The leader's rows, where the worker beats once right after the leader's confirmation read."""

    def __init__(self, inner: WorkerMetricsStore, beat: Callable[[], object]) -> None:
        super().__init__(inner)
        self._beat = beat

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        row = super().get(worker_id)
        self._beat()
        return row


class CountingRows(ThrottledRows):
    """The leader's rows, counting the declarations written."""

    def __init__(self, inner: WorkerMetricsStore) -> None:
        super().__init__(inner)
        self.declarations = 0

    def declare_gone(self, worker_id: str, counter: int) -> bool:
        self.declarations += 1
        return super().declare_gone(worker_id, counter)


@dataclass
class World:
    clock: ManualClock
    rows: WorkerMetricsStore
    holder: LeaseHolder
    landed: LandedTimeoutSink
    flaky: FlakySink
    slow: SlowSink
    loop: HeartbeatLoop
    watch: LivenessWatch
    lost: list[tuple[str, str]] = field(default_factory=list)

    def leader_looks(self) -> set[str]:
        """One tick of the leader: scan the rows; the workers it would move leases from (confirmed and declared)."""
        view = self.watch.observe(self.rows.list_all())
        return {worker for worker in view.gone if self.watch.confirm_gone(worker)}


@pytest.fixture
def world(ddb: Any, app_name: str) -> World:
    clock = ManualClock(wall=WALL)
    rows = WorkerMetricsStore(app_name, client=ddb, clock=clock)
    leases = DynamoDBLeaseStore(app_name, client=ddb)
    holder, lost = w1_holder(leases, clock, failover_ms=FAILOVER_MS)
    holder.set_renewing(False)  # worker liveness mode: the heartbeat alone vouches for the leases
    landed = LandedTimeoutSink(rows)
    flaky = FlakySink(landed)
    slow = SlowSink(flaky, clock)
    loop = HeartbeatLoop(slow, "w1", interval_ms=1_000, fence=holder, on_notice=lambda _: None, clock=clock)
    watch = LivenessWatch(rows, failover_ms=FAILOVER_MS, max_clock_skew_ms=SKEW_MS, clock=clock)
    for key in ("shard-a", "shard-b"):
        assert holder.take(owned_lease(leases, key, "w1"))
    return World(clock, rows, holder, landed, flaky, slow, loop, watch, lost)


def _established(world: World) -> None:
    """Two beats a second apart, the leader looking after each: the row is certified, the fence in force."""
    for _ in range(2):
        assert world.loop.beat()
        assert world.leader_looks() == set()
        world.clock.advance(1)


def test_a_leader_certifies_each_heartbeating_worker_once(world: World) -> None:
    # GIVEN a worker that beat once (no certificate attribute yet)
    assert world.loop.beat()
    before = world.rows.get("w1")
    assert before is not None and before.heartbeat is not None and before.heartbeat.gone_counter is None
    # WHEN the leader looks at the rows
    world.leader_looks()
    # THEN the row says this leader certifies: hbg = 0 (declared nothing)
    after = world.rows.get("w1")
    assert after is not None and after.heartbeat is not None and after.heartbeat.gone_counter == 0


def test_beats_that_land_while_their_replies_time_out_past_the_fence_cost_no_lease(world: World) -> None:
    # GIVEN an established worker holding two leases
    _established(world)
    # WHEN every beat lands but its reply times out, for longer than the fence, the leader looking every second
    world.landed.failing = True
    suspended_seen = False
    for _ in range(int(VALIDITY_S) + 3):
        assert not world.loop.beat()
        assert world.leader_looks() == set()  # THEN the leader sees the counter move: never gone
        world.clock.advance(1)
        suspended_seen |= world.holder.suspended("shard-a")
    # AND meanwhile the worker processes nothing: its leases are suspended, not valid
    assert suspended_seen and not world.holder.is_valid("shard-a")
    # WHEN a reply comes back again
    world.landed.failing = False
    assert world.loop.beat()
    # THEN both leases are valid again and none was reported lost
    assert world.holder.held_keys() == ["shard-a", "shard-b"]
    assert world.holder.is_valid("shard-a") and world.holder.is_valid("shard-b")
    assert world.lost == []


def test_a_reply_late_past_the_fence_costs_no_lease_when_the_leader_declared_nothing(world: World) -> None:
    # GIVEN an established worker
    _established(world)
    # WHEN a beat lands at once but its reply takes longer than the whole fence (a starved machine)
    world.slow.delay_s = VALIDITY_S + 1
    assert world.loop.beat()
    # THEN the leases stay: the beat's reply shows no certificate since the last confirmed beat; they are only
    # suspended, as that beat's own fence (sent + validity) has passed too
    assert world.holder.held_keys() == ["shard-a", "shard-b"] and world.lost == []
    assert world.holder.suspended("shard-a")
    # AND the next beat makes them valid again
    world.slow.delay_s = 0
    assert world.loop.beat()
    assert world.holder.is_valid("shard-a") and world.lost == []


def test_a_worker_silent_past_the_failover_time_is_declared_gone_and_drops_everything_at_its_next_beat(
    world: World,
) -> None:
    # GIVEN an established worker
    _established(world)
    # WHEN its beats fail without landing (throttled) and the leader keeps looking
    world.flaky.failing = True
    declared: set[str] = set()
    for _ in range(int(FAILOVER_MS / 1000) + 3):
        world.loop.beat()
        declared |= world.leader_looks()
        world.clock.advance(1)
    # THEN the leader declared it gone: the certificate names the counter it stood still at
    assert declared == {"w1"}
    row = world.rows.get("w1")
    assert row is not None and row.heartbeat is not None
    assert row.heartbeat.gone_counter == row.heartbeat.counter
    # AND a later pass confirms it without writing the certificate again (it is on the item)
    writes = CountingRows(world.rows)
    again = LivenessWatch(writes, failover_ms=FAILOVER_MS, max_clock_skew_ms=SKEW_MS, clock=world.clock)
    again.observe(world.rows.list_all())
    world.clock.advance(FAILOVER_MS / 1000 + 1)
    assert again.confirm_gone("w1") and writes.declarations == 0
    # WHEN its beats work again
    world.flaky.failing = False
    assert world.loop.beat()
    # THEN it drops both leases as lost: they may have moved
    assert world.holder.held_keys() == []
    assert sorted(key for key, _ in world.lost) == ["shard-a", "shard-b"]
    assert all("declared" in reason for _, reason in world.lost)


def test_a_beat_landing_between_the_leaders_read_and_its_declaration_keeps_the_worker_alive(world: World) -> None:
    # GIVEN an established worker that then fell silent for longer than the failover time
    _established(world)
    world.flaky.failing = True
    for _ in range(int(FAILOVER_MS / 1000) + 2):
        world.loop.beat()
        world.clock.advance(1)
    assert "w1" in world.watch.observe(world.rows.list_all()).gone
    # WHEN its beat lands right after the leader's confirmation read, before the declaration
    world.flaky.failing = False
    racing = LivenessWatch(
        BeatBeforeDeclaring(world.rows, world.loop.beat),
        failover_ms=FAILOVER_MS,
        max_clock_skew_ms=SKEW_MS,
        clock=world.clock,
    )
    racing.observe(world.rows.list_all())
    world.clock.advance(FAILOVER_MS / 1000 + 1)  # the racing leader has seen the counter stand still too
    confirmed = racing.confirm_gone("w1")
    # THEN the declaration fails (the counter moved): nothing of the worker may move
    assert not confirmed
    row = world.rows.get("w1")
    assert row is not None and row.heartbeat is not None and row.heartbeat.gone_counter == 0


def test_under_a_leader_that_writes_no_certificates_a_lapse_drops_everything_as_before(world: World) -> None:
    # GIVEN a worker whose rows no certifying leader has seen (an older leader)
    for _ in range(2):
        assert world.loop.beat()
        world.clock.advance(1)
    # WHEN a reply comes back after the fence ran out
    world.slow.delay_s = VALIDITY_S + 1
    assert world.loop.beat()
    # THEN the reply cannot tell: both leases are dropped as lost
    assert world.holder.held_keys() == []
    assert sorted(key for key, _ in world.lost) == ["shard-a", "shard-b"]


def test_a_suspended_lease_waits_for_the_verdict_of_the_next_beat(world: World) -> None:
    # GIVEN an established worker whose fence has just run out (beats landing, replies timing out)
    _established(world)
    world.landed.failing = True
    world.clock.advance(VALIDITY_S + 1)
    assert not world.loop.beat()
    assert world.holder.suspended("shard-a")
    # WHEN a consumer waits for the verdict while the next beat gets its reply on another thread
    world.landed.failing = False
    beat = threading.Thread(target=world.loop.beat)
    verdict: list[bool] = []
    waiting = threading.Thread(
        target=lambda: verdict.append(world.holder.await_verdict("shard-a", timeout_s=VALIDITY_S))
    )
    waiting.start()
    beat.start()
    beat.join(timeout=hang_bound_s(0.0))  # liveness: a beat is a few calls, and the waiter waits on the manual clock
    waiting.join(timeout=hang_bound_s(0.0))
    assert not beat.is_alive() and not waiting.is_alive(), "a beat or the waiter hangs"
    # THEN it is told the lease is valid again
    assert verdict == [True] and world.lost == []
