"""Stream administration for local runs (demo, tests, benchmarks): create, wait, put, split, merge.

Production streams are created by their owners; these helpers exist so that local scenarios drive real
resharding through the Kinesis API of an emulator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError


def wait_active(kinesis: Any, stream: str, *, clock: Clock = SYSTEM_CLOCK, timeout_s: float = 30.0) -> None:
    deadline = clock.monotonic() + timeout_s
    while True:
        with aws.translated("kinesis DescribeStreamSummary", stream):
            status = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
        if status == "ACTIVE":
            return
        if clock.monotonic() > deadline:
            raise DependencyError(f"stream {stream} is still {status} after {timeout_s:.0f} s")
        clock.sleep(0.05)


def create_stream(kinesis: Any, stream: str, shards: int, *, clock: Clock = SYSTEM_CLOCK) -> None:
    with aws.translated("kinesis CreateStream", stream):
        kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_active(kinesis, stream, clock=clock)


def list_all_shards(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"StreamName": stream}
    while True:
        with aws.translated("kinesis ListShards", stream):
            response = kinesis.list_shards(**kwargs)
        shards.extend(response.get("Shards", []))
        token = response.get("NextToken")
        if not token:
            return shards
        kwargs = {"NextToken": token}


def record_positions(kinesis: Any, stream: str) -> dict[str, tuple[str, str]]:
    """Every record now in ``stream``, read from TRIM_HORIZON: its id (the data before any ``|``, as
    :class:`~worker_lib.testing.producers.Producer` writes it) -> (shard id, sequence number)."""
    found: dict[str, tuple[str, str]] = {}
    for shard in list_all_shards(kinesis, stream):
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            reply = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            for record in reply["Records"]:
                found[record["Data"].split(b"|", 1)[0].decode()] = (shard["ShardId"], record["SequenceNumber"])
            if not reply["Records"] and reply.get("MillisBehindLatest", 0) == 0:
                break  # at the tip (an empty page behind the tip is not the end)
            iterator = reply.get("NextShardIterator")
    return found


def split_shard(kinesis: Any, stream: str, shard_id: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
    """Split ``shard_id`` at the middle of its hash range."""
    shard = next(s for s in list_all_shards(kinesis, stream) if s["ShardId"] == shard_id)
    low = int(shard["HashKeyRange"]["StartingHashKey"])
    high = int(shard["HashKeyRange"]["EndingHashKey"])
    with aws.translated("kinesis SplitShard", stream):
        kinesis.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((low + high + 1) // 2))
    wait_active(kinesis, stream, clock=clock)


def merge_shards(kinesis: Any, stream: str, lower: str, upper: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
    """Merge two adjacent shards; ``lower`` must own the lower hash range (both emulators insist)."""
    with aws.translated("kinesis MergeShards", stream):
        kinesis.merge_shards(StreamName=stream, ShardToMerge=lower, AdjacentShardToMerge=upper)
    wait_active(kinesis, stream, clock=clock)


def put_records(
    kinesis: Any, stream: str, payloads: Iterable[bytes], *, partition_key: str | None = None
) -> list[tuple[str, str]]:
    """Put ``payloads`` in batches of 500 (Kinesis's limit); returns ``(shard id, sequence number)`` per record.

    Each record's partition key is ``partition_key`` or, by default, its index, which spreads records over the
    shards. A record the emulator rejects raises :class:`DependencyError` (tests want to know, not to retry).
    """
    out: list[tuple[str, str]] = []
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        with aws.translated("kinesis PutRecords", stream):
            response = kinesis.put_records(StreamName=stream, Records=batch)
        for result in response["Records"]:
            if "ShardId" not in result:
                raise DependencyError(
                    f"put_records to {stream}: {result.get('ErrorCode')} {result.get('ErrorMessage')}"
                )
            out.append((result["ShardId"], result["SequenceNumber"]))
        batch.clear()

    for index, data in enumerate(payloads):
        batch.append({"Data": data, "PartitionKey": partition_key or f"pk-{index}"})
        if len(batch) == 500:
            flush()
    if batch:
        flush()
    return out
