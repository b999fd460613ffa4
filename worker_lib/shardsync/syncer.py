"""One shard sync: scan leases, list shards, plan (pure, :mod:`.hierarchy`), write conditionally, report.

Leases are scanned *before* shards are listed: a lease can only exist for a shard that already existed, so every
lease considered here had its shard in the listing unless the shard is really gone. (Listing first would let a
child lease created by a worker in between look like a lease of an unknown shard.) An incomplete listing writes
nothing at all. A lease whose shard a complete listing (without hash-range holes) misses is deleted only when the
detector confirms the shard is gone (``shard_exists`` is False: GetShardIterator answers ResourceNotFound, as KCL's
lease cleanup checks); otherwise it is reported in ``unknown_pending`` and asked about again next sync. The
confirmation needs no memory between syncs, so it works as well in a Lambda leader built afresh per invocation
and in ``shardlease leader --once``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.shardsync.detector import ShardDetector
from worker_lib.shardsync.hierarchy import plan_sync

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ShardSyncResult:
    shards_seen: int
    open_shards: int
    leases_before: int
    created: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    children_recorded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # "shard: reason"
    unknown_pending: tuple[str, ...] = ()  # leases whose shard is not listed but not confirmed gone: kept
    listing_complete: bool = True
    duration_ms: float = 0.0
    # multi-stream applications (docs/multi-stream.md): serialized identifiers
    streams_synced: tuple[str, ...] = ()
    streams_missing: tuple[str, ...] = ()  # tracked names Kinesis does not know (deleted or not created yet)
    former_streams_waiting: tuple[str, ...] = ()  # untracked streams in their grace period
    former_streams_deleted: tuple[str, ...] = ()  # streams whose leases this sync deleted


class SyncLeaseStore(Protocol):
    """What a shard sync needs of a lease store (a :class:`~worker_lib.leases.store.LeaseStore`, or one stream's
    view of it in a multi-stream application)."""

    def list_leases(self) -> list[Lease]: ...

    def create_lease_if_absent(self, lease: Lease) -> bool: ...

    def update_child_shard_ids(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease | None: ...

    def get_lease(self, lease_key: str) -> Lease | None: ...

    def delete_lease(self, lease: Lease, *, only_if_finished: bool = True) -> bool: ...


class ShardSyncer:
    def __init__(
        self,
        lease_store: SyncLeaseStore,
        detector: ShardDetector,
        *,
        config: ShardSyncConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = lease_store
        self._detector = detector
        self._config = config or ShardSyncConfig()
        self._clock = clock

    def sync_once(self) -> ShardSyncResult:
        started = self._clock.monotonic()
        leases = self._store.list_leases()
        listing = self._detector.list_shards()
        open_shards = sum(1 for shard in listing.shards if shard.is_open)
        if not listing.complete:
            log.warning("shard listing incomplete: shard sync writes nothing this time")
            return ShardSyncResult(
                shards_seen=len(listing.shards),
                open_shards=open_shards,
                leases_before=len(leases),
                listing_complete=False,
                duration_ms=self._elapsed_ms(started),
            )
        plan = plan_sync(
            listing.shards,
            leases,
            self._config.initial_position,
            listing_complete=True,
            cleanup=self._config.cleanup_enabled,
            delete_unknown=self._config.delete_unknown_shard_leases,
        )
        for skipped in plan.skipped:
            log.warning("shard sync skipped %s: %s", skipped.shard_id, skipped.reason)

        created = []
        for lease in plan.to_create:
            if self._store.create_lease_if_absent(lease):
                created.append(lease.lease_key)
                log.info(
                    "lease created lease=%s checkpoint=%s reason=%s",
                    lease.lease_key,
                    lease.checkpoint,
                    plan.reasons.get(lease.lease_key, ""),
                )

        by_key = {lease.lease_key: lease for lease in leases}
        recorded = []
        for key, children in sorted(plan.children_to_record.items()):
            if self._store.update_child_shard_ids(by_key[key], children) is not None:
                recorded.append(key)

        deleted = []
        for lease in plan.to_delete:
            if self._delete(lease.lease_key, only_if_finished=True, reason=plan.reasons.get(lease.lease_key, "")):
                deleted.append(lease.lease_key)
        pending = []
        for key in plan.unknown_shard_leases:
            shard_id = key.rsplit(":", 1)[-1]
            exists = self._detector.shard_exists(shard_id)
            if exists is False and self._delete(
                key, only_if_finished=False, reason="shard no longer listed and the service reports it not found"
            ):
                deleted.append(key)
            elif exists is not False:
                log.info("lease %s: shard not listed but %s; kept", key, "still exists" if exists else "unconfirmed")
                pending.append(key)

        return ShardSyncResult(
            shards_seen=len(listing.shards),
            open_shards=open_shards,
            leases_before=len(leases),
            created=tuple(created),
            deleted=tuple(deleted),
            children_recorded=tuple(recorded),
            skipped=tuple(f"{s.shard_id}: {s.reason}" for s in plan.skipped),
            unknown_pending=tuple(pending),
            listing_complete=True,
            duration_ms=self._elapsed_ms(started),
        )

    def _delete(self, key: str, *, only_if_finished: bool, reason: str) -> bool:
        lease = self._store.get_lease(key)
        if lease is None:
            return False
        try:
            done = self._store.delete_lease(lease, only_if_finished=only_if_finished)
        except DependencyError as exc:
            log.warning("could not delete lease %s: %s", key, exc)
            return False
        if done:
            log.info("lease deleted lease=%s reason=%s", key, reason)
        return done

    def _elapsed_ms(self, started: float) -> float:
        return round((self._clock.monotonic() - started) * 1000, 3)
