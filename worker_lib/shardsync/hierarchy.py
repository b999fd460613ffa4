"""Shard-hierarchy rules (KCL's HierarchicalShardSyncer): pure functions of a shard listing and the leases that
exist. No I/O. What KCL does is summarised in docs/kcl-compatibility.md, "Shard sync and lease lifecycle".

Three decisions per sync:

* **creation** — empty table: a lease for every shard the initial position selects (LATEST: the open shards;
  TRIM_HORIZON / AT_TIMESTAMP: the root shards, i.e. those whose parents are not in the listing). Non-empty table:
  for every open shard without a lease, a memoised descendant check; a *descendant* (some ancestor has, or will
  get, a lease) gets leases created for the lease-less parents that must be read, and nothing for itself (its
  lease is created when its parents end); a non-descendant gets a lease at the initial position. This reproduces
  every cell of the reference's shard graph A (tests/unit/test_shard_hierarchy.py). Inconsistent input is skipped
  with a reason, never a crash: an open shard whose parent is still open gets no lease (KCL's inconsistent
  shards), and a listing whose open shards leave a hole in the hash-key space creates nothing at all and counts
  as incomplete (it missed shards).
* **repair** — a finished (SHARD_END) lease whose children have no lease: create each child lease (TRIM_HORIZON,
  parents set) once *every* parent of that child has a lease — what the worker does at SHARD_END, done again by
  the leader in case that worker died in between; repeated to a fixed point, since a child repaired for one
  finished lease can complete the parents of another's merge child. Also records missing ``childShardIds``.
* **cleanup** — a finished lease is deleted once every child lease exists with a real checkpoint (the child has
  started: not TRIM_HORIZON / LATEST / AT_TIMESTAMP) and none of its own parents still has a lease; a lease of a
  shard the listing no longer contains is reported only when the listing is complete and has no holes (the caller
  deletes it once the service confirms the shard is gone).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from worker_lib.core.config import InitialPosition
from worker_lib.core.models import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint, Lease, ShardInfo


def initial_checkpoint(position: InitialPosition) -> Checkpoint:
    return {
        InitialPosition.LATEST: LATEST,
        InitialPosition.TRIM_HORIZON: TRIM_HORIZON,
        InitialPosition.AT_TIMESTAMP: AT_TIMESTAMP,
    }[position]


@dataclass(frozen=True, kw_only=True)
class Skipped:
    shard_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class SyncPlan:
    """What one sync should write. ``to_create`` leases are unowned with counter 0."""

    to_create: tuple[Lease, ...] = ()
    to_delete: tuple[Lease, ...] = ()
    children_to_record: Mapping[str, frozenset[str]] = field(default_factory=dict)
    unknown_shard_leases: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)  # lease key -> why created / deleted


def new_lease(shard: ShardInfo, checkpoint: Checkpoint) -> Lease:
    return Lease(
        lease_key=shard.shard_id,
        checkpoint=checkpoint,
        parent_shard_ids=frozenset(shard.parent_ids),
        starting_hash_key=shard.starting_hash_key,
        ending_hash_key=shard.ending_hash_key,
    )


def _parents_in_listing(shard: ShardInfo, shards: Mapping[str, ShardInfo]) -> tuple[str, ...]:
    """KCL ignores parents that are no longer listed (trimmed): such a shard counts as a root."""
    return tuple(p for p in shard.parent_ids if p in shards)


MAX_HASH_KEY = 2**128 - 1
LISTING = "(listing)"  # the ``shard_id`` of a Skipped entry about the listing as a whole


def hash_range_holes(shards: Iterable[ShardInfo]) -> list[str]:
    """Gaps in the hash-key space covered by the open shards (KCL's completeness check), described in words.

    Every key from 0 to 2^128 − 1 belongs to exactly one open shard of a healthy stream; a gap means the listing
    missed a shard (a partial answer, or one caught in the middle of a reshard). Overlaps (an open child whose
    parent is still open) are reported by :func:`inconsistent_shards` instead.
    """
    ranges = sorted((int(s.starting_hash_key), int(s.ending_hash_key), s.shard_id) for s in shards if s.is_open)
    holes: list[str] = []
    covered_to, last = -1, "the start of the key space"
    for start, end, shard_id in ranges:
        if start > covered_to + 1:
            holes.append(f"hash keys {covered_to + 1}..{start - 1} (between {last} and {shard_id}) have no open shard")
        if end > covered_to:
            covered_to, last = end, shard_id
    if covered_to < MAX_HASH_KEY:
        holes.append(f"hash keys {covered_to + 1}..{MAX_HASH_KEY} (after {last}) have no open shard")
    return holes


def inconsistent_shards(shards: Mapping[str, ShardInfo]) -> dict[str, str]:
    """Open shards whose listed parent is still open: a listing caught mid-reshard (KCL refuses to sync on it)."""
    bad: dict[str, str] = {}
    for shard in shards.values():
        if not shard.is_open:
            continue
        for parent in _parents_in_listing(shard, shards):
            if shards[parent].is_open:
                bad[shard.shard_id] = f"open shard whose parent {parent} is still open"
    return bad


class _Hierarchy:
    """KCL's checkIfDescendantAndAddNewLeasesForAncestors with its memoisation context."""

    def __init__(self, shards: Mapping[str, ShardInfo], leased: set[str], position: InitialPosition) -> None:
        self.shards = shards
        self.leased = leased
        self.position = position
        self.is_descendant: dict[str, bool] = {}
        self.should_create: set[str] = set()
        self.new_leases: dict[str, Lease] = {}
        self.reasons: dict[str, str] = {}

    def check(self, shard_id: str) -> bool:
        known = self.is_descendant.get(shard_id)
        if known is not None:
            return known
        descendant = False
        shard = self.shards.get(shard_id)
        if shard is not None:
            if shard_id in self.leased:
                descendant = True  # its ancestors were handled when its own lease was created
            else:
                parents = _parents_in_listing(shard, self.shards)
                descendant_parents: set[str] = set()
                for parent in parents:
                    if self.check(parent) or parent in self.should_create:
                        descendant = True
                        descendant_parents.add(parent)
                if descendant:
                    self._add_parent_leases(shard_id, parents, descendant_parents)
                elif self.position is not InitialPosition.LATEST and not parents:
                    # A root: with TRIM_HORIZON / AT_TIMESTAMP everything from the start must be read.
                    self.should_create.add(shard_id)
        self.is_descendant[shard_id] = descendant
        return descendant

    def _add_parent_leases(self, shard_id: str, parents: Sequence[str], descendant_parents: set[str]) -> None:
        for parent in parents:
            if parent in self.leased:
                continue
            lease = self.new_leases.get(parent)
            if lease is None and (parent in self.should_create or parent not in descendant_parents):
                lease = new_lease(self.shards[parent], TRIM_HORIZON)
                self.reasons[parent] = f"parent of {shard_id} that must be read before it"
            if lease is None:
                continue
            if parent in descendant_parents and self.position is not InitialPosition.AT_TIMESTAMP:
                checkpoint = TRIM_HORIZON
            else:
                checkpoint = initial_checkpoint(self.position)
            self.new_leases[parent] = lease.with_(checkpoint=checkpoint)


def plan_creation(
    shards: Sequence[ShardInfo], leases: Sequence[Lease], position: InitialPosition
) -> tuple[list[Lease], list[Skipped], dict[str, str]]:
    """Leases to create for shards without one (KCL's rules; see the module documentation)."""
    by_id = {shard.shard_id: shard for shard in shards}
    bad = inconsistent_shards(by_id)
    skipped = [Skipped(shard_id=s, reason=r) for s, r in sorted(bad.items())]
    holes = hash_range_holes(shards)
    if holes:
        # KCL refuses to build leases from a listing that does not cover the key space: it is partial.
        skipped += [Skipped(shard_id=LISTING, reason=f"{hole}: no lease created this sync") for hole in holes]
        return [], skipped, {}
    leased = {lease.shard_id for lease in leases}
    checkpoint = initial_checkpoint(position)
    if not leases:
        if position is InitialPosition.LATEST:
            chosen = [s for s in shards if s.is_open and s.shard_id not in bad]
            why = "open shard (empty table, LATEST)"
        else:
            chosen = [s for s in shards if not _parents_in_listing(s, by_id)]
            why = f"root shard (empty table, {position.value})"
        created = [new_lease(s, checkpoint) for s in sorted(chosen, key=lambda s: s.shard_id)]
        return created, skipped, {lease.lease_key: why for lease in created}
    hierarchy = _Hierarchy(by_id, leased, position)
    for shard in sorted(shards, key=lambda s: s.shard_id):
        if not shard.is_open or shard.shard_id in leased or shard.shard_id in bad:
            continue
        if not hierarchy.check(shard.shard_id):
            hierarchy.new_leases[shard.shard_id] = new_lease(shard, checkpoint)
            hierarchy.reasons[shard.shard_id] = f"new open shard with no leased ancestor ({position.value})"
    created = [hierarchy.new_leases[key] for key in sorted(hierarchy.new_leases)]
    return created, skipped, hierarchy.reasons


def children_in_listing(shards: Iterable[ShardInfo]) -> dict[str, set[str]]:
    children: dict[str, set[str]] = {}
    for shard in shards:
        for parent in shard.parent_ids:
            children.setdefault(parent, set()).add(shard.shard_id)
    return children


def _started(lease: Lease) -> bool:
    """A child that has begun processing: its checkpoint is a sequence number (or SHARD_END)."""
    return not lease.checkpoint.is_sentinel or lease.checkpoint.is_shard_end


def plan_sync(
    shards: Sequence[ShardInfo],
    leases: Sequence[Lease],
    position: InitialPosition,
    *,
    listing_complete: bool = True,
    cleanup: bool = True,
    delete_unknown: bool = True,
) -> SyncPlan:
    """Creation, repair and cleanup for one sync."""
    by_id = {shard.shard_id: shard for shard in shards}
    by_key = {lease.lease_key: lease for lease in leases}
    created, skipped, reasons = plan_creation(shards, leases, position)
    # a listing with holes missed shards: "not listed" would not mean "gone"
    listing_complete = listing_complete and not any(s.shard_id == LISTING for s in skipped)
    leased = set(by_key) | {lease.lease_key for lease in created}
    children_of = children_in_listing(shards)

    # repair: child leases of finished parents, once every parent of the child has a lease. Repeated until
    # nothing changes: a lease repaired for one parent can complete the parents of a merge child of another.
    children_to_record: dict[str, frozenset[str]] = {}
    finished = sorted((lease for lease in leases if lease.is_finished), key=lambda lease: lease.lease_key)
    for lease in finished:
        children = set(lease.child_shard_ids) | children_of.get(lease.shard_id, set())
        if children and not lease.child_shard_ids >= children:
            children_to_record[lease.lease_key] = frozenset(children)
    changed = True
    while changed:
        changed = False
        for lease in finished:
            children = set(lease.child_shard_ids) | children_of.get(lease.shard_id, set())
            for child_id in sorted(children):
                child = by_id.get(child_id)
                if child is None or child_id in leased:
                    continue
                # (a parent no longer listed was trimmed: it will never get a lease and does not hold the child back)
                if all(p in leased for p in child.parent_ids if p in by_id):
                    created.append(new_lease(child, TRIM_HORIZON))
                    leased.add(child_id)
                    reasons[child_id] = f"child of finished {lease.lease_key} (every parent has a lease)"
                    changed = True

    to_delete: list[Lease] = []
    unknown: list[str] = []
    if cleanup:
        for lease in sorted(leases, key=lambda lease: lease.lease_key):
            if lease.shard_id not in by_id:
                if listing_complete and delete_unknown:
                    unknown.append(lease.lease_key)
                continue
            if not lease.is_finished:
                continue
            children = set(lease.child_shard_ids) | children_of.get(lease.shard_id, set())
            if not children:
                continue
            child_leases = [by_key.get(c) for c in children]
            if any(c is None or not _started(c) for c in child_leases):
                continue
            if any(p in by_key for p in lease.parent_shard_ids):
                continue
            to_delete.append(lease)
            reasons[lease.lease_key] = "finished; every child has started and its own parents are gone"
    return SyncPlan(
        to_create=tuple(created),
        to_delete=tuple(to_delete),
        children_to_record=children_to_record,
        unknown_shard_leases=tuple(sorted(unknown)),
        skipped=tuple(skipped),
        reasons=reasons,
    )
