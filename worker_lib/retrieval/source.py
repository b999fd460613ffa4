"""What every record source shares: the batch it returns, the :class:`RecordSource` base a shard consumer reads
through, where a lease's reading starts, and the user records of a response.

:class:`RecordSource` owns the rules that do not depend on how records arrive; polling
(:class:`~worker_lib.retrieval.polling.ShardRecordFetcher`) and enhanced fan-out
(:class:`~worker_lib.retrieval.fanout.ShardSubscriber`) add only their transport:

* **Start.** A checkpoint that is a sequence number resumes ``AT_SEQUENCE_NUMBER`` and drops every user record at
  or before the checkpoint ``(sequence, sub_sequence)`` after de-aggregation — the checkpointed record itself, and
  the sub-records of a KPL aggregate up to the checkpointed one. (``AFTER_SEQUENCE_NUMBER`` would be wrong for a
  checkpoint inside an aggregate, including one at sub-sequence 0: it skips the aggregate's remaining sub-records.
  KCL resumes the same way.) The sentinels and :class:`InitialPosition` map to ``TRIM_HORIZON``, ``LATEST`` and
  ``AT_TIMESTAMP``; a ``SHARD_END`` checkpoint is at its end already (:func:`iterator_start`).
* **User records.** KPL aggregates are de-aggregated; records at or before the floor (delivered already) are
  dropped; :attr:`RecordSource.last_delivered` is the last one returned (:func:`user_records`).
* **Shard end.** A response (or event) after which nothing follows ends the shard: that batch has
  ``end_of_shard`` set and carries the child shard ids from its ``ChildShards`` (or, where an emulator omits
  them, from ListShards: :func:`child_shards_from_list_shards`). Later fetches return the same empty end batch
  without calling Kinesis.

All waiting goes through the injected :class:`~worker_lib.core.clock.Clock`;
:meth:`RecordSource.seconds_until_next_call` lets a caller wait on its own stop event instead.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Required, TypedDict

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import InitialPosition
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Checkpoint, KinesisRecord, SentinelCheckpoint
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.retrieval.deaggregation import deaggregate

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RecordBatch:
    """What one :meth:`RecordSource.fetch` returns.

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


class SourceArguments(TypedDict, total=False):
    """The arguments every source takes after ``stream`` and ``shard_id`` (see :class:`RecordSource`)."""

    kinesis_client: Required[Any]
    start: Required[Checkpoint | InitialPosition]
    timestamp: datetime | None
    clock: Clock
    config: RetrievalConfig | None
    hash_range: tuple[int, int] | None


class RecordSource(ABC):
    """One shard read from a starting point as :class:`RecordBatch` values; see the module documentation.

    The shared state and rules live here; a subclass adds its transport (:meth:`_next_batch`), passing what it
    received to :meth:`_accept`. Not thread-safe: one source belongs to one shard consumer.

    start: the lease's checkpoint, or an initial position; ``timestamp`` is required with ``AT_TIMESTAMP``
      (as :class:`InitialPosition` or as the ``AT_TIMESTAMP`` checkpoint sentinel) and rejected otherwise
      (:class:`~worker_lib.core.errors.ConfigError`, raised here).
    kinesis_client: the transport's client; also asked for ListShards where a shard's end names no children.
    hash_range: if given, user records of KPL aggregates outside it are dropped (KCL's behaviour; see
      :func:`~worker_lib.retrieval.deaggregation.deaggregate` for why it is off by default).
    """

    def __init__(
        self,
        stream: str,
        shard_id: str,
        *,
        kinesis_client: Any,
        start: Checkpoint | InitialPosition,
        timestamp: datetime | None = None,
        clock: Clock = SYSTEM_CLOCK,
        config: RetrievalConfig | None = None,
        hash_range: tuple[int, int] | None = None,
    ) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self._kinesis = kinesis_client
        self._clock = clock
        self._config = config or RetrievalConfig()
        self._hash_range = hash_range
        # GetShardIterator's arguments for the start (a subscription's StartingPosition is made from them)
        self._start_arguments, self._start_floor = iterator_start(start, timestamp)
        self._floor: Checkpoint | None = self._start_floor  # user records at or before this are not delivered
        self._last_delivered: Checkpoint | None = None
        self._ended = isinstance(start, Checkpoint) and start.is_shard_end
        self._child_shards: tuple[str, ...] = ()

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def last_delivered(self) -> Checkpoint | None:
        """The position of the last user record returned (None before the first)."""
        return self._last_delivered

    @property
    def is_ended(self) -> bool:
        """Whether the end of the shard was returned (or the start was ``SHARD_END``)."""
        return self._ended

    @property
    def child_shards(self) -> tuple[str, ...]:
        """The ids of the shards that replaced this one (once ended)."""
        return self._child_shards

    def seconds_until_next_call(self) -> float:
        """How long :meth:`fetch` would wait before its next call (0 if it may call now), so that a caller can wait
        on its own stop event instead."""
        return 0.0

    # --- reading ---------------------------------------------------------------------------------------------

    def fetch(self) -> RecordBatch:
        """The next batch; once the shard ended, the same empty end batch without calling Kinesis.

        Raises :class:`~worker_lib.core.errors.DependencyError` (or a subclass) for failures the source cannot get
        past; its position is unchanged then, so calling again is safe.
        """
        if self._ended:
            return RecordBatch(records=(), millis_behind_latest=0, end_of_shard=True, child_shards=self._child_shards)
        return self._next_batch()

    @abstractmethod
    def _next_batch(self) -> RecordBatch:
        """The transport's next batch (the shard has not ended yet), through :meth:`_accept` when something came."""

    def restart(self) -> None:  # noqa: B027 - a hook: a transport with nothing to drop keeps it
        """After a failed :meth:`fetch`: drop what the transport holds, in case it was what failed; the next fetch
        resumes from where delivery stopped."""

    def close(self) -> None:  # noqa: B027 - a hook: a transport with nothing to release keeps it
        """Release what the transport holds (idempotent)."""

    def _accept(
        self,
        raw_records: Sequence[dict[str, Any]],
        millis_behind_latest: int | None,
        *,
        more: bool,
        children: Sequence[Mapping[str, Any]] | None,
        received_at: float | None = None,
    ) -> RecordBatch:
        """The batch of one response (or event): its user records past the floor, and the end of the shard unless
        ``more`` follows. children: the response's ``ChildShards``; None when it gave none (then ListShards)."""
        records = user_records(raw_records, floor=self._floor, hash_range=self._hash_range)
        if records:
            self._last_delivered = records[-1].checkpoint
            self._floor = None
        batch = RecordBatch(
            records=tuple(records),
            millis_behind_latest=None if millis_behind_latest is None else int(millis_behind_latest),
            fetched=len(raw_records),
            received_at=received_at,
        )
        if more:
            return batch
        self._ended = True
        if children is None:
            self._child_shards = child_shards_from_list_shards(self._kinesis, self.stream, self.shard_id)
        else:
            self._child_shards = tuple(sorted(str(child["ShardId"]) for child in children))
        log.info("shard %s ended; child shards %s", self.shard_id, ", ".join(self._child_shards) or "none")
        return replace(batch, end_of_shard=True, child_shards=self._child_shards)


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
    raw_records: Sequence[dict[str, Any]], *, floor: Checkpoint | None, hash_range: tuple[int, int] | None
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
