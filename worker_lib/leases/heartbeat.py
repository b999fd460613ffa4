"""The worker heartbeat: one small write per worker per interval that tells the leader "alive", "leaving" or
"gone", and brings back the leader's notice of newly assigned leases (docs/failover.md).

Each beat is one UpdateItem on the worker's own ``<app>-WorkerMetricStats`` item (``hbc`` + 1, ``hbt``, ``hbi``,
``wst``, ``evc``, and REMOVE ``asl``) that returns the item as it was before, so the worker learns of new leases
(``asv``/``asl``, written by the leader) from a write it makes anyway, and consumes the key list in the same atomic
step — no read per second, and no race with a notice written in between.

The heartbeat is also a fence. The leader may move the leases of a worker whose heartbeat it has watched stand
still for the failover time (without waiting for each lease's own counter), so a worker must stop processing
*every* lease once its heartbeat is older than that: :class:`~worker_lib.leases.renewer.LeaseHolder` treats a
lease as valid only while ``now < last beat's send time + failover − ε``, and a beat whose reply comes back after
that moment does not revive anything — every lease held then is dropped as lost (the leader may have judged us
dead in between). A worker that announces ``STOPPED`` fences itself first.

Each process beats with a session of its own (``hbs``: start time, then a random suffix), and each reply shows the
session of the beat before. Two processes under one worker id — a restarted Spark query whose old source runner is
still leaving, a worker restarted with a fixed id before the old process ended — would otherwise take the same
leases from each other in turn (each sees leases owned by its id that it does not hold). The newer process wins,
"newer" by what the row shows rather than by clocks: the session a process's first beat finds on the row is its
predecessor; a process that later finds any *other* session there has a successor, and so fences itself, stops
beating and takes nothing more. The newer one, when its first beat shows a predecessor beating lately, takes
nothing until that one has beaten once more (and so stood down).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Collection
from typing import Protocol

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import WorkerMetricStats, WorkerState

log = logging.getLogger(__name__)

NoticeCallback = Callable[[tuple[str, ...] | None], None]
"""Called with the lease keys the leader announced (``None``: announced without keys — query the index)."""


class HeartbeatSink(Protocol):
    def heartbeat(
        self,
        worker_id: str,
        *,
        interval_ms: int,
        state: WorkerState,
        events: int,
        done_requests: Collection[str] = (),
        liveness: str | None = None,
        session: str | None = None,
    ) -> WorkerMetricStats | None: ...


class HeartbeatFence(Protocol):
    def heartbeat_succeeded(self, sent_at: float, replied_at: float, *, declared_gone: bool | None = None) -> bool:
        """Extend the fence; True if leases were dropped: it had run out before this reply and the leader declared
        this worker gone meanwhile (``declared_gone``; ``None``: the reply cannot tell, so assume it did)."""

    def fence_all(self, reason: str) -> None:
        """Stop processing everything now; nothing is valid until the next beat lands."""

    @property
    def fenced_for_s(self) -> float:
        """How long ago the fence ran out (0 while it holds): nothing is valid until a beat lands."""

    def handoff_requests(self, elements: Collection[str], sent_at: float) -> Collection[str]:
        """The leader's hand-off requests on our item (``worker`` liveness mode), seen by a beat sent at
        ``sent_at``; returns the elements we are done with (removed by the next beat)."""


def new_session(clock: Clock) -> str:
    """A process's heartbeat session: its start time (ms, for people reading the table) and a random suffix."""
    return f"{int(clock.wall() * 1000):015d}-{secrets.token_hex(4)}"


class HeartbeatLoop:
    """Beats every ``interval_ms`` on a daemon thread once :meth:`start` ran; :meth:`announce` and
    :meth:`note_event` beat at once (from the caller's thread)."""

    def __init__(
        self,
        sink: HeartbeatSink,
        worker_id: str,
        *,
        interval_ms: int,
        fence: HeartbeatFence,
        on_notice: NoticeCallback,
        quiet_after_lapse_ms: int = 0,
        on_superseded: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if interval_ms <= 0:
            raise ValueError("interval_ms must be positive")
        self._sink = sink
        self.worker_id = worker_id
        self._interval_s = interval_ms / 1000
        self._interval_ms = interval_ms
        self._fence = fence
        self._on_notice = on_notice
        self._clock = clock
        self._beat_lock = threading.Lock()
        # The event counter has a lock of its own: note_event may be called from inside a beat (a hand-off completed
        # while handling the reply's requests releases a lease, and a release notes an event).
        self._events_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen_version: int | None = None
        self._done_requests: set[str] = set()
        self._failing = False
        self._quiet_after_lapse_s = quiet_after_lapse_ms / 1000
        self._quiet_until: float | None = None
        self._on_superseded = on_superseded
        self.session = new_session(clock)
        self._predecessor: str | None = None
        self._predecessor_until: float | None = None
        self._confirmed_counter: int | None = None  # ``hbc`` after our last beat whose reply came back
        self.superseded = threading.Event()
        """Set once a newer process under our worker id beat: we hold nothing and beat no more."""
        self.state = WorkerState.ACTIVE
        self.events = 0
        self.liveness: str | None = None
        """The liveness mode this worker runs in, written with every beat (``lvm``): the leader completes a switch
        back to ``lease`` only once every worker says it renews (docs/liveness-modes.md)."""
        self.established = threading.Event()
        """Set after the first successful beat: leases are taken only from then on (the fence is in force)."""
        self.beats = 0
        self.failures = 0
        self.notices_seen = False
        """True once a reply carried a notice version: the leader sends notices (the GSI query can slow down)."""

    # --- one beat ---------------------------------------------------------------------------------------------

    @property
    def interval_ms(self) -> int:
        return self._interval_ms

    def set_interval_ms(self, interval_ms: int) -> None:
        """Beat at another interval from the next beat on (the liveness mode changed)."""
        if interval_ms <= 0:
            raise ValueError("interval_ms must be positive")
        if interval_ms != self._interval_ms:
            log.info("heartbeat of %s now every %d ms", self.worker_id, interval_ms)
        self._interval_ms = interval_ms
        self._interval_s = interval_ms / 1000

    def beat(self) -> bool:
        """Write one heartbeat; True on success. Infrastructure failures are logged (once per run of failures)."""
        with self._beat_lock:
            if self.superseded.is_set():
                return False
            sent = self._clock.monotonic()
            done = frozenset(self._done_requests)
            try:
                row = self._sink.heartbeat(
                    self.worker_id,
                    interval_ms=self._interval_ms,
                    state=self.state,
                    events=self._events(),
                    done_requests=done,
                    liveness=self.liveness,
                    session=self.session,
                )
            except DependencyError as exc:
                self.failures += 1
                if not self._failing:
                    log.warning("heartbeat of %s failed (the fence keeps counting down): %s", self.worker_id, exc)
                self._failing = True
                self._go_quiet_if_lapsed()
                return False
            lapsed = self._fence.heartbeat_succeeded(
                sent, self._clock.monotonic(), declared_gone=self._declared_gone(row)
            )
            if self._failing:
                log.info("heartbeat of %s succeeded again", self.worker_id)
            self._failing = False
            self.beats += 1
            other = row.heartbeat if row is not None else None
            if other is not None and other.session is not None and other.session != self.session:
                if self.beats == 1:
                    self._predecessor = other.session
                    if other.state is not WorkerState.STOPPED:
                        self._await_predecessor(other.interval_ms, other.wall_ms, sent)
                elif other.session != self._predecessor:
                    self._stand_down(other.session)
                    return False
            if self._predecessor_until is None or sent >= self._predecessor_until:
                self.established.set()
            self._done_requests -= done
            if lapsed:
                # What was dropped while fenced may still be ours in the table (in worker mode the leader moves
                # nothing from a worker whose beats kept landing, e.g. when only their replies were lost): look now.
                self._notify(None)
            if row is not None:
                self._notice(row)
                # The reply is the item *before* this beat: what we removed in it is still listed there.
                requests = [element for element in row.handoff_requests if element not in done]
                # Not yet established (a predecessor under our id may still hold leases): the requests stay on the
                # item and the next beat brings them back.
                if requests and self.established.is_set():
                    self._requests(requests, sent)
            elif self._seen_version is None:
                self._seen_version = 0  # the item did not exist before this beat: no notice yet
            return True

    def _declared_gone(self, row: WorkerMetricStats | None) -> bool | None:
        """Whether the leader declared us gone since our last confirmed beat, from the item as it was before this
        beat (``hbg``, written by the leader before it moves anything, conditionally on the counter it saw stand
        still: docs/failover.md). ``None`` when the reply cannot tell: no item, no earlier confirmed beat, or a
        leader that writes no certificates."""
        beat = row.heartbeat if row is not None else None
        confirmed = self._confirmed_counter
        self._confirmed_counter = beat.counter + 1 if beat is not None else None
        if beat is None or confirmed is None or beat.gone_counter is None:
            return None
        return beat.gone_counter >= confirmed

    def _await_predecessor(self, interval_ms: int, wall_ms: int, sent: float) -> None:
        """An older process under our worker id beat lately: take nothing until it has beaten again (and so seen
        us and stood down). One that has not beaten for three of its intervals is stalled or gone: should it come
        back, its fence has run out and its next beat — before it may take anything — shows it our session."""
        age_s = self._clock.wall() - wall_ms / 1000
        if age_s > 3 * interval_ms / 1000:
            return
        self._predecessor_until = sent + 2 * interval_ms / 1000 + 0.5
        log.info(
            "worker id %s: an older process beat %.1f s ago; taking leases once it has stood down",
            self.worker_id,
            max(0.0, age_s),
        )

    def _stand_down(self, newer: str) -> None:
        self.superseded.set()
        self.established.clear()
        self._stop.set()
        self._fence.fence_all("a newer process runs under this worker id")
        log.error(
            "worker id %s is used by a newer process (session %s, ours %s): this one holds nothing from now on and "
            "stops beating",
            self.worker_id,
            newer,
            self.session,
        )
        if self._on_superseded is not None:
            try:
                self._on_superseded()
            except Exception:
                log.exception("standing down %s failed", self.worker_id)

    def _notice(self, row: WorkerMetricStats) -> None:
        version = row.assignment_version
        self.notices_seen = self.notices_seen or version > 0
        previous, self._seen_version = self._seen_version, version
        if previous is None or version == previous:
            return  # the first beat only learns the version: the worker's start-up discovery covers the rest
        keys = row.assigned_keys if version == previous + 1 and row.assigned_keys else None
        self._notify(keys)

    def _notify(self, keys: tuple[str, ...] | None) -> None:
        try:
            self._on_notice(keys)
        except Exception:
            log.exception("handling the assignment notice for %s failed", self.worker_id)

    def _go_quiet_if_lapsed(self) -> None:
        """In ``worker`` mode, once the fence has run out under failing beats, stop beating for a while.

        Beats can land while their replies never come back (a timeout after the write was applied): the leader
        then sees a live worker and moves nothing, while the worker, fenced, processes nothing — its shards would
        wait for as long as that lasts. In ``lease`` mode its leases expire by counter; in ``worker`` mode only
        silence does it: after ``quiet_after_lapse_ms`` (longer than the failover time) without a beat the leader
        judges the worker gone and moves its leases. A worker whose beats do not land at all loses nothing by it.
        Only a lapse that lasts (fenced for longer than two beats less than the quiet time, i.e. the failover time)
        does it: a short one — a slow moment — is followed by a look at what is still ours and nothing moves."""
        if self._quiet_after_lapse_s <= 0 or self.liveness != "worker" or self._quiet_until is not None:
            return
        if self._fence.fenced_for_s >= self._quiet_after_lapse_s - 2 * self._interval_s:
            self._quiet_until = self._clock.monotonic() + self._quiet_after_lapse_s
            log.warning(
                "heartbeat of %s: fenced after failing beats; silent for %.0f s so that the leader moves its leases",
                self.worker_id,
                self._quiet_after_lapse_s,
            )

    def _requests(self, elements: list[str], sent: float) -> None:
        try:
            self._done_requests.update(self._fence.handoff_requests(elements, sent))
        except Exception:
            log.exception("handling the hand-off requests for %s failed", self.worker_id)

    # --- state changes ------------------------------------------------------------------------------------------

    def announce(self, state: WorkerState) -> bool:
        """Say ``state`` now (one beat from this thread); later beats repeat it."""
        self.state = state
        log.info("worker %s announces %s", self.worker_id, state.value)
        return self.beat()

    def _events(self) -> int:
        with self._events_lock:
            return self.events

    def note_event(self) -> None:
        """Something the leader should look at soon (a lease given up, child leases created): bump ``evc`` and
        beat at the next opportunity (the beat thread is woken; no I/O in the caller's thread)."""
        with self._events_lock:
            self.events += 1
        self._wake.set()

    # --- thread -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("heartbeat already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.worker_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock.monotonic()
            if self._quiet_until is not None:
                if started < self._quiet_until:
                    self._stop.wait(min(self._quiet_until - started, self._interval_s))
                    continue
                self._quiet_until = None
            try:
                self.beat()
            except Exception:
                log.exception("heartbeat of %s raised; continuing", self.worker_id)
            remaining = self._interval_s - (self._clock.monotonic() - started)
            if remaining > 0 and self._wake.wait(remaining):
                self._wake.clear()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
