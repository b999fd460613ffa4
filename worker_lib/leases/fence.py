"""Which of the worker's leases it may use now: the per-lease renewal clock and the worker-wide heartbeat fence.

Self-fencing: a lease is *valid* only until ``sent + failover − epsilon``, where ``sent`` is the monotonic time at
which the last successful conditional write was **sent**. Any other worker can take the lease only after the
leader has watched its counter stay unchanged for a full failover time, which starts no earlier than the moment
our write was applied, which is after we sent it. So a worker stops processing before anyone else may start,
without trusting wall clocks (docs/worker.md).

With a worker heartbeat (docs/failover.md) a second, worker-wide bound applies: every lease is valid only until
``last heartbeat sent + failover − epsilon`` as well. Once that moment passes the leases are *suspended*: nothing is
processed or checkpointed. The next beat's reply decides: if the leader declared this worker gone meanwhile (its
certificate ``hbg``, written before it moves anything) — or the reply cannot tell — every lease held is dropped as
lost; otherwise nothing can have moved, and the leases are valid again. A slow machine (late timers, replies lost
while the beats landed) so never costs a lease. :meth:`FencedLeases.heartbeat_succeeded` keeps it.

:class:`FencedLeases` holds the leases and judges them; :class:`~worker_lib.leases.renewer.LeaseHolder` extends it
with every write made to them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from worker_lib.core.clock import Clock
from worker_lib.core.models import Lease
from worker_lib.leases.config import LeaseConfig

log = logging.getLogger(__name__)

LostCallback = Callable[[str, str], None]  # (lease_key, reason)


@dataclass(kw_only=True)
class HeldLease:
    lease: Lease
    sent_at: float  # monotonic send time of the last successful conditional write
    lock: threading.Lock = field(default_factory=threading.Lock)
    lost: bool = False
    handoff_requested: bool = False  # the leader moved leaseOwner away; we are still checkpointOwner
    handoff_until: float | None = None  # worker mode: the leader may force the hand-off after this (monotonic)


class FencedLeases:
    """The leases this worker holds and whether each may be used now; losing one tells ``on_lost``."""

    def __init__(self, worker_id: str, *, config: LeaseConfig, clock: Clock, on_lost: LostCallback | None) -> None:
        self.worker_id = worker_id
        self._config = config
        self._clock = clock
        self._on_lost = on_lost
        self._held: dict[str, HeldLease] = {}
        self._heartbeat_until: float | None = None  # None: no heartbeat fence (heartbeats off or not yet sent)
        self._fence_before_reply: float | None = None  # the fence in force when the latest beat's reply came
        self._renewing = True  # False in worker liveness mode: the heartbeat fence alone bounds every lease
        self._guard = threading.Lock()
        self._verdict = threading.Condition()  # notified when a beat's reply (or a fence) decides suspended leases

    # --- bookkeeping ----------------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def validity_s(self) -> float:
        return (self._config.failover_time_ms - self._config.epsilon_ms) / 1000

    @property
    def epsilon_s(self) -> float:
        return self._config.epsilon_ms / 1000

    def held_keys(self) -> list[str]:
        with self._guard:
            return sorted(self._held)

    def _entry(self, lease_key: str) -> HeldLease | None:
        with self._guard:
            return self._held.get(lease_key)

    def lease(self, lease_key: str) -> Lease | None:
        entry = self._entry(lease_key)
        return entry.lease if entry is not None else None

    def handoff_requested(self, lease_key: str) -> bool:
        entry = self._entry(lease_key)
        return entry is not None and entry.handoff_requested

    def drop(self, lease_key: str) -> None:
        """Forget a lease without writing (after SHARD_END cleanup, or once a handoff completed)."""
        with self._guard:
            self._held.pop(lease_key, None)

    def _mark_lost(self, lease_key: str, reason: str) -> None:
        with self._guard:
            entry = self._held.pop(lease_key, None)
        if entry is None:
            return
        entry.lost = True
        self._report_lost([lease_key], reason)

    def _report_lost(self, keys: list[str], reason: str) -> None:
        for key in keys:
            log.info("lease lost lease=%s worker=%s reason=%s", key, self.worker_id, reason)
            if self._on_lost is not None:
                self._on_lost(key, reason)

    # --- validity -------------------------------------------------------------------------------------------

    def is_valid(self, lease_key: str) -> bool:
        """Whether this worker may still process the shard (not lost, renewed recently enough — in ``lease`` mode —,
        heartbeat fresh, and a requested hand-off not overdue)."""
        entry = self._entry(lease_key)
        if entry is None or entry.lost:
            return False
        now = self._clock.monotonic()
        fence = self._heartbeat_until
        if self._renewing and now >= entry.sent_at + self.validity_s:
            return False
        if entry.handoff_until is not None and now >= entry.handoff_until:
            return False
        if fence is None:
            return self._renewing  # without renewals only the heartbeat vouches for a lease
        return now < fence

    def suspended(self, lease_key: str) -> bool:
        """Held, and invalid only because the heartbeat fence ran out: nothing may be done with it until the next
        beat's reply says whether the leader declared this worker gone (the lease is then lost) or not (valid again)."""
        entry = self._entry(lease_key)
        if entry is None or entry.lost:
            return False
        now = self._clock.monotonic()
        fence = self._heartbeat_until
        if fence is None or now < fence or fence == -float("inf"):
            return False
        if self._renewing and now >= entry.sent_at + self.validity_s:
            return False
        return entry.handoff_until is None or now < entry.handoff_until

    @property
    def verdict_timeout_s(self) -> float:
        """How long a suspended lease waits for a verdict before it counts as lost: three failover times (a worker
        whose beats keep failing goes quiet after one, the leader declares it gone after another)."""
        return 3 * self._config.failover_time_ms / 1000

    def still_valid(self, lease_key: str, *, stop: threading.Event | None = None) -> bool:
        """:meth:`is_valid`, waiting for the verdict first if the lease is :meth:`suspended`."""
        if self.is_valid(lease_key):
            return True
        return self.await_verdict(lease_key, timeout_s=self.verdict_timeout_s, stop=stop)

    def await_verdict(self, lease_key: str, *, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """While the lease is :meth:`suspended`, wait for the next beat's verdict (at most ``timeout_s``, or until
        ``stop`` is set); then whether it is valid."""
        deadline = self._clock.monotonic() + timeout_s
        with self._verdict:
            while self.suspended(lease_key) and not (stop is not None and stop.is_set()):
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    break
                self._verdict.wait(min(left, 0.1))
        return self.is_valid(lease_key)

    @property
    def fenced(self) -> bool:
        """The heartbeat fence has run out: nothing is valid, and nothing should be taken, until a beat lands."""
        return self.fenced_for_s > 0

    @property
    def fenced_for_s(self) -> float:
        """How long ago the heartbeat fence ran out (0 while it holds, or before the first beat)."""
        fence = self._heartbeat_until
        return 0.0 if fence is None else max(0.0, self._clock.monotonic() - fence)

    # --- liveness mode (docs/liveness-modes.md) ---------------------------------------------------------------

    @property
    def renewing(self) -> bool:
        return self._renewing

    def set_renewing(self, renewing: bool) -> None:
        """Start (``lease`` mode) or stop (``worker`` mode) judging each lease by its own renewals.

        Stopping needs no care: the heartbeat fence keeps bounding every lease. When renewals start again, each
        lease's own clock starts now, before its first renewal: safe because during a switch back to ``lease`` the
        leader keeps judging this worker's leases by its heartbeat until it has seen every one of their counters
        move (:func:`~worker_lib.leases.mode.switched_to_lease_everywhere`), and the caller renews at once."""
        with self._guard:
            if renewing and not self._renewing:
                now = self._clock.monotonic()
                for entry in self._held.values():
                    entry.sent_at = max(entry.sent_at, now)
            self._renewing = renewing

    # --- the heartbeat fence (docs/failover.md) ---------------------------------------------------------------

    def heartbeat_succeeded(self, sent_at: float, replied_at: float, *, declared_gone: bool | None = None) -> bool:
        """A heartbeat sent at ``sent_at`` was acknowledged at ``replied_at`` (monotonic). It extends the fence to
        ``sent_at + validity``. If the previous fence had already run out when the reply came, the leader may have
        judged this worker dead: unless the reply shows it did not (``declared_gone`` False: no certificate since
        our last confirmed beat, and none can be written now that this beat landed), every lease held is dropped
        as lost first. Returns whether the fence had run out (the caller looks again at what the table says is
        ours: in ``worker`` mode the leader moves nothing from a worker whose beats kept landing)."""
        with self._guard:
            lapsed = self._heartbeat_until is not None and replied_at >= self._heartbeat_until
            dropped = self._drop_all_locked() if (lapsed and declared_gone is not False) or declared_gone else []
            self._fence_before_reply = self._heartbeat_until
            self._heartbeat_until = sent_at + self.validity_s
            kept = len(self._held)
        if lapsed and kept:
            log.info("heartbeat fence of %s ran out, the leader declared nothing: %d leases on", self.worker_id, kept)
        self._report_lost(dropped, "heartbeat lapsed and the leader declared this worker gone")
        self._decided()
        return lapsed

    def fence_all(self, reason: str) -> None:
        """Stop processing everything now (the worker is leaving): every lease is dropped as lost and nothing is
        valid until the next heartbeat."""
        with self._guard:
            dropped = self._drop_all_locked()
            self._heartbeat_until = -float("inf")
        self._report_lost(dropped, reason)
        self._decided()

    def _decided(self) -> None:
        with self._verdict:
            self._verdict.notify_all()

    def _drop_all_locked(self) -> list[str]:
        keys = list(self._held)
        for entry in self._held.values():
            entry.lost = True
        self._held.clear()
        return keys

    def _request_basis(self, sent_at: float) -> float:
        """When a hand-off request seen by the beat sent at ``sent_at`` may have been written, at the latest for our
        bound: the beat's send time — or, if that beat's reply came after the fence had run out (its leases kept:
        the leader declared nothing), the end of that fence. The request was not on the item when our last answered
        beat landed, and the leader forces it a timeout plus a failover time after writing it (rule 3 of
        docs/liveness-modes.md), so the bound must not grow with the time the replies were missing."""
        before = self._fence_before_reply
        return sent_at if before is None else min(sent_at, before)
