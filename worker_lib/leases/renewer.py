"""The worker's side of its leases: renewal, self-fencing, fenced checkpoints, handoff and eviction.

Every write a worker makes to one lease goes through :class:`LeaseHolder` under that lease's lock, so renewals
and checkpoints (which both move ``leaseCounter``) never race each other into a spurious "lease lost" — the same
reason KCL synchronises on its authoritative lease copy.

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
while the beats landed) so never costs a lease. :meth:`LeaseHolder.heartbeat_succeeded` keeps it.

In ``worker`` liveness mode (docs/liveness-modes.md) nothing is renewed (:attr:`LeaseHolder.renewing` is off): the
heartbeat fence alone bounds every lease, the leader asks for graceful hand-offs through the worker's own item
(:meth:`LeaseHolder.handoff_requests`, which also bounds the old owner by the hand-off timeout), and throughput is
written only when it changed (:meth:`LeaseHolder.refresh_throughput`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Checkpoint, Lease, ShardBlock
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.mode import parse_handoff_request
from worker_lib.leases.store import LeaseStore

log = logging.getLogger(__name__)

LostCallback = Callable[[str, str], None]  # (lease_key, reason)
ReleaseCallback = Callable[[str, str | None], None]  # (lease_key, new owner after a handoff; None = given up)
ThroughputSource = Callable[[str], float | None]  # lease_key -> KBps to write with the renewal


@dataclass(kw_only=True)
class HeldLease:
    lease: Lease
    sent_at: float  # monotonic send time of the last successful conditional write
    lock: threading.Lock = field(default_factory=threading.Lock)
    lost: bool = False
    handoff_requested: bool = False  # the leader moved leaseOwner away; we are still checkpointOwner
    handoff_until: float | None = None  # worker mode: the leader may force the hand-off after this (monotonic)


@dataclass(frozen=True, kw_only=True)
class RenewalReport:
    renewed: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # infrastructure errors; the lease stays held until it times out
    handoffs: tuple[str, ...] = ()


class LeaseHolder:
    """The set of leases this worker holds, and every conditional write it makes to them."""

    def __init__(
        self,
        store: LeaseStore,
        worker_id: str,
        *,
        config: LeaseConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        throughput: ThroughputSource | None = None,
        on_lost: LostCallback | None = None,
        on_release: ReleaseCallback | None = None,
        in_use: Callable[[str], bool] | None = None,
        max_parallel_renewals: int = 16,
    ) -> None:
        self._store = store
        self.worker_id = worker_id
        self._config = config or LeaseConfig()
        self._clock = clock
        self._throughput = throughput
        self._on_lost = on_lost
        self.on_release = on_release
        # Whether something of ours still works on a lease we no longer hold (a consumer winding down): an orphaned
        # hand-off of that lease waits for it (handoff_requests).
        self._in_use = in_use
        self._held: dict[str, HeldLease] = {}
        self._heartbeat_until: float | None = None  # None: no heartbeat fence (heartbeats off or not yet sent)
        self._fence_before_reply: float | None = None  # the fence in force when the latest beat's reply came
        self._renewing = True  # False in worker liveness mode: the heartbeat fence alone bounds every lease
        self._requests_seen: set[str] = set()
        self._guard = threading.Lock()
        self._verdict = threading.Condition()  # notified when a beat's reply (or a fence) decides suspended leases
        self._max_parallel = max(1, max_parallel_renewals)
        self._pool: ThreadPoolExecutor | None = None

    # --- bookkeeping ----------------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def validity_s(self) -> float:
        return (self._config.failover_time_ms - self._config.epsilon_ms) / 1000

    def held_keys(self) -> list[str]:
        with self._guard:
            return sorted(self._held)

    def _entry(self, lease_key: str) -> HeldLease | None:
        with self._guard:
            return self._held.get(lease_key)

    def lease(self, lease_key: str) -> Lease | None:
        entry = self._entry(lease_key)
        return entry.lease if entry is not None else None

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

    def handoff_requests(self, elements: Collection[str], sent_at: float) -> set[str]:
        """The leader's graceful hand-off requests (``worker`` mode), seen on our item by a heartbeat sent at
        ``sent_at``. For each lease we hold that is now being handed over (``checkpointOwner`` = us), the consumer
        is told as a renewal would tell it, and the lease stays valid at most until ``sent_at`` + the request's
        timeout: the leader forces the hand-off only after the timeout *plus* the failover time from its request
        (docs/liveness-modes.md).

        A request for a lease that names us as ``checkpointOwner`` but that this process does not hold — dropped
        after a lapse of the fence, or held by an earlier process under our worker id that was killed — is an
        *orphaned* hand-off: nobody would ever complete it, and the leader would force it only after the hand-off
        timeout (30 s) because our worker id keeps beating. It is completed at once, from the last checkpoint, as
        soon as nothing of ours works on that lease any more (``in_use``). The caller asks only once this process
        may act for the worker id (its heartbeat is established: a predecessor has stood down).

        Returns the elements we are done with (handed over, stale or foreign)."""
        done: set[str] = set()
        for element in elements:
            parsed = parse_handoff_request(element)
            if parsed is None:
                done.add(element)
                continue
            lease_key, timeout_ms = parsed
            entry = self._entry(lease_key)
            if entry is None or entry.lost:
                if self._complete_orphaned_handoff(lease_key):
                    done.add(element)
                continue
            if element in self._requests_seen:
                continue
            try:
                current = self._store.get_lease(lease_key)
            except DependencyError as exc:
                log.warning("could not read lease=%s for a hand-off request: %s", lease_key, exc)
                continue  # the request stays on our item: the next beat brings it back
            outcome = self._apply_request(
                entry, current, until=self._request_basis(sent_at) + timeout_ms / 1000 - self.epsilon_s
            )
            if outcome == "lost":
                self._mark_lost(lease_key, "taken over while a hand-off was requested")
            if outcome in ("lost", "stale"):
                done.add(element)
            elif outcome == "handoff":
                self._requests_seen.add(element)
        self._requests_seen &= set(elements)
        return done

    def _request_basis(self, sent_at: float) -> float:
        """When a hand-off request seen by the beat sent at ``sent_at`` may have been written, at the latest for our
        bound: the beat's send time — or, if that beat's reply came after the fence had run out (its leases kept:
        the leader declared nothing), the end of that fence. The request was not on the item when our last answered
        beat landed, and the leader forces it a timeout plus a failover time after writing it (rule 3 of
        docs/liveness-modes.md), so the bound must not grow with the time the replies were missing."""
        before = self._fence_before_reply
        return sent_at if before is None else min(sent_at, before)

    def _complete_orphaned_handoff(self, lease_key: str) -> bool:
        """Complete the hand-off of a lease we do not hold but are named ``checkpointOwner`` of (see
        :meth:`handoff_requests`); True when the request needs nothing more from us."""
        if self._in_use is not None and self._in_use(lease_key):
            return False  # our consumer is still winding down: the request stays, the next beat asks again
        try:
            current = self._store.get_lease(lease_key)
            if current is None or current.checkpoint_owner != self.worker_id or current.lease_owner is None:
                return True  # handed over, forced or cancelled meanwhile: nothing of ours
            with self._guard:
                if lease_key in self._held:
                    return False  # taken again meanwhile (a race with discovery): the held path answers next beat
            after = self._store.complete_handoff(current, self.worker_id)
        except DependencyError as exc:
            log.warning("could not complete the orphaned hand-off of lease=%s: %s", lease_key, exc)
            return False
        log.info(
            "graceful handoff completed lease=%s from=%s to=%s ok=%s (not held by this process: nothing to finish)",
            lease_key,
            self.worker_id,
            current.lease_owner,
            after is not None,
        )
        if after is not None:
            self._released(lease_key, current.lease_owner)
        return True

    def _apply_request(self, entry: HeldLease, current: Lease | None, *, until: float) -> str:
        me = self.worker_id
        with entry.lock:
            if current is None or current.actual_owner != me:
                return "lost"
            if current.checkpoint_owner != me:
                return "stale"  # we own it outright: the hand-off was cancelled or is not written yet
            if current.lease_counter == entry.lease.lease_counter:
                entry.lease = current
            # else a write of ours raced the read: the consumer's next checkpoint finds the hand-off itself
            if not entry.handoff_requested:
                log.info(
                    "graceful handoff requested lease=%s from=%s to=%s", current.lease_key, me, current.lease_owner
                )
            entry.handoff_requested = True
            entry.handoff_until = until if entry.handoff_until is None else min(entry.handoff_until, until)
            return "handoff"

    @property
    def epsilon_s(self) -> float:
        return self._config.epsilon_ms / 1000

    def refresh_throughput(self, *, min_change: float = 0.2, min_kbps: float = 1.0) -> int:
        """``worker`` mode: write each held lease's throughput if it moved by more than ``min_change`` (relative)
        and ``min_kbps`` since the value stored, without moving its counter. Returns the number written."""
        if self._throughput is None:
            return 0
        written = 0
        for lease_key in self.held_keys():
            entry = self._entry(lease_key)
            if entry is None:
                continue
            value = self._throughput(lease_key)
            stored = entry.lease.throughput_kbps
            baseline = 0.0 if stored is None else stored  # nothing stored and nothing flowing is not worth a write
            if value is None or abs(value - baseline) <= max(min_kbps, min_change * max(baseline, value)):
                continue
            with entry.lock:
                if entry.lost:
                    continue
                try:
                    updated = self._store.update_throughput(entry.lease, self.worker_id, round(value, 3))
                except DependencyError as exc:
                    log.warning("throughput update failed lease=%s: %s", lease_key, exc)
                    continue
                if updated is not None:  # a failed condition is left to the checkpoint / hand-off paths
                    entry.lease = updated
                    written += 1
        return written

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

    def _decided(self) -> None:
        with self._verdict:
            self._verdict.notify_all()

    def fence_all(self, reason: str) -> None:
        """Stop processing everything now (the worker is leaving): every lease is dropped as lost and nothing is
        valid until the next heartbeat."""
        with self._guard:
            dropped = self._drop_all_locked()
            self._heartbeat_until = -float("inf")
        self._report_lost(dropped, reason)
        self._decided()

    def _drop_all_locked(self) -> list[str]:
        keys = list(self._held)
        for entry in self._held.values():
            entry.lost = True
        self._held.clear()
        return keys

    def _report_lost(self, keys: list[str], reason: str) -> None:
        for key in keys:
            log.info("lease lost lease=%s worker=%s reason=%s", key, self.worker_id, reason)
            if self._on_lost is not None:
                self._on_lost(key, reason)

    def handoff_requested(self, lease_key: str) -> bool:
        entry = self._entry(lease_key)
        return entry is not None and entry.handoff_requested

    def _mark_lost(self, lease_key: str, reason: str) -> None:
        with self._guard:
            entry = self._held.pop(lease_key, None)
        if entry is None:
            return
        entry.lost = True
        log.info("lease lost lease=%s worker=%s reason=%s", lease_key, self.worker_id, reason)
        if self._on_lost is not None:
            self._on_lost(lease_key, reason)

    def drop(self, lease_key: str) -> None:
        """Forget a lease without writing (after SHARD_END cleanup, or once a handoff completed)."""
        with self._guard:
            self._held.pop(lease_key, None)

    # --- taking and renewing --------------------------------------------------------------------------------

    def take(self, lease: Lease) -> bool:
        """Start holding a lease the leader assigned to us: one renewal proves it and starts the validity clock."""
        with self._guard:
            if lease.lease_key in self._held:
                return True
        sent = self._clock.monotonic()
        renewed = self._store.renew_lease(lease, self.worker_id, throughput_kbps=None)
        if renewed is None or renewed.lease_owner != self.worker_id or renewed.checkpoint_owner is not None:
            return False
        with self._guard:
            self._held[lease.lease_key] = HeldLease(lease=renewed, sent_at=sent)
        log.info("lease taken lease=%s worker=%s counter=%d", lease.lease_key, self.worker_id, renewed.lease_counter)
        return True

    def _renew_one(self, lease_key: str) -> str:
        entry = self._entry(lease_key)
        if entry is None:
            return "gone"
        with entry.lock:
            if entry.lost:
                return "gone"
            throughput = self._throughput(lease_key) if self._throughput is not None else None
            sent = self._clock.monotonic()
            try:
                renewed = self._store.renew_lease(entry.lease, self.worker_id, throughput_kbps=throughput)
            except DependencyError as exc:
                log.warning("lease renewal failed lease=%s worker=%s: %s", lease_key, self.worker_id, exc)
                return "failed"
            if renewed is None:
                outcome = "lost"
            else:
                return "handoff" if self._written(entry, renewed, sent=sent, what="renewal") else "renewed"
        self._mark_lost(lease_key, "renewal condition failed (another owner or counter moved)")
        return outcome

    def _written(self, entry: HeldLease, updated: Lease, *, sent: float | None, what: str) -> bool:
        """A write of ours to a held lease succeeded: keep the item as it now is (and, for a counter-moving write,
        restart the lease's validity from ``sent``). True when the item shows the leader handing the lease away from
        us (``leaseOwner`` moved, ``checkpointOwner`` = us): we process until we complete the hand-off."""
        entry.lease = updated
        if sent is not None:
            entry.sent_at = sent
        away = updated.lease_owner != self.worker_id and updated.checkpoint_owner == self.worker_id
        if away and not entry.handoff_requested:
            log.info(
                "graceful handoff requested lease=%s from=%s to=%s (seen at %s)",
                updated.lease_key,
                self.worker_id,
                updated.lease_owner,
                what,
            )
        entry.handoff_requested = away
        return away

    def renew_all(self) -> RenewalReport:
        keys = self.held_keys()
        if len(keys) <= 1 or self._max_parallel == 1:
            outcomes = [self._renew_one(key) for key in keys]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._max_parallel, thread_name_prefix="lease-renewer")
            outcomes = list(self._pool.map(self._renew_one, keys))
        by_outcome: dict[str, list[str]] = {}
        for key, outcome in zip(keys, outcomes, strict=True):
            by_outcome.setdefault(outcome, []).append(key)
        # Self-fencing for leases we could not renew because of infrastructure errors happens by time
        # (is_valid); once they are past validity they are dropped here so that discovery can take them again.
        now = self._clock.monotonic()
        for key in by_outcome.get("failed", []):
            entry = self._entry(key)
            if entry is not None and now >= entry.sent_at + self.validity_s:
                self._mark_lost(key, "not renewed within the lease duration")
        return RenewalReport(
            renewed=tuple(by_outcome.get("renewed", [])),
            lost=tuple(by_outcome.get("lost", [])),
            failed=tuple(by_outcome.get("failed", [])),
            handoffs=tuple(by_outcome.get("handoff", [])),
        )

    # --- writes on behalf of the consumer -------------------------------------------------------------------

    def _fenced_write(
        self, lease_key: str, write: Callable[[Lease], Lease | None], what: str, *, moves_counter: bool = True
    ) -> Lease | None:
        """One write on behalf of the consumer, while the lease is valid. The store re-reads once after a lost
        condition and retries once as checkpoint owner when the leader started a hand-off meanwhile
        (:meth:`~worker_lib.leases.dynamodb.DynamoDBLeaseStore.checkpoint`); here the outcome is only recorded."""
        entry = self._entry(lease_key)
        if entry is None or not self.still_valid(lease_key):
            return None
        with entry.lock:
            sent = self._clock.monotonic()
            updated = write(entry.lease)
            if updated is not None:
                # a counter increment is a renewal: validity restarts from the send time
                self._written(entry, updated, sent=sent if moves_counter else None, what=what)
                return updated
        self._mark_lost(lease_key, f"{what} condition failed")
        return None

    def checkpoint(self, lease_key: str, checkpoint: Checkpoint) -> Lease | None:
        """Fenced checkpoint; ``None`` means the lease is no longer ours (and it has been dropped)."""
        return self._fenced_write(
            lease_key, lambda lease: self._store.checkpoint(lease, self.worker_id, checkpoint), "checkpoint"
        )

    def prepare_checkpoint(self, lease_key: str, pending: Checkpoint) -> Lease | None:
        return self._fenced_write(
            lease_key,
            lambda lease: self._store.prepare_checkpoint(lease, self.worker_id, pending),
            "prepare checkpoint",
        )

    def update_child_shard_ids(self, lease_key: str, children: list[str]) -> Lease | None:
        return self._fenced_write(
            lease_key,
            lambda lease: self._store.update_child_shard_ids(lease, children),
            "record children",
            moves_counter=False,
        )

    def mark_block(self, lease_key: str, block: ShardBlock | None) -> Lease | None:
        """Record (None: remove) the shard's failure marker; ``None`` means the lease is no longer ours."""
        return self._fenced_write(
            lease_key, lambda lease: self._store.mark_block(lease, self.worker_id, block), "mark failure"
        )

    def stop_shard(self, lease_key: str, block: ShardBlock) -> bool:
        """Give the lease up marked stopped (policy stop-shard); False if it was no longer ours."""
        entry = self._entry(lease_key)
        if entry is None:
            return False
        with entry.lock:
            try:
                after = self._store.stop_shard(entry.lease, self.worker_id, block)
            except DependencyError as exc:
                log.warning("could not stop shard lease=%s worker=%s: %s", lease_key, self.worker_id, exc)
                after = None
        self.drop(lease_key)
        return after is not None

    def complete_handoff(self, lease_key: str) -> bool:
        """Old owner, after its final checkpoint: let the new owner start now rather than after the deadline."""
        entry = self._entry(lease_key)
        if entry is None:
            return False
        with entry.lock:
            done = self._store.complete_handoff(entry.lease, self.worker_id) is not None
        self.drop(lease_key)
        log.info("graceful handoff completed lease=%s from=%s ok=%s", lease_key, self.worker_id, done)
        if done:
            self._released(lease_key, entry.lease.lease_owner)
        return done

    def _released(self, lease_key: str, new_owner: str | None) -> None:
        if self.on_release is None:
            return
        try:
            self.on_release(lease_key, new_owner)
        except Exception as exc:  # a notice is an optimisation: the new owner's discovery finds the lease anyway
            log.warning("release notice for lease=%s failed: %s", lease_key, exc)

    def evict(self, lease_key: str) -> bool:
        """Give a lease up at once (shutdown): the leader can reassign it in its next cycle, not after expiry."""
        entry = self._entry(lease_key)
        if entry is None:
            return False
        with entry.lock:
            try:
                after = self._store.evict_lease(entry.lease, self.worker_id)
            except DependencyError as exc:
                log.warning("could not give up lease=%s worker=%s: %s", lease_key, self.worker_id, exc)
                after = None
        self.drop(lease_key)
        if after is not None:
            # Given up in the middle of a graceful handoff, the lease went to its chosen new owner: tell that one.
            new_owner = after.lease_owner if after.lease_owner != self.worker_id else None
            self._released(lease_key, new_owner)
        return after is not None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class LeaseDiscoverer:
    """Finds leases the leader assigned to us: GSI query by owner, then consistent reads of the new keys (one
    BatchGetItem per hundred when there are several)."""

    def __init__(self, store: LeaseStore, worker_id: str) -> None:
        self._store = store
        self.worker_id = worker_id

    def discover(self, already_held: set[str] | frozenset[str]) -> list[Lease]:
        return self.discover_keys(self._store.list_lease_keys_for_owner(self.worker_id), already_held)

    def discover_keys(self, keys: Iterable[str], already_held: set[str] | frozenset[str]) -> list[Lease]:
        """The leases among ``keys`` that are ours to start (consistent reads, batched: many leases handed over at
        once cost one request per hundred, not one each): the leader's notice names them, so no index query is
        needed."""
        new_keys = [key for key in keys if key not in already_held]
        read = self._store.get_leases(new_keys)
        found: list[Lease] = []
        for key in new_keys:
            lease = read.get(key)
            # The GSI is eventually consistent and a handoff *to* us is not ours until the old owner lets go.
            # A finished lease (SHARD_END) has nothing left to read: its consumer already dropped it.
            if (
                lease is not None
                and lease.lease_owner == self.worker_id
                and lease.checkpoint_owner is None
                and not lease.is_finished
            ):
                found.append(lease)
        return sorted(found, key=lambda lease: lease.lease_key)
