"""Graceful hand-offs in ``worker`` liveness mode on thousands of seeded random schedules on fake clocks: the leader's
request, the old owner's bound, its completion and the leader's deadline never give the lease two valid holders at
one instant (docs/liveness-modes.md, "Safety in worker mode", rules 2 and 3; issue 36).

The leader starts a hand-off of one lease from ``old`` to ``new`` and asks for it on ``old``'s item
(:class:`HandoffTracker` with a requester whose writes fail, find no item, or land); later runs (some in a new term,
some a moment after the deadline) force what is overdue. ``old`` is a :class:`LeaseHolder` that does not renew
(``worker`` mode) and beats one beat at a time as ``HeartbeatLoop`` does: a beat is applied within the network
delay or never, its reply — the item as it was before the beat, hand-off requests included — is handled at once,
late or never, and the elements it is done with are removed by its next beat. When a reply brings a request,
``old`` bounds the lease (:meth:`LeaseHolder.handoff_requests`); its consumer then either completes the hand-off
while the lease is still valid, or hangs. ``new`` starts the lease once the hand-off is completed — by ``old``'s
consumer, by ``old`` as an orphaned hand-off (a request it sees after its lapsed fence dropped the lease), or forced
by the leader — after its notice arrives (at once, or up to half a failover time later).

Times are integer microseconds of true time; each host's monotonic clock is an offset of it. The schedules run under
both kinds of leader: one that writes no certificates (a reply after the fence ran out cannot tell, and drops every
lease) and a certifying one, which never declares ``old`` gone here (a hand-off is no declaration): each reply after
the first says so (``declared_gone=False``), and a lapsed fence keeps the lease (docs/failover.md).
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease
from worker_lib.leader.handoffs import HandoffTracker
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.leases.store import LeaseStore

US = 1_000_000
KEY = "shardId-000000000007"
OLD, NEW = "old", "new"
SCHEDULES = 2_000
DECISIONS = logging.getLogger("tests.unit.test_handover_schedules.decisions")
DECISIONS.propagate = False
DECISIONS.addHandler(logging.NullHandler())


def move_to(clock: ManualClock, monotonic_s: float) -> None:
    """Set ``clock`` to exactly ``monotonic_s`` (the difference of two nearby floats is exact)."""
    clock.advance(monotonic_s - clock.monotonic())


def extreme(rng: random.Random, most: int) -> int:
    """A value in [0, most]: either end of it half the time (where the properties are tightest), else uniform."""
    roll = rng.random()
    return 0 if roll < 0.25 else most if roll < 0.5 else rng.randint(0, most)


@dataclass
class World:
    """What both sides write: the lease item and ``old``'s hand-off requests (``hrq``), at the current instant."""

    now: int = 0
    lease: Lease = field(default_factory=lambda: Lease(lease_key=KEY, lease_owner=OLD, lease_counter=1))
    requests: set[str] = field(default_factory=set)
    completed_at: int | None = None  # when the hand-off was completed (the new owner may start after)
    completed_by: str = ""  # "leader" (forced), "old" (its consumer let go) or "orphan" (old had dropped the lease)
    actor: str = "orphan"  # who writes now
    landed: list[int] = field(default_factory=list)  # when each request landed on old's item
    rng: random.Random = field(default_factory=random.Random)

    # --- the lease table (the store of old's holder and the leader's completer) ------------------------------

    table_name = "leases"

    def get_lease(self, lease_key: str) -> Lease | None:
        return self.lease

    def renew_lease(self, lease: Lease, owner: str, *, throughput_kbps: float | None = None) -> Lease | None:
        if self.lease.lease_owner != owner or self.lease.checkpoint_owner is not None:
            return None
        self.lease = self.lease.with_(lease_counter=self.lease.lease_counter + 1)
        return self.lease

    def complete_handoff(self, lease: Lease, old_owner: str) -> Lease | None:
        """Old owner, or the leader past the deadline: conditional on the hand-off still being in progress."""
        if self.lease.checkpoint_owner != old_owner:
            return None
        self.lease = self.lease.with_(checkpoint_owner=None, lease_counter=self.lease.lease_counter + 1)
        self.completed_at, self.completed_by = self.now, self.actor
        return self.lease

    # --- old's item, for the leader's requests ---------------------------------------------------------------

    def request_handoff(self, worker_id: str, elements: Sequence[str]) -> bool:
        roll = self.rng.random()
        if roll < 0.12:
            raise DependencyError("throttled")
        if roll < 0.17:
            return False  # the item is not there (as the store answers for a missing item)
        self.requests.update(elements)
        self.landed.append(self.now)
        return True


@dataclass(frozen=True)
class Timing:
    failover_us: int
    epsilon_us: int
    timeout_us: int  # the graceful hand-off timeout
    delay_us: int
    interval_us: int  # old's beat interval

    @property
    def config(self) -> LeaseConfig:
        return LeaseConfig(
            failover_time_ms=self.failover_us // 1000,
            epsilon_ms=self.epsilon_us // 1000,
            graceful_handoff_timeout_ms=self.timeout_us // 1000,
            liveness_mode="worker",
        )


def random_timing(rng: random.Random) -> Timing:
    failover = rng.choice((1_000, 3_000, 10_000)) * 1000
    return Timing(
        failover_us=failover,
        epsilon_us=rng.choice((1_000, 25_000)),
        timeout_us=rng.choice((0, 500_000, failover, 3 * failover)),
        delay_us=rng.randint(1_000, failover // 8),
        interval_us=rng.randint(failover // 12, failover // 3),
    )


@dataclass
class Old:
    """The old owner's process: its holder and clock, the requests it is done with, and what its consumer does."""

    holder: LeaseHolder
    clock: ManualClock
    done: set[str] = field(default_factory=set)  # elements it is done with: removed by its next beat
    hangs: bool = False  # its consumer never completes the hand-off


def run_schedule(seed: int, *, certifying: bool = False) -> tuple[list[str], str]:
    """One schedule: what went wrong (nothing, we expect), and who completed the hand-off ("" if nobody did)."""
    rng = random.Random(seed)
    timing = random_timing(rng)
    failover, timeout = timing.failover_us, timing.timeout_us
    world = World(rng=random.Random(seed + 1))
    leader_clock = ManualClock(monotonic=50.0)
    tracker = HandoffTracker(world, world, config=timing.config, clock=leader_clock, decisions=DECISIONS)
    old_clock = ManualClock(monotonic=1_000.0)
    holder = LeaseHolder(cast(LeaseStore, world), OLD, config=timing.config, clock=old_clock)
    old = Old(holder, old_clock, hangs=rng.random() < 0.4)
    old.holder.set_renewing(False)
    beating = frozenset({OLD})

    def leader_mono(at: int) -> float:
        return (50 * US + at) / US

    def old_mono(at: int) -> float:
        return (1_000 * US + at) / US

    # The old owner took the lease after its first beat, at 0.
    old.holder.heartbeat_succeeded(old_mono(0), old_mono(0))
    assert old.holder.take(world.lease)
    horizon = 4 * (failover + timeout) + 4 * failover
    events: list[tuple[int, int, str, tuple[int, ...]]] = []
    order = 0

    def at(when: int, kind: str, *args: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (when, order, kind, args))

    at(rng.randint(0, 2 * failover), "start")
    at(rng.randint(1, timing.interval_us), "send")
    problems: list[str] = []
    new_since: int | None = None
    new_notified = False
    replies: dict[int, tuple[int, frozenset[str]]] = {}  # beat → (sent, done elements it carries)
    snapshots: dict[int, frozenset[str]] = {}  # beat → old's requests as its write found them
    beat_no = 0
    while events:
        when, _, kind, args = heapq.heappop(events)
        if when > horizon:
            break
        world.now = when
        move_to(leader_clock, leader_mono(when))
        move_to(old.clock, old_mono(when))
        if kind == "start":
            # The leader writes the hand-off (counter untouched) and asks old for it on its item.
            world.lease = world.lease.with_(lease_owner=NEW, checkpoint_owner=OLD)
            tracker.started([(KEY, NEW, OLD)], requested_from=beating)
            at(when + rng.randint(1, failover), "run")
        elif kind == "run":
            if rng.random() < 0.05:
                tracker.reset()  # a new term: every hand-off is seen afresh (and requested again)
            world.actor = "leader"
            tracker.force_overdue([world.lease], leader_mono(when), requested_from=beating)
            world.actor = "orphan"
            # The deadline runs from the latest request that landed (an earlier one is not re-requested).
            deadline = world.landed[-1] + timeout + failover if world.landed else None
            if deadline is not None and deadline >= when and rng.random() < 0.5:
                at(deadline + rng.randint(1, 1_000), "run")  # adversarially: a moment after the deadline
            else:
                at(when + rng.randint(failover // 4, 2 * failover), "run")
        elif kind == "send":
            beat_no += 1
            done = frozenset(old.done)
            replies[beat_no] = (when, done)
            outcome = rng.random()
            returned = when + rng.randint(0, 2 * timing.delay_us)
            if outcome < 0.86:
                applied = when + extreme(rng, timing.delay_us)
                at(applied, "apply", beat_no)
                returned = max(returned, applied)
                if outcome < 0.72:
                    handled = applied + extreme(rng, timing.delay_us)
                    if rng.random() < 0.08:  # a slow reply, or a process frozen before it handled the reply
                        handled += rng.randint(0, 2 * failover)
                    at(handled, "reply", beat_no)
                    returned = handled
            following = max(returned, when + timing.interval_us + rng.randint(-timing.interval_us // 4, 0))
            if rng.random() < 0.04:  # frozen between beats
                following += rng.randint(0, 3 * failover)
            at(following, "send")
        elif kind == "apply":
            (beat,) = args
            snapshots[beat] = frozenset(world.requests)  # the reply is the item before this beat (ALL_OLD)
            world.requests -= replies[beat][1]
        elif kind == "reply":
            (beat,) = args
            sent, done = replies[beat]
            old.holder.heartbeat_succeeded(old_mono(sent), old_mono(when), declared_gone=False if certifying else None)
            old.done -= done
            pending = [element for element in snapshots[beat] if element not in done]
            if pending:
                already = old.holder.handoff_requested(KEY)
                old.done |= set(old.holder.handoff_requests(pending, old_mono(sent)))
                if not already and old.holder.handoff_requested(KEY) and not old.hangs:
                    at(when + rng.randint(0, timeout + failover), "complete")
        elif kind == "complete":
            if old.holder.is_valid(KEY):  # its consumer checkpoints, then lets go
                world.actor = "old"
                old.holder.complete_handoff(KEY)
                world.actor = "orphan"
        elif kind == "new":
            new_since = when
        if world.completed_at is not None and not new_notified:
            new_notified = True
            at(world.completed_at + extreme(rng, failover // 2), "new")
        if new_since is not None and old.holder.is_valid(KEY):
            problems.append(f"seed {seed}: old and new both valid at t={when} (new since {new_since})")
        if new_since is not None and not old.holder.held_keys():
            break  # old holds nothing any more: it can never consider the lease valid again
    return problems, world.completed_by


@pytest.mark.parametrize("certifying", [False, True], ids=["older-leader", "certifying-leader"])
def test_a_lease_in_graceful_handoff_never_has_two_valid_holders(
    caplog: pytest.LogCaptureFixture, certifying: bool
) -> None:
    caplog.set_level(logging.ERROR, logger="worker_lib")  # thousands of failed requests, each logged: not the subject
    # GIVEN 2 000 seeded schedules of a hand-off in worker mode: requests that fail or land, new terms, leader runs
    # a moment after the deadline; an old owner whose beats land, fail, lose or delay their replies, that freezes,
    # and whose consumer completes the hand-off or hangs
    problems: list[str] = []
    completed_by: dict[str, int] = {}
    for seed in range(SCHEDULES):
        # WHEN the hand-off is completed (by the old owner, as an orphan, or forced) and the new owner starts
        found, by = run_schedule(seed, certifying=certifying)
        problems += found
        completed_by[by] = completed_by.get(by, 0) + 1
    # THEN at no instant from the new owner's start on does the old owner consider the lease valid
    assert problems == []
    # AND every way of completing was exercised many times (an orphaned hand-off needs a lease dropped at a lapse,
    # which a certifying leader that declared nothing never causes)
    ways = ("leader", "old") if certifying else ("leader", "old", "orphan")
    assert all(completed_by.get(by, 0) > SCHEDULES // 20 for by in ways), completed_by
