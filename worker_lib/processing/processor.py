"""The record-processor protocol (KCL's ``ShardRecordProcessor`` in Python names) and how users supply one.

A user gives the worker either

* a **class** (or any factory taking no arguments) whose instances implement :class:`RecordProcessor` — one
  instance per shard lease, as in KCL — or
* a **plain function** ``handle(records, checkpointer)``, wrapped in :class:`FunctionProcessor`.

``shardlease worker --processor MODULE:ATTR`` resolves the spec with :func:`load_processor`.

Lifecycle of one processor instance (one lease, one shard)::

    initialize ─▶ process_records* ─┬─▶ shard_ended          (the shard is closed; MUST checkpoint)
                                    ├─▶ shutdown_requested   (graceful handoff or SIGTERM; should checkpoint)
                                    └─▶ lease_lost           (another worker owns the shard; cannot checkpoint)

Checkpoint rules (:func:`validate_checkpoint_value` states them for implementers of :class:`Checkpointer`):
a checkpoint may not go backwards from the last one, and may not go beyond the last record delivered to the
processor — except at shard end, where ``checkpoint()`` writes ``SHARD_END``. A checkpoint after the lease is
lost raises :class:`ShutdownError`; no stale checkpoint is ever written.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeAlias, cast, runtime_checkable

from worker_lib.core.errors import ConfigError, ShardleaseError
from worker_lib.core.imports import import_attr
from worker_lib.core.models import Checkpoint, KinesisRecord

log = logging.getLogger(__name__)

__all__ = [
    "AsyncCheckpointer",
    "AsyncFunctionProcessor",
    "AsyncHandleFunction",
    "CheckpointError",
    "Checkpointer",
    "ExactlyOnceCheckpointer",
    "FunctionProcessor",
    "HandleFunction",
    "InitializationInput",
    "InvalidCheckpointError",
    "KinesisRecord",
    "LeaseLostInput",
    "PreparedCheckpointer",
    "ProcessRecordsInput",
    "ProcessorFactory",
    "ProcessorFailedError",
    "RecordProcessor",
    "ShardEndedInput",
    "ShutdownError",
    "ShutdownRequestedInput",
    "load_processor",
    "validate_checkpoint_value",
]


# --- errors --------------------------------------------------------------------------------------------------


class CheckpointError(ShardleaseError):
    """A checkpoint could not be written. Base of the checkpoint errors a processor may see."""


class ShutdownError(CheckpointError):
    """The lease is no longer ours (lost, expired, or handed off): the checkpoint was *not* written.

    KCL's ``ShutdownException``. A processor should stop work for the shard; ``lease_lost`` follows.
    """


class InvalidCheckpointError(CheckpointError, ValueError):
    """The checkpoint value is malformed or out of range (before the last checkpoint or after the last
    delivered record). KCL's ``IllegalArgumentException``. Nothing was written."""


class ProcessorFailedError(ShardleaseError):
    """The processor can do nothing more for this lease (a MultiLang child that exited, broke the protocol or fell
    silent): the consumer neither retries the batch nor checkpoints; it gives the lease up at once, and the shard's
    next processor starts from the last checkpoint. Raise it from any processor method."""


# --- records -------------------------------------------------------------------------------------------------


# --- checkpointer --------------------------------------------------------------------------------------------


@runtime_checkable
class PreparedCheckpointer(Protocol):
    """A pending checkpoint (KCL's two-phase checkpoint): stored as ``pendingCheckpoint`` until committed."""

    @property
    def pending_checkpoint(self) -> Checkpoint:
        """The prepared value."""
        ...

    def checkpoint(self) -> None:
        """Commit the prepared value as the checkpoint (raises :class:`ShutdownError` if the lease was lost)."""
        ...


@runtime_checkable
class Checkpointer(Protocol):
    """Writes checkpoints for one lease, fenced by the lease counter (a stale owner can never write)."""

    def checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None:
        """Record progress.

        With no argument: the largest permitted value — the last record delivered to the processor, or
        ``SHARD_END`` once the shard has ended. With ``sequence`` (and optionally ``sub_sequence``): exactly that
        position, which must lie between the last checkpoint and the last delivered record.

        Raises :class:`ShutdownError` if the lease was lost and :class:`InvalidCheckpointError` if the value is
        out of range; infrastructure failures raise :class:`~worker_lib.core.errors.DependencyError`.
        """
        ...

    def checkpoint_record(self, record: KinesisRecord) -> None:
        """Record progress up to and including ``record`` (its sequence and sub-sequence number)."""
        ...

    def prepare_checkpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> PreparedCheckpointer:
        """Store a pending checkpoint (same value rules as :meth:`checkpoint`) and return its committer."""
        ...

    def prepare_checkpoint_record(self, record: KinesisRecord) -> PreparedCheckpointer:
        """:meth:`prepare_checkpoint` for the position of ``record``."""
        ...

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        """The last checkpoint this lease has (from the table at start, then every successful write)."""
        ...


@runtime_checkable
class ExactlyOnceCheckpointer(Checkpointer, Protocol):
    """What the worker's checkpointers also do (docs/exactly-once.md): stage DynamoDB outputs that commit with the
    checkpoint, and name the lease and its fencing token for a sink that keeps positions."""

    lease_key: str
    fencing_token: int  # the lease counter at the take: grows with every change of owner

    def stage(self, record: KinesisRecord, *writes: Mapping[str, Any]) -> None:
        """``TransactWriteItems`` actions that are ``record``'s effects, committed in one transaction with the next
        checkpoint at or past ``record``; outputs of a record already checkpointed are not staged again."""
        ...


@runtime_checkable
class AsyncCheckpointer(Checkpointer, Protocol):
    """A :class:`Checkpointer` an async processor can await: the same rules, without blocking the event loop."""

    async def acheckpoint(self, sequence: str | None = None, sub_sequence: int = 0) -> None: ...

    async def acheckpoint_record(self, record: KinesisRecord) -> None: ...


def validate_checkpoint_value(
    sequence: str,
    sub_sequence: int,
    *,
    last_checkpoint: Checkpoint | None,
    largest_permitted: Checkpoint | None,
) -> Checkpoint:
    """The checkpoint ``(sequence, sub_sequence)`` if a processor may write it now, else raise.

    Rules (KCL's ``RecordProcessorCheckpointer``): the value is a decimal sequence number (or ``SHARD_END``)
    with a non-negative sub-sequence; it is not before ``last_checkpoint`` (a real sequence number only);
    and it is not after ``largest_permitted`` (the last delivered record, or ``SHARD_END`` at shard end).
    """
    if sub_sequence < 0:
        raise InvalidCheckpointError(f"sub-sequence number {sub_sequence} is negative")
    value = Checkpoint(sequence=sequence, sub_sequence=sub_sequence)
    if last_checkpoint is not None and last_checkpoint.is_shard_end and not value.is_shard_end:
        raise InvalidCheckpointError(f"checkpoint {value} is before the last checkpoint SHARD_END")
    if value.is_shard_end:
        if largest_permitted is None or not largest_permitted.is_shard_end:
            raise InvalidCheckpointError("SHARD_END may only be checkpointed once the shard has ended")
        return Checkpoint(sequence=sequence)
    if not sequence.isdigit():
        raise InvalidCheckpointError(f"{sequence!r} is not a sequence number")
    if last_checkpoint is not None and not last_checkpoint.is_sentinel and last_checkpoint.is_after(value):
        raise InvalidCheckpointError(f"checkpoint {value} is before the last checkpoint {last_checkpoint}")
    if largest_permitted is None:
        raise InvalidCheckpointError(f"checkpoint {value} is beyond the last delivered record (none delivered)")
    if not largest_permitted.is_sentinel and value.is_after(largest_permitted):
        raise InvalidCheckpointError(f"checkpoint {value} is beyond the last delivered record {largest_permitted}")
    return value


# --- the processor protocol ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class InitializationInput:
    """Where the lease starts: its checkpoint (a sequence number or a sentinel) and any pending checkpoint.

    shard_id: the shard (every input names it; in a multi-stream application the bare shard id, as in KCL).
    stream_name: the Kinesis stream the records come from.
    stream_identifier: in a multi-stream application the stream's ``account:stream:creationEpoch`` (KCL's
      ``streamIdentifierSerOpt``), which tells a stream from a deleted one of the same name; None otherwise.
    """

    shard_id: str
    checkpoint: Checkpoint
    pending_checkpoint: Checkpoint | None = None
    stream_name: str = ""
    stream_identifier: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProcessRecordsInput:
    """One batch of de-aggregated records in shard order.

    millis_behind_latest: how far the batch is behind the tip of the shard (from GetRecords; None if unknown).
    cache_entry_time / cache_exit_time: when the batch was fetched (with enhanced fan-out: when its event was
      received) and handed to the processor (KCL's prefetch-cache timestamps; equal when the batch was not queued).
    is_at_shard_end: True for the last batch of a closed shard (``shard_ended`` follows).
    """

    shard_id: str
    records: Sequence[KinesisRecord]
    checkpointer: Checkpointer
    millis_behind_latest: int | None = None
    cache_entry_time: datetime | None = None
    cache_exit_time: datetime | None = None
    is_at_shard_end: bool = False


@dataclass(frozen=True, kw_only=True)
class LeaseLostInput:
    """The lease was taken by another worker or expired: stop work; checkpointing is no longer possible."""

    shard_id: str


@dataclass(frozen=True, kw_only=True)
class ShardEndedInput:
    """The shard is closed and every record was delivered. The processor must call ``checkpointer.checkpoint()``
    (which writes ``SHARD_END``), otherwise the children never start."""

    shard_id: str
    checkpointer: Checkpointer
    child_shard_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ShutdownRequestedInput:
    """The worker is giving the lease up (graceful handoff or shutdown): flush and checkpoint now."""

    shard_id: str
    checkpointer: Checkpointer


@runtime_checkable
class RecordProcessor(Protocol):
    """What a record processor implements (KCL's ``ShardRecordProcessor``)."""

    def initialize(self, input: InitializationInput) -> object:
        """Returns None (or, in an async processor, is a coroutine: any of these methods may be)."""
        ...

    def process_records(self, input: ProcessRecordsInput) -> object:
        """Process one batch. Return None, or — a partial batch result — raise
        :class:`~worker_lib.processing.failures.RecordFailedError` naming the first record that failed, or return
        Lambda's ``{"batchItemFailures": [{"itemIdentifier": "<sequence number>"}]}``: the records before it are
        checkpointed and the rest is retried under the failure policy (docs/failures.md)."""
        ...

    def lease_lost(self, input: LeaseLostInput) -> object: ...

    def shard_ended(self, input: ShardEndedInput) -> object: ...

    def shutdown_requested(self, input: ShutdownRequestedInput) -> object: ...


ProcessorFactory: TypeAlias = Callable[[], RecordProcessor]
# The checkpointer handed over is an ExactlyOnceCheckpointer (an AsyncCheckpointer too, for an async function): Any,
# so that a function may annotate it as any of the protocols it uses.
HandleFunction: TypeAlias = Callable[[Sequence[KinesisRecord], Any], object]
AsyncHandleFunction: TypeAlias = Callable[[Sequence[KinesisRecord], Any], Awaitable[object]]

_PROCESSOR_METHODS = ("initialize", "process_records", "lease_lost", "shard_ended", "shutdown_requested")


class FunctionProcessor:
    """Adapts a plain function ``handle(records, checkpointer)`` to :class:`RecordProcessor`.

    Contract for the function: when ``handle`` returns, the records it was given are done. The function may
    checkpoint itself whenever it likes. Because it cannot see the lifecycle, this adapter checkpoints for it:

    * at shard end: ``SHARD_END`` (otherwise the child shards would never start);
    * on a shutdown request: the last record of the last batch ``handle`` returned from normally;
    * after every batch as well, if ``checkpoint_every_batch`` is set.

    Empty batches are not passed to the function. An exception from ``handle`` propagates and that batch is never
    checkpointed by the adapter: the consumer applies the failure policy (docs/failures.md). ``handle`` may report
    a partial batch result by raising :class:`~worker_lib.processing.failures.RecordFailedError` or by returning
    Lambda's ``{"batchItemFailures": [...]}``.
    """

    def __init__(self, handle: HandleFunction, *, checkpoint_every_batch: bool = False) -> None:
        self.handle = handle
        self.checkpoint_every_batch = checkpoint_every_batch
        self.shard_id: str | None = None
        self._done: KinesisRecord | None = None  # last record of the last batch handled without error
        self._checkpointed: KinesisRecord | None = None

    def __repr__(self) -> str:
        return f"FunctionProcessor({_qualname(self.handle)})"

    def initialize(self, input: InitializationInput) -> None:
        self.shard_id = input.shard_id

    def process_records(self, input: ProcessRecordsInput) -> object:
        if not input.records:
            return None
        return self._handled(input, self.handle(input.records, input.checkpointer))

    def _handled(self, input: ProcessRecordsInput, result: object) -> object:
        if isinstance(result, Mapping) and result.get("batchItemFailures"):
            return result  # a partial batch result: the consumer checkpoints what came before the failure
        done = input.records[-1]  # (this batch's: with lanes, another lane may have set _done meanwhile)
        self._done = done
        if self.checkpoint_every_batch:
            self._checkpoint(input.checkpointer, done)
        return None

    def lease_lost(self, input: LeaseLostInput) -> None:
        self._done = None

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self._checkpoint_done(input.checkpointer)

    def _checkpoint_done(self, checkpointer: Checkpointer) -> None:
        if self._done is not None:
            self._checkpoint(checkpointer, self._done)

    def _checkpoint(self, checkpointer: Checkpointer, done: KinesisRecord) -> None:
        if done is self._checkpointed:
            return
        last = checkpointer.last_checkpoint
        if last is not None and not last.is_sentinel and not done.checkpoint.is_after(last):
            return  # the function already checkpointed this far (or further)
        checkpointer.checkpoint_record(done)
        self._checkpointed = done


class AsyncFunctionProcessor(FunctionProcessor):
    """:class:`FunctionProcessor` for a coroutine function ``async def handle(records, checkpointer)``: it runs on
    the worker's event loop, its lanes as tasks (docs/worker.md, "Async processors"); the checkpointer's awaitable
    methods (``await checkpointer.acheckpoint()``) never block the loop."""

    def __init__(self, handle: AsyncHandleFunction, *, checkpoint_every_batch: bool = False) -> None:
        super().__init__(cast(HandleFunction, handle), checkpoint_every_batch=checkpoint_every_batch)
        self.async_handle = handle

    def __repr__(self) -> str:
        return f"AsyncFunctionProcessor({_qualname(self.handle)})"

    async def process_records(self, input: ProcessRecordsInput) -> object:
        if not input.records:
            return None
        return self._handled(input, await self.async_handle(input.records, input.checkpointer))


# --- loading a processor from "module:attr" ------------------------------------------------------------------


def load_processor(spec: str) -> ProcessorFactory:
    """Resolve ``"module:attr"`` to a factory that makes one :class:`RecordProcessor` per lease.

    ``attr`` (dots allowed, e.g. ``Outer.Inner``) may name a record-processor class, a factory taking no
    arguments (its result is checked when called), or a function ``handle(records, checkpointer)`` (wrapped in
    :class:`FunctionProcessor`). Anything else raises :class:`ConfigError` with one line saying what is wrong.
    """
    target = import_attr(spec, what="processor", example="mypkg.processors:MyProcessor")
    attr_path = spec.strip().partition(":")[2]

    if inspect.isclass(target):
        missing = [m for m in _PROCESSOR_METHODS if not callable(getattr(target, m, None))]
        if missing:
            raise ConfigError(
                f"invalid processor {spec!r}: class {target.__name__} is not a record processor "
                f"(missing {', '.join(missing)})"
            )
        if not _accepts(target, 0):
            raise ConfigError(
                f"invalid processor {spec!r}: class {target.__name__} must be constructible without arguments"
            )
        return cast(ProcessorFactory, target)  # checked above: it has every method of the protocol
    if not callable(target):
        kind = "a record processor instance" if _looks_like_processor(target) else f"a {type(target).__name__}"
        raise ConfigError(
            f"invalid processor {spec!r}: {attr_path} is {kind}; expected a record-processor class, "
            "a factory taking no arguments, or a function handle(records, checkpointer)"
        )
    if _accepts(target, 0):
        return _CheckedFactory(target, spec)
    if _accepts(target, 2):
        return _FunctionProcessorFactory(target)
    raise ConfigError(
        f"invalid processor {spec!r}: {attr_path} takes neither no arguments (a factory) nor "
        "(records, checkpointer) (a handle function)"
    )


class _CheckedFactory:
    """A user factory whose result is checked to be a record processor (it is only known once called)."""

    def __init__(self, factory: Callable[[], object], spec: str) -> None:
        self._factory = factory
        self._spec = spec

    def __repr__(self) -> str:
        return f"factory {self._spec}"

    def __call__(self) -> RecordProcessor:
        made = self._factory()
        if isinstance(made, RecordProcessor):
            return made
        missing = [m for m in _PROCESSOR_METHODS if not callable(getattr(made, m, None))]
        raise ConfigError(
            f"invalid processor {self._spec!r}: the factory returned a {type(made).__name__}, "
            f"not a record processor (missing {', '.join(missing)})"
        )


class _FunctionProcessorFactory:
    def __init__(self, handle: Callable[..., object]) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"function {_qualname(self.handle)}"

    def __call__(self) -> RecordProcessor:
        if inspect.iscoroutinefunction(self.handle):
            return AsyncFunctionProcessor(self.handle)
        return FunctionProcessor(self.handle)


def _accepts(func: Callable[..., object], positional: int) -> bool:
    """Whether ``func`` can be called with exactly ``positional`` positional arguments."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # some builtins have no signature: assume the simplest use
        return positional == 0
    try:
        signature.bind(*([None] * positional))
    except TypeError:
        return False
    return True


def _looks_like_processor(obj: object) -> bool:
    return all(callable(getattr(obj, m, None)) for m in _PROCESSOR_METHODS)


def _qualname(func: object) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
