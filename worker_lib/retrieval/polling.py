"""Polling record retrieval for one shard: GetShardIterator + GetRecords within the Kinesis limits.

:class:`ShardRecordFetcher` is the polling :class:`~worker_lib.retrieval.source.RecordSource`: the start, the
floor of records delivered already, de-aggregation and the end of the shard follow that module's rules (a
response without ``NextShardIterator`` ends the shard). Its own rules:

* **Pacing.** At most one GetRecords call per ``min_interval_between_calls_ms`` (200 ms = 5 calls/s per shard);
  after a read that returned nothing and was at the tip of the shard, wait ``idle_time_between_reads_ms``.
* **Throttling.** ``ProvisionedThroughputExceededException`` / ``LimitExceededException`` (on GetRecords or
  GetShardIterator) return an empty batch marked ``throttled`` and push the next call back exponentially
  (``throttle_backoff_base_ms`` doubling up to ``throttle_backoff_max_ms``), so a caller's loop stays responsive.
* **Expired iterators.** ``ExpiredIteratorException`` gets a fresh iterator at the last delivered record
  (``AT_SEQUENCE_NUMBER``, dropping what was delivered) — or at the original start if nothing was delivered
  yet — and the read is retried once.

Give the fetcher a client with few botocore retries (``max_attempts`` 1–2): throttling is better handled here,
where the backoff uses the injected clock.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.backoff import Retry
from worker_lib.core.errors import DependencyError
from worker_lib.retrieval.source import RecordBatch, RecordSource, SourceArguments

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only, so 3.10 runs this module

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


class ShardRecordFetcher(RecordSource):
    """Reads one shard by polling; see the module documentation for the rules and
    :class:`~worker_lib.retrieval.source.RecordSource` for the arguments."""

    def __init__(self, stream: str, shard_id: str, **arguments: Unpack[SourceArguments]) -> None:
        super().__init__(stream, shard_id, **arguments)
        self._iterator: str | None = None
        # One schedule for pacing and throttling: next_at is when the next call may run, failures the throttles
        # in a row (exact: one shard's reads need no jitter).
        self._pace = Retry(backoff=self._config.throttle_backoff, clock=self._clock)
        self.get_records_calls = 0  # successful or not; for tests and metrics

    @property
    def consecutive_throttles(self) -> int:
        return self._pace.failures

    def seconds_until_next_call(self) -> float:
        """How long :meth:`fetch` would wait before calling GetRecords (0 if it may call now)."""
        return self._pace.seconds_left()

    def restart(self) -> None:
        """Drop the current shard iterator: the next :meth:`fetch` asks for a new one from where delivery stopped
        (after a failed call, in case the iterator itself was what failed)."""
        if not self._ended:
            self._iterator = None

    def _next_batch(self) -> RecordBatch:
        """Wait for the next permitted call, read one batch and return it (see the module documentation)."""
        renewed = False
        while True:
            self._pace.wait()
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
            self._pace.succeeded()
            next_iterator = response.get("NextShardIterator")
            self._iterator = str(next_iterator) if next_iterator else None
            # Emulators may omit ChildShards at the end of a shard (None: ask ListShards); AWS sends them.
            children = (response.get("ChildShards") or []) if "ChildShards" in response else None
            batch = self._accept(
                response.get("Records", []),
                response.get("MillisBehindLatest"),
                more=bool(next_iterator),
                children=children,
            )
            if not batch.fetched and not batch.millis_behind_latest:
                self._pace.next_at = max(
                    self._pace.next_at, self._clock.monotonic() + self._config.idle_time_between_reads_ms / 1000
                )
            return batch

    def _throttled(self, code: str) -> RecordBatch:
        delay = self._pace.failed()
        log.warning(
            "shard %s throttled (%s, %d in a row): next read in %.2f s",
            self.shard_id,
            code,
            self._pace.failures,
            delay,
        )
        return RecordBatch(records=(), millis_behind_latest=None, throttled=True)

    # --- calls -----------------------------------------------------------------------------------------------

    def _resume_point(self) -> str:
        if self._last_delivered is not None:
            return f"after {self._last_delivered}"
        return str(self._start_arguments.get("StartingSequenceNumber") or self._start_arguments["ShardIteratorType"])

    def _new_iterator(self) -> str:
        if self._last_delivered is not None:
            kwargs: dict[str, Any] = {
                "ShardIteratorType": "AT_SEQUENCE_NUMBER",
                "StartingSequenceNumber": self._last_delivered.sequence,
            }
            self._floor = self._last_delivered
        else:
            kwargs = dict(self._start_arguments)
            self._floor = self._start_floor
        response = self._call("GetShardIterator", StreamName=self.stream, ShardId=self.shard_id, **kwargs)
        return str(response["ShardIterator"])

    def _get_records(self, iterator: str) -> dict[str, Any]:
        self.get_records_calls += 1
        self._pace.next_at = self._clock.monotonic() + self._config.min_interval_between_calls_ms / 1000
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
