"""Shard sync against real resharding: graph A built with MergeShards/SplitShard on kinesalite, leases in moto."""

from __future__ import annotations

import logging
import sys
import uuid
from typing import Any

import botocore.exceptions
import pytest

from tests.support.processes import CLI_BOUND_S, run_command
from tests.support.shard_graph_a import AT, CASES, TH, L
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.errors import DependencyError, StreamMissingError, ThrottledError
from worker_lib.core.models import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease, ShardInfo
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.shardsync.detector import KinesisShardDetector, ShardListing
from worker_lib.shardsync.syncer import ShardSyncer
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, split_shard

pytestmark = pytest.mark.kinesalite


def sync_config(position: InitialPosition) -> ShardSyncConfig:
    from datetime import datetime, timezone

    stamp = datetime(2026, 1, 1, tzinfo=timezone.utc) if position is AT else None
    return ShardSyncConfig(initial_position=position, initial_timestamp=stamp)


@pytest.fixture(scope="module")
def kinesis(kinesalite_endpoint: str) -> Any:
    return aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=2))


@pytest.fixture(scope="module")
def graph_a(kinesis: Any) -> tuple[str, dict[int, str]]:
    """A 6-shard stream resharded into graph A; returns the stream and graph label → real shard id."""
    stream = f"graph-a-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, stream, 6)
    roots = sorted(list_all_shards(kinesis, stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
    label = {n: s["ShardId"] for n, s in enumerate(roots)}

    def child_of(*parents: str) -> str:
        for s in list_all_shards(kinesis, stream):
            if {s.get("ParentShardId"), s.get("AdjacentParentShardId")} - {None} == set(parents):
                return str(s["ShardId"])
        raise AssertionError(f"no child of {parents}")

    merge_shards(kinesis, stream, label[0], label[1])
    label[6] = child_of(label[0], label[1])
    merge_shards(kinesis, stream, label[2], label[3])
    label[7] = child_of(label[2], label[3])
    merge_shards(kinesis, stream, label[6], label[7])
    label[8] = child_of(label[6], label[7])
    split_shard(kinesis, stream, label[5])
    nine, ten = sorted(
        (s for s in list_all_shards(kinesis, stream) if s.get("ParentShardId") == label[5]),
        key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
    )
    label[9], label[10] = nine["ShardId"], ten["ShardId"]
    return stream, label


@pytest.fixture
def store(moto_aws: AwsConfig) -> DynamoDBLeaseStore:
    app = f"sync-{uuid.uuid4().hex[:10]}"
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app, ddb)
    return DynamoDBLeaseStore(app, client=ddb)


def test_graph_a_is_really_resharded(kinesis: Any, graph_a: tuple[str, dict[int, str]]) -> None:
    stream, label = graph_a
    listing = {s["ShardId"]: s for s in list_all_shards(kinesis, stream)}
    open_ids = {sid for sid, s in listing.items() if "EndingSequenceNumber" not in s["SequenceNumberRange"]}
    assert open_ids == {label[n] for n in (4, 8, 9, 10)} and len(listing) == 11


@pytest.mark.parametrize(("existing", "position", "expected"), CASES)
def test_graph_a_on_a_resharded_stream(  # noqa: PLR0917 - pytest passes fixtures and parameters positionally
    kinesis: Any,
    graph_a: tuple[str, dict[int, str]],
    store: DynamoDBLeaseStore,
    existing: tuple[int, ...],
    position: InitialPosition,
    expected: tuple[int, ...],
) -> None:
    stream, label = graph_a
    number = {sid: n for n, sid in label.items()}
    # GIVEN the row's leases (being processed: real checkpoints)
    for n in existing:
        assert store.create_lease_if_absent(
            Lease(lease_key=label[n], lease_owner="w", checkpoint=Checkpoint(sequence="1"))
        )
    # WHEN the leader syncs once
    result = ShardSyncer(store, KinesisShardDetector(stream, client=kinesis), config=sync_config(position)).sync_once()
    # THEN exactly the table's leases were created, with the checkpoints KCL gives them
    assert sorted(number[key] for key in result.created) == sorted(expected)
    assert result.shards_seen == 11 and result.listing_complete and result.deleted == ()
    want = {L: LATEST, TH: TRIM_HORIZON, AT: AT_TIMESTAMP}[position]
    listed = {s["ShardId"]: s for s in list_all_shards(kinesis, stream)}
    for key in result.created:
        lease = store.get_lease(key)
        assert lease is not None and lease.checkpoint == want and lease.lease_owner is None
        assert lease.lease_counter == 0 and lease.child_shard_ids == frozenset()
        raw = listed[key]
        assert lease.parent_shard_ids == {raw.get("ParentShardId"), raw.get("AdjacentParentShardId")} - {None}
        assert lease.starting_hash_key == raw["HashKeyRange"]["StartingHashKey"]
    # AND a second sync creates nothing more
    again = ShardSyncer(store, KinesisShardDetector(stream, client=kinesis), config=sync_config(position)).sync_once()
    assert again.created == ()


def test_resharding_while_leases_exist_creates_only_what_must_be_read(kinesis: Any, store: DynamoDBLeaseStore) -> None:
    # GIVEN a 2-shard stream with both shards leased from TRIM_HORIZON
    stream = f"live-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, stream, 2)
    syncer = ShardSyncer(store, KinesisShardDetector(stream, client=kinesis), config=sync_config(TH))
    assert len(syncer.sync_once().created) == 2
    low, high = sorted(list_all_shards(kinesis, stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
    # WHEN one shard is split and the leader syncs
    split_shard(kinesis, stream, low["ShardId"])
    after_split = syncer.sync_once()
    # THEN no lease is created: the children are descendants of a leased parent and start when it ends
    assert after_split.created == ()
    # WHEN the parent is read to its end (SHARD_END) and the leader syncs again
    parent = store.get_lease(low["ShardId"])
    assert parent is not None
    assert store.checkpoint(store.assign_lease(parent, "w") or parent, "w", SHARD_END) is not None
    repaired = syncer.sync_once()
    # THEN the children get leases from TRIM_HORIZON with the parent recorded, and the parent its children
    children = {s["ShardId"] for s in list_all_shards(kinesis, stream) if s.get("ParentShardId") == low["ShardId"]}
    assert set(repaired.created) == children
    for child in children:
        lease = store.get_lease(child)
        assert lease is not None and lease.checkpoint == TRIM_HORIZON and lease.parent_shard_ids == {low["ShardId"]}
    finished = store.get_lease(low["ShardId"])
    assert finished is not None and finished.child_shard_ids == children
    assert high["ShardId"] not in repaired.created


def test_cleanup_steps(kinesis: Any, store: DynamoDBLeaseStore) -> None:
    # GIVEN G split into P1, P2, and P1 split into C1, C2 (all leased); G and P1 finished
    stream = f"clean-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, stream, 1)
    (g,) = [s["ShardId"] for s in list_all_shards(kinesis, stream)]
    split_shard(kinesis, stream, g)
    p1, p2 = sorted(
        (s for s in list_all_shards(kinesis, stream) if s.get("ParentShardId") == g),
        key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
    )
    split_shard(kinesis, stream, p1["ShardId"])
    c1, c2 = (s["ShardId"] for s in list_all_shards(kinesis, stream) if s.get("ParentShardId") == p1["ShardId"])
    seq = Checkpoint(sequence="49590338271490256608559692538361571095921575989136588898")
    leases = {
        g: Lease(lease_key=g, checkpoint=SHARD_END),
        p1["ShardId"]: Lease(lease_key=p1["ShardId"], checkpoint=SHARD_END, parent_shard_ids=frozenset({g})),
        p2["ShardId"]: Lease(lease_key=p2["ShardId"], checkpoint=TRIM_HORIZON, parent_shard_ids=frozenset({g})),
        c1: Lease(lease_key=c1, checkpoint=seq, parent_shard_ids=frozenset({p1["ShardId"]})),
        c2: Lease(lease_key=c2, checkpoint=TRIM_HORIZON, parent_shard_ids=frozenset({p1["ShardId"]})),
    }
    for lease in leases.values():
        assert store.create_lease_if_absent(lease)
    syncer = ShardSyncer(store, KinesisShardDetector(stream, client=kinesis), config=sync_config(L))

    def advance(key: str) -> None:
        current = store.get_lease(key)
        assert current is not None
        taken = store.assign_lease(current, "w")
        assert taken is not None and store.checkpoint(taken, "w", seq) is not None

    # WHEN P2 has not started: nothing is deleted (G's children have not all started; P1's parent G exists)
    assert syncer.sync_once().deleted == ()
    # WHEN P2 starts: G is deleted (P1 finished counts as started), P1 still waits for C2
    advance(p2["ShardId"])
    assert syncer.sync_once().deleted == (g,)
    # WHEN C2 starts: P1 is deleted (its parent G is gone now)
    advance(c2)
    assert syncer.sync_once().deleted == (p1["ShardId"],)
    assert {lease.lease_key for lease in store.list_leases()} == {p2["ShardId"], c1, c2}


@pytest.mark.parametrize("backend", ["moto", "kinesalite"])
def test_a_lease_of_a_vanished_shard_is_deleted_once_the_service_confirms_it_is_gone(
    backend: str, request: pytest.FixtureRequest, store: DynamoDBLeaseStore
) -> None:
    # GIVEN a stream and, next to its shard's lease, an owned lease of a shard the stream does not have (trimmed)
    endpoint = request.getfixturevalue(f"{backend}_endpoint")
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=endpoint, max_attempts=2))
    stream = f"gone-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, stream, 1)
    (real,) = (s["ShardId"] for s in list_all_shards(kinesis, stream))
    gone = "shardId-999999999999"
    assert store.create_lease_if_absent(Lease(lease_key=gone, lease_owner="w", checkpoint=Checkpoint(sequence="3")))
    assert store.create_lease_if_absent(Lease(lease_key=real, lease_owner="w", checkpoint=Checkpoint(sequence="3")))
    # WHEN a leader built afresh (as each Lambda invocation is) syncs once
    syncer = ShardSyncer(store, KinesisShardDetector(stream, client=kinesis), config=sync_config(L))
    result = syncer.sync_once()
    # THEN the unknown shard's lease is deleted (GetShardIterator: not found) and the real one is kept
    assert result.deleted == (gone,) and result.unknown_pending == ()
    assert [lease.lease_key for lease in store.list_leases()] == [real]


@pytest.mark.parametrize("exists", [True, None], ids=["still-exists", "cannot-tell"])
def test_an_unlisted_shard_that_is_not_confirmed_gone_keeps_its_lease(
    store: DynamoDBLeaseStore, exists: bool | None
) -> None:
    # GIVEN a complete listing that misses a leased shard the service still knows (or cannot tell about)
    assert store.create_lease_if_absent(Lease(lease_key="shardId-000000000009", checkpoint=Checkpoint(sequence="7")))
    detector = FixedDetector(TWO_SHARDS, exists={"shardId-000000000009": exists})
    syncer = ShardSyncer(store, detector, config=sync_config(L))
    # WHEN synced twice THEN the lease is kept and reported pending each time
    for _ in range(2):
        result = syncer.sync_once()
        assert result.deleted == () and result.unknown_pending == ("shardId-000000000009",)
    assert detector.asked == ["shardId-000000000009"] * 2


def test_unknown_shard_leases_are_kept_when_deletion_is_disabled(store: DynamoDBLeaseStore) -> None:
    assert store.create_lease_if_absent(Lease(lease_key="shardId-000000000009", checkpoint=SHARD_END))
    detector = FixedDetector(TWO_SHARDS, exists={"shardId-000000000009": False})
    config = ShardSyncConfig(initial_position=L, delete_unknown_shard_leases=False)
    result = ShardSyncer(store, detector, config=config).sync_once()
    assert result.deleted == () and detector.asked == [] and store.get_lease("shardId-000000000009") is not None


@pytest.mark.parametrize("backend", ["moto", "kinesalite"])
def test_detector_paginates(backend: str, request: pytest.FixtureRequest) -> None:
    endpoint = request.getfixturevalue(f"{backend}_endpoint")
    client = aws.client("kinesis", AwsConfig(endpoint_url=endpoint, max_attempts=2))
    stream = f"pages-{uuid.uuid4().hex[:8]}"
    create_stream(client, stream, 25)
    detector = KinesisShardDetector(stream, client=client, page_size=10)
    listing = detector.list_shards()
    assert listing.complete and len({s.shard_id for s in listing.shards}) == 25
    # moto pages by MaxResults (3 pages of ≤ 10); kinesalite ignores MaxResults and answers in one page
    assert listing.pages == (3 if backend == "moto" else 1)


def test_a_missing_stream_is_a_typed_error(kinesis: Any) -> None:
    with pytest.raises(StreamMissingError):
        KinesisShardDetector("no-such-stream", client=kinesis).list_shards()


def test_leader_once_runs_a_shard_sync_and_exits_0(moto_endpoint: str, moto_aws: AwsConfig) -> None:
    app = f"cli-{uuid.uuid4().hex[:8]}"
    ddb = aws.client("dynamodb", moto_aws)
    kinesis = aws.client("kinesis", moto_aws)
    ensure_tables(app, ddb)
    create_stream(kinesis, f"{app}-s", 3)
    args = [sys.executable, "-m", "worker_lib.cli", "leader", "--app", app, "--stream", f"{app}-s", "--once"]
    args += ["--initial-position", "TRIM_HORIZON", "--endpoint-url", moto_endpoint]
    first = run_command(args, timeout_s=CLI_BOUND_S)
    assert first.returncode == 0, first.stderr
    assert "created 3 lease(s)" in first.stdout
    second = run_command([*args, "--json"], timeout_s=CLI_BOUND_S)
    assert second.returncode == 0, second.stderr
    import json

    report = json.loads(second.stdout)
    assert report["leader"] and report["shard_sync"]["created"] == []


# --- detector behaviour on scripted answers (what no emulator produces: throttling, expiry, mid-listing failure) ---


class ScriptedKinesis:
    """ListShards the AWS way (follow-ups carry NextToken only) with scripted errors by call number."""

    def __init__(self, shards: int, *, errors: dict[int, str] | None = None) -> None:
        self.shards = [
            {"ShardId": f"shardId-{n:012d}", "HashKeyRange": {}, "SequenceNumberRange": {}} for n in range(shards)
        ]
        self.errors = dict(errors or {})
        self.calls: list[dict[str, Any]] = []

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        code = self.errors.get(len(self.calls))
        if code:
            raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "scripted"}}, "GetShardIterator")
        return {"ShardIterator": "it"}

    def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        code = self.errors.get(len(self.calls))
        if code:
            raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "scripted"}}, "ListShards")
        if "NextToken" in kwargs:
            assert set(kwargs) <= {"NextToken", "MaxResults"}, kwargs  # AWS rejects StreamName with NextToken
            start, page = (int(part) for part in kwargs["NextToken"].split(":"))
        else:
            start, page = 0, kwargs["MaxResults"]
        end = start + page
        answer: dict[str, Any] = {"Shards": self.shards[start:end]}
        if end < len(self.shards):
            answer["NextToken"] = f"{end}:{page}"
        return answer


def test_detector_pages_with_next_token_only_after_the_first_call() -> None:
    # GIVEN an AWS-like endpoint with 7 shards, pages of 3
    fake = ScriptedKinesis(7)
    # WHEN listed
    listing = KinesisShardDetector("s", client=fake, page_size=3, clock=ManualClock()).list_shards()
    # THEN 3 pages, all shards, StreamName and MaxResults on the first call only
    assert listing == ShardListing(shards=listing.shards, complete=True, pages=3) and len(listing.shards) == 7
    assert fake.calls[0] == {"StreamName": "s", "MaxResults": 3}
    assert all(set(call) == {"NextToken"} for call in fake.calls[1:])


@pytest.mark.parametrize("code", ["LimitExceededException", "ThrottlingException", "ResourceInUseException"])
def test_detector_backs_off_on_the_injected_clock_and_retries(code: str) -> None:
    # GIVEN an endpoint that answers the first two calls with a retryable error
    fake = ScriptedKinesis(2, errors={1: code, 2: code})
    clock = ManualClock()
    before = clock.monotonic()
    # WHEN listed
    listing = KinesisShardDetector("s", client=fake, clock=clock, backoff_base_s=0.2).list_shards()
    # THEN the listing completes after exponential backoff (0.2 s + 0.4 s) measured on the manual clock
    assert listing.complete and len(listing.shards) == 2 and len(fake.calls) == 3
    assert clock.monotonic() - before == pytest.approx(0.6)


def test_detector_gives_up_with_a_typed_error_after_max_attempts() -> None:
    fake = ScriptedKinesis(2, errors=dict.fromkeys(range(1, 10), "LimitExceededException"))
    with pytest.raises(ThrottledError):
        KinesisShardDetector("s", client=fake, clock=ManualClock(), max_attempts=3).list_shards()
    assert len(fake.calls) == 3


@pytest.mark.parametrize(
    ("code", "error"), [("ResourceNotFoundException", StreamMissingError), ("AccessDeniedException", DependencyError)]
)
def test_detector_translates_other_errors_without_retrying(code: str, error: type[Exception]) -> None:
    fake = ScriptedKinesis(2, errors={1: code})
    with pytest.raises(error):
        KinesisShardDetector("s", client=fake, clock=ManualClock()).list_shards()
    assert len(fake.calls) == 1


def test_a_listing_that_fails_after_the_first_page_is_incomplete_not_shorter() -> None:
    # GIVEN an endpoint that fails for good on the second page
    fake = ScriptedKinesis(5, errors={2: "InternalFailure"})
    # WHEN listed THEN the first page is returned, flagged incomplete
    listing = KinesisShardDetector("s", client=fake, page_size=2, clock=ManualClock()).list_shards()
    assert not listing.complete and len(listing.shards) == 2 and listing.pages == 1


def test_an_expired_page_token_restarts_the_listing_once() -> None:
    # GIVEN a token that expires between the first and second page
    fake = ScriptedKinesis(5, errors={2: "ExpiredNextTokenException"})
    # WHEN listed THEN the listing starts over and completes without duplicates
    listing = KinesisShardDetector("s", client=fake, page_size=2, clock=ManualClock()).list_shards()
    assert listing.complete and [s.shard_id for s in listing.shards] == [s["ShardId"] for s in fake.shards]
    assert fake.calls[2] == {"StreamName": "s", "MaxResults": 2}
    # AND a token that keeps expiring gives an incomplete listing, not an endless loop
    always = ScriptedKinesis(5, errors={2: "ExpiredNextTokenException", 4: "ExpiredNextTokenException"})
    assert not KinesisShardDetector("s", client=always, page_size=2, clock=ManualClock()).list_shards().complete


# --- syncer on listings no emulator gives: partial answers -----------------------------------------------------


class FixedDetector:
    def __init__(
        self, shards: list[ShardInfo], *, complete: bool = True, exists: dict[str, bool | None] | None = None
    ) -> None:
        self.listing = ShardListing(shards=tuple(shards), complete=complete)
        self.exists = exists or {}
        self.asked: list[str] = []

    def list_shards(self) -> ShardListing:
        return self.listing

    def shard_exists(self, shard_id: str) -> bool | None:
        self.asked.append(shard_id)
        return self.exists.get(shard_id, True)


HALF = 2**127
TWO_SHARDS = [
    ShardInfo(shard_id="shardId-000000000000", ending_hash_key=str(HALF - 1)),
    ShardInfo(shard_id="shardId-000000000001", starting_hash_key=str(HALF)),
]


def test_an_incomplete_listing_writes_nothing(store: DynamoDBLeaseStore) -> None:
    # GIVEN an empty table and a listing flagged incomplete
    syncer = ShardSyncer(store, FixedDetector(TWO_SHARDS, complete=False), config=sync_config(TH))
    # WHEN synced THEN no lease is created and the result says why
    result = syncer.sync_once()
    assert result.created == () and not result.listing_complete and store.list_leases() == []


def test_a_listing_with_a_hole_creates_nothing_and_never_condemns_unlisted_leases(
    store: DynamoDBLeaseStore,
) -> None:
    # GIVEN a lease of a shard missing from a listing that also misses half the key space
    assert store.create_lease_if_absent(Lease(lease_key="shardId-000000000001", checkpoint=Checkpoint(sequence="7")))
    syncer = ShardSyncer(store, FixedDetector(TWO_SHARDS[:1]), config=sync_config(L))
    # WHEN synced twice (two complete listings would otherwise delete an unknown shard's lease)
    results = [syncer.sync_once(), syncer.sync_once()]
    # THEN nothing is created or deleted, the hole is reported as skipped
    assert all(r.created == () and r.deleted == () and r.unknown_pending == () for r in results)
    assert "no open shard" in results[0].skipped[0]
    assert [lease.lease_key for lease in store.list_leases()] == ["shardId-000000000001"]


def test_each_created_and_deleted_lease_is_logged_with_its_reason(
    store: DynamoDBLeaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a finished parent whose two children have started, and an empty slot for nothing else
    parent = ShardInfo(shard_id="shardId-000000000000", ending_sequence_number="9")
    children = [
        ShardInfo(shard_id="shardId-000000000001", parent_shard_id=parent.shard_id, ending_hash_key=str(HALF - 1)),
        ShardInfo(shard_id="shardId-000000000002", parent_shard_id=parent.shard_id, starting_hash_key=str(HALF)),
    ]
    assert store.create_lease_if_absent(Lease(lease_key=parent.shard_id, checkpoint=SHARD_END))
    assert store.create_lease_if_absent(
        Lease(
            lease_key=children[0].shard_id,
            checkpoint=Checkpoint(sequence="5"),
            parent_shard_ids=frozenset({parent.shard_id}),
        )
    )
    syncer = ShardSyncer(store, FixedDetector([parent, *children]), config=sync_config(L))
    caplog.set_level(logging.INFO, logger="worker_lib.shardsync")
    # WHEN synced: the missing child lease is repaired
    first = syncer.sync_once()
    assert first.created == (children[1].shard_id,) and first.children_recorded == (parent.shard_id,)
    # AND once that child has started, the parent is deleted
    child = store.get_lease(children[1].shard_id)
    assert child is not None
    taken = store.assign_lease(child, "w")
    assert taken is not None and store.checkpoint(taken, "w", Checkpoint(sequence="8")) is not None
    second = syncer.sync_once()
    assert second.deleted == (parent.shard_id,) and second.created == ()
    # THEN one log line per write, each with its reason
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lease ")]
    assert len(lines) == 2
    assert lines[0].startswith(f"lease created lease={children[1].shard_id} checkpoint=TRIM_HORIZON reason=child of")
    assert lines[1].startswith(f"lease deleted lease={parent.shard_id} reason=finished")


@pytest.mark.parametrize(
    ("errors", "answer", "calls"),
    [
        ({}, True, 1),
        ({1: "ResourceNotFoundException"}, False, 1),
        ({1: "LimitExceededException", 2: "ProvisionedThroughputExceededException"}, True, 3),
        ({1: "AccessDeniedException"}, None, 1),
        (dict.fromkeys(range(1, 10), "LimitExceededException"), None, 6),
    ],
    ids=["exists", "not-found", "throttled-then-exists", "denied", "always-throttled"],
)
def test_shard_exists_asks_get_shard_iterator(errors: dict[int, str], answer: bool | None, calls: int) -> None:
    # GIVEN scripted GetShardIterator answers WHEN asked about a shard THEN only "not found" means gone
    fake = ScriptedKinesis(1, errors=errors)
    detector = KinesisShardDetector("s", client=fake, clock=ManualClock(), max_attempts=6)
    assert detector.shard_exists("shardId-000000000000") is answer
    assert len(fake.calls) == calls
    assert fake.calls[0] == {"StreamName": "s", "ShardId": "shardId-000000000000", "ShardIteratorType": "TRIM_HORIZON"}
