"""Leases as a test needs them in a lease table, written through the store the way the leader does."""

from __future__ import annotations

from worker_lib.core.models import Lease
from worker_lib.leases.dynamodb import DynamoDBLeaseStore


def assigned_lease(store: DynamoDBLeaseStore, key: str, owner: str) -> Lease:
    """A lease created unowned and assigned to ``owner`` (counter 1), as the store returned it."""
    assert store.create_lease_if_absent(Lease(lease_key=key))
    lease = store.get_lease(key)
    assert lease is not None
    assigned = store.assign_lease(lease, owner)
    assert assigned is not None
    return assigned
