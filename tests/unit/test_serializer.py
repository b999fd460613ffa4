"""Lease ⇄ item translation: KCL 3.x names and types exactly; foreign and corrupt items recognised."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import kcl_fixture
from worker_lib.core.errors import CorruptItemError
from worker_lib.core.models import SHARD_END, Checkpoint, Lease
from worker_lib.leases import serializer

FIXTURE = kcl_fixture.load()


@pytest.mark.parametrize("item", FIXTURE["items"], ids=lambda i: i["leaseKey"]["S"])
def test_kcl_items_round_trip_unchanged(item: dict[str, Any]) -> None:
    # GIVEN an item as KCL 3.x writes it
    # WHEN it is read as a lease and written back
    lease = serializer.from_item(item)
    again = serializer.to_item(lease)
    # THEN the item is identical, including attributes this version does not model
    assert serializer.canonical(again) == serializer.canonical(item)


def test_fields_are_read_with_kcl_meaning() -> None:
    # GIVEN the fixture's leases keyed by leaseKey
    leases = {lease.lease_key: lease for lease in map(serializer.from_item, FIXTURE["items"])}
    # THEN each KCL attribute lands in its field
    pending = leases["shardId-000000000001"]
    assert pending.checkpoint == Checkpoint(
        sequence="49655487212340346062361743093325362462615161021838049298", sub_sequence=3
    )
    assert pending.pending_checkpoint is not None and pending.pending_checkpoint.sequence.endswith("300")
    assert pending.owner_switches_since_checkpoint == 2
    assert "pendingCheckpointState" in pending.extra
    merged = leases["shardId-000000000004"]
    assert merged.lease_owner is None
    assert merged.parent_shard_ids == {"shardId-000000000002", "shardId-000000000003"}
    finished = leases["shardId-000000000002"]
    assert finished.checkpoint == SHARD_END and finished.is_finished
    assert finished.child_shard_ids == {"shardId-000000000004"}
    handoff = leases["shardId-000000000005"]
    assert handoff.checkpoint_owner == "worker-a" and handoff.lease_owner == "worker-c"
    assert handoff.actual_owner == "worker-a" and handoff.is_handoff_in_progress
    assert handoff.throughput_kbps == pytest.approx(64.000001)
    multi = leases["123456789012:orders:1700000000:shardId-000000000007"]
    assert multi.shard_id == "shardId-000000000007"


@pytest.mark.parametrize("item", FIXTURE["foreign"], ids=lambda i: i["leaseKey"]["S"])
def test_items_of_other_entity_types_are_foreign(item: dict[str, Any]) -> None:
    assert serializer.is_foreign(item)


@pytest.mark.parametrize("item", FIXTURE["items"], ids=lambda i: i["leaseKey"]["S"])
def test_lease_items_are_not_foreign(item: dict[str, Any]) -> None:
    assert not serializer.is_foreign(item)


@pytest.mark.parametrize("item", FIXTURE["corrupt"], ids=lambda i: i["leaseKey"]["S"])
def test_corrupt_items_raise_a_typed_error_naming_the_key(item: dict[str, Any]) -> None:
    with pytest.raises(CorruptItemError) as info:
        serializer.from_item(item)
    assert info.value.key == item["leaseKey"]["S"]


def test_a_new_lease_is_written_with_only_the_attributes_kcl_writes() -> None:
    # GIVEN a fresh, unowned lease without parents
    lease = Lease(lease_key="shardId-000000000009")
    # WHEN serialised
    item = serializer.to_item(lease)
    # THEN no empty sets and no owner attribute are written (DynamoDB rejects empty sets; GSI needs absence)
    assert set(item) == {
        "leaseKey",
        "leaseCounter",
        "checkpoint",
        "checkpointSubSequenceNumber",
        "ownerSwitchesSinceCheckpoint",
    }
    assert item["checkpoint"] == {"S": "TRIM_HORIZON"}


def test_a_new_multi_stream_lease_names_its_stream_and_shard_as_kcl_writes_them() -> None:
    # GIVEN a lease of a multi-stream application (key account:stream:epoch:shardId), created by us
    lease = Lease(lease_key="123456789012:orders:1700000000:shardId-000000000009")
    # WHEN serialised THEN streamName and shardId are there (DynamoDBMultiStreamLeaseSerializer)
    item = serializer.to_item(lease)
    assert item["streamName"] == {"S": "123456789012:orders:1700000000"}
    assert item["shardId"] == {"S": "shardId-000000000009"}


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (1.5, "1.5"), (812.3456789, "812.345679"), (100.0, "100"), (1e-9, "0"), (12345678.25, "12345678.25")],
)
def test_throughput_is_written_with_at_most_six_decimals_in_canonical_form(value: float, text: str) -> None:
    assert serializer.number(value) == {"N": text}
