"""Polling record retrieval for one shard: GetShardIterator + GetRecords within the Kinesis limits.

:class:`ShardRecordFetcher` turns a lease's starting point into a sequence of :class:`RecordBatch` values:

* **Start.** A checkpoint that is a sequence number resumes with ``AT_SEQUENCE_NUMBER`` and drops every user
  record at or before the checkpoint ``(sequence, sub_sequence)`` after de-aggregation — the checkpointed record
  itself, and the sub-records of a KPL aggregate up to the checkpointed one. (``AFTER_SEQUENCE_NUMBER`` would
  be wrong for a checkpoint inside an aggregate, including one at sub-sequence 0: it skips the aggregate's
  remaining sub-records. KCL resumes the same way.) The sentinels and :class:`InitialPosition` map to
  ``TRIM_HORIZON``, ``LATEST`` and ``AT_TIMESTAMP``; a ``SHARD_END`` checkpoint is at its end already.
* **Pacing.** At most one GetRecords call per ``min_interval_between_calls_ms`` (200 ms = 5 calls/s per shard);
  after a read that returned nothing and was at the tip of the shard, wait ``idle_time_between_reads_ms``.
* **Throttling.** ``ProvisionedThroughputExceededException`` / ``LimitExceededException`` (on GetRecords or
  GetShardIterator) return an empty batch marked ``throttled`` and push the next call back exponentially
  (``throttle_backoff_base_ms`` doubling up to ``throttle_backoff_max_ms``), so a caller's loop stays responsive.
* **Expired iterators.** ``ExpiredIteratorException`` gets a fresh iterator at the last delivered record
  (``AT_SEQUENCE_NUMBER``, dropping what was delivered) — or at the original start if nothing was delivered
  yet — and the read is retried once.
* **Shard end.** A response without ``NextShardIterator`` ends the shard: that batch has ``end_of_shard`` set
  and carries the child shard ids from the response's ``ChildShards`` (or, where an emulator omits the field,
  from ListShards). Later calls return the same empty end batch without calling Kinesis.

All waiting goes through the injected :class:`~worker_lib.core.clock.Clock`;
:meth:`ShardRecordFetcher.seconds_until_next_call` lets a caller wait on its own stop event instead. Give the
fetcher a client with few botocore retries (``max_attempts`` 1–2): throttling is better handled here, where the
backoff uses the injected clock.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import InitialPosition
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Checkpoint
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.retrieval.source import RecordBatch, child_shards_from_list_shards, iterator_start, user_records

log = logging.getLogger(__name__)

_THROTTLED = (
    frozenset({"ProvisionedThroughputExceededException", "LimitExceededException", "KMSThrottlingException"})
    | aws.THROTTLING_CODES
)
_EXPIRED = "ExpiredIteratorException"


class _Throttled(Exception):
    pass


class _Expired(Exception):
    pass


class ShardRecordFetcher:
    """Reads one shard from a starting point; see the module documentation for the rules.

    start: the lease's checkpoint, or an initial position; ``timestamp`` is required with ``AT_TIMESTAMP``
      (as :class:`InitialPosition` or as the ``AT_TIMESTAMP`` checkpoint sentinel) and rejected otherwise.
    hash_range: if given, user records of KPL aggregates outside it are dropped (KCL's behaviour; see
      :func:`~worker_lib.retrieval.deaggregation.deaggregate` for why it is off by default).
    Not thread-safe: one fetcher belongs to one shard consumer.
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
        self._start_kwargs, self._start_floor = iterator_start(start, timestamp)
        self._iterator: str | None = None
        self._floor: Checkpoint | None = self._start_floor  # user records at or before this are not delivered
        self._last_delivered: Checkpoint | None = None
        self._next_call_at = clock.monotonic()
        self._consecutive_throttles = 0
        self._ended = isinstance(start, Checkpoint) and start.is_shard_end
        self._child_shards: tuple[str, ...] = ()
        self.get_records_calls = 0  # successful or not; for tests and metrics

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def last_delivered(self) -> Checkpoint | None:
        """The position of the last user record returned (None before the first)."""
        return self._last_delivered

    @property
    def is_ended(self) -> bool:
        return self._ended

    @property
    def child_shards(self) -> tuple[str, ...]:
        return self._child_shards

    @property
    def consecutive_throttles(self) -> int:
        return self._consecutive_throttles

    def seconds_until_next_call(self) -> float:
        """How long :meth:`fetch` would wait before calling GetRecords (0 if it may call now)."""
        return max(0.0, self._next_call_at - self._clock.monotonic())

    # --- reading ---------------------------------------------------------------------------------------------

    def restart(self) -> None:
        """Drop the current shard iterator: the next :meth:`fetch` asks for a new one from where delivery stopped
        (after a failed call, in case the iterator itself was what failed)."""
        if not self._ended:
            self._iterator = None

    def fetch(self) -> RecordBatch:
        """Wait for the next permitted call, read one batch and return it (see the module documentation).

        Raises :class:`~worker_lib.core.errors.DependencyError` (or a subclass) for failures other than throttling
        and one expired iterator; the fetcher's position is unchanged then, so calling again is safe.
        """
        if self._ended:
            return RecordBatch(records=(), millis_behind_latest=0, end_of_shard=True, child_shards=self._child_shards)
        renewed = False
        while True:
            self._clock.sleep(self.seconds_until_next_call())
            try:
                if self._iterator is None:
                    self._iterator = self._new_iterator()
                response = self._get_records(self._iterator)
            except _Throttled as exc:
                return self._throttled(str(exc))
            except _Expired:
                if renewed:
                    raise DependencyError(
                        f"kinesis GetRecords on {self.stream}/{self.shard_id}: a fresh shard iterator expired at once"
                    ) from None
                log.info("shard iterator for %s expired; renewing from %s", self.shard_id, self._resume_point())
                self._iterator = None
                renewed = True
                continue
            self._consecutive_throttles = 0
            return self._accept(response)

    def _accept(self, response: dict[str, Any]) -> RecordBatch:
        raw_records = response.get("Records", [])
        records = user_records(raw_records, floor=self._floor, hash_range=self._hash_range)
        if records:
            self._last_delivered = records[-1].checkpoint
            self._floor = None
        millis = response.get("MillisBehindLatest")
        millis_behind = int(millis) if millis is not None else None
        next_iterator = response.get("NextShardIterator")
        now = self._clock.monotonic()
        if not raw_records and not millis_behind:
            self._next_call_at = max(self._next_call_at, now + self._config.idle_time_between_reads_ms / 1000)
        if next_iterator:
            self._iterator = str(next_iterator)
            return RecordBatch(records=tuple(records), millis_behind_latest=millis_behind, fetched=len(raw_records))
        self._iterator = None
        self._ended = True
        if "ChildShards" in response:
            children = tuple(sorted(str(c["ShardId"]) for c in response.get("ChildShards") or []))
        else:
            children = self._children_from_list_shards()
        self._child_shards = children
        log.info("shard %s ended; child shards %s", self.shard_id, ", ".join(children) or "none")
        return RecordBatch(
            records=tuple(records),
            millis_behind_latest=millis_behind,
            end_of_shard=True,
            child_shards=children,
            fetched=len(raw_records),
        )

    def _throttled(self, code: str) -> RecordBatch:
        self._consecutive_throttles += 1
        delay = self._config.throttle_backoff_s(self._consecutive_throttles)
        self._next_call_at = max(self._next_call_at, self._clock.monotonic() + delay)
        log.warning(
            "shard %s throttled (%s, %d in a row): next read in %.2f s",
            self.shard_id,
            code,
            self._consecutive_throttles,
            delay,
        )
        return RecordBatch(records=(), millis_behind_latest=None, throttled=True)

    # --- calls -----------------------------------------------------------------------------------------------

    def _resume_point(self) -> str:
        if self._last_delivered is not None:
            return f"after {self._last_delivered}"
        return str(self._start_kwargs.get("StartingSequenceNumber") or self._start_kwargs["ShardIteratorType"])

    def _new_iterator(self) -> str:
        if self._last_delivered is not None:
            kwargs: dict[str, Any] = {
                "ShardIteratorType": "AT_SEQUENCE_NUMBER",
                "StartingSequenceNumber": self._last_delivered.sequence,
            }
            self._floor = self._last_delivered
        else:
            kwargs = dict(self._start_kwargs)
            self._floor = self._start_floor
        response = self._call("GetShardIterator", StreamName=self.stream, ShardId=self.shard_id, **kwargs)
        return str(response["ShardIterator"])

    def _get_records(self, iterator: str) -> dict[str, Any]:
        self.get_records_calls += 1
        self._next_call_at = self._clock.monotonic() + self._config.min_interval_between_calls_ms / 1000
        return self._call("GetRecords", ShardIterator=iterator, Limit=self._config.max_records)

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        method = getattr(self._kinesis, "get_shard_iterator" if operation == "GetShardIterator" else "get_records")
        try:
            result: dict[str, Any] = method(**kwargs)
        except botocore.exceptions.ClientError as exc:
            code = aws.error_code(exc)
            if code in _THROTTLED:
                raise _Throttled(code) from exc
            if code == _EXPIRED and operation == "GetRecords":
                raise _Expired(code) from exc
            aws.raise_translated(exc, operation=f"kinesis {operation}", resource=f"{self.stream}/{self.shard_id}")
        except botocore.exceptions.BotoCoreError as exc:
            aws.raise_translated(exc, operation=f"kinesis {operation}", resource=f"{self.stream}/{self.shard_id}")
        return result

    def _children_from_list_shards(self) -> tuple[str, ...]:
        return child_shards_from_list_shards(self._kinesis, self.stream, self.shard_id)

    def close(self) -> None:
        """Nothing to release: each read is a call of its own."""
