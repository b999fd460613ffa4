"""A record processor that is a MultiLang child process: what KCL's ``MultiLangShardRecordProcessor`` does.

One :class:`MultiLangProcessor` per lease, so one child per held shard, as under KCL's MultiLangDaemon. Every
call of the worker's record-processor protocol becomes one message to the child and waits for the child's status;
the checkpoints the child asks for meanwhile go through the lease's own checkpointer (fenced, validated) and are
answered with KCL's exception names, so kclpy's and aws-kcl's error handling works unchanged.

A child that exits, breaks the protocol or does not answer within ``response_timeout_s`` while it handles a batch
is replaced by a new child (initialized at the lease's last checkpoint), and the batch fails with
:class:`ChildBatchFailedError`: the failure policy decides, as for any processor (retry, bisect, record, stop the
shard; docs/failures.md). A child that fails anywhere else — or a new child that cannot start — raises
:class:`~worker_lib.multilang.child.ChildFailedError` (a :class:`ProcessorFailedError`): the consumer gives the lease
up without a checkpoint of its own, so the shard resumes from the last checkpoint the child confirmed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from worker_lib.core.errors import DependencyError, ShardleaseError, ThrottledError
from worker_lib.core.models import SHARD_END
from worker_lib.multilang import messages
from worker_lib.multilang.child import ChildFailedError, ChildProcess, child_log
from worker_lib.processing.processor import (
    Checkpointer,
    InitializationInput,
    InvalidCheckpointError,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownError,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)

# What KCL's daemon answers a checkpoint request with: the simple name of the exception its checkpointer threw.
SHUTDOWN_EXCEPTION = "ShutdownException"  # the lease is no longer ours (kclpy's sample stops checkpointing)
THROTTLING_EXCEPTION = "ThrottlingException"  # DynamoDB throttled the write: try again later
DEPENDENCY_EXCEPTION = "KinesisClientLibDependencyException"  # DynamoDB failed otherwise
INVALID_STATE_EXCEPTION = "InvalidStateException"  # no checkpointer: during initialize and leaseLost
ILLEGAL_ARGUMENT_EXCEPTION = "IllegalArgumentException"  # before the last checkpoint / after the last record


class ChildBatchFailedError(ShardleaseError):
    """The child failed while it handled a batch (it exited, broke the protocol or fell silent) and was replaced
    by a new one: the batch failed, and the failure policy decides what happens to it."""


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """How to start a child and talk to it.

    command: the program and its arguments (``executableName`` split on whitespace).
    cwd: its working directory (the properties file's directory, as for KCL's daemon).
    env: its environment (default: the daemon's).
    response_timeout_s: how long the child may stay silent while it handles a message — each line it writes,
      checkpoint requests included, restarts the wait (KCL's ``timeoutInSeconds``); ``None``: as long as it takes
      (KCL's default).
    generation: 2 (KCL 2.x/3.x: leaseLost, shardEnded) or 1 (KCL 1.x: shutdown with reason ZOMBIE or TERMINATE).
    close_grace_s: how long a child may take to exit once its stdin is closed before it is killed.
    """

    command: tuple[str, ...]
    cwd: Path | None = None
    env: Mapping[str, str] | None = None
    response_timeout_s: float | None = None
    generation: messages.Generation = 2
    close_grace_s: float = 5.0


@dataclass
class ChildRegistry:
    """The children started and not yet ended, so that the daemon can end what is left when it exits."""

    live: set[ChildProcess] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, child: ChildProcess) -> None:
        with self.lock:
            self.live.add(child)

    def discard(self, child: ChildProcess) -> None:
        with self.lock:
            self.live.discard(child)

    def close_all(self, grace_s: float) -> None:
        with self.lock:
            left = list(self.live)
            self.live.clear()
        for child in left:
            child.close(grace_s)


class MultiLangProcessor:
    """One lease's child process, driven through the MultiLang protocol (see the module's docstring)."""

    def __init__(self, spec: ChildSpec, *, registry: ChildRegistry | None = None) -> None:
        self._spec = spec
        self._registry = registry if registry is not None else ChildRegistry()
        self._child: ChildProcess | None = None
        self._shard_id = "?"
        self._init: InitializationInput | None = None

    @property
    def child(self) -> ChildProcess | None:
        """The running child, if any."""
        return self._child

    # --- the record-processor protocol ------------------------------------------------------------------------

    def initialize(self, input: InitializationInput) -> None:
        self._shard_id = input.shard_id
        self._init = input
        self._child = ChildProcess.start(
            self._spec.command, shard_id=input.shard_id, cwd=self._spec.cwd, env=self._spec.env
        )
        self._registry.add(self._child)
        # A pending checkpoint (two-phase) is not part of the MultiLang message: KCL's daemon does not send it either.
        self._exchange(messages.initialize_message(input.shard_id, input.checkpoint), None)

    def process_records(self, input: ProcessRecordsInput) -> None:
        message = messages.process_records_message(input.records, input.millis_behind_latest)
        try:
            self._exchange(message, input.checkpointer)
        except ChildFailedError as exc:
            self._restart(input.checkpointer)  # raises ChildFailedError (the lease is given up) if it cannot
            raise ChildBatchFailedError(f"{exc}; a new child took its place") from exc

    def lease_lost(self, input: LeaseLostInput) -> None:
        try:
            self._exchange(messages.lease_lost_message(self._spec.generation), None)
        finally:
            self._end()

    def shard_ended(self, input: ShardEndedInput) -> None:
        self._exchange(messages.shard_ended_message(self._spec.generation), input.checkpointer)
        if input.checkpointer.last_checkpoint == SHARD_END:
            self._end()
        # else the consumer says so and asks again: the child stays to be asked

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        """The child checkpoints, then hears ``leaseLost`` — KCL 3.x's sequence when a lease is handed over or the
        worker shuts down — and ends."""
        try:
            self._exchange(messages.shutdown_requested_message(), input.checkpointer)
            self._exchange(messages.lease_lost_message(self._spec.generation), None)
        finally:
            self._end()

    def _restart(self, checkpointer: Checkpointer) -> None:
        """A new child in place of the one that failed, initialized at the lease's last checkpoint."""
        if self._init is None:
            raise ChildFailedError(f"multilang child for {self._shard_id} failed before it was initialized")
        checkpoint = checkpointer.last_checkpoint or self._init.checkpoint
        self.initialize(replace(self._init, checkpoint=checkpoint, pending_checkpoint=None))

    # --- one message and its answer ---------------------------------------------------------------------------

    def _exchange(self, message: dict[str, Any], checkpointer: Checkpointer | None) -> None:
        """Send ``message``, answer the child's checkpoint requests, return at its status for ``message``.

        Without a checkpointer (initialize, leaseLost) a checkpoint request is answered InvalidStateException, as
        by KCL.
        """
        child = self._child
        if child is None:
            raise ChildFailedError(f"multilang child for {self._shard_id} is not running")
        action = message["action"]
        timeout = self._spec.response_timeout_s
        try:
            child.send(messages.encode(message))
            while True:
                try:
                    line = child.next_line(timeout)  # each line restarts the wait, as in KCL
                except queue.Empty:
                    raise ChildFailedError(
                        f"multilang child for {self._shard_id} (pid {child.pid}) did not answer {action}: "
                        f"{timeout:g} s without a line (timeoutInSeconds); killed"
                    ) from None
                if line is None:
                    raise child.gone()
                try:
                    answer = messages.decode(line)
                except messages.ProtocolError as exc:
                    raise ChildFailedError(
                        f"multilang child for {self._shard_id} (pid {child.pid}) broke the protocol while handling "
                        f"{action}: {exc}"
                    ) from exc
                if isinstance(answer, messages.ChildOutput):
                    if answer.text:  # kclpy and aws-kcl surround every message with blank lines
                        child_log.info("[%s] (stdout) %s", self._shard_id, answer.text)
                elif isinstance(answer, messages.CheckpointRequest):
                    child.send(messages.encode(self._checkpoint(answer, checkpointer)))
                elif answer.response_for == action:
                    return
                else:
                    raise ChildFailedError(
                        f"multilang child for {self._shard_id} (pid {child.pid}) broke the protocol: a status for "
                        f"{answer.response_for!r} while {action} was expected"
                    )
        except ChildFailedError:
            self._end(kill=True)
            raise

    def _checkpoint(self, request: messages.CheckpointRequest, checkpointer: Checkpointer | None) -> dict[str, Any]:
        error: str | None = None
        if checkpointer is None:
            error = INVALID_STATE_EXCEPTION
        else:
            try:
                if request.sequence is None:
                    checkpointer.checkpoint()
                else:
                    checkpointer.checkpoint(request.sequence, request.sub_sequence or 0)
            except ShutdownError:
                error = SHUTDOWN_EXCEPTION
            except InvalidCheckpointError as exc:
                log.warning("checkpoint refused on %s: %s", self._shard_id, exc)
                error = ILLEGAL_ARGUMENT_EXCEPTION
            except ThrottledError:
                error = THROTTLING_EXCEPTION
            except DependencyError as exc:
                log.warning("checkpoint on %s failed: %s", self._shard_id, exc)
                error = DEPENDENCY_EXCEPTION
            except Exception as exc:  # KCL answers any failure with its exception's name; the child decides
                log.error("checkpoint on %s failed: %s: %s", self._shard_id, type(exc).__name__, exc)
                error = type(exc).__name__
        return messages.checkpoint_reply(request.sequence, request.sub_sequence, error)

    def _end(self, *, kill: bool = False) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if kill:
            child.kill()
        child.close(0.0 if kill else self._spec.close_grace_s)
        self._registry.discard(child)


def split_command(executable: str) -> tuple[str, ...]:
    """``executableName`` as KCL's daemon runs it: split on whitespace, no shell."""
    return tuple(executable.split())
