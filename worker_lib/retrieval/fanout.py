"""Enhanced fan-out retrieval: the application's stream consumer, and one SubscribeToShard subscription per lease.

:class:`StreamConsumers` gives the consumer ARN of each stream: the configured one (created beforehand, e.g. by
the CDK construct), else the consumer named after the application — registered if missing, waited on until
``ACTIVE``, and never deregistered (a consumer deregistered when one worker stops breaks every other worker of the
application: Flink's FLINK-24431).

:class:`ShardSubscriber` reads one shard through a subscription and hands out the same :class:`RecordBatch` values
as the polling :class:`~worker_lib.retrieval.polling.ShardRecordFetcher`, so the consumer, the processor and the
checkpoints work the same way (KPL de-aggregation, ``millis_behind_latest``, the floor below which records were
delivered already):

* **Start.** The first subscription starts where polling would: ``AT_SEQUENCE_NUMBER`` of the checkpoint,
  dropping the user records at or before it (so a checkpoint inside a KPL aggregate resumes inside it), or the
  initial position. Until the first event arrives, a new subscription starts there again.
* **Renewal.** Kinesis ends every subscription after 5 minutes; the next one starts ``AFTER_SEQUENCE_NUMBER`` of
  the last event's ``ContinuationSequenceNumber`` — the position of everything received — so nothing is skipped
  or repeated across renewals. Read timeouts, resets and errors inside the stream resubscribe from there too.
* **Limits.** At most one SubscribeToShard per second per shard (Kinesis' limit per consumer and shard);
  ``ResourceInUseException`` (the previous owner's subscription is younger than 5 s: every hand-over) and
  ``LimitExceededException`` are retried each second, other failures with a backoff doubling to 5 s.
* **Backpressure.** A reader thread puts each pushed event into a queue of ``fanout_buffer_events`` (2) and
  blocks while it is full: it then reads nothing, the connection's buffers fill, and Kinesis stops pushing. Memory
  per shard is bounded by a few events, whatever the processor's speed.
* **Shard end.** The event without a continuation, with ``ChildShards``, ends the shard: that batch has
  ``end_of_shard`` set and carries the child shard ids.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.errors import CredentialsError, DependencyError, StreamMissingError
from worker_lib.core.models import Checkpoint
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.retrieval.source import RecordBatch, child_shards_from_list_shards, iterator_start, user_records

log = logging.getLogger(__name__)

SUBSCRIPTION_READ_TIMEOUT_S = 35.0
"""Kinesis pushes an event at least every few seconds on a subscription; a read waits this long before resubscribing."""
SUBSCRIBE_INTERVAL_S = 1.0  # Kinesis: one SubscribeToShard per second per consumer and shard
RETRY_MAX_S = 5.0
_RETRY_EACH_SECOND = frozenset({"ResourceInUseException", "LimitExceededException"})
_POLL_S = 0.2  # how long one fetch() waits for an event: the consumer checks for stop and hand-off in between


def subscription_config(aws_config: AwsConfig) -> AwsConfig:
    """The settings of a client that holds subscriptions: a read may wait seconds between events."""
    return replace(aws_config, read_timeout_s=max(aws_config.read_timeout_s, SUBSCRIPTION_READ_TIMEOUT_S))


# --- the stream consumer -----------------------------------------------------------------------------------------


class StreamConsumers:
    """The application's stream consumer ARN per stream, registered once if missing (thread-safe, cached).

    ``consumer_arn``: a consumer created beforehand, used as it is (single-stream applications).
    ``wait_active_s``: how long a consumer may stay ``CREATING`` (Kinesis takes seconds; KCL waits 10 × 1 s).
    """

    def __init__(
        self,
        kinesis_client: Any,
        *,
        consumer_name: str,
        consumer_arn: str = "",
        clock: Clock = SYSTEM_CLOCK,
        wait_active_s: float = 60.0,
    ) -> None:
        self._kinesis = kinesis_client
        self.consumer_name = consumer_name
        self._configured_arn = consumer_arn
        self._clock = clock
        self._wait_active_s = wait_active_s
        self._arns: dict[str, str] = {}
        self._lock = threading.Lock()

    def arn_for(self, stream: str) -> str:
        """The consumer ARN for ``stream``; registers the consumer if missing and waits until it is ACTIVE.

        Raises :class:`CredentialsError` (one line naming the missing permission) when registering or describing
        is not allowed, :class:`StreamMissingError`, or another :class:`DependencyError`.
        """
        if self._configured_arn:
            return self._configured_arn
        with self._lock:
            if stream not in self._arns:
                self._arns[stream] = self._resolve(stream)
            return self._arns[stream]

    def _resolve(self, stream: str) -> str:
        with aws.translated("kinesis DescribeStreamSummary", stream):
            stream_arn = str(
                self._kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
            )
        deadline = self._clock.monotonic() + self._wait_active_s
        attempt = 0
        while True:
            description = self._describe(stream, stream_arn)
            if description is None:
                self._register(stream, stream_arn)
                description = self._describe(stream, stream_arn)
            if description is not None and description.get("ConsumerStatus") == "ACTIVE":
                arn = str(description["ConsumerARN"])
                log.info("fan-out consumer %s of %s is ACTIVE: %s", self.consumer_name, stream, arn)
                return arn
            if self._clock.monotonic() >= deadline:
                status = None if description is None else description.get("ConsumerStatus")
                raise DependencyError(
                    f"kinesis stream consumer {self.consumer_name} of {stream} is {status} after "
                    f"{self._wait_active_s:g} s (expected ACTIVE)"
                )
            attempt += 1
            self._clock.sleep(min(1.0 * attempt, 5.0) * random.uniform(0.8, 1.2))

    def _describe(self, stream: str, stream_arn: str) -> dict[str, Any] | None:
        try:
            reply = self._kinesis.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=self.consumer_name)
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) == "ResourceNotFoundException":
                return None
            raise self._translated(exc, "DescribeStreamConsumer", stream) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise self._translated(exc, "DescribeStreamConsumer", stream) from exc
        description: dict[str, Any] = reply["ConsumerDescription"]
        return description

    def _register(self, stream: str, stream_arn: str) -> None:
        delay = 1.0
        for _ in range(10):
            try:
                self._kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=self.consumer_name)
                log.warning("registered fan-out consumer %s on %s", self.consumer_name, stream)
                return
            except botocore.exceptions.ClientError as exc:
                code = aws.error_code(exc)
                if code == "ResourceInUseException":
                    return  # another worker registered it first
                if code != "LimitExceededException":
                    raise self._translated(exc, "RegisterStreamConsumer", stream) from exc
            except botocore.exceptions.BotoCoreError as exc:
                raise self._translated(exc, "RegisterStreamConsumer", stream) from exc
            # 5 registrations per second per account: back off with jitter (KCL retries at once, 10 times)
            self._clock.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 10.0)
        raise DependencyError(f"kinesis RegisterStreamConsumer on {stream}: throttled 10 times in a row")

    def _translated(self, exc: BaseException, operation: str, stream: str) -> DependencyError:
        error = aws.translate(exc, operation=f"kinesis {operation}", resource=stream)
        if isinstance(error, CredentialsError) and aws.error_code(exc) == "AccessDeniedException":
            return CredentialsError(
                f"kinesis {operation} on {stream}: not allowed (AccessDeniedException): grant "
                f"kinesis:{operation} on the stream and its consumers, or create the consumer beforehand and give "
                "its ARN (SHARDLEASE_FANOUT_CONSUMER_ARN; the CDK construct does both)"
            )
        return error


# --- where a subscription starts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Start:
    position: dict[str, Any]  # SubscribeToShard's StartingPosition
    floor: Checkpoint | None  # user records at or before it are not delivered


def first_position(start: Checkpoint | InitialPosition, timestamp: datetime | None) -> _Start:
    """Where the first subscription of a lease starts: the polling fetcher's start, as a StartingPosition."""
    arguments, floor = iterator_start(start, timestamp)
    position: dict[str, Any] = {"Type": arguments["ShardIteratorType"]}
    if "StartingSequenceNumber" in arguments:
        position["SequenceNumber"] = arguments["StartingSequenceNumber"]
    if "Timestamp" in arguments:
        position["Timestamp"] = arguments["Timestamp"]
    return _Start(position, floor)


def after(continuation: str) -> _Start:
    """Where a renewed subscription starts: after everything received."""
    return _Start({"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": continuation}, None)


# --- one shard's subscription ------------------------------------------------------------------------------------


class _Failure:
    """A failure the reader thread cannot get past; :meth:`ShardSubscriber.fetch` raises it."""

    def __init__(self, error: DependencyError) -> None:
        self.error = error


class ShardSubscriber:
    """Reads one shard through enhanced fan-out; see the module documentation. The consumer's thread calls
    :meth:`fetch`; a reader thread of its own (started at the first fetch) holds the subscription. Call
    :meth:`close` when done: it ends the subscription and the thread."""

    def __init__(
        self,
        stream: str,
        shard_id: str,
        *,
        kinesis_client: Any,
        consumer_arn: str,
        start: Checkpoint | InitialPosition,
        timestamp: datetime | None = None,
        clock: Clock = SYSTEM_CLOCK,
        config: RetrievalConfig | None = None,
        hash_range: tuple[int, int] | None = None,
    ) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self._kinesis = kinesis_client
        self._consumer_arn = consumer_arn
        self._clock = clock
        self._config = config or RetrievalConfig()
        self._hash_range = hash_range
        self._start = first_position(start, timestamp)
        self._floor = self._start.floor
        self._resume = self._start
        self._events: queue.Queue[tuple[dict[str, Any], float] | _Failure] = queue.Queue(
            maxsize=self._config.fanout_buffer_events
        )
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream_lock = threading.Lock()
        self._open_stream: Any = None
        self._last_delivered: Checkpoint | None = None
        self._ended = isinstance(start, Checkpoint) and start.is_shard_end
        self._child_shards: tuple[str, ...] = ()
        self._next_subscribe_at = 0.0
        self.subscriptions = 0  # SubscribeToShard calls that succeeded
        self.events_received = 0

    # --- the consumer's side ---------------------------------------------------------------------------------

    @property
    def last_delivered(self) -> Checkpoint | None:
        return self._last_delivered

    @property
    def is_ended(self) -> bool:
        return self._ended

    @property
    def child_shards(self) -> tuple[str, ...]:
        return self._child_shards

    def seconds_until_next_call(self) -> float:
        return 0.0  # fetch() waits for pushed events itself, briefly

    def fetch(self) -> RecordBatch:
        """The next pushed event as a batch, or an empty batch if none came within a fraction of a second."""
        if self._ended:
            return RecordBatch(records=(), millis_behind_latest=0, end_of_shard=True, child_shards=self._child_shards)
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, name=f"fanout-{self.shard_id}", daemon=True)
            self._thread.start()
        try:
            item = self._events.get(timeout=_POLL_S)
        except queue.Empty:
            return RecordBatch(records=(), millis_behind_latest=None, pending=True)
        if isinstance(item, _Failure):
            self._thread = None  # the reader ended: the next fetch starts a new one, from where it stopped
            raise item.error
        event, received_at = item
        return self._accept(event, received_at)

    def restart(self) -> None:
        """Nothing to drop: a subscription resumes by itself from the last event received."""

    def close(self) -> None:
        """End the subscription and the reader thread (idempotent)."""
        self._closed.set()
        self._close_stream()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    def _accept(self, event: dict[str, Any], received_at: float) -> RecordBatch:
        raw_records = event.get("Records") or []
        records = user_records(raw_records, floor=self._floor, hash_range=self._hash_range)
        if records:
            self._last_delivered = records[-1].checkpoint
            self._floor = None
        millis = event.get("MillisBehindLatest")
        millis_behind = int(millis) if millis is not None else None
        if event.get("ContinuationSequenceNumber"):
            return RecordBatch(
                records=tuple(records),
                millis_behind_latest=millis_behind,
                fetched=len(raw_records),
                received_at=received_at,
            )
        self._ended = True
        if event.get("ChildShards"):
            self._child_shards = tuple(sorted(str(c["ShardId"]) for c in event["ChildShards"]))
        else:  # an emulator may omit them (AWS sends them): ask ListShards, as the polling fetcher does
            self._child_shards = child_shards_from_list_shards(self._kinesis, self.stream, self.shard_id)
        log.info("shard %s ended; child shards %s", self.shard_id, ", ".join(self._child_shards) or "none")
        return RecordBatch(
            records=tuple(records),
            millis_behind_latest=millis_behind,
            end_of_shard=True,
            child_shards=self._child_shards,
            fetched=len(raw_records),
            received_at=received_at,
        )

    # --- the reader thread -----------------------------------------------------------------------------------

    def _read(self) -> None:
        failures = 0
        while not self._closed.is_set():
            self._pause(self._next_subscribe_at - self._clock.monotonic())
            if self._closed.is_set():
                return
            self._next_subscribe_at = self._clock.monotonic() + SUBSCRIBE_INTERVAL_S
            try:
                ended = self._subscribe_once()
                failures = 0
                if ended:
                    return
            except botocore.exceptions.ClientError as exc:  # EventStreamError (an error inside the stream) too
                code = aws.error_code(exc)
                if self._closed.is_set():
                    return
                if code in _RETRY_EACH_SECOND:
                    log.info("subscription to %s: %s; retrying in 1 s", self.shard_id, code)
                    continue
                error = aws.translate(
                    exc, operation="kinesis SubscribeToShard", resource=f"{self.stream}/{self.shard_id}"
                )
                if isinstance(error, CredentialsError | StreamMissingError):
                    self._put(_Failure(error))  # the consumer decides (a deleted stream ends the lease)
                    return
                failures += 1
                self._back_off(failures, error)
            except Exception as exc:  # read timeouts, resets, a stream closed under the reader by close()
                if self._closed.is_set():
                    return
                failures += 1
                resource = f"{self.stream}/{self.shard_id}"
                self._back_off(failures, aws.translate(exc, operation="kinesis SubscribeToShard", resource=resource))

    def _subscribe_once(self) -> bool:
        """One subscription, read until it ends; True at the end of the shard."""
        response = self._kinesis.subscribe_to_shard(
            ConsumerARN=self._consumer_arn, ShardId=self.shard_id, StartingPosition=self._resume.position
        )
        self.subscriptions += 1
        event_stream = response["EventStream"]
        with self._stream_lock:
            self._open_stream = event_stream
        try:
            for item in event_stream:
                event = item.get("SubscribeToShardEvent")
                if event is None:
                    continue
                self.events_received += 1
                if not self._put((event, self._clock.wall())):
                    return False  # closed
                continuation = event.get("ContinuationSequenceNumber")
                if not continuation:
                    return True
                self._resume = after(str(continuation))
            return False  # Kinesis ended the subscription (5 minutes): renew from the last event
        finally:
            self._close_stream()

    def _put(self, item: tuple[dict[str, Any], float] | _Failure) -> bool:
        """Queue one item, waiting while the queue is full (backpressure); False if closed meanwhile."""
        while not self._closed.is_set():
            try:
                self._events.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _back_off(self, failures: int, error: DependencyError) -> None:
        delay = min(SUBSCRIBE_INTERVAL_S * 2 ** (failures - 1), RETRY_MAX_S)
        log.warning("subscription to %s failed (%s); resubscribing in %.1f s", self.shard_id, error, delay)
        self._next_subscribe_at = max(self._next_subscribe_at, self._clock.monotonic() + delay)

    def _pause(self, seconds: float) -> None:
        end = self._clock.monotonic() + seconds
        while not self._closed.is_set() and (left := end - self._clock.monotonic()) > 0:
            self._clock.sleep(min(left, 0.1))

    def _close_stream(self) -> None:
        with self._stream_lock:
            event_stream, self._open_stream = self._open_stream, None
        if event_stream is not None:
            with contextlib.suppress(Exception):
                event_stream.close()


SubscriberFactory = Callable[..., ShardSubscriber]
