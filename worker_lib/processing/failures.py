"""What a shard consumer does when the record processor fails on a batch: the failure policy's rules (pure logic).

The policy (:class:`~worker_lib.processing.config.FailureConfig`, docs/failures.md) is Lambda's event source
mapping's, applied to a KCL-style consumer:

* **record age** (``MaximumRecordAgeInSeconds``): records that arrived longer ago than ``max_record_age_s`` are not
  processed; they go to the failure destination, then the checkpoint moves past them;
* **attempts** (``MaximumRetryAttempts``): a failing batch is delivered again, up to ``max_attempts`` in all, with
  a backoff doubling from ``retry_backoff_ms``;
* **bisection** (``BisectBatchOnFunctionError``): a failing batch of more than one record is split in two at once
  (no backoff; a split does not use an attempt), down to the record that fails;
* **partial batch results** (``ReportBatchItemFailures``): a processor that names the first record that failed
  (:class:`RecordFailedError`, or Lambda's ``{"batchItemFailures": [...]}`` as the return value) has the records
  before it checkpointed, and only the rest is retried (with bisection: that record alone);
* **at the end** (:class:`~worker_lib.processing.config.FailureAction`): ``retry`` gives the lease up without a
  checkpoint, so the batch is read again from the checkpoint (KCL-compatible: nothing is skipped, ever);
  ``skip-and-record`` sends the failing records to the destination, checkpoints past them and goes on;
  ``stop-shard`` stops the shard at the failing record until an operator resumes it; ``skip`` only logs (at most
  once for those records; not recommended).

:class:`BatchDelivery` applies the rules to one batch through :class:`BatchPorts` (the consumer's I/O: the
processor, the checkpointer, the destination, the wait), so the rules are tested without AWS. A record is always
either processed or in the destination before the checkpoint moves past it: the port that records raises when the
destination cannot take the records, and nothing is checkpointed then.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol, cast

from worker_lib.core.errors import ShardleaseError
from worker_lib.core.models import KinesisRecord
from worker_lib.processing.config import FailureAction, FailureConfig

log = logging.getLogger(__name__)

RETRIES_EXHAUSTED = "RetryAttemptsExhausted"  # Lambda's condition names, as its destination records carry them
RECORD_AGE_EXCEEDED = "RecordAgeExceeded"


class RecordFailedError(ShardleaseError):
    """Raise from ``process_records`` (or a handle function) to report a partial batch result: every record
    before ``record`` is done, ``record`` failed (chain the cause: ``raise RecordFailedError(r) from exc``).
    Lambda's ``ReportBatchItemFailures``. With the default policy (``retry``) the records before it are
    checkpointed and the batch is delivered again from ``record``."""

    def __init__(self, record: KinesisRecord, message: str = "") -> None:
        super().__init__(message or f"record {record.checkpoint} failed")
        self.record = record


@dataclass(frozen=True)
class Failure:
    """One failed delivery: the error, and the index of the first record that failed (0: the whole batch)."""

    error: BaseException
    first_failed: int = 0


def failure_from_result(result: object, records: Sequence[KinesisRecord]) -> Failure | None:
    """A Lambda-style return value (``{"batchItemFailures": [{"itemIdentifier": seq}, ...]}``) as a failure at
    the lowest sequence number it names; None for any other return value (the batch succeeded)."""
    if not isinstance(result, Mapping) or not result.get("batchItemFailures"):
        return None
    named = {str(item.get("itemIdentifier")) for item in result["batchItemFailures"] if isinstance(item, Mapping)}
    for index, record in enumerate(records):
        if record.sequence_number in named:
            return Failure(PartialBatchFailure(record), first_failed=index)
    # Lambda treats an identifier it cannot match as a failure of the whole batch
    return Failure(PartialBatchFailure(None), first_failed=0)


class PartialBatchFailure(ShardleaseError):
    """A processor returned ``batchItemFailures``: the error recorded for that batch."""

    def __init__(self, record: KinesisRecord | None) -> None:
        where = f"from record {record.checkpoint}" if record is not None else "an unknown record"
        super().__init__(f"the processor reported a failure {where} (batchItemFailures)")


def failure_from_exception(exc: BaseException, records: Sequence[KinesisRecord]) -> Failure:
    """An exception from the processor as a failure: at the record a :class:`RecordFailedError` names."""
    if isinstance(exc, RecordFailedError):
        target = exc.record.checkpoint
        for index, record in enumerate(records):
            if record.checkpoint == target:
                return Failure(exc.__cause__ or exc, first_failed=index)
    return Failure(exc, first_failed=0)


class Delivered(enum.Enum):
    """How one batch's delivery ended."""

    DONE = "done"  # every record processed, skipped or recorded
    GIVE_UP = "give_up"  # policy retry, attempts spent: give the lease up without a checkpoint
    STOP_SHARD = "stop_shard"  # policy stop-shard, attempts spent: the shard stops at the failing record
    INTERRUPTED = "interrupted"  # the wait was cut short (stop requested or lease lost)


@dataclass
class FailureStats:
    """Counts of what the policy did: one batch's delivery, or (summed) since a consumer started."""

    failures: int = 0  # deliveries that raised or reported a failed record
    retries: int = 0  # deliveries again after a backoff
    bisections: int = 0  # failing batches split in two
    recorded: int = 0  # records sent to the failure destination
    skipped: int = 0  # records skipped without a destination (policy skip)
    expired: int = 0  # records older than max_record_age_s, sent to the destination unprocessed
    stopped: int = 0  # shards stopped (policy stop-shard)

    def __bool__(self) -> bool:
        """Whether anything happened (most batches: nothing, and nothing to count or publish)."""
        return any(vars(self).values())

    def add(self, other: FailureStats) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


class BatchPorts(Protocol):
    """The consumer's side of one batch's delivery."""

    def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        """Deliver ``records`` to the processor; the failure, or None if it succeeded."""
        ...

    def checkpoint(self, record: KinesisRecord) -> None:
        """Checkpoint at ``record`` (every record up to it is done), unless the processor went further."""
        ...

    def record(self, records: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None) -> None:
        """Send ``records`` to the failure destination; returns only once they are there."""
        ...

    def wait(self, seconds: float) -> bool:
        """Wait before the next attempt; False if the consumer must stop now (stop requested, lease lost)."""
        ...

    def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        """The shard is held up at ``records[0]`` (``attempts`` failed so far; failure None once unblocked)."""
        ...


class AsyncBatchPorts(Protocol):
    """:class:`BatchPorts` with awaitable methods (a lane of an async processor)."""

    async def process(self, records: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None: ...

    async def checkpoint(self, record: KinesisRecord) -> None: ...

    async def record(
        self, records: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None
    ) -> None: ...

    async def wait(self, seconds: float) -> bool: ...

    async def blocked(self, records: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None: ...


class PortCall(NamedTuple):
    """One call the policy makes on its ports: a :class:`BatchPorts` method's name and its arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}


def _call(name: str, *args: Any, **kwargs: Any) -> PortCall:
    return PortCall(name, args, kwargs)


Steps = Generator[PortCall, Any, Delivered]  # the policy's calls on its ports, each answered with the call's result


def _advance(steps: Steps, result: Any) -> PortCall | Delivered:
    """The policy's next call on its ports, given the last one's result; or how the delivery ended."""
    try:
        return steps.send(result)
    except StopIteration as done:
        return cast(Delivered, done.value)


@dataclass
class BatchDelivery:
    """Delivers one batch under the failure policy; see the module documentation.

    The rules are one generator (:meth:`steps`) of calls on the ports; :meth:`run` answers them with ``ports``
    (the consumer's thread), :meth:`run_async` with awaitable ports (a lane of an async processor), so a thread and a
    coroutine follow the same rules."""

    config: FailureConfig
    ports: BatchPorts | None
    lease_key: str
    now: float  # wall-clock seconds at delivery, for the record-age rule
    stats: FailureStats = field(default_factory=FailureStats)
    stopped_at: KinesisRecord | None = None  # with STOP_SHARD: the record the shard stopped at
    last_failure: Failure | None = None

    def run(self, records: Sequence[KinesisRecord], *, at_shard_end: bool = False) -> Delivered:
        """The rules on ``records``, through ``ports``; what a port raises propagates."""
        ports = self.ports
        assert ports is not None, "run() needs ports; run_async() takes its own"
        steps = self.steps(records, at_shard_end=at_shard_end)
        step = _advance(steps, None)
        while isinstance(step, PortCall):
            step = _advance(steps, getattr(ports, step.name)(*step.args, **step.kwargs))
        return step

    async def run_async(self, records: Sequence[KinesisRecord], ports: AsyncBatchPorts) -> Delivered:
        """:meth:`run`, with every port call awaited."""
        steps = self.steps(records)
        step = _advance(steps, None)
        while isinstance(step, PortCall):
            step = _advance(steps, await getattr(ports, step.name)(*step.args, **step.kwargs))
        return step

    def steps(self, records: Sequence[KinesisRecord], *, at_shard_end: bool = False) -> Steps:
        """The policy's calls for ``records``; its value is how the delivery ended."""
        pending: deque[Sequence[KinesisRecord]] = deque([records]) if records else deque()
        blocked = False
        while pending:
            sub = yield from self._expire(pending.popleft())
            if not sub:
                continue
            attempts = 0
            while True:
                failure = yield _call("process", sub, at_shard_end=at_shard_end and not pending)
                if failure is None:
                    break
                self.stats.failures += 1
                self.last_failure = failure
                if failure.first_failed > 0:  # a partial result: what came before it is done
                    yield _call("checkpoint", sub[failure.first_failed - 1])
                    sub = sub[failure.first_failed :]
                attempts += 1
                if not blocked:
                    blocked = True
                    yield _call("blocked", sub, attempts=attempts, failure=failure)
                if self.config.bisects and len(sub) > 1:
                    # A named record is the culprit: isolate it; otherwise halve. No backoff, no attempt used.
                    named = failure.first_failed > 0 or isinstance(failure.error, PartialBatchFailure)
                    cut = 1 if named else len(sub) // 2
                    pending.appendleft(sub[cut:])
                    sub = sub[:cut]
                    self.stats.bisections += 1
                    attempts = 0
                    continue
                if attempts >= self.config.max_attempts:
                    outcome = yield from self._exhausted(sub, attempts, failure)
                    if outcome is not None:
                        return outcome  # the shard stays marked: the next owner, status and the leader see it
                    break
                if not (yield _call("wait", self.config.retry_backoff_s(attempts))):
                    return Delivered.INTERRUPTED
                self.stats.retries += 1
                sub = yield from self._expire(sub)
                if not sub:
                    break
        # Through: remove the mark (ours, or one a previous owner left while the shard was failing).
        yield _call("blocked", (), attempts=0, failure=None)
        return Delivered.DONE

    def _expire(self, sub: Sequence[KinesisRecord]) -> Generator[PortCall, Any, Sequence[KinesisRecord]]:
        """Send the leading records older than the maximum age to the destination; the rest."""
        limit = self.config.max_record_age_s
        if not limit or not sub:
            return sub
        cutoff = self.now - limit
        old = 0
        for record in sub:
            arrival = record.approximate_arrival_timestamp
            if arrival is None or _epoch(arrival) >= cutoff:
                break
            old += 1
        if not old:
            return sub
        log.warning(
            "%d records on %s are older than %d s (max_record_age_s): sent to the failure destination unprocessed",
            old,
            self.lease_key,
            limit,
        )
        yield _call("record", sub[:old], condition=RECORD_AGE_EXCEEDED, attempts=0, error=None)
        self.stats.expired += old
        yield _call("checkpoint", sub[old - 1])
        return sub[old:]

    def _exhausted(
        self, sub: Sequence[KinesisRecord], attempts: int, failure: Failure
    ) -> Generator[PortCall, Any, Delivered | None]:
        """Attempts spent on ``sub``: the policy's action. None to go on with the next records."""
        action = self.config.on_failure
        where = f"{self.lease_key} records {sub[0].checkpoint}..{sub[-1].checkpoint} ({len(sub)})"
        error = one_line(failure.error)
        if action is FailureAction.SKIP_AND_RECORD:
            log.error("%s failed %d times (%s): sent to the failure destination, shard goes on", where, attempts, error)
            yield _call("record", sub, condition=RETRIES_EXHAUSTED, attempts=attempts, error=failure)
            self.stats.recorded += len(sub)
            yield _call("checkpoint", sub[-1])
            return None
        if action is FailureAction.SKIP:
            log.error("%s failed %d times (%s): skipped (policy skip, not recorded)", where, attempts, error)
            self.stats.skipped += len(sub)
            return None
        if action is FailureAction.STOP_SHARD:  # the consumer logs the one line, once the lease is marked
            self.stopped_at = sub[0]
            self.stats.stopped += 1
            yield _call("blocked", sub, attempts=attempts, failure=failure)
            return Delivered.STOP_SHARD
        log.error(
            "%s failed %d times (%s): lease given up without checkpointing (policy retry); the batch is read "
            "again from the last checkpoint",
            where,
            attempts,
            error,
        )
        return Delivered.GIVE_UP


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def one_line(exc: BaseException) -> str:
    """``Type: first line of its message``: how the consumer and the policy name an error in one log line."""
    text = str(exc).splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
