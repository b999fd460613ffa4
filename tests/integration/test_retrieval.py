"""ShardRecordFetcher against real Kinesis emulators (moto server and kinesalite).

Time is a ManualClock: the fetcher's pacing, idle waits and throttling backoff advance it instead of sleeping,
so the call times recorded through botocore hooks show the schedule exactly. Faults the emulators cannot
produce on demand (expired iterators, throttling) are injected with botocore hooks (tests/support).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.support.kinesis_faults import add_child_shards, fail_calls, one_attempt_kinesis, record_calls
from tests.support.kpl import put_aggregate
from worker_lib.core.clock import SYSTEM_CLOCK, ManualClock
from worker_lib.core.config import InitialPosition
from worker_lib.core.errors import ConfigError, DependencyError, StreamMissingError
from worker_lib.core.models import SHARD_END, TRIM_HORIZON, Checkpoint, KinesisRecord
from worker_lib.retrieval import RecordBatch, ShardRecordFetcher
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.testing.streams import create_stream, list_all_shards, split_shard

SHARD = "shardId-000000000000"


@pytest.fixture(params=["moto", pytest.param("kinesalite", marks=pytest.mark.kinesalite)])
def kinesis(request: pytest.FixtureRequest) -> Any:
    """A Kinesis client on moto, then on kinesalite; one attempt per call, so faults reach the fetcher."""
    return one_attempt_kinesis(str(request.getfixturevalue(f"{request.param}_endpoint")))


@pytest.fixture
def kinesalite(kinesalite_endpoint: str) -> Any:
    return one_attempt_kinesis(kinesalite_endpoint)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def put(kinesis: Any, stream: str, data: bytes, key: str = "pk") -> str:
    return str(kinesis.put_record(StreamName=stream, Data=data, PartitionKey=key)["SequenceNumber"])


def fetcher(
    kinesis: Any, stream: str, clock: ManualClock, start: Checkpoint | InitialPosition, **kwargs: Any
) -> ShardRecordFetcher:
    config = kwargs.pop("config", RetrievalConfig())
    return ShardRecordFetcher(stream, SHARD, kinesis_client=kinesis, start=start, clock=clock, config=config, **kwargs)


def drain(f: ShardRecordFetcher, want: int, *, max_calls: int = 40) -> tuple[list[KinesisRecord], list[RecordBatch]]:
    """Fetch until ``want`` records arrived (or the shard ended); all records and all batches."""
    got: list[KinesisRecord] = []
    batches: list[RecordBatch] = []
    for _ in range(max_calls):
        batch = f.fetch()
        batches.append(batch)
        got.extend(batch.records)
        if len(got) >= want or batch.end_of_shard:
            return got, batches
    return got, batches


def positions(records: list[KinesisRecord]) -> list[tuple[str, int, bytes]]:
    return [(r.sequence_number, r.sub_sequence_number, r.data) for r in records]


# --- initial positions ---------------------------------------------------------------------------------------


def test_trim_horizon_reads_everything_in_order(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN five records in the shard
    sequences = [put(kinesis, stream, f"r{i}".encode()) for i in range(5)]
    # WHEN read from TRIM_HORIZON (as an initial position and as a checkpoint sentinel)
    for start in (InitialPosition.TRIM_HORIZON, TRIM_HORIZON):
        records, batches = drain(fetcher(kinesis, stream, clock, start), 5)
        # THEN all five arrive in order, undecorated, with millis-behind-latest reported
        assert [r.sequence_number for r in records] == sequences
        assert [r.data for r in records] == [f"r{i}".encode() for i in range(5)]
        assert all(not r.aggregated and r.sub_sequence_number == 0 for r in records)
        assert all(r.approximate_arrival_timestamp is not None for r in records)
        assert batches[-1].millis_behind_latest is not None and not batches[-1].end_of_shard
        assert batches[0].data_bytes == sum(len(r.data) for r in batches[0].records)


def test_latest_reads_only_what_arrives_afterwards(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN records written before the consumer starts
    for i in range(3):
        put(kinesis, stream, f"old{i}".encode())
    f = fetcher(kinesis, stream, clock, InitialPosition.LATEST)
    # WHEN the consumer starts at LATEST, and then new records arrive
    first = f.fetch()
    new = [put(kinesis, stream, f"new{i}".encode()) for i in range(2)]
    records, _ = drain(f, 2)
    # THEN only the new ones are delivered
    assert first.records == ()
    assert [r.sequence_number for r in records] == new


def test_at_timestamp_starts_at_the_first_record_at_or_after_it(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN two groups of records written at distinct server times
    before = [put(kinesis, stream, f"a{i}".encode()) for i in range(3)]
    SYSTEM_CLOCK.sleep(0.05)  # the emulator stamps arrival with its real clock: make the groups distinguishable
    after = [put(kinesis, stream, f"b{i}".encode()) for i in range(3)]
    everything, _ = drain(fetcher(kinesis, stream, ManualClock(), InitialPosition.TRIM_HORIZON), 6)
    start_ts = next(r.approximate_arrival_timestamp for r in everything if r.sequence_number == after[0])
    assert start_ts is not None
    # WHEN read AT_TIMESTAMP the arrival time of the second group's first record
    records, _ = drain(fetcher(kinesis, stream, clock, InitialPosition.AT_TIMESTAMP, timestamp=start_ts), 3)
    # THEN the second group, and only it, is delivered
    assert [r.sequence_number for r in records] == after
    assert not set(before) & {r.sequence_number for r in records}


def test_at_timestamp_checkpoint_sentinel_uses_the_timestamp(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN a lease whose checkpoint is the AT_TIMESTAMP sentinel and a timestamp before every record
    sequences = [put(kinesis, stream, b"x") for _ in range(2)]
    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    f = fetcher(kinesis, stream, clock, Checkpoint(sequence="AT_TIMESTAMP"), timestamp=past)
    # THEN everything since then is delivered
    assert [r.sequence_number for r in drain(f, 2)[0]] == sequences


# --- resuming from checkpoints -------------------------------------------------------------------------------


def test_resume_after_a_plain_checkpoint(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN five plain records, the third checkpointed
    sequences = [put(kinesis, stream, f"r{i}".encode()) for i in range(5)]
    # WHEN a new owner resumes from that checkpoint
    records, _ = drain(fetcher(kinesis, stream, clock, Checkpoint(sequence=sequences[2])), 2)
    # THEN it gets exactly the records after it
    assert [r.sequence_number for r in records] == sequences[3:]


@pytest.mark.parametrize(
    ("checkpoint_sub", "expected_subs"),
    [
        (0, [1, 2, 3]),  # the case AFTER_SEQUENCE_NUMBER would lose: sub-records 1–3
        (1, [2, 3]),
        (3, []),
    ],
)
def test_resume_inside_an_aggregate(
    kinesis: Any, stream: str, clock: ManualClock, checkpoint_sub: int, expected_subs: list[int]
) -> None:
    # GIVEN a plain record, a KPL aggregate of four user records (put with PutRecord) and another plain record
    first = put(kinesis, stream, b"plain-before")
    aggregate = put_aggregate(kinesis, stream, [b"u0", b"u1", b"u2", b"u3"])
    last = put(kinesis, stream, b"plain-after")
    # WHEN processing resumes from a checkpoint at one of the aggregate's sub-records
    f = fetcher(kinesis, stream, clock, Checkpoint(sequence=aggregate, sub_sequence=checkpoint_sub))
    records, _ = drain(f, len(expected_subs) + 1)
    # THEN exactly the later sub-records and the following record are delivered, once each
    expected = [(aggregate, s, f"u{s}".encode()) for s in expected_subs] + [(last, 0, b"plain-after")]
    assert positions(records) == expected
    assert all(r.aggregated for r in records[:-1]) and not records[-1].aggregated
    assert first not in {r.sequence_number for r in records}
    assert f.last_delivered == Checkpoint(sequence=last)


def test_aggregates_are_deaggregated_from_trim_horizon(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN two aggregates around a plain record
    a = put_aggregate(kinesis, stream, [b"a0", b"a1"])
    p = put(kinesis, stream, b"p")
    b = put_aggregate(kinesis, stream, [b"b0", b"b1", b"b2"])
    # WHEN read from the start THEN every user record comes out with its position
    records, _ = drain(fetcher(kinesis, stream, clock, InitialPosition.TRIM_HORIZON), 6)
    assert positions(records) == [
        (a, 0, b"a0"),
        (a, 1, b"a1"),
        (p, 0, b"p"),
        (b, 0, b"b0"),
        (b, 1, b"b1"),
        (b, 2, b"b2"),
    ]
    assert [r.partition_key for r in records if r.sequence_number == b] == ["user-0", "user-1", "user-2"]


# --- pacing --------------------------------------------------------------------------------------------------


def test_calls_are_paced_and_idle_reads_back_off(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN three records read one per call
    for i in range(3):
        put(kinesis, stream, f"r{i}".encode())
    config = RetrievalConfig(max_records=1)
    f = fetcher(kinesis, stream, clock, InitialPosition.TRIM_HORIZON, config=config)
    # WHEN the consumer fetches as fast as it can: three full reads, then two empty reads at the tip
    with record_calls(kinesis, "GetRecords", clock) as calls:
        sizes = [len(f.fetch().records) for _ in range(5)]
    # THEN calls are at least 200 ms apart (≤ 5/s per shard), and an empty read at the tip waits the idle time
    assert sizes == [1, 1, 1, 0, 0]
    assert calls.gaps() == [0.2, 0.2, 0.2, 1.0]
    assert all(p.get("Limit") == 1 for p in calls.params)
    assert f.seconds_until_next_call() == pytest.approx(1.0)


# --- expired iterators ---------------------------------------------------------------------------------------


def test_expired_iterator_is_renewed_from_the_last_delivered_record(
    kinesis: Any, stream: str, clock: ManualClock
) -> None:
    # GIVEN a plain record, an aggregate and two more records, read one Kinesis record per call
    p0 = put(kinesis, stream, b"p0")
    agg = put_aggregate(kinesis, stream, [b"s0", b"s1", b"s2"])
    p2, p3 = put(kinesis, stream, b"p2"), put(kinesis, stream, b"p3")
    f = fetcher(kinesis, stream, clock, InitialPosition.TRIM_HORIZON, config=RetrievalConfig(max_records=1))
    head, _ = drain(f, 4)  # p0, then the aggregate's three sub-records
    # WHEN the iterator has expired at the next read
    with (
        record_calls(kinesis, "GetShardIterator", clock) as renewals,
        fail_calls(kinesis, "GetRecords", "ExpiredIteratorException") as injected,
    ):
        rest, _ = drain(f, 2)
    # THEN a new iterator is taken at the last delivered record and nothing is lost or repeated
    assert injected.failed == 1
    assert renewals.count == 1
    assert renewals.params[0]["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
    assert renewals.params[0]["StartingSequenceNumber"] == agg
    assert positions(head + rest) == [
        (p0, 0, b"p0"),
        (agg, 0, b"s0"),
        (agg, 1, b"s1"),
        (agg, 2, b"s2"),
        (p2, 0, b"p2"),
        (p3, 0, b"p3"),
    ]


def test_expired_iterator_before_any_record_restarts_from_the_start(
    kinesis: Any, stream: str, clock: ManualClock
) -> None:
    # GIVEN a consumer resuming from a checkpoint that has read nothing yet
    sequences = [put(kinesis, stream, f"r{i}".encode()) for i in range(3)]
    f = fetcher(kinesis, stream, clock, Checkpoint(sequence=sequences[0]))
    # WHEN its very first read finds the iterator expired
    with fail_calls(kinesis, "GetRecords", "ExpiredIteratorException", skip=0):
        records, _ = drain(f, 2)
    # THEN it starts again from the checkpoint and delivers what follows it
    assert [r.sequence_number for r in records] == sequences[1:]


def test_iterator_expiring_twice_in_a_row_raises_and_keeps_the_position(
    kinesis: Any, stream: str, clock: ManualClock
) -> None:
    # GIVEN a consumer part-way through a shard
    sequences = [put(kinesis, stream, f"r{i}".encode()) for i in range(3)]
    f = fetcher(kinesis, stream, clock, InitialPosition.TRIM_HORIZON, config=RetrievalConfig(max_records=1))
    assert [r.sequence_number for r in f.fetch().records] == sequences[:1]
    # WHEN even the renewed iterator is reported expired
    with (
        fail_calls(kinesis, "GetRecords", "ExpiredIteratorException", times=2),
        pytest.raises(DependencyError, match="expired at once"),
    ):
        f.fetch()
    # THEN the error is raised, and the next fetch carries on where the consumer was
    records, _ = drain(f, 2)
    assert [r.sequence_number for r in records] == sequences[1:]


# --- throttling ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "LimitExceededException"])
def test_throttled_reads_back_off_exponentially(kinesis: Any, stream: str, clock: ManualClock, code: str) -> None:
    # GIVEN a record to read and a shard that throttles the next three GetRecords calls
    sequence = put(kinesis, stream, b"r0")
    config = RetrievalConfig(throttle_backoff_base_ms=500, throttle_backoff_max_ms=1_500)
    f = fetcher(kinesis, stream, clock, InitialPosition.TRIM_HORIZON, config=config)
    # WHEN the consumer keeps fetching
    with record_calls(kinesis, "GetRecords", clock) as calls, fail_calls(kinesis, "GetRecords", code, times=3):
        batches = [f.fetch() for _ in range(4)]
        throttles_before_success = [b.throttled for b in batches]
    # THEN throttled fetches return at once with empty batches, and calls are spaced 0.5, 1.0, 1.5 (capped) s
    assert throttles_before_success == [True, True, True, False]
    assert all(b.records == () for b in batches[:3])
    assert [r.sequence_number for r in batches[3].records] == [sequence]
    assert calls.gaps() == [0.5, 1.0, 1.5]
    assert f.consecutive_throttles == 0


def test_throttled_get_shard_iterator_backs_off_too(kinesis: Any, stream: str, clock: ManualClock) -> None:
    # GIVEN GetShardIterator is over its limit once
    sequence = put(kinesis, stream, b"r0")
    f = fetcher(kinesis, stream, clock, InitialPosition.TRIM_HORIZON)
    start = clock.monotonic()
    with fail_calls(kinesis, "GetShardIterator", "LimitExceededException"):
        first = f.fetch()
        second = f.fetch()
    # THEN the first fetch reports throttling and the second, after the backoff, delivers
    assert first.throttled and not second.throttled
    assert [r.sequence_number for r in second.records] == [sequence]
    assert clock.monotonic() - start == pytest.approx(0.5)


# --- shard end -----------------------------------------------------------------------------------------------


def test_split_parent_is_read_to_its_end_and_reports_children(kinesalite: Any, clock: ManualClock) -> None:
    # GIVEN a kinesalite stream whose only shard received records and was then split, with more records after
    stream = f"split-{uuid.uuid4().hex[:10]}"
    create_stream(kinesalite, stream, 1)
    before = [put(kinesalite, stream, f"before{i}".encode(), key=f"k{i}") for i in range(4)]
    split_shard(kinesalite, stream, SHARD)
    for i in range(4):
        put(kinesalite, stream, f"after{i}".encode(), key=f"k{i}")
    children = sorted(s["ShardId"] for s in list_all_shards(kinesalite, stream) if s.get("ParentShardId") == SHARD)
    assert len(children) == 2
    f = fetcher(kinesalite, stream, clock, InitialPosition.TRIM_HORIZON)
    # WHEN the parent is read until the fetcher reports its end
    records, batches = drain(f, 10**6)
    # THEN exactly the parent's records were delivered, the last batch ends the shard and names both children
    assert [r.sequence_number for r in records] == before
    assert batches[-1].end_of_shard and batches[-1].child_shards == tuple(children)
    assert not any(b.end_of_shard for b in batches[:-1])
    assert f.is_ended and f.child_shards == tuple(children)
    # AND later fetches return the end again without calling Kinesis
    calls = f.get_records_calls
    again = f.fetch()
    assert again.end_of_shard and again.records == () and again.child_shards == tuple(children)
    assert f.get_records_calls == calls


def test_shard_end_prefers_child_shards_from_the_response(kinesalite: Any, clock: ManualClock) -> None:
    # GIVEN a split parent whose shard-end reply carries ChildShards (as the real service sends)
    stream = f"split-{uuid.uuid4().hex[:10]}"
    create_stream(kinesalite, stream, 1)
    put(kinesalite, stream, b"r0")
    split_shard(kinesalite, stream, SHARD)
    f = fetcher(kinesalite, stream, clock, Checkpoint(sequence=SHARD_END.sequence))
    assert f.is_ended  # a SHARD_END checkpoint needs no reading at all
    f = fetcher(kinesalite, stream, clock, InitialPosition.TRIM_HORIZON)
    # WHEN read to its end
    with (
        add_child_shards(kinesalite, ["shardId-000000000007"]),
        record_calls(kinesalite, "ListShards", clock) as list_calls,
    ):
        _, batches = drain(f, 10**6)
    # THEN the children come from the reply, and ListShards is not needed
    assert batches[-1].end_of_shard and batches[-1].child_shards == ("shardId-000000000007",)
    assert list_calls.count == 0


# --- configuration and errors --------------------------------------------------------------------------------


def test_missing_stream_is_a_typed_error(kinesis: Any, clock: ManualClock) -> None:
    f = fetcher(kinesis, f"absent-{uuid.uuid4().hex[:8]}", clock, InitialPosition.TRIM_HORIZON)
    with pytest.raises(StreamMissingError):
        f.fetch()


@pytest.mark.parametrize(
    ("start", "timestamp", "fragment"),
    [
        (InitialPosition.AT_TIMESTAMP, None, "needs a timestamp"),
        (Checkpoint(sequence="AT_TIMESTAMP"), None, "needs a timestamp"),
        (InitialPosition.LATEST, datetime(2026, 1, 1, tzinfo=timezone.utc), "only valid with AT_TIMESTAMP"),
        (Checkpoint(sequence="123"), datetime(2026, 1, 1, tzinfo=timezone.utc), "only valid with AT_TIMESTAMP"),
        (Checkpoint(sequence="12x"), None, "not a sequence number"),
    ],
)
def test_invalid_start_is_a_config_error(
    start: Checkpoint | InitialPosition, timestamp: datetime | None, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ShardRecordFetcher("s", SHARD, kinesis_client=object(), start=start, timestamp=timestamp)


def test_retrieval_config_defaults_and_env() -> None:
    default = RetrievalConfig()
    assert (default.max_records, default.idle_time_between_reads_ms, default.min_interval_between_calls_ms) == (
        10_000,
        1_000,
        200,
    )
    assert [default.throttle_backoff_s(n) for n in (1, 2, 3, 6, 60)] == [0.5, 1.0, 2.0, 10.0, 10.0]
    env = {
        "SHARDLEASE_MAX_RECORDS": "500",
        "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "250",
        "SHARDLEASE_MIN_INTERVAL_BETWEEN_CALLS_MS": "400",
        "SHARDLEASE_THROTTLE_BACKOFF_BASE_MS": "100",
        "SHARDLEASE_THROTTLE_BACKOFF_MAX_MS": "800",
    }
    assert RetrievalConfig.from_env(env) == RetrievalConfig(
        max_records=500,
        idle_time_between_reads_ms=250,
        min_interval_between_calls_ms=400,
        throttle_backoff_base_ms=100,
        throttle_backoff_max_ms=800,
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_records": 0}, "max_records=0"),
        ({"max_records": 10_001}, "max_records=10001"),
        ({"min_interval_between_calls_ms": 100}, "5 GetRecords calls per second"),
        ({"idle_time_between_reads_ms": -1}, "must not be negative"),
        ({"throttle_backoff_base_ms": 0}, "must be positive"),
        ({"throttle_backoff_base_ms": 500, "throttle_backoff_max_ms": 100}, "at least throttle_backoff_base_ms"),
    ],
)
def test_retrieval_config_rejects_bad_values(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        RetrievalConfig(**kwargs)


def test_retrieval_config_env_rejects_non_numbers() -> None:
    with pytest.raises(ConfigError, match="SHARDLEASE_MAX_RECORDS='many' is not a whole number"):
        RetrievalConfig.from_env({"SHARDLEASE_MAX_RECORDS": "many"})
