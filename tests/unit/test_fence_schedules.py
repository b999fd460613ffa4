"""The worker's heartbeat fence against the leader's judgement of silent workers, on thousands of seeded random
schedules on fake clocks (docs/failover.md, "Safety argument", rule 2; issue 36).

One worker id is served by a succession of processes (killed, departing gracefully, or running to the end), each
with its own :class:`LeaseHolder` holding one lease. Each process beats one beat at a time, as ``HeartbeatLoop``
does: a beat is sent, applied to the worker's item (``hbc`` + 1, ``hbt`` = the worker's wall clock in whole ms,
``wst``) within the network delay or never, and its reply is handled (``heartbeat_succeeded``) at once, late
(a slow reply, a process frozen between receiving and handling it) or never (a lost reply, a failed write). The
next beat is sent only after the previous one returned, and a process may freeze between beats. A leader observes
the item at random ticks with eventually consistent reads lagging by up to a bound, starts new terms at random (so
first sightings are dated by ``hbt`` + the skew bound, with the wall clocks of worker and leader apart by anything up
to that bound), and whenever a worker is *gone* it scans the leases and confirms with a consistent read
(:meth:`HeartbeatTracker.still_gone`) — the instant ``t2`` at which rule 2 lets it move the worker's leases.

Assumption of the model (and of the safety argument): a request is applied within the network delay of its sending
or never, so the beats of one worker id are applied in the order they were sent (a process restarted under the same
id starts after its predecessor's last request could land). Times are integer microseconds of true time; the
monotonic and wall clocks of each host are offsets of it (monotonic clocks run at the rate of true time).

These tests run today's fence semantics: ``heartbeat_succeeded(sent_at, replied_at)`` without the leader's
certificate (a lapsed fence drops every lease).
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import cast

from worker_lib.assignment.heartbeats import HeartbeatTracker
from worker_lib.core.clock import ManualClock
from worker_lib.core.models import Lease, WorkerHeartbeat, WorkerMetricStats, WorkerState
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.workermetrics.stats_store import heartbeat_stamp_ms

US = 1_000_000
WALL0_US = 1_700_000_000 * US


def _stamp_ms(wall_us: int) -> int:
    """``hbt`` as the sink writes it (:func:`heartbeat_stamp_ms`: rounded up to the ms), in whole µs arithmetic."""
    return -(-wall_us // 1000)


WORKER = "w"
KEY = "shardId-000000000000"
SCHEDULES = 1_000
HEALTHY_SCHEDULES = 1_000


# ----------------------------------------------------------------------------------------------- the model


class Renewals:
    """The one lease-store write a holder makes here: a take or renewal always lands (counter + 1)."""

    table_name = "leases"

    def renew_lease(self, lease: Lease, owner: str, *, throughput_kbps: float | None = None) -> Lease:
        return lease.with_(lease_owner=owner, lease_counter=lease.lease_counter + 1)


STORE = cast(LeaseStore, Renewals())


def move_to(clock: ManualClock, monotonic_s: float) -> None:
    """Set ``clock`` to exactly ``monotonic_s`` (the difference of two nearby floats is exact)."""
    clock.advance(monotonic_s - clock.monotonic())


@dataclass(frozen=True)
class Timing:
    failover_us: int
    epsilon_us: int
    skew_us: int  # the leader's bound on wall-clock disagreement (max_clock_skew)
    delay_us: int  # network delay bound: a request lands within it of its sending, a reply within it of landing
    lag_us: int  # eventually consistent reads show the item as it was up to this long ago
    tick_us: int  # the leader's mean tick interval
    worker_wall_us: int  # worker's wall clock minus true time
    leader_wall_us: int  # leader's wall clock minus true time: within skew_us of the worker's
    renewing: bool  # lease mode (renewals and the fence) or worker mode (the fence alone)

    @property
    def config(self) -> LeaseConfig:
        return LeaseConfig(failover_time_ms=self.failover_us // 1000, epsilon_ms=self.epsilon_us // 1000)


def random_timing(rng: random.Random) -> Timing:
    failover_us = rng.choice((1_000, 3_000, 10_000)) * 1000
    skew_us = rng.choice((0, 200_000, 1_000_000))
    worker_wall = rng.randint(-5 * US, 5 * US)
    # The extremes of the skew bound are where first sightings are tightest: hit them often.
    apart = rng.choice((-skew_us, skew_us, rng.randint(-skew_us, skew_us)))
    return Timing(
        failover_us=failover_us,
        epsilon_us=rng.choice((1_000, 25_000)),
        skew_us=skew_us,
        delay_us=rng.randint(1_000, failover_us // 8),
        lag_us=rng.randint(0, failover_us // 3),
        tick_us=rng.randint(failover_us // 12, failover_us // 3),
        worker_wall_us=worker_wall,
        leader_wall_us=worker_wall + apart,
        renewing=rng.random() < 0.5,
    )


@dataclass(frozen=True)
class Beat:
    process: int
    sent: int
    stamp_ms: int  # hbt: the worker's wall clock at sending, rounded up to the ms (heartbeat_stamp_ms)
    state: WorkerState
    applied: int | None  # None: never applied
    handled: int | None  # when heartbeat_succeeded runs; None: the reply never came (or came after an exit)


@dataclass
class Process:
    index: int
    start: int
    end: int  # killed, or gone after its departure, at this instant
    departs: bool  # fence_all at ``end``, then a STOPPED beat
    holder: LeaseHolder
    clock: ManualClock
    established: bool = False  # a reply was handled: the fence is in force
    must_lapse: bool = False  # the leader may have moved its leases: the next reply must drop them


@dataclass
class Row:
    """The worker-metrics item as beats left it: (applied at, counter, hbt ms, state) after each beat, in order."""

    applied: list[int] = field(default_factory=list)
    states: list[tuple[int, int, WorkerState]] = field(default_factory=list)

    def add(self, at: int, stamp_ms: int, state: WorkerState) -> None:
        counter = len(self.states) + 1
        assert not self.applied or at >= self.applied[-1], "beats are applied in order"
        self.applied.append(at)
        self.states.append((counter, stamp_ms, state))

    def at(self, when: int) -> WorkerMetricStats | None:
        """The item as a read at ``when`` sees it (every beat applied by then), or None before the first beat."""
        index = bisect_right(self.applied, when)
        if index == 0:
            return None
        counter, stamp_ms, state = self.states[index - 1]
        return WorkerMetricStats(
            worker_id=WORKER,
            last_update_epoch_s=stamp_ms // 1000,
            heartbeat=WorkerHeartbeat(counter=counter, wall_ms=stamp_ms, interval_ms=1_000, state=state),
        )


def extreme(rng: random.Random, most: int) -> int:
    """A value in [0, most]: either end of it half the time (where the properties are tightest), else uniform."""
    roll = rng.random()
    return 0 if roll < 0.25 else most if roll < 0.5 else rng.randint(0, most)


def worker_mono(timing: Timing, at: int) -> float:
    return (1_000 * US + at) / US


def beat_outcome(rng: random.Random, timing: Timing, sent: int) -> tuple[int | None, int | None, int]:
    """(applied, handled, returned): a beat lands and its reply is handled (sometimes late), lands with its reply
    lost, or fails; ``returned`` is when the next beat may be sent."""
    delay = timing.delay_us
    roll = rng.random()
    if roll < 0.72:
        applied = sent + extreme(rng, delay)
        handled = applied + extreme(rng, delay)
        if rng.random() < 0.08:  # a slow reply, or a process frozen before it handled the reply
            handled += rng.randint(0, 2 * timing.failover_us)
        return applied, handled, handled
    if roll < 0.86:
        applied = sent + rng.randint(0, delay)
        return applied, None, applied + rng.randint(0, 2 * delay)
    return None, None, sent + rng.randint(0, 2 * delay)


def worker_schedule(rng: random.Random, timing: Timing, horizon: int) -> tuple[list[Process], list[Beat], Row]:
    failover = timing.failover_us
    processes: list[Process] = []
    beats: list[Beat] = []
    row = Row()
    start = rng.randint(0, failover)
    while start < horizon:
        index = len(processes)
        end = start + rng.randint(failover // 2, 6 * failover)
        departs = rng.random() < 0.4
        clock = ManualClock(monotonic=worker_mono(timing, start))
        holder = LeaseHolder(STORE, WORKER, config=timing.config, clock=clock)
        holder.set_renewing(timing.renewing)
        processes.append(Process(index, start, end, departs, holder, clock))
        interval = rng.randint(failover // 12, failover // 3)
        departing_from = end - rng.randint(0, 3 * interval) if departs else end + 1
        sent = start
        while sent < min(end, horizon):
            applied, handled, returned = beat_outcome(rng, timing, sent)
            if handled is not None and handled >= end:
                handled = None  # the process exited (or was killed) before it handled the reply
            state = WorkerState.DEPARTING if sent >= departing_from else WorkerState.ACTIVE
            beats.append(Beat(index, sent, _stamp_ms(WALL0_US + timing.worker_wall_us + sent), state, applied, handled))
            sent = max(returned, sent + interval + rng.randint(-interval // 4, interval // 4))
            if rng.random() < 0.03:  # frozen (SIGSTOP, a GC pause, a throttled container)
                sent += rng.randint(0, 3 * failover)
        if departs and end < horizon:
            # The departure: every lease fenced first, then one STOPPED beat (it may land or not).
            applied, _, _ = beat_outcome(rng, timing, end)
            stamp = _stamp_ms(WALL0_US + timing.worker_wall_us + end)
            beats.append(Beat(index, end, stamp, WorkerState.STOPPED, applied, None))
        # A restart under the same id comes after the last request of this process could land.
        start = end + 2 * timing.delay_us + rng.randint(0, 3 * failover) if rng.random() < 0.7 else horizon
    for beat in sorted((b for b in beats if b.applied is not None), key=lambda b: (b.applied, b.sent)):
        assert beat.applied is not None
        row.add(beat.applied, beat.stamp_ms, beat.state)
    return processes, beats, row


def leader_moves(rng: random.Random, timing: Timing, row: Row, horizon: int) -> list[int]:
    """The instants ``t2`` at which the leader confirmed the worker gone (and so may move its leases)."""
    failover = timing.failover_us
    tracker = HeartbeatTracker(failover_s=failover / US, max_clock_skew_s=timing.skew_us / US)

    def mono(at: int) -> float:
        return (50 * US + at) / US

    def wall(at: int) -> float:
        return (WALL0_US + timing.leader_wall_us + at) / US

    moves: list[int] = []
    now = rng.randint(0, timing.tick_us)
    while now < horizon:
        if rng.random() < 0.04:  # a new term (a new leader, a new Lambda invocation): first sightings again
            tracker = HeartbeatTracker(failover_s=failover / US, max_clock_skew_s=timing.skew_us / US)
        seen = row.at(max(0, now - extreme(rng, timing.lag_us)))
        view = tracker.observe([seen] if seen is not None else [], mono(now), wall(now))
        if WORKER in view.gone:
            # The pass: scan the leases, then the consistent confirmation read, taken after the scan.
            confirmed_at = now + 1 if rng.random() < 0.3 else now + rng.randint(1, 2 * timing.delay_us)
            if tracker.still_gone(row.at(confirmed_at), mono(confirmed_at), wall(confirmed_at)):
                moves.append(confirmed_at)
            now = confirmed_at
        now = next_tick(rng, timing, tracker, now, mono(now))
    return moves


def next_tick(rng: random.Random, timing: Timing, tracker: HeartbeatTracker, now: int, now_mono: float) -> int:
    """The leader's next tick: after a random interval, or (adversarially) within 20 ms before to 1 ms after the
    moment the worker's silence, as the tracker dates it, exceeds the failover time."""
    silent_s = tracker.seconds_silent(WORKER, now_mono)
    if silent_s is not None and rng.random() < 0.5:
        due = now + round((timing.failover_us / US - silent_s) * US) + rng.randint(-20_000, 1_000)
        if due > now:
            return due
    return now + rng.randint(timing.tick_us // 2, timing.tick_us * 3 // 2)


@dataclass
class Outcome:
    moves: int = 0
    lapses: int = 0
    violations: list[str] = field(default_factory=list)


def run_schedule(seed: int) -> Outcome:
    """One schedule: the worker's processes against the leader's confirmations, in true-time order."""
    rng = random.Random(seed)
    timing = random_timing(rng)
    horizon = 8 * timing.failover_us
    processes, beats, row = worker_schedule(rng, timing, horizon)
    moves = leader_moves(rng, timing, row, horizon + 2 * timing.failover_us)
    outcome = Outcome(moves=len(moves))
    # (time, order, kind, index): at one instant a departure's fence comes first, the leader's check before a reply.
    events: list[tuple[int, int, str, int]] = [(t2, 1, "move", i) for i, t2 in enumerate(moves)]
    events += [(p.end, 0, "depart", p.index) for p in processes if p.departs]
    events += [(b.handled, 2, "reply", i) for i, b in enumerate(beats) if b.handled is not None]
    heapq.heapify(events)
    lease = Lease(lease_key=KEY, lease_owner=WORKER)
    while events:
        at, _, kind, index = heapq.heappop(events)
        if kind == "depart":
            process = processes[index]
            move_to(process.clock, worker_mono(timing, at))
            process.holder.fence_all("departing")
        elif kind == "move":
            for process in processes:
                if not process.start <= at < process.end:
                    continue
                move_to(process.clock, worker_mono(timing, at))
                if process.holder.is_valid(KEY):
                    outcome.violations.append(f"seed {seed}: process {process.index} valid at the move t2={at}")
                if not process.established and process.holder.held_keys():
                    outcome.violations.append(f"seed {seed}: process {process.index} holds a lease before a beat")
                process.must_lapse = process.established
        else:
            beat = beats[index]
            process = processes[beat.process]
            move_to(process.clock, worker_mono(timing, at))
            lapsed = process.holder.heartbeat_succeeded(worker_mono(timing, beat.sent), worker_mono(timing, at))
            outcome.lapses += lapsed
            if process.must_lapse and not lapsed:
                outcome.violations.append(f"seed {seed}: process {process.index} kept its leases at t={at}")
            process.must_lapse = False
            process.established = True
            if beat.state is WorkerState.ACTIVE and not process.holder.held_keys():
                process.holder.take(lease)
            elif timing.renewing:
                process.holder.renew_all()
    return outcome


# ----------------------------------------------------------------------------------------------- healthy workers


def healthy_beats(rng: random.Random, timing: Timing, horizon: int) -> list[tuple[int, int, int]]:
    """(sent, applied, handled) of a worker whose beats all land in time: the next beat lands less than the failover
    time less the read lag (and 1 ms of ``hbt`` truncation) after the previous one was sent, and its reply is handled
    before the fence of the previous one runs out."""
    budget = min(timing.failover_us - timing.lag_us - 1_001, timing.failover_us - timing.epsilon_us - 1)
    beats: list[tuple[int, int, int]] = []
    sent = rng.randint(0, timing.failover_us)
    latency = rng.randint(0, budget // 3)
    while sent < horizon:
        applied = sent + extreme(rng, latency)
        beats.append((sent, applied, sent + latency))
        following = rng.randint(0, budget // 3)
        longest = budget - following  # the next reply is handled by sent + budget
        gap = longest if rng.random() < 0.25 else rng.randint(latency, longest)
        sent, latency = sent + max(gap, 1), following
    return beats


def run_healthy_schedule(seed: int) -> list[str]:
    rng = random.Random(seed)
    timing = random_timing(rng)
    horizon = 8 * timing.failover_us
    beats = healthy_beats(rng, timing, horizon)
    row = Row()
    for sent, applied, _ in beats:
        row.add(applied, _stamp_ms(WALL0_US + timing.worker_wall_us + sent), WorkerState.ACTIVE)
    clock = ManualClock(monotonic=worker_mono(timing, 0))
    holder = LeaseHolder(STORE, WORKER, config=timing.config, clock=clock)
    holder.set_renewing(timing.renewing)
    failover_s, skew_s = timing.failover_us / US, timing.skew_us / US
    tracker = HeartbeatTracker(failover_s=failover_s, max_clock_skew_s=skew_s)
    problems: list[str] = []
    replies = [(handled, sent) for sent, _, handled in beats]
    next_reply = 0
    last_sight = False
    now = rng.randint(0, timing.tick_us)
    last = beats[-1][2]
    while now < last:
        while next_reply < len(replies) and replies[next_reply][0] <= now:
            handled, sent = replies[next_reply]
            move_to(clock, worker_mono(timing, handled))
            if holder.heartbeat_succeeded(worker_mono(timing, sent), worker_mono(timing, handled)):
                problems.append(f"seed {seed}: the fence lapsed at t={handled}")
            if not holder.held_keys():
                holder.take(Lease(lease_key=KEY, lease_owner=WORKER))
            elif timing.renewing:
                holder.renew_all()
            next_reply += 1
        move_to(clock, worker_mono(timing, now))
        if next_reply and not holder.is_valid(KEY):
            problems.append(f"seed {seed}: the lease is not valid at t={now}")
        if rng.random() < 0.04:
            tracker = HeartbeatTracker(failover_s=failover_s, max_clock_skew_s=skew_s)
        mono, wall = (50 * US + now) / US, (WALL0_US + timing.leader_wall_us + now) / US
        seen = row.at(max(0, now - (timing.lag_us if last_sight else extreme(rng, timing.lag_us))))
        gone = WORKER in tracker.observe([seen] if seen is not None else [], mono, wall).gone
        if gone or tracker.still_gone(row.at(now), mono, wall):
            problems.append(f"seed {seed}: judged gone at t={now}")
        # Adversarially, the next tick is sometimes the last instant a read lagging by the bound shows this value.
        landing = bisect_right(row.applied, now)
        last_sight = landing < len(row.applied) and rng.random() < 0.3
        if last_sight:
            now = max(now + 1, row.applied[landing] + timing.lag_us - 1)
        else:
            now = next_tick(rng, timing, tracker, now, mono)
    return problems


# ----------------------------------------------------------------------------------------------- the tests


def test_the_leader_moves_a_workers_leases_only_when_no_process_of_it_can_use_them_before_it_learns() -> None:
    # GIVEN 1 000 seeded schedules: processes of one worker id beating with landed, lost, late and failed beats,
    # freezes, kills, departures and restarts; a leader reading its item with lagging reads, new terms and clock skew
    total = Outcome()
    for seed in range(SCHEDULES):
        # WHEN the leader confirms the worker gone at t2 (rule 2: it may now move the worker's leases)
        outcome = run_schedule(seed)
        total.moves += outcome.moves
        total.lapses += outcome.lapses
        total.violations += outcome.violations
    # THEN at t2 no living process of the worker considers its lease valid, and each one that had beaten drops
    # every lease at its next reply (it never processes again under the sessions the leader may have moved)
    assert total.violations == []
    # AND the schedules exercised the rule: hundreds of moves and lapses
    assert total.moves > SCHEDULES // 2 and total.lapses > SCHEDULES // 2


def test_a_worker_whose_beats_all_land_in_time_is_never_judged_gone_and_never_loses_its_lease() -> None:
    # GIVEN 1 000 seeded schedules of a worker whose beats land less than the failover time less the read lag apart
    # and whose replies come before its fence runs out, watched by a leader with lagging reads, new terms and skew
    problems: list[str] = []
    for seed in range(HEALTHY_SCHEDULES):
        # WHEN the leader observes and confirms at every tick, and the worker handles every reply
        problems += run_healthy_schedule(10_000_000 + seed)
    # THEN it is never gone (neither in a tick's view nor by a consistent read), its fence never lapses, and its
    # lease stays valid from its first beat on
    assert problems == []


def test_a_first_sighting_never_moves_leases_before_the_fence_runs_out_even_with_epsilon_zero() -> None:
    """Seed 2059 of the schedules above run with ``epsilon_ms=0`` (a valid setting): were ``hbt`` the worker's wall
    clock truncated to whole ms, ``hbt + S`` could be up to 1 ms *before* the beat was sent, and docs/failover.md's
    first-sight case ("``hbt + S`` is no earlier than the real send time of beat k") would need ε ≥ 1 ms: a new leader
    could move the leases up to 1 ms before the worker stops using them. ``hbt`` is rounded up
    (:func:`heartbeat_stamp_ms`)."""
    # GIVEN ε = 0, wall clocks that agree (skew bound 0), and a worker whose one beat is sent and answered at once
    # at wall time …000.9 ms: its item says hbt = …001 ms
    config = LeaseConfig(failover_time_ms=3_000, epsilon_ms=0)
    worker_clock = ManualClock(monotonic=1_000.0, wall=1_700_000_000.0009)
    holder = LeaseHolder(STORE, WORKER, config=config, clock=worker_clock)
    holder.heartbeat_succeeded(worker_clock.monotonic(), worker_clock.monotonic())
    assert holder.take(Lease(lease_key=KEY, lease_owner=WORKER))
    item = WorkerMetricStats(
        worker_id=WORKER,
        last_update_epoch_s=1_700_000_000,
        heartbeat=WorkerHeartbeat(counter=1, wall_ms=heartbeat_stamp_ms(worker_clock.wall()), interval_ms=1_000),
    )
    # WHEN a new leader sees the item for the first time 2.9995 s later (its fence has 0.5 ms left) and confirms
    worker_clock.advance(2.9995)
    leader = HeartbeatTracker(failover_s=3.0, max_clock_skew_s=0.0)
    leader.observe([item], 50.0, worker_clock.wall())
    moved = leader.still_gone(item, 50.0, worker_clock.wall())
    # THEN it may move the worker's lease only if the worker no longer considers it valid
    assert not (moved and holder.is_valid(KEY)), "a new leader moves the lease 0.5 ms before the worker's fence ends"
