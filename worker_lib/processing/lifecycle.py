"""The record processor's lifecycle calls for one lease, each only where KCL makes it (docs/worker.md).

``initialize`` first; ``shutdown_requested`` and ``lease_lost`` only once ``initialize`` returned (a consumer that
ends while waiting on its parents never started its processor); what those two raise is logged, never propagated:
the lease moves on anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from worker_lib.core.models import Lease
from worker_lib.core.streams import StreamIdentifier
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.delivery import ShardIdentity, tell_lease_lost
from worker_lib.processing.failures import one_line
from worker_lib.processing.processor import (
    InitializationInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)


class ProcessorLifecycle:
    """One lease's processor, as the consumer's states call it."""

    def __init__(self, processor: RecordProcessor, shard: ShardIdentity, stream: StreamIdentifier | None) -> None:
        self._processor = processor
        self._shard = shard
        self._stream_identifier = None if stream is None else stream.serialize()
        self.initialized = False  # initialize returned

    def initialize(self, lease: Lease) -> None:
        """``initialize`` with the lease's checkpoints; ProcessorFailedError propagates (the lease is given up)."""
        self._processor.initialize(
            InitializationInput(
                shard_id=self._shard.shard_id,
                checkpoint=lease.checkpoint,
                pending_checkpoint=lease.pending_checkpoint,
                stream_name=self._shard.stream,
                stream_identifier=self._stream_identifier,
            )
        )
        self.initialized = True

    def shutdown_requested(self, checkpointer: LeaseCheckpointer | None) -> None:
        """The processor's last chance to checkpoint before the lease moves (stop or hand-off)."""
        if not self.initialized or checkpointer is None:
            return
        try:
            self._processor.shutdown_requested(
                ShutdownRequestedInput(shard_id=self._shard.shard_id, checkpointer=checkpointer)
            )
        except Exception as exc:
            log.warning("processor.shutdown_requested raised on %s: %s", self._shard.lease_key, one_line(exc))

    def lease_lost(self) -> None:
        if self.initialized:
            tell_lease_lost(self._processor, self._shard)

    def shard_ended(self, checkpointer: LeaseCheckpointer, children: Sequence[str]) -> None:
        """``shard_ended`` (it must checkpoint SHARD_END); what it raises propagates: the consumer retries."""
        self._processor.shard_ended(
            ShardEndedInput(shard_id=self._shard.shard_id, checkpointer=checkpointer, child_shard_ids=tuple(children))
        )
