"""Enhanced fan-out retrieval: the application's stream consumer, and one SubscribeToShard subscription per lease.

:class:`StreamConsumers` gives the consumer ARN of each stream: the configured one (created beforehand, e.g. by
the CDK construct), else the consumer named after the application — registered if missing, waited on until
``ACTIVE``, and never deregistered (a consumer deregistered when one worker stops breaks every other worker of the
application: Flink's FLINK-24431).

:class:`ShardSubscriber` is the enhanced fan-out :class:`~worker_lib.retrieval.source.RecordSource`: the start,
the floor of records delivered already, de-aggregation and the end of the shard (the event without a continuation
ends it) follow that module's rules, so the consumer, the processor and the checkpoints work as with polling. Its
own rules:

* **Start.** The first subscription starts where polling would, as a ``StartingPosition``
  (:func:`first_position`). Until the first event arrives, a new subscription starts there again.
* **Renewal.** Kinesis ends every subscription after 5 minutes; the next one starts ``AFTER_SEQUENCE_NUMBER`` of
  the last event's ``ContinuationSequenceNumber`` — the position of everything received — so nothing is skipped
  or repeated across renewals. Read timeouts, resets and errors inside the stream resubscribe from there too.
* **Limits.** At most one SubscribeToShard per second per shard (Kinesis' limit per consumer and shard);
  ``ResourceInUseException`` (the previous owner's subscription is younger than 5 s: every hand-over) and
  ``LimitExceededException`` are retried each second, other failures with a backoff doubling to 5 s. Waiting for a
  new consumer to be ``ACTIVE`` and throttled registrations back off with jitter (every worker asks at start).
* **Backpressure.** A reader thread puts each pushed event into a queue of ``fanout_buffer_events`` (2) and
  blocks while it is full: it then reads nothing, the connection's buffers fill, and Kinesis stops pushing. Memory
  per shard is bounded by a few events, whatever the processor's speed.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.errors import CredentialsError, DependencyError, StreamMissingError
from worker_lib.core.models import Checkpoint
from worker_lib.retrieval.source import RecordBatch, RecordSource, SourceArguments, iterator_start
from worker_lib.retrieval.stream_arns import stream_arn_of

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only, so 3.10 runs this module

log = logging.getLogger(__name__)

SUBSCRIPTION_READ_TIMEOUT_S = 35.0
"""Kinesis pushes an event at least every few seconds on a subscription; a read waits this long before resubscribing."""
SUBSCRIBE_INTERVAL_S = 1.0  # Kinesis: one SubscribeToShard per second per consumer and shard
RETRY_MAX_S = 5.0
_RETRY_EACH_SECOND = frozenset({"ResourceInUseException", "LimitExceededException"})
_POLL_S = 0.2  # how long one fetch() waits for an event: the consumer checks for stop and hand-off in between
# Failed subscriptions of one shard: exact (one reader per shard and consumer, nothing to spread).
_RESUBSCRIBE_BACKOFF = Backoff(base_s=SUBSCRIBE_INTERVAL_S, max_s=RETRY_MAX_S)
# Every worker of an application asks at start: jitter spreads them. A consumer is ACTIVE within seconds; 5
# registrations per second per account (KCL retries at once, 10 times).
_ACTIVE_BACKOFF = Backoff(base_s=1.0, max_s=5.0, jitter=0.2)
_REGISTER_BACKOFF = Backoff(base_s=1.0, max_s=10.0, jitter=0.5)


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
        stream_arn = stream_arn_of(self._kinesis, stream)
        deadline = self._clock.monotonic() + self._wait_active_s
        retry = Retry(backoff=_ACTIVE_BACKOFF, clock=self._clock)
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
            retry.failed_and_wait()

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
        retry = Retry(backoff=_REGISTER_BACKOFF, clock=self._clock)
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
            retry.failed_and_wait()
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


def _starting_position(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """SubscribeToShard's StartingPosition for GetShardIterator's arguments (:func:`iterator_start`)."""
    position: dict[str, Any] = {"Type": arguments["ShardIteratorType"]}
    if "StartingSequenceNumber" in arguments:
        position["SequenceNumber"] = arguments["StartingSequenceNumber"]
    if "Timestamp" in arguments:
        position["Timestamp"] = arguments["Timestamp"]
    return position


def first_position(start: Checkpoint | InitialPosition, timestamp: datetime | None) -> _Start:
    """Where the first subscription of a lease starts: the polling fetcher's start, as a StartingPosition."""
    arguments, floor = iterator_start(start, timestamp)
    return _Start(_starting_position(arguments), floor)


def after(continuation: str) -> _Start:
    """Where a renewed subscription starts: after everything received."""
    return _Start({"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": continuation}, None)


# --- one shard's subscription ------------------------------------------------------------------------------------


class _Failure:
    """A failure the reader thread cannot get past; :meth:`ShardSubscriber.fetch` raises it."""

    def __init__(self, error: DependencyError) -> None:
        self.error = error


class ShardSubscriber(RecordSource):
    """Reads one shard through enhanced fan-out; see the module documentation, and
    :class:`~worker_lib.retrieval.source.RecordSource` for the arguments. The consumer's thread calls
    :meth:`fetch`; a reader thread of its own (started at the first fetch) holds the subscription. Call
    :meth:`close` when done: it ends the subscription and the thread."""

    def __init__(self, stream: str, shard_id: str, *, consumer_arn: str, **arguments: Unpack[SourceArguments]) -> None:
        super().__init__(stream, shard_id, **arguments)
        self._consumer_arn = consumer_arn
        self._resume = _Start(_starting_position(self._start_arguments), self._start_floor)
        self._events: queue.Queue[tuple[dict[str, Any], float] | _Failure] = queue.Queue(
            maxsize=self._config.fanout_buffer_events
        )
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream_lock = threading.Lock()
        self._open_stream: Any = None
        # The reader's schedule: next_at keeps subscriptions a second apart (across readers too), failures back off
        self._resubscribe = Retry(backoff=_RESUBSCRIBE_BACKOFF, clock=self._clock, stop=self._closed)
        self.subscriptions = 0  # SubscribeToShard calls that succeeded
        self.events_received = 0

    # --- the consumer's side ---------------------------------------------------------------------------------

    def _next_batch(self) -> RecordBatch:
        """The next pushed event as a batch, or an empty ``pending`` batch if none came within a fraction of a
        second (:meth:`seconds_until_next_call` stays 0: fetch waits for pushed events itself, briefly). Nothing to
        :meth:`restart`: a subscription resumes by itself from the last event received."""
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
        return self._accept(
            event.get("Records") or [],
            event.get("MillisBehindLatest"),
            more=bool(event.get("ContinuationSequenceNumber")),
            children=event.get("ChildShards") or None,  # an emulator may omit them (AWS sends them): ListShards
            received_at=received_at,
        )

    def close(self) -> None:
        """End the subscription and the reader thread (idempotent)."""
        self._closed.set()
        self._close_stream()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    # --- the reader thread -----------------------------------------------------------------------------------

    def _read(self) -> None:
        retry = self._resubscribe
        retry.succeeded()  # a new reader (after a failure the consumer saw) backs off from the start again
        while retry.wait():  # False once closed
            retry.next_at = self._clock.monotonic() + SUBSCRIBE_INTERVAL_S
            try:
                ended = self._subscribe_once()
                retry.succeeded()
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
                self._back_off(error)
            except Exception as exc:  # read timeouts, resets, a stream closed under the reader by close()
                if self._closed.is_set():
                    return
                resource = f"{self.stream}/{self.shard_id}"
                self._back_off(aws.translate(exc, operation="kinesis SubscribeToShard", resource=resource))

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

    def _back_off(self, error: DependencyError) -> None:
        delay = self._resubscribe.failed()
        log.warning("subscription to %s failed (%s); resubscribing in %.1f s", self.shard_id, error, delay)

    def _close_stream(self) -> None:
        with self._stream_lock:
            event_stream, self._open_stream = self._open_stream, None
        if event_stream is not None:
            with contextlib.suppress(Exception):
                event_stream.close()


SubscriberFactory = Callable[..., ShardSubscriber]
