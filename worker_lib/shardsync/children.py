"""The lease table's parent/child rules for a holder of leases, shared by the worker's shard consumer and the Spark
driver: a child is read only once its parents ended (:class:`ParentsEnded`), and child leases are created at
SHARD_END (:func:`ensure_child_leases`).

KCL's rule: create each missing child lease (TRIM_HORIZON, parents and hash range set); for a merge child only
once the merge partner's lease exists too — otherwise shard sync creates the partner's lease first (it must be
read before the child). A partner no longer listed was trimmed: it will never have a lease and does not hold the
child back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from worker_lib.core.models import TRIM_HORIZON, Lease, ShardInfo
from worker_lib.core.streams import related_lease_key, split_lease_key
from worker_lib.leases.store import LeaseStore
from worker_lib.shardsync.hierarchy import new_lease

log = logging.getLogger(__name__)


class ParentsEnded:
    """Whether a lease's parents all reached SHARD_END (or their leases are gone), so that it may be read — KCL's
    rule. A parent once seen finished stays finished, so it is read again never."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store
        self._finished: set[str] = set()

    def ended(self, lease: Lease) -> bool:
        for parent in sorted(lease.parent_shard_ids):
            key = related_lease_key(lease.lease_key, parent)
            if key in self._finished:
                continue
            parent_lease = self._store.get_lease(key)
            if parent_lease is not None and not parent_lease.is_finished:
                return False
            self._finished.add(key)
        return True


def ensure_child_leases(
    store: LeaseStore, parent_key: str, children: Sequence[str], list_shards: Callable[[], Iterable[ShardInfo]]
) -> bool:
    """True when every child of ``parent_key`` has a lease (creating what is missing); False to retry later. The
    stream's shards are listed only when a child lease is missing.

    ``children`` and the shards' parents are bare shard ids; in a multi-stream application their leases carry the
    parent's stream prefix (:func:`~worker_lib.core.streams.related_lease_key`)."""
    parent_shard = split_lease_key(parent_key)[1]
    shards: dict[str, ShardInfo] | None = None
    for child_id in children:
        child_key = related_lease_key(parent_key, child_id)
        if store.get_lease(child_key) is not None:
            continue
        if shards is None:
            shards = {shard.shard_id: shard for shard in list_shards()}
        shard = shards.get(child_id)
        if shard is None:
            log.warning("child shard %s of %s is not listed yet; retrying", child_id, parent_key)
            return False
        partners = [p for p in shard.parent_ids if p != parent_shard and p in shards]
        if any(store.get_lease(related_lease_key(parent_key, p)) is None for p in partners):
            log.warning(
                "merge child %s: partner lease %s missing; waiting for shard sync", child_id, ",".join(partners)
            )
            return False
        created = store.create_lease_if_absent(new_lease(shard, TRIM_HORIZON).with_(lease_key=child_key))
        log.info("child lease %s of %s %s", child_key, parent_key, "created" if created else "exists")
    return True
