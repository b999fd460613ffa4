"""Pure shard-hierarchy rules: the whole shard-graph-A table of docs/kcl-compatibility.md, cleanup, repair,
properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.shard_graph_a import AT, CASES, TH, L
from worker_lib.core.config import InitialPosition
from worker_lib.core.models import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease, ShardInfo
from worker_lib.shardsync.hierarchy import LISTING, hash_range_holes, plan_creation, plan_sync

MAX_KEY = 2**128 - 1
INITIAL = {L: LATEST, TH: TRIM_HORIZON, AT: AT_TIMESTAMP}


def shard(n: int, *parents: int, closed: bool = False) -> ShardInfo:
    """A shard covering the whole key space (for graphs whose hash ranges do not matter)."""
    ids = [f"s{p}" for p in parents]
    return ShardInfo(
        shard_id=f"s{n}",
        parent_shard_id=ids[0] if ids else None,
        adjacent_parent_shard_id=ids[1] if len(ids) > 1 else None,
        ending_sequence_number="999" if closed else None,
    )


class Resharder:
    """A shard graph built the way Kinesis builds it: ids in creation order, hash ranges halved by a split and
    joined by a merge of two adjacent open shards, parents closed."""

    def __init__(self, roots: int) -> None:
        self.shards: dict[str, ShardInfo] = {}
        step = (MAX_KEY + 1) // roots
        for n in range(roots):
            self._add(None, None, n * step, MAX_KEY if n == roots - 1 else (n + 1) * step - 1)

    def _add(self, parent: str | None, adjacent: str | None, low: int, high: int) -> str:
        shard_id = f"s{len(self.shards)}"
        self.shards[shard_id] = ShardInfo(
            shard_id=shard_id,
            parent_shard_id=parent,
            adjacent_parent_shard_id=adjacent,
            starting_hash_key=str(low),
            ending_hash_key=str(high),
        )
        return shard_id

    def _close(self, shard_id: str) -> tuple[int, int]:
        s = self.shards[shard_id]
        assert s.is_open
        self.shards[shard_id] = ShardInfo(**{**s.__dict__, "ending_sequence_number": "99"})
        return int(s.starting_hash_key), int(s.ending_hash_key)

    def split(self, shard_id: str) -> tuple[str, str]:
        low, high = self._close(shard_id)
        middle = (low + high) // 2
        return self._add(shard_id, None, low, middle), self._add(shard_id, None, middle + 1, high)

    def merge(self, lower: str, upper: str) -> str:
        low, lower_high = self._close(lower)
        upper_low, high = self._close(upper)
        assert lower_high + 1 == upper_low, "only adjacent shards merge"
        return self._add(lower, upper, low, high)

    def open_in_key_order(self) -> list[str]:
        return sorted((s.shard_id for s in self.shards.values() if s.is_open), key=self.start)

    def start(self, shard_id: str) -> int:
        return int(self.shards[shard_id].starting_hash_key)

    @property
    def listing(self) -> list[ShardInfo]:
        return list(self.shards.values())


def build_graph_a() -> list[ShardInfo]:
    """Graph A: 0–5 closed; 6 = merge(0,1); 7 = merge(2,3); 8 = merge(6,7); 9, 10 = split(5). Open: 4, 8, 9, 10."""
    stream = Resharder(6)
    assert stream.merge("s0", "s1") == "s6"
    assert stream.merge("s2", "s3") == "s7"
    assert stream.merge("s6", "s7") == "s8"
    assert stream.split("s5") == ("s9", "s10")
    return stream.listing


GRAPH_A = build_graph_a()


def leases_for(ids: tuple[int, ...]) -> list[Lease]:
    return [Lease(lease_key=f"s{n}", lease_owner="w", checkpoint=Checkpoint(sequence="1")) for n in ids]


@pytest.mark.parametrize(("existing", "position", "expected"), CASES)
def test_shard_graph_a(existing: tuple[int, ...], position: InitialPosition, expected: tuple[int, ...]) -> None:
    # GIVEN graph A (real hash ranges) and the row's existing leases
    leases = leases_for(existing)
    # WHEN the leader plans a sync
    created, skipped, reasons = plan_creation(GRAPH_A, leases, position)
    # THEN exactly the table's leases are created, each with a reason, nothing skipped
    assert sorted(int(lease.lease_key[1:]) for lease in created) == sorted(expected)
    assert skipped == [] and set(reasons) == {lease.lease_key for lease in created}
    # AND every created lease starts at the initial position, as in KCL's own graph-A expectations: LATEST gives
    # LATEST even to the closed parents 2 and 6 (they exist for ordering; a parent that must be read fully is
    # always a TRIM_HORIZON/AT_TIMESTAMP root); TRIM_HORIZON gives TRIM_HORIZON; AT_TIMESTAMP keeps the sentinel
    # (the timestamp itself comes from the configuration, as in KCL)
    for lease in created:
        assert lease.checkpoint == INITIAL[position], lease
        assert lease.lease_owner is None and lease.lease_counter == 0 and lease.child_shard_ids == frozenset()
        source = next(s for s in GRAPH_A if s.shard_id == lease.lease_key)
        assert lease.parent_shard_ids == frozenset(source.parent_ids)
        assert (lease.starting_hash_key, lease.ending_hash_key) == (source.starting_hash_key, source.ending_hash_key)


@pytest.mark.parametrize(
    "existing",
    [(0, 1, 4, 7, 9, 10), (0, 1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7), (4, 8, 9, 10)],
    ids=lambda ids: ",".join(map(str, ids)),
)
@pytest.mark.parametrize("position", [L, TH, AT], ids=lambda p: p.value)
def test_a_table_that_covers_every_open_shard_creates_nothing(
    existing: tuple[int, ...], position: InitialPosition
) -> None:
    # GIVEN leases covering every open shard of graph A (directly or through an ancestor) — KCL's CompleteHashRange
    # cases — WHEN planned THEN nothing is created, whatever the initial position
    created, skipped, _ = plan_creation(GRAPH_A, leases_for(existing), position)
    assert created == [] and skipped == []


def test_graph_c_latest_with_leases_on_two_grandchildren() -> None:
    # GIVEN KCL's graph C: 0 splits into 4, 5; 4 into 7, 8; 5 into 9, 10; 1 stays; 2 + 3 merge into 6
    stream = Resharder(4)
    assert stream.split("s0") == ("s4", "s5")
    assert stream.merge("s2", "s3") == "s6"
    assert stream.split("s4") == ("s7", "s8")
    assert stream.split("s5") == ("s9", "s10")
    # WHEN leases exist for 9 and 10 and the position is LATEST
    created, _, _ = plan_creation(stream.listing, leases_for((9, 10)), L)
    # THEN the open shards without a leased ancestor get LATEST leases (KCL: 1, 6, 7, 8)
    assert {(lease.lease_key, lease.checkpoint) for lease in created} == {(f"s{n}", LATEST) for n in (1, 6, 7, 8)}


@pytest.mark.parametrize(("existing", "expected"), [((6,), (7,)), ((5,), ()), ((), (9, 10))])
def test_graph_b_latest(existing: tuple[int, ...], expected: tuple[int, ...]) -> None:
    # GIVEN KCL's graph B: one key range merged and split alternately (0+1 → 2 → 3, 4 → 5 → 6, 7 → 8 → 9, 10)
    stream = Resharder(2)
    assert stream.merge("s0", "s1") == "s2"
    assert stream.split("s2") == ("s3", "s4")
    assert stream.merge("s3", "s4") == "s5"
    assert stream.split("s5") == ("s6", "s7")
    assert stream.merge("s6", "s7") == "s8"
    assert stream.split("s8") == ("s9", "s10")
    # WHEN planned with LATEST THEN KCL's expectations hold
    created, _, _ = plan_creation(stream.listing, leases_for(existing), L)
    assert sorted(lease.lease_key for lease in created) == sorted(f"s{n}" for n in expected)
    assert all(lease.checkpoint == LATEST for lease in created)


@pytest.mark.parametrize("position", [L, TH, AT], ids=lambda p: p.value)
def test_empty_table_on_a_fresh_stream_leases_every_shard(position: InitialPosition) -> None:
    # GIVEN a stream never resharded and an empty lease table
    created, skipped, reasons = plan_creation(Resharder(3).listing, [], position)
    # THEN every shard gets a lease at the initial position
    assert [(lease.lease_key, lease.checkpoint) for lease in created] == [
        (f"s{n}", INITIAL[position]) for n in range(3)
    ]
    assert skipped == [] and all("empty table" in reasons[lease.lease_key] for lease in created)


def test_an_open_child_of_an_open_parent_is_skipped_with_a_reason_not_a_crash() -> None:
    # GIVEN a listing caught mid-reshard: a child is open while its parent is still open
    shards = [shard(0), shard(1, 0)]
    # WHEN planned (non-empty and empty table)
    created, skipped, _ = plan_creation(shards, leases_for((7,)), L)
    empty_created, empty_skipped, _ = plan_creation(shards, [], L)
    # THEN the child is skipped with a reason; the parent is handled as usual
    assert [s.shard_id for s in skipped] == ["s1"] and "still open" in skipped[0].reason
    assert [lease.lease_key for lease in created] == ["s0"]
    assert [lease.lease_key for lease in empty_created] == ["s0"] and empty_skipped == skipped


def test_a_listing_with_a_hole_creates_nothing_and_deletes_no_unknown_lease() -> None:
    # GIVEN graph A's listing without shard 9 (a partial answer): keys of 9 are covered by no open shard
    partial = [s for s in GRAPH_A if s.shard_id != "s9"]
    assert len(hash_range_holes(partial)) == 1 and hash_range_holes(GRAPH_A) == []
    leases = [Lease(lease_key="gone", checkpoint=SHARD_END)]
    # WHEN planned
    plan = plan_sync(partial, leases, TH)
    # THEN no lease is created, the hole is reported, and the lease of an unlisted shard is not condemned
    assert plan.to_create == () and plan.unknown_shard_leases == ()
    assert [s.shard_id for s in plan.skipped] == [LISTING] and "no open shard" in plan.skipped[0].reason


def test_an_empty_listing_is_a_hole_not_a_stream_without_shards() -> None:
    plan = plan_sync([], [Lease(lease_key="s0", checkpoint=Checkpoint(sequence="5"))], L)
    assert plan.to_create == () and plan.unknown_shard_leases == () and plan.skipped[0].shard_id == LISTING


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


def test_repair_reaches_a_merge_child_whose_partner_is_repaired_in_the_same_sync() -> None:
    # GIVEN s0 split into s1, s2 which merged again into s3; s0 and s1 finished, the worker of s0 died before
    # creating s2's lease
    stream = Resharder(1)
    assert stream.split("s0") == ("s1", "s2")
    assert stream.merge("s1", "s2") == "s3"
    leases = [
        Lease(lease_key="s1", checkpoint=SHARD_END, parent_shard_ids=frozenset({"s0"})),
        Lease(lease_key="s0", checkpoint=SHARD_END),
    ]
    # WHEN planned, in either scan order
    plans = [plan_sync(stream.listing, order, L) for order in (leases, leases[::-1])]
    # THEN s2 is repaired and, its parents now all leased, the merge child s3 too
    assert plans[0] == plans[1]
    assert [(lease.lease_key, lease.checkpoint) for lease in plans[0].to_create] == [
        ("s2", TRIM_HORIZON),
        ("s3", TRIM_HORIZON),
    ]
    assert plans[0].to_create[1].parent_shard_ids == {"s1", "s2"}


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
    # GIVEN finished s0 (split into s1, s2) with the given child leases and own parents
    parent = Lease(lease_key="s0", checkpoint=SHARD_END, parent_shard_ids=frozenset(parent_parents))
    leases = [parent, *(Lease(lease_key=k, checkpoint=c) for k, c in children.items())]
    leases += [Lease(lease_key=p, checkpoint=SHARD_END) for p in parent_parents]
    # WHEN planned
    plan = plan_sync(SPLIT, leases, L)
    # THEN s0 is deleted exactly when both children have started and no parent of s0 has a lease
    assert ("s0" in {lease.lease_key for lease in plan.to_delete}) is deleted
    # AND never with cleanup disabled
    assert plan_sync(SPLIT, leases, L, cleanup=False).to_delete == ()


@pytest.mark.parametrize(("child_checkpoint", "deleted"), [(None, False), (TRIM_HORIZON, False), (SHARD_END, True)])
def test_children_recorded_on_the_lease_count_even_when_the_listing_no_longer_shows_them(
    child_checkpoint: Checkpoint | None, deleted: bool
) -> None:
    # GIVEN a finished lease whose recorded child s9 the listing does not relate to it
    parent = Lease(lease_key="s0", checkpoint=SHARD_END, child_shard_ids=frozenset({"s9"}))
    leases = [parent] + ([Lease(lease_key="s9", checkpoint=child_checkpoint)] if child_checkpoint else [])
    listing = [shard(0, closed=True), shard(9)]
    # WHEN planned THEN the parent goes only once s9 has a lease with a real checkpoint
    plan = plan_sync(listing, leases, L)
    assert ("s0" in {lease.lease_key for lease in plan.to_delete}) is deleted


def test_leases_of_unknown_shards_are_reported_only_with_a_complete_listing() -> None:
    # GIVEN a lease of a shard the listing does not contain
    leases = [Lease(lease_key="gone", checkpoint=SHARD_END), Lease(lease_key="s1")]
    # THEN it is reported for deletion (after confirmation by the caller) only when the listing is complete and
    # deleting unknown-shard leases is enabled
    assert plan_sync(SPLIT, leases, L).unknown_shard_leases == ("gone",)
    assert plan_sync(SPLIT, leases, L, listing_complete=False).unknown_shard_leases == ()
    assert plan_sync(SPLIT, leases, L, delete_unknown=False).unknown_shard_leases == ()
    # AND a multi-stream lease key is judged by its shard id
    multi = [Lease(lease_key="123:orders:1700000000:s1"), Lease(lease_key="123:orders:1700000000:s7")]
    assert plan_sync(SPLIT, multi, L).unknown_shard_leases == ("123:orders:1700000000:s7",)


# --- properties over random split/merge histories --------------------------------------------------------------

CHECKPOINTS = [Checkpoint(sequence="42"), SHARD_END, TRIM_HORIZON, LATEST, AT_TIMESTAMP]


History = tuple[list[ShardInfo], list[Lease]]
"""A stream's shard listing after random resharding, and the leases a sync could meet for it."""


@st.composite
def histories(draw: st.DrawFn) -> History:
    """A random resharding history (splits, merges of adjacent open shards) and a random set of leases."""
    stream = Resharder(draw(st.integers(1, 4)))
    for _ in range(draw(st.integers(0, 9))):
        open_ids = stream.open_in_key_order()
        if len(open_ids) >= 2 and draw(st.booleans()):
            i = draw(st.integers(0, len(open_ids) - 2))
            stream.merge(open_ids[i], open_ids[i + 1])
        else:
            stream.split(draw(st.sampled_from(open_ids)))
    shards = stream.listing
    keys = draw(st.lists(st.sampled_from([s.shard_id for s in shards]), unique=True))
    parents = {s.shard_id: frozenset(s.parent_ids) for s in shards}
    leases = [
        Lease(lease_key=k, checkpoint=draw(st.sampled_from(CHECKPOINTS)), parent_shard_ids=parents[k]) for k in keys
    ]
    return shards, leases


def ancestors(shard_id: str, by_id: dict[str, ShardInfo]) -> set[str]:
    found: set[str] = set()
    stack = list(by_id[shard_id].parent_ids)
    while stack:
        parent = stack.pop()
        if parent in by_id and parent not in found:
            found.add(parent)
            stack.extend(by_id[parent].parent_ids)
    return found


@settings(max_examples=400, deadline=None)
@given(histories(), st.sampled_from([L, TH, AT]), st.randoms(use_true_random=False))
def test_properties_of_creation(history: History, position: InitialPosition, rnd: random.Random) -> None:
    shards, leases = history
    by_id = {s.shard_id: s for s in shards}
    existing = {lease.lease_key for lease in leases}
    created, skipped, reasons = plan_creation(shards, leases, position)
    keys = [lease.lease_key for lease in created]
    # a real history has no inconsistent shard and no hole
    assert skipped == [] and hash_range_holes(shards) == []
    # never a duplicate, never a lease that already exists, only listed shards, always a reason
    assert len(keys) == len(set(keys)) and not set(keys) & existing and set(keys) <= set(by_id)
    assert set(reasons) == set(keys)
    # every created lease starts at the initial position, unowned, with its parents and hash range
    for lease in created:
        source = by_id[lease.lease_key]
        assert lease.checkpoint == INITIAL[position] and lease.lease_owner is None and lease.lease_counter == 0
        assert lease.parent_shard_ids == frozenset(source.parent_ids)
        assert lease.starting_hash_key == source.starting_hash_key
    # justified: no created shard is reached through an existing lease, none is an ancestor of another created
    # one, and a closed one is only ever a parent of a shard that needs it (or a root read from the start)
    for key in keys:
        assert not ancestors(key, by_id) & existing, key
        assert not ancestors(key, by_id) & set(keys), key
        if not by_id[key].is_open and position is L:
            assert any(key in s.parent_ids and ancestors(s.shard_id, by_id) & existing for s in shards), key
        if not by_id[key].is_open and position is not L:
            assert not by_id[key].parent_ids, key
    # every open shard ends up leased or covered by a leased/created ancestor
    covered = existing | set(keys)
    for s in shards:
        if s.is_open:
            assert s.shard_id in covered or ancestors(s.shard_id, by_id) & covered, s.shard_id
    # deterministic whatever the listing and scan order
    again, _, _ = plan_creation(rnd.sample(shards, len(shards)), rnd.sample(leases, len(leases)), position)
    assert again == created
    # and a fixed point: once created, the next sync creates nothing more
    assert plan_creation(shards, [*leases, *created], position)[0] == []


@settings(max_examples=400, deadline=None)
@given(histories(), st.sampled_from([L, TH, AT]), st.randoms(use_true_random=False))
def test_properties_of_repair_and_cleanup(history: History, position: InitialPosition, rnd: random.Random) -> None:
    shards, leases = history
    by_id = {s.shard_id: s for s in shards}
    by_key = {lease.lease_key: lease for lease in leases}
    plan = plan_sync(shards, leases, position)
    # deterministic whatever the listing and scan order
    assert plan_sync(rnd.sample(shards, len(shards)), rnd.sample(leases, len(leases)), position) == plan
    created = {lease.lease_key: lease for lease in plan.to_create}
    assert len(created) == len(plan.to_create) and not set(created) & set(by_key)
    children_of = {k: {s.shard_id for s in shards if k in s.parent_ids} for k in by_id}
    # repair: a child lease only for a child of a finished lease, from TRIM_HORIZON, with every parent leased
    only_repair = set(created) - {lease.lease_key for lease in plan_creation(shards, leases, position)[0]}
    for key in only_repair:
        lease = created[key]
        assert lease.checkpoint == TRIM_HORIZON and lease.parent_shard_ids == frozenset(by_id[key].parent_ids)
        assert any(by_key.get(p) is not None and by_key[p].is_finished for p in lease.parent_shard_ids)
        assert all(p in by_key or p in created for p in lease.parent_shard_ids)
    # after repair no finished lease has a child whose parents are all leased but which has no lease itself
    leased = set(by_key) | set(created)
    for lease in leases:
        if lease.is_finished:
            for child in children_of[lease.lease_key]:
                assert child in leased or not all(p in leased for p in by_id[child].parent_ids)
            assert plan.children_to_record.get(lease.lease_key, lease.child_shard_ids) == children_of[lease.lease_key]
    # cleanup: only finished leases, only once every child has started and none of its parents has a lease
    for lease in plan.to_delete:
        assert lease.is_finished and children_of[lease.lease_key]
        for child in children_of[lease.lease_key]:
            assert child in by_key and by_key[child].checkpoint.is_real
        assert not any(p in by_key for p in by_id[lease.lease_key].parent_ids)
    # and nothing is created and deleted in the same plan, no listed shard is called unknown
    assert not set(created) & {lease.lease_key for lease in plan.to_delete}
    assert plan.unknown_shard_leases == ()
