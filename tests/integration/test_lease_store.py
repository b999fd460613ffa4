"""The DynamoDB lease store against real emulators (moto server and dynalite): every write conditional."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import kcl_fixture
from tests.support.faults import lose_replies
from tests.support.leases import assigned_lease
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import EndpointUnreachableError, InvalidStateError, TableMissingError
from worker_lib.core.models import SHARD_END, TRIM_HORIZON, Checkpoint, Lease
from worker_lib.leases import serializer
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.renewer import LeaseDiscoverer
from worker_lib.tables.admin import ensure_tables


@pytest.fixture
def ddb(ddb_aws: AwsConfig) -> Any:
    return aws.client("dynamodb", ddb_aws)


@pytest.fixture
def store(ddb: Any, app_name: str) -> DynamoDBLeaseStore:
    ensure_tables(app_name, ddb)
    return DynamoDBLeaseStore(app_name, client=ddb)


# --- creation and reading ------------------------------------------------------------------------------------


def test_create_if_absent_creates_once(store: DynamoDBLeaseStore) -> None:
    # GIVEN an empty table
    assert store.is_empty()
    lease = Lease(lease_key="shardId-000000000000", parent_shard_ids=frozenset({"shardId-p"}))
    # WHEN the same lease is created twice
    first = store.create_lease_if_absent(lease)
    second = store.create_lease_if_absent(lease.with_(lease_owner="intruder"))
    # THEN only the first write lands
    assert (first, second) == (True, False)
    stored = store.get_lease("shardId-000000000000")
    assert stored is not None and stored.lease_owner is None and stored.parent_shard_ids == {"shardId-p"}
    assert not store.is_empty()


def test_kcl_written_items_are_adopted_and_survive_our_writes(store: DynamoDBLeaseStore, ddb: Any) -> None:
    # GIVEN a table KCL 3.x wrote, including foreign entities and corrupt items
    fixture = kcl_fixture.load()
    for item in fixture["items"] + fixture["foreign"] + fixture["corrupt"]:
        ddb.put_item(TableName=store.table_name, Item=item)
    # WHEN we scan
    scan = store.scan()
    # THEN every lease is read, foreign and corrupt items are skipped by key
    assert sorted(lease.lease_key for lease in scan.leases) == sorted(i["leaseKey"]["S"] for i in fixture["items"])
    assert sorted(scan.skipped_foreign) == sorted(i["leaseKey"]["S"] for i in fixture["foreign"])
    assert sorted(scan.skipped_corrupt) == sorted(i["leaseKey"]["S"] for i in fixture["corrupt"])
    # AND every lease reads back exactly as stored
    for item in fixture["items"]:
        raw = store.get_raw_item(item["leaseKey"]["S"])
        assert raw is not None and serializer.canonical(raw) == serializer.canonical(item)
    # AND renewing and checkpointing keep the attributes we do not model and the checkpoint semantics
    lease = next(x for x in scan.leases if x.lease_key == "shardId-000000000001")
    renewed = store.renew_lease(lease, "worker-b", throughput_kbps=3.25)
    assert renewed is not None and renewed.lease_counter == 8
    raw = store.get_raw_item("shardId-000000000001")
    assert raw is not None and raw["pendingCheckpointState"] == {"B": b"\x00\x01\x02\x03\x04"}
    # AND a foreign item is invisible to get_lease
    assert store.get_lease("Leader") is None


def test_paginated_and_parallel_scans_return_every_lease(store: DynamoDBLeaseStore) -> None:
    # GIVEN 57 leases
    keys = [f"shardId-{i:012d}" for i in range(57)]
    created = store.create_leases_if_absent(Lease(lease_key=k) for k in keys)
    assert len(created) == 57
    # WHEN scanned with small pages, and in 4 parallel segments
    paged = store.scan(page_size=10)
    parallel = store.scan(segments=4, page_size=7)
    # THEN both see every lease exactly once
    assert [x.lease_key for x in paged.leases] == keys
    assert [x.lease_key for x in parallel.leases] == keys


def test_query_by_owner_uses_the_gsi(store: DynamoDBLeaseStore) -> None:
    # GIVEN leases owned by two workers and one unowned
    for i in range(3):
        assigned_lease(store, f"shardId-a{i}", "worker-a")
    assigned_lease(store, "shardId-b0", "worker-b")
    store.create_lease_if_absent(Lease(lease_key="shardId-free"))
    # THEN each owner's keys come back through LeaseOwnerToLeaseKeyIndex
    assert store.list_lease_keys_for_owner("worker-a") == ["shardId-a0", "shardId-a1", "shardId-a2"]
    assert store.list_lease_keys_for_owner("worker-b") == ["shardId-b0"]
    assert store.list_lease_keys_for_owner("nobody") == []


# --- renewal ---------------------------------------------------------------------------------------------------


def test_renew_increments_the_counter_and_writes_throughput(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    renewed = store.renew_lease(lease, "w1", throughput_kbps=12.5)
    assert renewed is not None
    assert renewed.lease_counter == lease.lease_counter + 1
    assert renewed.throughput_kbps == 12.5


def test_renew_with_a_stale_counter_loses(store: DynamoDBLeaseStore) -> None:
    # GIVEN a worker's view of its lease, and the leader reassigning it meanwhile
    lease = assigned_lease(store, "shardId-1", "w1")
    assert store.assign_lease(lease, "w2") is not None
    # WHEN the old owner renews from its stale view
    # THEN the lease is lost (None), and the new owner is untouched
    assert store.renew_lease(lease, "w1") is None
    current = store.get_lease("shardId-1")
    assert current is not None and current.lease_owner == "w2"


def test_renew_by_a_non_owner_loses(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    assert store.renew_lease(lease, "w2") is None


def test_renew_whose_reply_is_lost_is_recognised(store: DynamoDBLeaseStore, ddb: Any) -> None:
    # GIVEN a lease owned by w1
    lease = assigned_lease(store, "shardId-1", "w1")
    # WHEN the renewal is applied but its reply is lost (botocore re-sends it, the retry fails its condition)
    with lose_replies(ddb, "UpdateItem") as lost:
        renewed = store.renew_lease(lease, "w1", throughput_kbps=2.0)
    # THEN the store recognises its own write and reports success with the new counter
    assert lost == [1]
    assert renewed is not None and renewed.lease_counter == lease.lease_counter + 1


# --- checkpoints -----------------------------------------------------------------------------------------------


def test_checkpoint_is_fenced_by_counter_and_owner(store: DynamoDBLeaseStore) -> None:
    # GIVEN w1 owns a lease with a pending checkpoint and owner switches
    lease = assigned_lease(store, "shardId-1", "w1")
    prepared = store.prepare_checkpoint(lease, "w1", Checkpoint(sequence="100", sub_sequence=2))
    assert prepared is not None and prepared.pending_checkpoint == Checkpoint(sequence="100", sub_sequence=2)
    # WHEN w1 checkpoints from its current view
    done = store.checkpoint(prepared, "w1", Checkpoint(sequence="101", sub_sequence=4))
    # THEN the checkpoint (with sub-sequence) lands, pending fields go, owner switches reset
    assert done is not None
    assert done.checkpoint == Checkpoint(sequence="101", sub_sequence=4)
    assert done.pending_checkpoint is None and done.owner_switches_since_checkpoint == 0
    assert done.lease_counter == prepared.lease_counter + 1
    # AND a checkpoint from the stale view is rejected and changes nothing
    assert store.checkpoint(prepared, "w1", Checkpoint(sequence="50")) is None
    # AND a non-owner cannot checkpoint even with the right counter
    assert store.checkpoint(done, "w2", Checkpoint(sequence="999")) is None
    current = store.get_lease("shardId-1")
    assert current is not None and current.checkpoint == Checkpoint(sequence="101", sub_sequence=4)


def test_checkpoint_whose_reply_is_lost_is_recognised(store: DynamoDBLeaseStore, ddb: Any) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    with lose_replies(ddb, "UpdateItem") as lost:
        done = store.checkpoint(lease, "w1", Checkpoint(sequence="7"))
    assert lost == [1]
    assert done is not None and done.checkpoint == Checkpoint(sequence="7")


def test_checkpoint_after_reassignment_is_rejected(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    assert store.assign_lease(lease, "w2") is not None
    assert store.checkpoint(lease, "w1", Checkpoint(sequence="5")) is None


# --- assignment ------------------------------------------------------------------------------------------------


def test_assign_counts_owner_switches_and_respects_the_observed_owner(store: DynamoDBLeaseStore) -> None:
    # GIVEN an unowned lease
    store.create_lease_if_absent(Lease(lease_key="shardId-1"))
    free = store.get_lease("shardId-1")
    assert free is not None
    # WHEN the leader assigns it
    first = store.assign_lease(free, "w1")
    # THEN the owner is set, the counter moves, and the switch is counted
    assert first is not None and first.lease_owner == "w1" and first.lease_counter == 1
    assert first.owner_switches_since_checkpoint == 1
    # AND a second leader acting on the same (now stale) observation loses
    assert store.assign_lease(free, "w2") is None
    # AND re-assigning to the same owner is not a switch
    same = store.assign_lease(first, "w1")
    assert same is not None and same.owner_switches_since_checkpoint == 1


def test_assign_with_expected_counter_never_takes_a_lease_renewed_since_the_scan(store: DynamoDBLeaseStore) -> None:
    # GIVEN the leader saw counter c and judged the lease expired, but its owner renewed since
    lease = assigned_lease(store, "shardId-1", "w1")
    assert store.renew_lease(lease, "w1") is not None
    # WHEN the leader reassigns with the counter it observed
    # THEN it loses, and the live owner keeps the lease
    assert store.assign_lease(lease, "w2", expected_counter=lease.lease_counter) is None
    current = store.get_lease("shardId-1")
    assert current is not None and current.lease_owner == "w1"


def test_assign_whose_reply_is_lost_is_recognised(store: DynamoDBLeaseStore, ddb: Any) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    with lose_replies(ddb, "UpdateItem") as lost:
        moved = store.assign_lease(lease, "w2", expected_counter=lease.lease_counter)
    assert lost == [1]
    assert moved is not None and moved.lease_owner == "w2"


# --- graceful handoff ------------------------------------------------------------------------------------------


def test_graceful_handoff_lets_the_old_owner_renew_and_checkpoint_until_it_completes(
    store: DynamoDBLeaseStore,
) -> None:
    # GIVEN w1 processes a lease
    lease = assigned_lease(store, "shardId-1", "w1")
    # WHEN the leader starts a handoff to w2
    handing = store.initiate_graceful_handoff(lease, "w2")
    # THEN the new owner is recorded, the old one stays as checkpoint owner, the counter does not move
    assert handing is not None
    assert (handing.lease_owner, handing.checkpoint_owner) == ("w2", "w1")
    assert handing.lease_counter == lease.lease_counter
    # AND the old owner's next renewal (from its pre-handoff view) succeeds as checkpoint owner
    renewed = store.renew_lease(lease, "w1")
    assert renewed is not None and renewed.checkpoint_owner == "w1" and renewed.lease_owner == "w2"
    # AND the new owner cannot renew or checkpoint yet
    assert store.renew_lease(renewed.with_(checkpoint_owner=None), "w2") is None
    # AND the old owner checkpoints, then completes the handoff
    checkpointed = store.checkpoint(renewed, "w1", Checkpoint(sequence="42"))
    assert checkpointed is not None
    completed = store.complete_handoff(checkpointed, "w1")
    assert completed is not None
    assert (completed.lease_owner, completed.checkpoint_owner) == ("w2", None)
    assert completed.lease_counter == checkpointed.lease_counter + 1
    assert completed.checkpoint == Checkpoint(sequence="42")
    # AND the old owner's further renewals lose, the new owner's succeed
    assert store.renew_lease(checkpointed, "w1") is None
    assert store.renew_lease(completed, "w2") is not None


def test_a_second_handoff_cannot_start_while_one_is_in_progress(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    assert store.initiate_graceful_handoff(lease, "w2") is not None
    # A leader acting on the pre-handoff observation loses the condition
    assert store.initiate_graceful_handoff(lease, "w3") is None
    # and one acting on the in-handoff state is refused before any write
    handing = store.get_lease("shardId-1")
    assert handing is not None
    with pytest.raises(InvalidStateError):
        store.initiate_graceful_handoff(handing, "w3")


def test_leader_forces_an_overdue_handoff_to_complete(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    handing = store.initiate_graceful_handoff(lease, "w2")
    assert handing is not None
    forced = store.assign_lease(handing, "w2")
    assert forced is not None and forced.checkpoint_owner is None and forced.lease_owner == "w2"


# --- giving up, children, deletion -----------------------------------------------------------------------------


def test_evict_releases_at_once_and_only_for_the_owner(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    assert store.evict_lease(lease, "w2") is None
    freed = store.evict_lease(lease, "w1")
    assert freed is not None and freed.lease_owner is None and freed.lease_counter == lease.lease_counter + 1
    assert store.list_lease_keys_for_owner("w1") == []


def test_evict_during_a_handoff_completes_it(store: DynamoDBLeaseStore) -> None:
    lease = assigned_lease(store, "shardId-1", "w1")
    handing = store.initiate_graceful_handoff(lease, "w2")
    assert handing is not None
    done = store.evict_lease(handing, "w1")
    assert done is not None and done.lease_owner == "w2" and done.checkpoint_owner is None


def test_child_shard_ids_and_guarded_deletion(store: DynamoDBLeaseStore) -> None:
    # GIVEN a lease that is still being processed
    lease = assigned_lease(store, "shardId-1", "w1")
    # THEN it cannot be deleted as finished
    assert store.delete_lease(lease) is False
    assert store.get_lease("shardId-1") is not None
    # WHEN it reaches SHARD_END and records its children
    ended = store.checkpoint(lease, "w1", SHARD_END)
    assert ended is not None
    with_children = store.update_child_shard_ids(ended, ["shardId-3", "shardId-2"])
    assert with_children is not None and with_children.child_shard_ids == {"shardId-2", "shardId-3"}
    # THEN it can be deleted, and deleting again is harmless
    assert store.delete_lease(with_children) is True
    assert store.get_lease("shardId-1") is None
    assert store.delete_lease(with_children) is True


def test_unconditional_delete_of_an_unfinished_lease(store: DynamoDBLeaseStore) -> None:
    store.create_lease_if_absent(Lease(lease_key="shardId-gone", checkpoint=TRIM_HORIZON))
    lease = store.get_lease("shardId-gone")
    assert lease is not None
    assert store.delete_lease(lease, only_if_finished=False) is True
    assert store.get_lease("shardId-gone") is None


# --- infrastructure failures -----------------------------------------------------------------------------------


def test_missing_table_raises_a_typed_error(ddb: Any) -> None:
    store = DynamoDBLeaseStore("no-such-app", client=ddb)
    with pytest.raises(TableMissingError, match="create-tables"):
        store.list_leases()


def test_unreachable_endpoint_raises_a_typed_error() -> None:
    unreachable = AwsConfig(endpoint_url="http://127.0.0.1:9", max_attempts=1, connect_timeout_s=1)
    store = DynamoDBLeaseStore("some-app", aws_config=unreachable)
    with pytest.raises(EndpointUnreachableError) as info:
        store.get_lease("x")
    assert "\n" not in str(info.value)


# --- KCL parity: what each of our writes changes on a KCL-written item, and nothing else --------------------------

RENEW_CHANGES = {"leaseCounter", "throughputKBps"}
CHECKPOINT_CHANGES = {
    "leaseCounter",
    "checkpoint",
    "checkpointSubSequenceNumber",
    "ownerSwitchesSinceCheckpoint",
    "pendingCheckpoint",
    "pendingCheckpointSubSequenceNumber",
    "pendingCheckpointState",
}
ASSIGN_CHANGES = {"leaseOwner", "leaseCounter", "ownerSwitchesSinceCheckpoint", "checkpointOwner"}
KCL_ITEMS = kcl_fixture.load()["items"]


def changed_attributes(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    b, a = serializer.canonical(before), serializer.canonical(after)
    return {name for name in b.keys() | a.keys() if b.get(name) != a.get(name)}


@pytest.mark.parametrize("item", KCL_ITEMS, ids=[i["leaseKey"]["S"] for i in KCL_ITEMS])
def test_each_kcl_item_keeps_every_attribute_our_writes_do_not_mean_to_change(
    store: DynamoDBLeaseStore, ddb: Any, item: dict[str, Any]
) -> None:
    # GIVEN one lease item as KCL wrote it
    ddb.put_item(TableName=store.table_name, Item=item)
    key = item["leaseKey"]["S"]
    lease = store.get_lease(key)
    assert lease is not None
    before = store.get_raw_item(key)
    assert before is not None
    # WHEN we make the writes a fleet makes to it: its owner renews and checkpoints (as checkpoint owner during a
    # handoff); an unowned or finished lease is assigned by the leader
    allowed: set[str]
    if lease.lease_owner is None or lease.is_finished:
        assigned = store.assign_lease(lease, "worker-z")
        assert assigned is not None
        allowed = ASSIGN_CHANGES
    else:
        owner = lease.checkpoint_owner or lease.lease_owner
        renewed = store.renew_lease(lease, owner, throughput_kbps=42.5)
        assert renewed is not None
        done = store.checkpoint(
            renewed, owner, Checkpoint(sequence="49655487212999999999999999999999999999", sub_sequence=0)
        )
        assert done is not None
        allowed = RENEW_CHANGES | CHECKPOINT_CHANGES
    after = store.get_raw_item(key)
    assert after is not None
    # THEN only the attributes those writes mean to change changed (entityType, hash keys, parents, children,
    # unknown attributes: untouched)
    assert changed_attributes(before, after) <= allowed
    assert after.get("entityType") == before.get("entityType")


def put_pending(store: DynamoDBLeaseStore, ddb: Any, key: str, *, pending: str, state: dict[str, Any]) -> None:
    """A KCL lease owned by ``w``, checkpointed at 100, with a prepared checkpoint and its application state."""
    ddb.put_item(
        TableName=store.table_name,
        Item={
            "leaseKey": {"S": key},
            "leaseCounter": {"N": "3"},
            "leaseOwner": {"S": "w"},
            "checkpoint": {"S": "100"},
            "checkpointSubSequenceNumber": {"N": "0"},
            "pendingCheckpoint": {"S": pending},
            "pendingCheckpointSubSequenceNumber": {"N": "0"},
            "pendingCheckpointState": state,
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
        },
    )


@pytest.mark.parametrize(
    "state", [{"B": b"\x00\x01\x02"}, {"N": "0"}], ids=["bytes-from-updateLease", "number-from-createLease"]
)
def test_a_checkpoint_removes_the_pending_checkpoint_and_its_state_together(
    store: DynamoDBLeaseStore, ddb: Any, state: dict[str, Any]
) -> None:
    # GIVEN a KCL lease with a prepared checkpoint and application state
    put_pending(store, ddb, "shardId-000000000042", pending="200", state=state)
    lease = store.get_lease("shardId-000000000042")
    assert lease is not None
    # WHEN its owner checkpoints
    done = store.checkpoint(lease, "w", Checkpoint(sequence="200", sub_sequence=0))
    # THEN the pending pair and the state are gone together, as KCL's updateLease removes them
    raw = store.get_raw_item("shardId-000000000042")
    assert done is not None and raw is not None
    assert not {"pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState"} & raw.keys()
    assert "pendingCheckpointState" not in done.extra


def test_a_prepared_checkpoint_without_state_drops_an_earlier_state(store: DynamoDBLeaseStore, ddb: Any) -> None:
    # GIVEN a lease whose earlier prepared checkpoint carried application state
    put_pending(store, ddb, "shardId-000000000043", pending="150", state={"B": b"old"})
    lease = store.get_lease("shardId-000000000043")
    assert lease is not None
    # WHEN a new checkpoint is prepared (we pass no application state)
    prepared = store.prepare_checkpoint(lease, "w", Checkpoint(sequence="200", sub_sequence=0))
    # THEN the old state does not stay attached to the new pending checkpoint
    raw = store.get_raw_item("shardId-000000000043")
    assert prepared is not None and raw is not None
    assert raw["pendingCheckpoint"] == {"S": "200"} and "pendingCheckpointState" not in raw


def test_new_leases_carry_entity_type_lease_as_kcl_3_5_writes_them(store: DynamoDBLeaseStore) -> None:
    # WHEN we create a lease THEN its item says LEASE, so KCL 3.5 single-table readers take it for a lease
    assert store.create_lease_if_absent(Lease(lease_key="shardId-000000000077"))
    raw = store.get_raw_item("shardId-000000000077")
    assert raw is not None and raw["entityType"] == {"S": "LEASE"}


# --- batched reads ------------------------------------------------------------------------------------------------


def test_get_leases_reads_many_keys_in_batches_and_leaves_out_what_is_not_a_lease(
    store: DynamoDBLeaseStore, ddb: Any
) -> None:
    # GIVEN 230 leases, a foreign item and a corrupt one
    keys = [f"shardId-{n:012d}" for n in range(230)]
    for key in keys:
        assert store.create_lease_if_absent(Lease(lease_key=key))
    fixture = kcl_fixture.load()
    for item in fixture["foreign"][:1] + fixture["corrupt"][:1]:
        ddb.put_item(TableName=store.table_name, Item=item)
    calls: list[str] = []
    ddb.meta.events.register("before-call.dynamodb.*", lambda model, **_: calls.append(model.name))
    # WHEN they are read together with a key that does not exist (and one asked twice)
    odd = [fixture["foreign"][0]["leaseKey"]["S"], fixture["corrupt"][0]["leaseKey"]["S"], "shardId-missing"]
    found = store.get_leases([*keys, keys[0], *odd])
    # THEN every lease comes back, in three requests of at most 100 keys, and nothing else does
    assert sorted(found) == keys
    assert all(found[key].lease_key == key for key in keys)
    assert calls == ["BatchGetItem"] * 3
    # AND one key alone, or none, needs no batch at all
    calls.clear()
    assert store.get_leases([]) == {} and calls == []


def test_a_worker_discovers_many_handed_over_leases_in_one_request(store: DynamoDBLeaseStore, ddb: Any) -> None:
    # GIVEN eight leases the leader assigned to w, one of them finished and one in a hand-off to w
    keys = [f"shardId-{n:012d}" for n in range(8)]
    for key in keys:
        assigned_lease(store, key, "w")
    finished = store.get_lease(keys[0])
    assert finished is not None and store.checkpoint(finished, "w", SHARD_END) is not None
    moving = assigned_lease(store, "shardId-handoff", "old")
    assert store.initiate_graceful_handoff(moving, "w") is not None
    calls: list[str] = []
    ddb.meta.events.register("before-call.dynamodb.*", lambda model, **_: calls.append(model.name))
    # WHEN w discovers them from the leader's notice
    found = LeaseDiscoverer(store, "w").discover_keys([*keys, "shardId-handoff"], already_held=set())
    # THEN one consistent batch read finds the seven it may start (not the finished one, not the hand-off)
    assert [lease.lease_key for lease in found] == keys[1:]
    assert calls == ["BatchGetItem"]
