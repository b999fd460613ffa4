"""The record processor's lifecycle calls for one lease, each only where KCL makes it (docs/worker.md).

``initialize`` first; ``shutdown_requested`` and ``lease_lost`` only once ``initialize`` returned (a consumer that
ends while waiting on its parents never started its processor); what those two raise is logged, never propagated:
the lease moves on anyway.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from worker_lib.core.models import Lease
from worker_lib.core.streams import StreamIdentifier
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.failures import one_line
from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ShardIdentity:
    """Which lease a consumer works on: its key, its stream and its shard."""

    lease_key: str
    stream: str
    shard_id: str


class ProcessorLifecycle:
    """One lease's processor, as the consumer's states call it. A method that is a coroutine (an async processor)
    runs to its end on ``run_coroutine`` (the worker's event loop), the consumer waiting."""

    def __init__(
        self,
        processor: RecordProcessor,
        shard: ShardIdentity,
        stream: StreamIdentifier | None,
        *,
        run_coroutine: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run,
    ) -> None:
        self.processor = processor  # process_records is the delivery's (processing/delivery.py)
        self.shard = shard
        self._stream_identifier = None if stream is None else stream.serialize()
        self._run_coroutine = run_coroutine
        self.initialized = False  # initialize returned

    def _finish(self, result: object) -> None:
        if inspect.iscoroutine(result):
            self._run_coroutine(result)

    def initialize(self, lease: Lease) -> None:
        """``initialize`` with the lease's checkpoints; ProcessorFailedError propagates (the lease is given up)."""
        started = self.processor.initialize(
            InitializationInput(
                shard_id=self.shard.shard_id,
                checkpoint=lease.checkpoint,
                pending_checkpoint=lease.pending_checkpoint,
                stream_name=self.shard.stream,
                stream_identifier=self._stream_identifier,
            )
        )
        self._finish(started)
        self.initialized = True

    def shutdown_requested(self, checkpointer: LeaseCheckpointer | None) -> None:
        """The processor's last chance to checkpoint before the lease moves (stop or hand-off)."""
        if not self.initialized or checkpointer is None:
            return
        try:
            self._finish(
                self.processor.shutdown_requested(
                    ShutdownRequestedInput(shard_id=self.shard.shard_id, checkpointer=checkpointer)
                )
            )
        except Exception as exc:
            log.warning("processor.shutdown_requested raised on %s: %s", self.shard.lease_key, one_line(exc))

    def lease_lost(self) -> None:
        """The lease is gone (lost, or stopped by the failure policy); what the processor raises is logged."""
        if not self.initialized:
            return
        try:
            self._finish(self.processor.lease_lost(LeaseLostInput(shard_id=self.shard.shard_id)))
        except Exception as exc:
            log.warning("processor.lease_lost raised on %s: %s", self.shard.lease_key, one_line(exc))

    def shard_ended(self, checkpointer: LeaseCheckpointer, children: Sequence[str]) -> None:
        """``shard_ended`` (it must checkpoint SHARD_END); what it raises propagates: the consumer retries."""
        self._finish(
            self.processor.shard_ended(
                ShardEndedInput(
                    shard_id=self.shard.shard_id, checkpointer=checkpointer, child_shard_ids=tuple(children)
                )
            )
        )
