"""Pure shard-hierarchy rules: the whole shard-graph-A table of reference §8, cleanup, repair, properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_lib.config import InitialPosition
from worker_lib.models import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease, ShardInfo
from worker_lib.shardsync.hierarchy import plan_creation, plan_sync

L, TH, AT = InitialPosition.LATEST, InitialPosition.TRIM_HORIZON, InitialPosition.AT_TIMESTAMP


def shard(n: int, *parents: int, closed: bool = False) -> ShardInfo:
    ids = [f"s{p}" for p in parents]
    return ShardInfo(
        shard_id=f"s{n}",
        parent_shard_id=ids[0] if ids else None,
        adjacent_parent_shard_id=ids[1] if len(ids) > 1 else None,
        ending_sequence_number="999" if closed else None,
    )


# Graph A: 0–5 closed; 6 = merge(0,1); 7 = merge(2,3); 8 = merge(6,7); 9, 10 = split(5). Open: 4, 8, 9, 10.
GRAPH_A = [
    *(shard(n, closed=True) for n in (0, 1, 2, 3, 5)),
    shard(4),
    shard(6, 0, 1, closed=True),
    shard(7, 2, 3, closed=True),
    shard(8, 6, 7),
    shard(9, 5),
    shard(10, 5),
]

# reference §8: existing leases → created (LATEST, TRIM_HORIZON, AT_TIMESTAMP)
TABLE = [
    ((4, 5, 7), (6,), (0, 1), (0, 1)),
    ((3, 4, 5), (2, 6), (0, 1, 2), (0, 1, 2)),
    ((2, 6), (3, 4, 9, 10), (3, 4, 5), (3, 4, 5)),
    ((4, 9, 10), (8,), (0, 1, 2, 3), (0, 1, 2, 3)),
    ((), (4, 8, 9, 10), (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5)),
    ((4, 5, 6, 7), (), (), ()),
]
CASES = [
    pytest.param(existing, position, expected, id=f"{','.join(map(str, existing)) or 'none'}-{position.value}")
    for existing, latest, trim, at in TABLE
    for position, expected in ((L, latest), (TH, trim), (AT, at))
]


def leases_for(ids: tuple[int, ...]) -> list[Lease]:
    return [Lease(lease_key=f"s{n}", lease_owner="w", checkpoint=Checkpoint(sequence="1")) for n in ids]


@pytest.mark.parametrize(("existing", "position", "expected"), CASES)
def test_shard_graph_a(existing: tuple[int, ...], position: InitialPosition, expected: tuple[int, ...]) -> None:
    # GIVEN graph A and the row's existing leases
    created, skipped, reasons = plan_creation(GRAPH_A, leases_for(existing), position)
    # THEN exactly the table's leases are created, each with a reason
    assert sorted(int(lease.lease_key[1:]) for lease in created) == sorted(expected)
    assert skipped == [] and set(reasons) >= {lease.lease_key for lease in created}
    # AND their checkpoints: the initial position for new roots / open shards and LATEST's non-descendant
    # parents; TRIM_HORIZON for parents that must be read fully (AT_TIMESTAMP keeps its timestamp)
    for lease in created:
        n = int(lease.lease_key[1:])
        if not existing:
            want = {L: LATEST, TH: TRIM_HORIZON, AT: AT_TIMESTAMP}[position]
        elif position is AT:
            want = AT_TIMESTAMP
        elif position is TH:
            want = TRIM_HORIZON
        else:  # LATEST: every created lease is a parent with no leased ancestor, or a new non-descendant shard
            want = LATEST
        assert lease.checkpoint == want, (n, lease.checkpoint)
        assert lease.lease_owner is None and lease.lease_counter == 0


def test_created_leases_carry_parents_and_hash_ranges() -> None:
    created, _, _ = plan_creation(GRAPH_A, leases_for((4, 5, 7)), L)
    (six,) = created
    assert six.parent_shard_ids == {"s0", "s1"}
    assert six.starting_hash_key == "0" and six.ending_hash_key == str(2**128 - 1)


def test_an_inconsistent_listing_is_skipped_with_a_reason_not_a_crash() -> None:
    shards = [shard(0), shard(1, 0)]  # child open while its parent is still open
    created, skipped, _ = plan_creation(shards, leases_for((7,)), L)
    assert [s.shard_id for s in skipped] == ["s1"] and "still open" in skipped[0].reason
    assert [lease.lease_key for lease in created] == ["s0"]


# --- repair and cleanup ----------------------------------------------------------------------------------------

SPLIT = [shard(0, closed=True), shard(1, 0), shard(2, 0)]
MERGE = [shard(0, closed=True), shard(1, closed=True), shard(2, 0, 1)]


def test_repair_creates_children_of_a_finished_parent_and_records_them() -> None:
    # GIVEN a parent that reached SHARD_END but whose worker died before creating the child leases
    parent = Lease(lease_key="s0", checkpoint=SHARD_END)
    plan = plan_sync(SPLIT, [parent], L)
    # THEN both children are created from TRIM_HORIZON with the parent set, and the parent learns its children
    assert sorted(lease.lease_key for lease in plan.to_create) == ["s1", "s2"]
    assert all(lease.checkpoint == TRIM_HORIZON and lease.parent_shard_ids == {"s0"} for lease in plan.to_create)
    assert plan.children_to_record == {"s0": frozenset({"s1", "s2"})}
    assert plan.to_delete == ()


def test_a_merge_child_is_created_only_once_both_parents_have_leases() -> None:
    # GIVEN a merge whose first parent finished and whose second parent has no lease yet
    one_finished = [Lease(lease_key="s0", checkpoint=SHARD_END)]
    plan = plan_sync(MERGE, one_finished, TH)
    # THEN the second parent gets its lease (it must be read) and, with both parents leased, the child too
    assert [lease.lease_key for lease in plan.to_create] == ["s1", "s2"]
    s1, s2 = plan.to_create
    assert s1.checkpoint == TRIM_HORIZON and s2.parent_shard_ids == {"s0", "s1"}
    # AND with a closed merge child (not handled by creation) whose partner is unleased, repair waits
    closed_child = [shard(0, closed=True), shard(1, closed=True), shard(2, 0, 1, closed=True), shard(3, 2)]
    leases = [Lease(lease_key="s0", checkpoint=SHARD_END), Lease(lease_key="s3", checkpoint=Checkpoint(sequence="1"))]
    assert "s2" not in {lease.lease_key for lease in plan_sync(closed_child, leases, L).to_create}


def test_a_trimmed_merge_partner_does_not_hold_the_child_back() -> None:
    # GIVEN a finished parent whose merge partner was trimmed from the listing
    listing = [shard(0, closed=True), ShardInfo(shard_id="s2", parent_shard_id="s0", adjacent_parent_shard_id="s1")]
    plan = plan_sync(listing, [Lease(lease_key="s0", checkpoint=SHARD_END)], L)
    # THEN the child lease is created (the trimmed parent will never get a lease)
    assert [lease.lease_key for lease in plan.to_create] == ["s2"]


@pytest.mark.parametrize(
    ("children", "parent_parents", "deleted"),
    [
        ({"s1": TRIM_HORIZON, "s2": Checkpoint(sequence="7")}, (), False),  # a child has not started
        ({"s1": Checkpoint(sequence="3")}, (), False),  # a child lease is missing
        ({"s1": Checkpoint(sequence="3"), "s2": SHARD_END}, ("sX",), False),  # own parent still leased
        ({"s1": Checkpoint(sequence="3"), "s2": SHARD_END}, (), True),
        ({"s1": LATEST, "s2": AT_TIMESTAMP}, (), False),
    ],
)
def test_cleanup_deletes_a_finished_parent_only_when_children_started_and_own_parents_are_gone(
    children: dict[str, Checkpoint], parent_parents: tuple[str, ...], deleted: bool
) -> None:
    parent = Lease(lease_key="s0", checkpoint=SHARD_END, parent_shard_ids=frozenset(parent_parents))
    leases = [parent, *(Lease(lease_key=k, checkpoint=c) for k, c in children.items())]
    leases += [Lease(lease_key=p, checkpoint=SHARD_END) for p in parent_parents]
    plan = plan_sync(SPLIT, leases, L)
    assert ("s0" in {lease.lease_key for lease in plan.to_delete}) is deleted


def test_leases_of_unknown_shards_are_reported_only_with_a_complete_listing() -> None:
    leases = [Lease(lease_key="gone", checkpoint=SHARD_END), Lease(lease_key="s1")]
    assert plan_sync(SPLIT, leases, L).unknown_shard_leases == ("gone",)
    assert plan_sync(SPLIT, leases, L, listing_complete=False).unknown_shard_leases == ()
    assert plan_sync(SPLIT, leases, L, delete_unknown=False).unknown_shard_leases == ()


# --- properties over random split/merge histories --------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[ShardInfo], list[Lease]]:
    """A random resharding history: start with k roots, then splits and merges of open shards."""
    roots = draw(st.integers(1, 4))
    shards: dict[str, ShardInfo] = {f"s{n}": shard(n) for n in range(roots)}
    order = list(shards)
    next_id = roots
    for _ in range(draw(st.integers(0, 8))):
        open_ids = [s for s in order if shards[s].is_open]
        if len(open_ids) >= 2 and draw(st.booleans()):
            a, b = draw(st.permutations(open_ids))[:2]
            for x in (a, b):
                shards[x] = ShardInfo(**{**shards[x].__dict__, "ending_sequence_number": "9"})
            new = ShardInfo(shard_id=f"s{next_id}", parent_shard_id=a, adjacent_parent_shard_id=b)
            shards[new.shard_id] = new
            order.append(new.shard_id)
            next_id += 1
        else:
            a = draw(st.sampled_from(open_ids))
            shards[a] = ShardInfo(**{**shards[a].__dict__, "ending_sequence_number": "9"})
            for _ in range(2):
                new = ShardInfo(shard_id=f"s{next_id}", parent_shard_id=a)
                shards[new.shard_id] = new
                order.append(new.shard_id)
                next_id += 1
    leased = draw(st.lists(st.sampled_from(order), unique=True, max_size=len(order)))
    return list(shards.values()), [Lease(lease_key=k, checkpoint=Checkpoint(sequence="1")) for k in leased]


@settings(max_examples=300, deadline=None)
@given(histories(), st.sampled_from([L, TH, AT]))
def test_properties_of_creation(history: tuple[list[ShardInfo], list[Lease]], position: InitialPosition) -> None:
    shards, leases = history
    created, skipped, _ = plan_creation(shards, leases, position)
    keys = [lease.lease_key for lease in created]
    existing = {lease.lease_key for lease in leases}
    # never a duplicate, never a lease that already exists, only listed shards
    assert len(keys) == len(set(keys)) and not set(keys) & existing
    assert set(keys) <= {s.shard_id for s in shards}
    assert skipped == []
    # every open shard ends up leased, or is a descendant whose ancestors are covered
    covered = existing | set(keys)
    by_id = {s.shard_id: s for s in shards}

    def has_leased_ancestor(shard_id: str) -> bool:
        parents = by_id[shard_id].parent_ids
        return any(p in covered or (p in by_id and has_leased_ancestor(p)) for p in parents)

    for s in shards:
        if s.is_open:
            assert s.shard_id in covered or has_leased_ancestor(s.shard_id)
    # deterministic
    again, _, _ = plan_creation(list(reversed(shards)), list(reversed(leases)), position)
    assert [x.lease_key for x in again] == keys and [x.checkpoint for x in again] == [x.checkpoint for x in created]
