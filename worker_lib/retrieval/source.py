"""What every record source shares: the batch it returns, the seam a shard consumer reads through, where a lease's
reading starts, and the user records of a response (KPL de-aggregation, the floor of records delivered already)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.config import InitialPosition
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Checkpoint, KinesisRecord, SentinelCheckpoint
from worker_lib.retrieval.deaggregation import deaggregate

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RecordBatch:
    """What one :meth:`ShardRecordFetcher.fetch` returns.

    records: de-aggregated user records in shard order (possibly empty).
    millis_behind_latest: from GetRecords (None when no call succeeded).
    end_of_shard: the shard is closed and everything in it has now been returned.
    child_shards: the ids of the shards that replaced it (only with ``end_of_shard``).
    throttled: the call was throttled; the next one is pushed back.
    fetched: Kinesis records the call returned, before de-aggregation and before dropping the ones at or before
      the starting point (a response with fewer than the ``Limit`` asked for reached the tip of the shard).
    pending: nothing arrived yet (enhanced fan-out: no event within the wait) — says nothing about the tip.
    received_at: enhanced fan-out: the wall time the event was received (the processor's ``cache_entry_time``).
    """

    records: tuple[KinesisRecord, ...]
    millis_behind_latest: int | None
    end_of_shard: bool = False
    child_shards: tuple[str, ...] = ()
    throttled: bool = False
    fetched: int = 0
    pending: bool = False
    received_at: float | None = None

    @property
    def data_bytes(self) -> int:
        """Payload bytes in the batch (for the throughput recorder)."""
        return sum(len(r.data) for r in self.records)


class RecordSource(Protocol):
    """What a shard consumer reads from: :class:`ShardRecordFetcher` (polling) or
    :class:`~worker_lib.retrieval.fanout.ShardSubscriber` (enhanced fan-out)."""

    @property
    def last_delivered(self) -> Checkpoint | None: ...

    def seconds_until_next_call(self) -> float: ...

    def fetch(self) -> RecordBatch: ...

    def close(self) -> None: ...


def record_from_response(raw: dict[str, Any]) -> KinesisRecord:
    """One record of a GetRecords response as a (not yet de-aggregated) :class:`KinesisRecord`."""
    arrival = raw.get("ApproximateArrivalTimestamp")
    return KinesisRecord(
        data=bytes(raw["Data"]),
        partition_key=str(raw["PartitionKey"]),
        sequence_number=str(raw["SequenceNumber"]),
        approximate_arrival_timestamp=arrival if isinstance(arrival, datetime) else None,
        encryption_type=raw.get("EncryptionType"),
    )


def user_records(
    raw_records: list[dict[str, Any]], *, floor: Checkpoint | None, hash_range: tuple[int, int] | None
) -> list[KinesisRecord]:
    """The user records of a response's (or an event's) Kinesis records: KPL aggregates de-aggregated, those at
    or before ``floor`` (delivered already) dropped."""
    records: list[KinesisRecord] = []
    for raw in raw_records:
        for record in deaggregate(record_from_response(raw), hash_range=hash_range):
            if floor is not None and not record.checkpoint.is_after(floor):
                continue
            records.append(record)
    return records


def child_shards_from_list_shards(kinesis: Any, stream: str, shard_id: str) -> tuple[str, ...]:
    """Child shard ids from ListShards, for emulators that omit ``ChildShards``. Never raises: the records of the
    final batch must still be returned; shard sync creates any child lease this misses."""
    children: set[str] = set()
    kwargs: dict[str, Any] = {"StreamName": stream}
    try:
        while True:
            response = kinesis.list_shards(**kwargs)
            for shard in response.get("Shards", []):
                if shard_id in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")):
                    children.add(str(shard["ShardId"]))
            token = response.get("NextToken")
            if not token:
                break
            kwargs = {"NextToken": token}
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        log.warning(
            "shard %s ended but its children could not be listed: %s",
            shard_id,
            aws.translate(exc, operation="kinesis ListShards", resource=stream),
        )
    return tuple(sorted(children))


def iterator_start(
    start: Checkpoint | InitialPosition, timestamp: datetime | None
) -> tuple[dict[str, Any], Checkpoint | None]:
    """GetShardIterator arguments for ``start`` and the floor (records at or before it are dropped); a fan-out
    subscription starts from the same (:func:`worker_lib.retrieval.fanout.first_position`)."""
    if isinstance(start, InitialPosition):
        position = start.value
    elif start.is_sentinel:
        position = start.sequence
    else:
        if timestamp is not None:
            raise ConfigError("a start timestamp is only valid with AT_TIMESTAMP")
        if not start.sequence.isdigit():
            raise ConfigError(f"invalid checkpoint {start.sequence!r}: not a sequence number")
        return {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": start.sequence}, start
    if position == SentinelCheckpoint.AT_TIMESTAMP.value:
        if timestamp is None:
            raise ConfigError("initial position AT_TIMESTAMP needs a timestamp")
        return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": timestamp}, None
    if timestamp is not None:
        raise ConfigError("a start timestamp is only valid with AT_TIMESTAMP")
    if position == SentinelCheckpoint.SHARD_END.value:
        return {"ShardIteratorType": "TRIM_HORIZON"}, None  # never used: the fetcher starts ended
    return {"ShardIteratorType": position}, None
