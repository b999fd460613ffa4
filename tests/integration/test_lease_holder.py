"""The worker's lease holder and discoverer against a moto server: renewal, self-fencing, fenced checkpoints."""

from __future__ import annotations

import threading
from typing import Any

import botocore.exceptions
import pytest

from tests.support.leases import assigned_lease
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import SHARD_END, Checkpoint
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.renewer import LeaseDiscoverer, LeaseHolder
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.processor import InvalidCheckpointError
from worker_lib.tables.admin import ensure_tables


@pytest.fixture
def store(moto_aws: AwsConfig, app_name: str) -> DynamoDBLeaseStore:
    ddb: Any = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    return DynamoDBLeaseStore(app_name, client=ddb)


def test_discovery_finds_only_leases_assigned_to_us_without_a_handoff(store: DynamoDBLeaseStore) -> None:
    # GIVEN leases owned by us, by another worker, and one being handed off to us
    assigned_lease(store, "shard-a", "w1")
    assigned_lease(store, "shard-b", "w2")
    moving = assigned_lease(store, "shard-c", "w2")
    assert store.initiate_graceful_handoff(moving, "w1") is not None
    # WHEN w1 discovers
    found = LeaseDiscoverer(store, "w1").discover(set())
    # THEN it gets shard-a only (shard-c is still processed by w2)
    assert [lease.lease_key for lease in found] == ["shard-a"]
    assert LeaseDiscoverer(store, "w1").discover({"shard-a"}) == []


def test_renewal_keeps_leases_valid_and_writes_throughput(store: DynamoDBLeaseStore) -> None:
    # GIVEN a worker holding a lease
    clock = ManualClock()
    holder = LeaseHolder(store, "w1", clock=clock, throughput=lambda key: 12.5)
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    # WHEN time passes with renewals every 3.3 s
    for _ in range(5):
        clock.advance(3.3)
        report = holder.renew_all()
        assert report.renewed == ("shard-a",)
    # THEN the lease stays valid and the table shows our counter and throughput
    assert holder.is_valid("shard-a")
    stored = store.get_lease("shard-a")
    assert stored is not None and stored.lease_counter == 7 and stored.throughput_kbps == 12.5


def test_a_worker_that_cannot_renew_stops_before_anyone_can_take_over(store: DynamoDBLeaseStore) -> None:
    # GIVEN a worker whose renewals stop reaching DynamoDB (we simply stop calling renew_all)
    clock = ManualClock()
    config = LeaseConfig(failover_time_ms=10_000)
    holder = LeaseHolder(store, "w1", config=config, clock=clock)
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    # WHEN 9.9 s pass the lease is still valid; at the failover time minus epsilon it is not
    clock.advance(9.9)
    assert holder.is_valid("shard-a")
    clock.advance(0.1)
    # THEN processing must stop: the lease is invalid (the leader needs ≥ 10 s of no counter change to expire it)
    assert not holder.is_valid("shard-a")
    # AND a checkpoint attempt is refused locally, without a write
    assert holder.checkpoint("shard-a", Checkpoint(sequence="123")) is None


def test_a_lease_taken_by_another_worker_is_reported_lost(store: DynamoDBLeaseStore) -> None:
    # GIVEN w1 holds a lease and the leader reassigns it (it expired from the leader's view)
    clock = ManualClock()
    lost: list[tuple[str, str]] = []
    holder = LeaseHolder(store, "w1", clock=clock, on_lost=lambda key, why: lost.append((key, why)))
    lease = assigned_lease(store, "shard-a", "w1")
    assert holder.take(lease)
    current = store.get_lease("shard-a")
    assert current is not None and store.assign_lease(current, "w2") is not None
    # WHEN w1 renews
    report = holder.renew_all()
    # THEN the lease is lost, dropped, and the callback fired once
    assert report.lost == ("shard-a",) and holder.held_keys() == []
    assert [key for key, _ in lost] == ["shard-a"]
    # AND a stale checkpoint from w1 cannot land
    assert holder.checkpoint("shard-a", Checkpoint(sequence="999")) is None
    stored = store.get_lease("shard-a")
    assert stored is not None and stored.lease_owner == "w2" and not stored.checkpoint.is_real


def test_checkpoints_and_renewals_on_one_lease_never_race_into_a_false_loss(store: DynamoDBLeaseStore) -> None:
    # GIVEN a held lease, a thread checkpointing and a thread renewing at the same time
    holder = LeaseHolder(store, "w1")
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    errors: list[str] = []

    def checkpointer() -> None:
        for n in range(1, 21):
            if holder.checkpoint("shard-a", Checkpoint(sequence=str(1000 + n))) is None:
                errors.append(f"checkpoint {n} lost")

    def renewer() -> None:
        for _ in range(20):
            if holder.renew_all().lost:
                errors.append("renewal lost")

    threads = [threading.Thread(target=checkpointer), threading.Thread(target=renewer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=hang_bound_s(0.0))  # liveness: 40 calls, no timing (the floor)
    assert not any(thread.is_alive() for thread in threads), "a thread hangs"
    # THEN nothing was reported lost and the last checkpoint is in the table with 1 + 1 + 40 counter moves
    assert errors == []
    stored = store.get_lease("shard-a")
    assert stored is not None and stored.checkpoint == Checkpoint(sequence="1020")
    assert stored.lease_counter == 42


def test_graceful_handoff_is_followed_then_completed(store: DynamoDBLeaseStore) -> None:
    # GIVEN w1 holds a lease and the leader starts a handoff to w2
    holder = LeaseHolder(store, "w1")
    lease = assigned_lease(store, "shard-a", "w1")
    assert holder.take(lease)
    current = store.get_lease("shard-a")
    assert current is not None and store.initiate_graceful_handoff(current, "w2") is not None
    # WHEN w1 renews, it learns of the handoff and keeps the lease alive as checkpoint owner
    report = holder.renew_all()
    assert report.handoffs == ("shard-a",) and holder.handoff_requested("shard-a")
    # AND its final checkpoint still lands
    assert holder.checkpoint("shard-a", Checkpoint(sequence="42")) is not None
    # AND completing the handoff gives the lease to w2 with no checkpoint owner
    assert holder.complete_handoff("shard-a")
    stored = store.get_lease("shard-a")
    assert stored is not None and stored.lease_owner == "w2" and stored.checkpoint_owner is None
    assert stored.checkpoint == Checkpoint(sequence="42") and holder.held_keys() == []
    # AND w2 can now discover it
    assert [x.lease_key for x in LeaseDiscoverer(store, "w2").discover(set())] == ["shard-a"]


def test_eviction_frees_the_lease_at_once(store: DynamoDBLeaseStore) -> None:
    # GIVEN w1 holds two leases
    holder = LeaseHolder(store, "w1")
    for key in ("shard-a", "shard-b"):
        assert holder.take(assigned_lease(store, key, "w1"))
    # WHEN it shuts down and gives them up
    assert all(holder.evict(key) for key in holder.held_keys())
    # THEN both are unowned in the table and no longer held
    for key in ("shard-a", "shard-b"):
        stored = store.get_lease(key)
        assert stored is not None and stored.lease_owner is None
    assert holder.held_keys() == []


def test_many_leases_renew_in_parallel(store: DynamoDBLeaseStore) -> None:
    # GIVEN a worker with 40 leases
    holder = LeaseHolder(store, "w1", max_parallel_renewals=8)
    for n in range(40):
        assert holder.take(assigned_lease(store, f"shard-{n:03d}", "w1"))
    # WHEN it renews them all
    report = holder.renew_all()
    holder.close()
    # THEN every one is renewed
    assert len(report.renewed) == 40 and report.lost == () and report.failed == ()


def test_a_checkpoint_after_a_handoff_started_between_renewals_is_written_as_checkpoint_owner(
    store: DynamoDBLeaseStore,
) -> None:
    # GIVEN w1 holds a lease and the leader starts a graceful handoff to w2 before w1's next renewal
    holder = LeaseHolder(store, "w1")
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    current = store.get_lease("shard-a")
    assert current is not None and store.initiate_graceful_handoff(current, "w2") is not None
    # WHEN w1 checkpoints (its view still says it is the plain owner)
    written = holder.checkpoint("shard-a", Checkpoint(sequence="77"))
    # THEN the checkpoint lands as checkpoint owner, the lease is not lost, and the handoff is noticed
    assert written is not None and written.checkpoint == Checkpoint(sequence="77")
    assert holder.held_keys() == ["shard-a"] and holder.handoff_requested("shard-a")
    # AND completing the handoff gives w2 the lease with that checkpoint
    assert holder.complete_handoff("shard-a")
    stored = store.get_lease("shard-a")
    assert stored is not None and stored.lease_owner == "w2" and stored.checkpoint == Checkpoint(sequence="77")


def test_a_checkpoint_that_fails_transiently_is_retried_not_redelivered(store: DynamoDBLeaseStore) -> None:
    # GIVEN a held lease and a checkpointer whose first two UpdateItem calls fail with a 5xx after retries
    holder = LeaseHolder(store, "w1")
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    client = store._client  # the store's own botocore client
    failures = {"left": 2}

    def fail(params: dict[str, Any], **_: Any) -> None:
        if failures["left"] > 0 and "#checkpoint =" in str(params.get("UpdateExpression", "")):
            failures["left"] -= 1
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://dynamodb")

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", fail)
    checkpointer = LeaseCheckpointer(holder, "shard-a", initial=Checkpoint(sequence="1"))
    checkpointer.largest_permitted = Checkpoint(sequence="5")
    try:
        # WHEN the processor checkpoints
        checkpointer.checkpoint()
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.UpdateItem", fail)
    # THEN it succeeded after the transient failures, without raising into the processor
    stored = store.get_lease("shard-a")
    assert failures["left"] == 0 and stored is not None and stored.checkpoint == Checkpoint(sequence="5")


@pytest.mark.parametrize(
    ("sequence", "written"),
    [("9", SHARD_END), (None, SHARD_END), ("7", Checkpoint(sequence="7"))],
)
def test_at_shard_end_a_checkpoint_at_the_last_record_is_shard_end(
    store: DynamoDBLeaseStore, sequence: str | None, written: Checkpoint
) -> None:
    # GIVEN a held lease whose shard ended after record 9 was delivered
    holder = LeaseHolder(store, "w1")
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    checkpointer = LeaseCheckpointer(holder, "shard-a", initial=Checkpoint(sequence="1"))
    checkpointer.largest_permitted = Checkpoint(sequence="9")
    checkpointer.end_shard()
    # WHEN the processor checkpoints the last record (as MultiLang clients do), or with no value, or earlier
    checkpointer.checkpoint(sequence)
    # THEN the last record and no value mean SHARD_END (KCL's rule); an earlier record is that record
    stored = store.get_lease("shard-a")
    assert stored is not None and stored.checkpoint == written


def test_at_shard_end_a_checkpoint_beyond_the_last_record_is_refused(store: DynamoDBLeaseStore) -> None:
    holder = LeaseHolder(store, "w1")
    assert holder.take(assigned_lease(store, "shard-a", "w1"))
    checkpointer = LeaseCheckpointer(holder, "shard-a", initial=Checkpoint(sequence="1"))
    checkpointer.largest_permitted = Checkpoint(sequence="9")
    checkpointer.end_shard()
    with pytest.raises(InvalidCheckpointError, match="beyond the last delivered record 9"):
        checkpointer.checkpoint("10")
