"""Stream administration for local runs (demo, tests, benchmarks): create, wait, split, merge.

Production streams are created by their owners; these helpers exist so that local scenarios drive real
resharding through the Kinesis API of an emulator.
"""

from __future__ import annotations

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
