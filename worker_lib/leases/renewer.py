"""The worker's side of its leases: renewal, fenced checkpoints, handoff and eviction.

Every write a worker makes to one lease goes through :class:`LeaseHolder` under that lease's lock, so renewals
and checkpoints (which both move ``leaseCounter``) never race each other into a spurious "lease lost" — the same
reason KCL synchronises on its authoritative lease copy. Which leases may be used at all — self-fencing by the
renewal clock and the heartbeat fence, suspension and its verdict — is :class:`~worker_lib.leases.fence.FencedLeases`,
which :class:`LeaseHolder` extends.

In ``worker`` liveness mode (docs/liveness-modes.md) nothing is renewed (:attr:`LeaseHolder.renewing` is off): the
heartbeat fence alone bounds every lease, the leader asks for graceful hand-offs through the worker's own item
(:meth:`LeaseHolder.handoff_requests`, which also bounds the old owner by the hand-off timeout), and throughput is
written only when it changed (:meth:`LeaseHolder.refresh_throughput`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Checkpoint, Lease, ShardBlock
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.fence import FencedLeases, HeldLease, LostCallback
from worker_lib.leases.mode import parse_handoff_request
from worker_lib.leases.store import LeaseStore

__all__ = ["HeldLease", "LeaseDiscoverer", "LeaseHolder", "LostCallback", "RenewalReport"]

log = logging.getLogger(__name__)

ReleaseCallback = Callable[[str, str | None], None]  # (lease_key, new owner after a handoff; None = given up)
ThroughputSource = Callable[[str], float | None]  # lease_key -> KBps to write with the renewal


@dataclass(frozen=True, kw_only=True)
class RenewalReport:
    renewed: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # infrastructure errors; the lease stays held until it times out
    handoffs: tuple[str, ...] = ()


class LeaseHolder(FencedLeases):
    """The set of leases this worker holds (judged by :class:`~worker_lib.leases.fence.FencedLeases`), and every
    conditional write it makes to them."""

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
        super().__init__(worker_id, config=config or LeaseConfig(), clock=clock, on_lost=on_lost)
        self._store = store
        self._throughput = throughput
        self.on_release = on_release
        # Whether something of ours still works on a lease we no longer hold (a consumer winding down): an orphaned
        # hand-off of that lease waits for it (handoff_requests).
        self._in_use = in_use
        self._requests_seen: set[str] = set()
        self._max_parallel = max(1, max_parallel_renewals)
        self._pool: ThreadPoolExecutor | None = None

    # --- worker liveness mode: hand-off requests, throughput (docs/liveness-modes.md) -------------------------

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

    def checkpoint(
        self, lease_key: str, checkpoint: Checkpoint, *, writes: Sequence[Mapping[str, Any]] = ()
    ) -> Lease | None:
        """Fenced checkpoint (with ``writes``: in one transaction with them); ``None`` means the lease is no longer
        ours (and it has been dropped)."""
        return self._fenced_write(
            lease_key,
            lambda lease: self._store.checkpoint(lease, self.worker_id, checkpoint, writes=writes),
            "checkpoint with outputs" if writes else "checkpoint",
        )

    def output_key_names(self, table: str) -> tuple[str, ...]:
        """The key attributes of an output table (:meth:`~worker_lib.leases.store.LeaseStore.key_names`)."""
        return self._store.key_names(table)

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
