"""The lease-store seam: what the leader and the workers need from the lease table.

Every mutating operation is a conditional write. Losing the condition is a normal outcome and returns
``None`` (or ``False``); infrastructure failures raise :class:`~worker_lib.core.errors.DependencyError` subclasses.
Methods that succeed return the lease as it now is in the table, so callers never guess the new counter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from worker_lib.core.models import Checkpoint, Lease, ShardBlock


@dataclass(frozen=True, kw_only=True)
class LeaseScan:
    """The result of a full scan: the leases, and what was skipped and why (keys only — never payloads)."""

    leases: list[Lease]
    skipped_foreign: list[str] = field(default_factory=list)
    skipped_corrupt: list[str] = field(default_factory=list)


@runtime_checkable
class LeaseStore(Protocol):
    table_name: str

    # --- reading ---------------------------------------------------------------------------------------------
    def get_lease(self, lease_key: str) -> Lease | None:
        """A strongly consistent read; ``None`` if absent, foreign or corrupt."""

    def get_leases(self, lease_keys: Iterable[str]) -> dict[str, Lease]:
        """Strongly consistent reads of several keys in as few requests as the service allows (one key: one plain
        read); absent, foreign and corrupt items are left out."""

    def scan(self, *, segments: int = 1, page_size: int | None = None) -> LeaseScan:
        """Every lease (paginated; ``segments`` > 1 scans in parallel), skipping foreign and corrupt items."""

    def list_leases(self, *, segments: int = 1) -> list[Lease]:
        """``scan(...).leases``."""

    def list_lease_keys_for_owner(self, owner: str) -> list[str]:
        """Keys of leases whose ``leaseOwner`` is ``owner``, through the GSI (eventually consistent)."""

    def is_empty(self) -> bool:
        """Whether the table holds no lease."""

    # --- writing ---------------------------------------------------------------------------------------------
    def create_lease_if_absent(self, lease: Lease) -> bool:
        """``attribute_not_exists(leaseKey)``; False if a lease with that key exists."""

    def create_leases_if_absent(self, leases: Iterable[Lease]) -> list[Lease]:
        """Create each lease that does not exist yet; returns those created."""

    def renew_lease(self, lease: Lease, owner: str, *, throughput_kbps: float | None = None) -> Lease | None:
        """Owner's heartbeat: counter c → c+1 (and throughput). Handles lost replies and handoffs (docs/design.md)."""

    def update_throughput(self, lease: Lease, owner: str, throughput_kbps: float) -> Lease | None: ...

    def checkpoint(
        self, lease: Lease, owner: str, checkpoint: Checkpoint, *, writes: Sequence[Mapping[str, Any]] = ()
    ) -> Lease | None:
        """Fenced checkpoint by the processing owner: counter must still be ``lease.lease_counter``. With
        ``writes`` (``TransactWriteItems`` actions), one transaction: they land with the checkpoint or not at all;
        a failed condition of theirs raises :class:`~worker_lib.core.errors.OutputConditionError`."""

    def key_names(self, table: str) -> tuple[str, ...]:
        """The key attribute names of a table the outputs go to (to tell which item a ``Put`` touches)."""

    def prepare_checkpoint(self, lease: Lease, owner: str, pending: Checkpoint) -> Lease | None:
        """First phase of a two-phase checkpoint: store ``pendingCheckpoint`` (fenced like ``checkpoint``)."""

    def assign_lease(self, lease: Lease, new_owner: str, *, expected_counter: int | None = None) -> Lease | None:
        """Leader: give ``lease`` to ``new_owner`` if its owner and checkpoint owner are still as observed."""

    def initiate_graceful_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        """Leader: ``leaseOwner`` = new, ``checkpointOwner`` = current owner; counter untouched."""

    def complete_handoff(self, lease: Lease, old_owner: str) -> Lease | None:
        """Old owner (or the leader after the handoff deadline): drop ``checkpointOwner`` for the new owner."""

    def evict_lease(self, lease: Lease, owner: str) -> Lease | None:
        """Owner gives the lease up at once (shutdown): ``leaseOwner`` removed, counter + 1."""

    def mark_block(self, lease: Lease, owner: str, block: ShardBlock | None) -> Lease | None:
        """Processing owner: record (None: remove) the failure marker, fenced like a checkpoint."""

    def stop_shard(self, lease: Lease, owner: str, block: ShardBlock) -> Lease | None:
        """Processing owner: give the lease up and mark it stopped (the leader then assigns it to nobody)."""

    def resume_shard(self, lease_key: str) -> Lease | None:
        """Operator: remove a shard's failure marker; None if it had none."""

    def update_child_shard_ids(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease | None:
        """Record the children of a finished shard (``childShardIds``)."""

    def delete_lease(self, lease: Lease, *, only_if_finished: bool = True) -> bool:
        """Delete; with ``only_if_finished`` the checkpoint must be SHARD_END in the table."""
