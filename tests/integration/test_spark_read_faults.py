"""A Spark read task (worker_lib/spark/reading.py) when Kinesis fails past the client's retries, on a moto server.

Internal errors (HTTP 500) are injected with botocore hooks (tests/support/kinesis_faults.py) on a real client; time
is a ManualClock, so the retries' pauses advance it instead of sleeping. A passing failure must cost a shorter
micro-batch, never the query: seen once in a 5-minute run of bench/spark_share.py, where one GetRecords answered
500 and the whole Spark application stopped.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from tests.support.kinesis_faults import fail_calls, one_attempt_kinesis, record_calls
from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import DependencyError, StreamMissingError
from worker_lib.core.models import TRIM_HORIZON, Checkpoint
from worker_lib.spark.planning import ReadSettings, ShardReadTask
from worker_lib.spark.reading import read_up_to

SHARD = "shardId-000000000000"


@pytest.fixture
def kinesis(moto_endpoint: str) -> Any:
    """One attempt per call, so an injected failure reaches the read."""
    return one_attempt_kinesis(moto_endpoint)


def put_records(kinesis: Any, stream: str, count: int) -> list[str]:
    return [
        str(kinesis.put_record(StreamName=stream, Data=f"r{i}".encode(), PartitionKey="pk")["SequenceNumber"])
        for i in range(count)
    ]


def task(stream: str, *, max_read_ms: int = 2_000, max_records: int = 100) -> ShardReadTask:
    settings = ReadSettings(
        app="app",
        stream=stream,
        worker_id="spark-a",
        region="us-east-1",
        max_records=max_records,
        max_read_ms=max_read_ms,
    )
    return ShardReadTask(lease_key=SHARD, position=TRIM_HORIZON, batch=3, run="run", settings=settings)


def test_a_passing_internal_error_is_retried_from_a_fresh_iterator(kinesis: Any, stream: str) -> None:
    # GIVEN a shard with five records, and Kinesis answering its next two GetRecords with an internal error
    sequences = put_records(kinesis, stream, 5)
    clock = ManualClock()
    began = clock.monotonic()
    with (
        fail_calls(kinesis, "GetRecords", "InternalFailure", times=2, status=500) as injected,
        record_calls(kinesis, "GetShardIterator", clock) as iterators,
    ):
        # WHEN a micro-batch reads the shard
        read = read_up_to(task(stream), kinesis, bound=None, clock=clock)
    # THEN every record is read, in order, up to the tip: each failure was followed by a new iterator and a pause
    assert injected.failed == 2
    assert [r.sequence_number for r in read.records] == sequences
    assert read.end.position == read.records[-1].checkpoint and read.end.caught_up
    assert iterators.count == 3
    assert clock.monotonic() - began >= 0.1 + 0.2


def test_a_read_whose_budget_runs_out_while_kinesis_fails_ends_where_it_got(
    kinesis: Any, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a shard with records, and Kinesis failing every GetRecords for longer than the read's 2 s budget
    put_records(kinesis, stream, 3)
    clock = ManualClock()
    began = clock.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="worker_lib.spark.reading"),
        fail_calls(kinesis, "GetRecords", "InternalFailure", times=1_000, status=500) as injected,
    ):
        # WHEN a micro-batch reads the shard
        read = read_up_to(task(stream, max_read_ms=2_000), kinesis, bound=None, clock=clock)
    # THEN the read ends without records where it started (recorded as usual, so the next batch starts there), not
    # caught up (the driver plans the shard again), after the budget and a few retries, with one warning line
    assert read.records == ()
    assert read.end.position == TRIM_HORIZON and not read.end.caught_up
    assert 2 <= injected.failed <= 8
    assert clock.monotonic() - began >= 2.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ended early after 0 records" in warnings[0]


def test_a_bounded_re_read_keeps_trying_to_its_end_and_fails_only_after_the_hard_deadline(
    kinesis: Any, stream: str
) -> None:
    # GIVEN a recorded end two records into the shard, and Kinesis failing every GetRecords
    sequences = put_records(kinesis, stream, 3)
    bound = Checkpoint(sequence=sequences[1])
    clock = ManualClock()
    began = clock.monotonic()
    with (
        fail_calls(kinesis, "GetRecords", "InternalFailure", times=10_000, status=500),
        pytest.raises(DependencyError, match=r"InternalFailure|injected"),
    ):
        # WHEN the replay of that batch reads to its end
        read_up_to(task(stream, max_read_ms=2_000), kinesis, bound=bound, clock=clock)
    # THEN it gave up only after the hard deadline (ten times the larger of the budget and 30 s), not the budget
    assert clock.monotonic() - began >= 300.0


def test_a_missing_stream_fails_the_read_at_once(kinesis: Any) -> None:
    # GIVEN a stream that does not exist
    clock = ManualClock()
    began = clock.monotonic()
    # WHEN a micro-batch reads it, THEN the typed error is raised without retrying
    with pytest.raises(StreamMissingError):
        read_up_to(task(f"missing-{uuid.uuid4().hex[:8]}"), kinesis, bound=None, clock=clock)
    assert clock.monotonic() == began
