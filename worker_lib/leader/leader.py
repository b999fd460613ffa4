"""The leader loop: one implementation for every host (Lambda, embedded thread, CLI).

A cycle is: make sure we hold the lock (acquire or heartbeat), run a shard sync when its interval is due, run the
assignment step, and report. Failures are counted; after ``max_consecutive_failures`` failed cycles in a row the
leader releases the lock so that another host can try (KCL releases after 3). An unexpected error (a bug, not an
infrastructure failure) releases at once and propagates.

The loop never assumes it is still leader: every step re-checks :meth:`LeaderLock.is_leader`, which is a local,
conservative judgement (see docs/leader-lock.md), and every write the steps make is conditional anyway.

Between full cycles a leader with a :class:`FastTick` (docs/failover.md) ticks every ``fast_tick_ms``: one cheap
read of the workers' heartbeats, and an assignment pass at once when a worker left or went silent. A host with a
deadline (a Lambda invocation) announces when it will release the lock, and an invocation that finds the lock
about to be released (or to expire) waits for it instead of exiting, so consecutive invocations hand over with no
leaderless gap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig

if TYPE_CHECKING:
    from worker_lib.leader.assignment_report import AssignmentReport
    from worker_lib.leader.lock import LeaderLock
    from worker_lib.shardsync.syncer import ShardSyncResult

log = logging.getLogger(__name__)

OnCycle = Callable[["CycleReport"], None]
"""What a host does with each cycle's report (print it, log it, publish its metrics)."""

TAKEOVER_POLL_S = 0.5
"""How often an invocation waiting for the lock to be handed over re-reads it."""


class ShardSyncStep(Protocol):
    def sync_once(self) -> ShardSyncResult:
        """Run one shard sync and say what it did."""


class AssignmentStep(Protocol):
    def run(self, *, run_number: int) -> AssignmentReport:
        """Run one assignment pass and say what it did."""


class FastTick(Protocol):
    def tick(self, *, run_number: int) -> AssignmentReport | None:
        """One cheap read between full cycles; the fast pass's report if one ran, else None."""

    def note_full_cycle(self) -> None:
        """A full cycle just ran."""


@dataclass(frozen=True, kw_only=True)
class CycleReport:
    """What one cycle did. ``leader`` is False when this host did not hold the lock (nothing else ran).

    ``shard_sync`` is set when a shard sync ran in the cycle, ``assignment`` when an assignment pass ran (a fast
    pass between full cycles has ``fast`` set and no shard sync); :mod:`worker_lib.leader.cycle_metrics` turns a
    report into the metrics every host publishes.
    """

    cycle: int
    owner: str
    leader: bool
    current_leader: str | None = None
    foreign_leader: bool = False  # the lock is held in the lock client's own format: a KCL worker leads
    shard_sync: ShardSyncResult | None = None
    assignment: AssignmentReport | None = None
    error: str | None = None
    released: bool = False
    duration_ms: int = 0
    fast: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every field, the shard sync's and the assignment's results as dicts too."""
        return asdict(self)


@dataclass(kw_only=True)
class _State:
    cycle: int = 0
    leader_runs: int = 0
    consecutive_failures: int = 0
    last_sync_monotonic: float | None = None
    last_heartbeat_monotonic: float | None = None
    reports: list[CycleReport] = field(default_factory=list)


class Leader:
    """Drives the lock, shard sync and assignment. Not thread-safe: one loop per instance."""

    def __init__(
        self,
        *,
        lock: LeaderLock,
        shard_sync: ShardSyncStep | None,
        assignment: AssignmentStep | None = None,
        config: LeaderConfig | None = None,
        lock_config: LeaderLockConfig | None = None,
        shard_sync_interval_ms: int = 60_000,
        fast_tick: FastTick | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._lock = lock
        self._shard_sync = shard_sync
        self._assignment = assignment
        self._fast_tick = fast_tick
        self._takeover_waited_s = 0.0
        self._takeover_wait_started = 0.0
        self._config = config or LeaderConfig()
        self._lock_config = lock_config or LeaderLockConfig()
        self._sync_interval_s = shard_sync_interval_ms / 1000
        self._clock = clock
        self._state = _State()

    @property
    def owner(self) -> str:
        return self._lock.owner

    # --- one cycle ------------------------------------------------------------------------------------------

    def _ensure_leadership(self) -> bool:
        now = self._clock.monotonic()
        if self._lock.is_leader():
            heartbeat_due = (
                self._state.last_heartbeat_monotonic is None
                or now - self._state.last_heartbeat_monotonic >= self._lock_config.heartbeat_interval_ms / 1000
            )
            if not heartbeat_due:
                return True
            if self._lock.heartbeat():
                self._state.last_heartbeat_monotonic = now
                return True
            log.warning("leader lock lost at heartbeat owner=%s", self.owner)
            return False
        if self._lock.try_acquire():
            self._state.last_heartbeat_monotonic = now
            self._state.last_sync_monotonic = None  # a new term starts with a shard sync
            self._state.leader_runs = 0
            return True
        return False

    def run_cycle(self) -> CycleReport:
        """One cycle. Infrastructure failures are caught and counted; bugs release the lock and propagate."""
        state = self._state
        state.cycle += 1
        started = self._clock.monotonic()
        try:
            if not self._ensure_leadership():
                # The holder as the acquire attempt just read it: no second read per poll (one read only when that
                # attempt saw no holder and lost a race for the free lock).
                holder = self._lock.last_seen_holder() or self._lock.current_leader()
                foreign = holder is not None and self._lock.holder_is_foreign()
                return self._report(started, leader=False, current_leader=holder, foreign_leader=foreign)
            shard_sync_result = None
            if self._shard_sync is not None and self._sync_due():
                shard_sync_result = self._shard_sync.sync_once()
                state.last_sync_monotonic = self._clock.monotonic()
            assignment_result = None
            if self._assignment is not None and self._lock.is_leader():
                state.leader_runs += 1
                assignment_result = self._assignment.run(run_number=state.leader_runs)
                if self._fast_tick is not None:
                    self._fast_tick.note_full_cycle()
        except DependencyError as exc:
            state.consecutive_failures += 1
            log.warning("leader cycle failed (%d in a row) owner=%s: %s", state.consecutive_failures, self.owner, exc)
            released = False
            if state.consecutive_failures >= self._config.max_consecutive_failures:
                released = self._release_quietly(reason=f"{state.consecutive_failures} consecutive failed cycles")
                state.consecutive_failures = 0
            return self._report(started, leader=True, error=str(exc), released=released)
        except Exception:
            self._release_quietly(reason="unexpected error")
            raise
        state.consecutive_failures = 0
        return self._report(
            started, leader=True, current_leader=self.owner, shard_sync=shard_sync_result, assignment=assignment_result
        )

    def _sync_due(self) -> bool:
        last = self._state.last_sync_monotonic
        return last is None or self._clock.monotonic() - last >= self._sync_interval_s

    def _report(self, started: float, **fields: Any) -> CycleReport:
        duration_ms = int((self._clock.monotonic() - started) * 1000)
        report = CycleReport(cycle=self._state.cycle, owner=self.owner, duration_ms=duration_ms, **fields)
        self._state.reports.append(report)
        del self._state.reports[:-10]  # keep a short history for status and tests
        return report

    def _release_quietly(self, *, reason: str) -> bool:
        try:
            released = self._lock.release()
        except DependencyError as exc:
            log.warning("could not release the leader lock owner=%s (%s): %s", self.owner, reason, exc)
            return False
        level = logging.INFO if reason in {"loop finished", "single cycle done"} else logging.WARNING
        log.log(level, "leadership released owner=%s reason=%s released=%s", self.owner, reason, released)
        return released

    # --- loops ----------------------------------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        deadline_monotonic: float | None = None,
        max_cycles: int | None = None,
        on_cycle: OnCycle | None = None,
        exit_when_held: bool = False,
    ) -> list[CycleReport]:
        """Run cycles until ``stop`` is set, the host's deadline approaches, or ``max_cycles`` ran; then release.

        Between cycles the holder heartbeats the lock on time (and ticks the fast path); a non-holder retries the
        lock every poll interval, so a dead leader is replaced within its lease duration plus one poll. With
        ``exit_when_held`` (a Lambda invocation) a non-holder stops after one read — unless the holder will
        release the lock, or its lock will expire, within ``takeover_wait_ms`` and the deadline: then it waits,
        polling twice a second, and takes over at once.
        """
        reports: list[CycleReport] = []
        cycle_s = self._config.cycle_interval_ms / 1000
        margin_s = self._config.deadline_margin_ms / 1000
        if deadline_monotonic is not None:
            release_at_s = self._clock.wall() + (deadline_monotonic - margin_s - self._clock.monotonic())
            self._lock.plan_release(int(release_at_s * 1000))
        waiting_until: float | None = None
        try:
            while not (stop is not None and stop.is_set()):
                if deadline_monotonic is not None and self._clock.monotonic() >= deadline_monotonic - margin_s:
                    break
                report = self.run_cycle()
                reports.append(report)
                if on_cycle is not None:
                    on_cycle(report)
                if max_cycles is not None and len(reports) >= max_cycles:
                    break
                wait_s = cycle_s if report.leader else self._lock_config.poll_interval_ms / 1000
                if report.leader:
                    waiting_until = None
                elif exit_when_held:
                    waiting_until = self._takeover_wait(waiting_until, deadline_monotonic)
                    if waiting_until is None:
                        break
                    wait_s = TAKEOVER_POLL_S
                self._wait(wait_s, stop=stop, deadline_monotonic=deadline_monotonic, on_cycle=on_cycle)
        finally:
            if self._lock.is_leader() or self._state.last_heartbeat_monotonic is not None:
                self._release_quietly(reason="loop finished")
                self._state.last_heartbeat_monotonic = None
        return reports

    def _takeover_wait(self, waiting_until: float | None, deadline_monotonic: float | None) -> float | None:
        """For a host that exits when the lock is held: until when to keep polling for it (None: exit now)."""
        now = self._clock.monotonic()
        if waiting_until is not None and now < waiting_until:
            return waiting_until
        if waiting_until is not None:
            # The release we waited for did not come (the holder died just before it): the lock's own expiry may
            # still be within our budget — look again rather than leave the application without a leader.
            self._takeover_waited_s += now - self._takeover_wait_started
        else:
            self._takeover_waited_s = 0.0
        self._takeover_wait_started = now
        budget_s = self._config.takeover_wait_ms / 1000 - self._takeover_waited_s
        if deadline_monotonic is not None:
            # Wait only if we would then lead at least as long as we waited: a duplicate delivery that started
            # with the holder has nothing to gain and exits after one read.
            budget_s = min(budget_s, (deadline_monotonic - self._config.deadline_margin_ms / 1000 - now) / 2)
        if budget_s <= 0:
            return None
        try:
            eta_s = self._lock.takeover_eta_s()
        except DependencyError as exc:
            log.warning("could not read the leader lock owner=%s: %s", self.owner, exc)
            return None
        if eta_s is None or eta_s > budget_s:
            return None
        log.info("leader lock held; taking over in about %.1f s owner=%s", eta_s, self.owner)
        return now + min(budget_s, eta_s + 2 * self._lock_config.poll_interval_ms / 1000)

    def _wait(
        self,
        seconds: float,
        *,
        stop: threading.Event | None,
        deadline_monotonic: float | None,
        on_cycle: OnCycle | None = None,
    ) -> None:
        """Sleep ``seconds`` in slices, heartbeating when due and ticking the fast path, returning early on stop or
        deadline."""
        end = self._clock.monotonic() + seconds
        heartbeat_s = self._lock_config.heartbeat_interval_ms / 1000
        tick_s = self._config.fast_tick_ms / 1000
        next_tick = self._clock.monotonic() + tick_s
        while True:
            now = self._clock.monotonic()
            if now >= end or (stop is not None and stop.is_set()):
                return
            if deadline_monotonic is not None and now >= deadline_monotonic - self._config.deadline_margin_ms / 1000:
                return
            last = self._state.last_heartbeat_monotonic
            if self._lock.is_leader() and last is not None and now - last >= heartbeat_s:
                try:
                    if self._lock.heartbeat():
                        self._state.last_heartbeat_monotonic = now
                    else:
                        log.warning("leader lock lost at heartbeat owner=%s", self.owner)
                        self._state.last_heartbeat_monotonic = None
                except DependencyError as exc:
                    log.warning("leader heartbeat failed owner=%s: %s", self.owner, exc)
            # After the heartbeat: a tick waits for its read at most half a heartbeat interval (FastPath).
            if self._fast_tick is not None and tick_s > 0 and self._clock.monotonic() >= next_tick:
                next_tick = self._clock.monotonic() + tick_s
                self._tick(on_cycle)
            pause = min(0.25, end - now)
            if self._fast_tick is not None and tick_s > 0:
                pause = min(pause, max(0.0, next_tick - self._clock.monotonic()))
            self._clock.sleep(pause)

    def _tick(self, on_cycle: OnCycle | None) -> None:
        """One fast-path tick, only while leading and after this term's first full cycle."""
        if self._fast_tick is None or self._state.leader_runs < 1 or not self._lock.is_leader():
            return
        started = self._clock.monotonic()
        try:
            result = self._fast_tick.tick(run_number=self._state.leader_runs)
        except DependencyError as exc:
            log.warning("fast path tick failed owner=%s: %s", self.owner, exc)
            return
        if result is None:
            return
        self._state.cycle += 1
        report = self._report(started, leader=True, current_leader=self.owner, assignment=result, fast=True)
        if on_cycle is not None:
            on_cycle(report)

    def run_once(self) -> CycleReport:
        """Acquire (or fail to), run one full cycle, release: ``shardlease leader --once``."""
        try:
            return self.run_cycle()
        finally:
            if self._state.last_heartbeat_monotonic is not None:
                self._release_quietly(reason="single cycle done")
                self._state.last_heartbeat_monotonic = None
