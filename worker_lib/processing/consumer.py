"""One shard consumer per held lease, as an explicit state machine (KCL's ShardConsumer): read, deliver to the
processor, checkpoint with fencing, end cleanly.

States and transitions (docs/kcl-compatibility.md, "Shard sync and lease lifecycle"; docs/worker.md)::

    admit ─▶ WAITING_ON_PARENTS ─▶ INITIALIZING ─▶ PROCESSING ─▶ SHARD_END ─▶ FINISHED
      │              │                  │              │             │
      │              └──────────────────┴──────┬───────┴─────────────┘  the guard, before every step:
      │                                        ├─▶ SHUTTING_DOWN ─▶ SHUTDOWN     stop requested
      │                                        ├─▶ HANDING_OFF   ─▶ HANDED_OFF   hand-off requested
      │                                        └─▶ LEASE_LOST    ─▶ LOST         lease no longer valid
      └─▶ LOST (not held) | FINISHED (already ended) | STOPPED (stopped by its policy)

    any step may also end in GAVE_UP (policy retry, or the processor failed) or STOPPED (policy stop-shard)

Every step of every active state starts with the one guard (:meth:`ShardConsumer._guard`), in one fixed order:
stop requested, hand-off requested, lease still valid; a fetched batch passes it again before it is delivered,
and so does every wait inside a delivery. The consumer thus never delivers a batch while its lease is invalid
(self-fencing), and never checkpoints except through :class:`LeaseCheckpointer`, whose every write is conditional
on the lease counter. The processor is told ``shutdown_requested`` or ``lease_lost`` only once it was initialized.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError, StreamMissingError
from worker_lib.core.models import SHARD_END, Checkpoint, LaneStats, Lease, ShardInfo
from worker_lib.core.streams import split_lease_key
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.checkpointer import LeaseCheckpointer
from worker_lib.processing.config import ConsumerConfig
from worker_lib.processing.delivery import Deliveries, DeliveryContext, FailureHandling, ShardMark
from worker_lib.processing.failures import Delivered, FailureStats, one_line
from worker_lib.processing.lane_driver import LaneDriver
from worker_lib.processing.lanes import LaneLoop, LaneResult, loop_for
from worker_lib.processing.lifecycle import ProcessorLifecycle, ShardIdentity
from worker_lib.processing.positions import PositionSink, later_start
from worker_lib.processing.processor import KinesisRecord, ProcessorFailedError, RecordProcessor, ShutdownError
from worker_lib.retrieval import RecordBatch, RecordSource, RecordSources
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.shardsync.children import ParentsEnded, ensure_child_leases

__all__ = ["ConsumerOutcome", "ConsumerState", "FailureHandling", "ShardConsumer"]

log = logging.getLogger(__name__)

ShardLister = Callable[[], Sequence[ShardInfo]]
BytesSink = Callable[[str, int], None]  # (lease_key, bytes delivered)
RecordsSink = Callable[[str, Sequence[KinesisRecord], int | None], None]  # (lease_key, records, millis behind)


class ConsumerOutcome(enum.Enum):
    FINISHED = "finished"  # SHARD_END checkpointed
    SHUTDOWN = "shutdown"  # worker stopping; lease given up
    HANDED_OFF = "handed_off"  # graceful handoff completed
    LOST = "lost"  # lease lost or not renewed in time
    GAVE_UP = "gave_up"  # processor kept failing (policy retry): lease given up for a retry from the checkpoint
    STOPPED = "stopped"  # processor kept failing (policy stop-shard): lease given up, marked stopped


class ConsumerState(enum.Enum):
    """Where a consumer is; see the module documentation's picture."""

    WAITING_ON_PARENTS = "waiting_on_parents"
    INITIALIZING = "initializing"
    PROCESSING = "processing"
    SHARD_END = "shard_end"
    SHUTTING_DOWN = "shutting_down"  # stop requested: give the lease up
    HANDING_OFF = "handing_off"  # hand-off requested: complete it
    LEASE_LOST = "lease_lost"  # the lease is no longer ours

    @property
    def active(self) -> bool:
        """Whether the guard runs before this state's steps (the last three only end the consumer)."""
        return self in _ACTIVE


_ACTIVE = frozenset(
    {ConsumerState.WAITING_ON_PARENTS, ConsumerState.INITIALIZING, ConsumerState.PROCESSING, ConsumerState.SHARD_END}
)

Step = ConsumerState | ConsumerOutcome  # where a step leads: the next state, or the end


class ShardConsumer:
    """Consumes one leased shard on the calling thread until it ends, is lost, handed off or stopped.

    sources: opens the lease's record source (None: polling with ``kinesis_client`` and ``retrieval``).
    """

    def __init__(
        self,
        *,
        lease_key: str,
        stream: str,
        holder: LeaseHolder,
        store: LeaseStore,
        processor: RecordProcessor,
        kinesis_client: object,
        list_shards: ShardLister,
        config: ConsumerConfig | None = None,
        retrieval: RetrievalConfig | None = None,
        initial_timestamp: datetime | None = None,
        on_bytes: BytesSink | None = None,
        on_records: RecordsSink | None = None,
        sources: RecordSources | None = None,
        failures: FailureHandling | None = None,
        lane_loop: LaneLoop | None = None,
        positions: PositionSink | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.lease_key = lease_key
        self._positions = positions
        self.stream = stream
        stream_identifier, self.shard_id = split_lease_key(lease_key)
        shard = ShardIdentity(lease_key=lease_key, stream=stream, shard_id=self.shard_id)
        self._config = config or ConsumerConfig()
        # Lanes (processing/lanes.py) with parallelism > 1 and for an async processor (event-loop tasks)
        self._loop, self._own_loop = loop_for(processor, lane_loop, name=f"lanes-{lease_key}")
        self._laned = self._loop is not None or self._config.parallelism > 1
        run_coroutine = self._loop.run if self._loop is not None else asyncio.run
        self._lifecycle = ProcessorLifecycle(processor, shard, stream_identifier, run_coroutine=run_coroutine)
        self._holder = holder
        self._store = store
        self._list_shards = list_shards
        self._sources = sources or RecordSources(
            retrieval or RetrievalConfig(), kinesis_client=kinesis_client, clock=clock
        )
        self._initial_timestamp = initial_timestamp
        self._on_bytes = on_bytes
        self._on_records = on_records
        self._clock = clock
        self._stop = threading.Event()
        # Every wait of the consumer wakes on stop; after a failed read it waits error_backoff_ms, constant as in KCL.
        error_backoff = self._config.error_backoff_ms
        self._pause = Retry(backoff=Backoff.of_ms(error_backoff, error_backoff), clock=clock, stop=self._stop)
        handling = failures or FailureHandling()
        self._mark = ShardMark(holder, lease_key, worker_id=handling.worker_id, clock=clock)
        self._deliveries = Deliveries(
            DeliveryContext(
                lifecycle=self._lifecycle,
                mark=self._mark,
                failures=handling,
                clock=clock,
                wait=self._wait_unless_interrupted,
            )
        )
        self._steps: dict[ConsumerState, Callable[[], Step]] = {
            ConsumerState.WAITING_ON_PARENTS: self._wait_on_parents,
            ConsumerState.INITIALIZING: self._initialize,
            ConsumerState.PROCESSING: self._process,
            ConsumerState.SHARD_END: self._end_shard,
            ConsumerState.SHUTTING_DOWN: self._shut_down,
            ConsumerState.HANDING_OFF: self._hand_off,
            ConsumerState.LEASE_LOST: self._lose_lease,
        }
        self.state = ConsumerState.WAITING_ON_PARENTS
        self._lease: Lease | None = None  # as found at the start
        self._parents = ParentsEnded(store)
        self._checkpointer: LeaseCheckpointer | None = None  # from INITIALIZING on
        self._source: RecordSource | None = None  # from INITIALIZING on
        self._lanes: LaneDriver | None = None  # from INITIALIZING on, with lanes
        self._children: tuple[str, ...] = ()  # at SHARD_END: the shard's children
        self.records_delivered = 0
        self.bytes_delivered = 0
        self.millis_behind_latest: int | None = None

    @property
    def failure_stats(self) -> FailureStats:
        """What the failure policy did on this lease so far."""
        return self._deliveries.stats

    def request_stop(self) -> None:
        """Worker shutdown: finish the batch in flight, let the processor checkpoint, give the lease up."""
        self._stop.set()
        if self._lanes is not None:
            self._lanes.lanes.wake()

    @property
    def lane_stats(self) -> LaneStats | None:
        """Records read and not yet done, and how long the first of them has waited (None: no lanes)."""
        lanes = self._lanes
        return None if lanes is None else LaneStats(in_flight=lanes.in_flight, watermark_lag_ms=lanes.lag_ms)

    # --- the machine ----------------------------------------------------------------------------------------

    def run(self) -> ConsumerOutcome:
        try:
            outcome = self._admit()
            while outcome is None:
                if self.state.active:
                    self.state = self._guard() or self.state
                step = self._steps[self.state]()
                if isinstance(step, ConsumerOutcome):
                    outcome = step
                else:
                    self.state = step
            return outcome
        finally:
            if self._lanes is not None:
                self._lanes.lanes.shutdown()
            if self._own_loop and self._loop is not None:
                self._loop.close()
            if self._source is not None:
                self._source.close()
            if self._on_bytes is not None:
                self._on_bytes(self.lease_key, 0)  # let the recorder close the window

    def _guard(self) -> ConsumerState | None:
        """The one transition guard, in its fixed order: stop requested, hand-off requested, lease still valid.
        None: go on in the current state."""
        if self._stop.is_set():
            return ConsumerState.SHUTTING_DOWN
        if self._holder.handoff_requested(self.lease_key):
            return ConsumerState.HANDING_OFF
        if self._holder.still_valid(self.lease_key, stop=self._stop):
            return None
        # still_valid returns early when a stop arrives while it waits for a verdict: then the stop path gives it up
        return ConsumerState.SHUTTING_DOWN if self._stop.is_set() else ConsumerState.LEASE_LOST

    def _wait_unless_interrupted(self, seconds: float) -> bool:
        """A delivery's wait (policy backoff, destination retry): wait, then False if the guard would move on."""
        self._pause.wait(seconds)
        return self._guard() is None

    def _admit(self) -> ConsumerOutcome | None:
        """The lease as the consumer finds it: not held, already ended or stopped ends the consumer at once."""
        lease = self._holder.lease(self.lease_key)
        if lease is None or not self._holder.still_valid(self.lease_key, stop=self._stop):
            return ConsumerOutcome.LOST
        if lease.is_finished:
            self._holder.drop(self.lease_key)
            return ConsumerOutcome.FINISHED
        if lease.is_stopped:
            # an older leader assigned a stopped shard: leave it stopped (shardlease resume-shard ends that)
            log.warning("lease %s is stopped by its failure policy: not processed, given up", self.lease_key)
            self._holder.evict(self.lease_key)
            return ConsumerOutcome.STOPPED
        self._lease = lease
        self._mark.block = lease.block
        return None

    # --- active states: one step each -----------------------------------------------------------------------

    def _wait_on_parents(self) -> Step:
        assert self._lease is not None
        if self._parents.ended(self._lease):
            return ConsumerState.INITIALIZING
        log.debug("lease %s waits for its parents %s", self.lease_key, sorted(self._lease.parent_shard_ids))
        self._pause.wait(self._config.parent_poll_interval_ms / 1000)
        return ConsumerState.WAITING_ON_PARENTS

    def _initialize(self) -> Step:
        lease = self._lease
        assert lease is not None
        checkpointer = LeaseCheckpointer(
            self._holder,
            self.lease_key,
            initial=lease.checkpoint,
            watermark=self._laned,
            fencing_token=lease.lease_counter,
            metrics=self._deliveries.context.failures.metrics,
        )
        self._checkpointer = checkpointer
        start = lease.checkpoint
        if self._positions is not None:
            try:
                held = self._positions.claim(self.lease_key, lease.lease_counter)
            except ShutdownError as exc:
                log.warning("%s; lease %s given up", exc, self.lease_key)
                return ConsumerState.LEASE_LOST
            except Exception as exc:  # the sink's own errors (connection refused, ...): the lease goes back
                return self._processor_failed(ProcessorFailedError(f"position sink: {one_line(exc)}"))
            start = later_start(lease.checkpoint, held)
            if start != lease.checkpoint:
                log.info(
                    "lease %s starts after the sink's position %s (checkpoint %s)",
                    self.lease_key,
                    start,
                    lease.checkpoint,
                )
        timestamp = self._initial_timestamp if start.sequence == "AT_TIMESTAMP" else None
        self._source = self._sources.open(self.stream, lease.shard_id, start=start, timestamp=timestamp)
        if self._laned:
            self._lanes = LaneDriver.open(
                self.lease_key,
                config=self._config,
                checkpointer=checkpointer,
                deliveries=self._deliveries,
                delivered=self._delivered,
                loop=self._loop,
                valid=lambda: self._holder.is_valid(self.lease_key),
                clock=self._clock,
            )
        try:
            self._lifecycle.initialize(lease)
        except ProcessorFailedError as exc:
            return self._processor_failed(exc)
        return ConsumerState.PROCESSING

    def _process(self) -> Step:
        """One read, and the delivery of what it returned."""
        if self._lanes is not None:
            return self._process_in_lanes(self._lanes)
        source, checkpointer = self._source, self._checkpointer
        assert source is not None and checkpointer is not None
        delay = source.seconds_until_next_call()
        if delay > 0:  # wait here, where the guard runs after it, not inside fetch()
            self._pause.wait(delay)
            return ConsumerState.PROCESSING
        batch = self._read(source)
        if not isinstance(batch, RecordBatch):
            return batch
        if batch.records or (self._config.deliver_empty_batches and not batch.end_of_shard):
            checkpointer.largest_permitted = source.last_delivered
            step = self._deliver(batch, checkpointer)
            if step is not None:
                return step
        elif batch.millis_behind_latest is not None:
            self.millis_behind_latest = batch.millis_behind_latest
        if batch.end_of_shard:
            self._children = tuple(batch.child_shards)
            return ConsumerState.SHARD_END
        return ConsumerState.PROCESSING

    def _read(self, source: RecordSource) -> RecordBatch | Step:
        """One read; where a failed read leads, or where the guard leads once it returned."""
        try:
            batch = source.fetch()
        except StreamMissingError as exc:
            if self._lease_deleted():
                # The stream is gone and the leader deleted its leases (docs/multi-stream.md): stop here, as for
                # any lost lease, rather than retry a read that can never succeed (in worker liveness mode
                # nothing else would tell us).
                log.info("lease %s was deleted with its stream (%s): consumer stopped", self.lease_key, exc)
                return ConsumerState.LEASE_LOST
            return self._read_failed(exc)
        except DependencyError as exc:
            return self._read_failed(exc)
        # Never deliver what we may no longer own; a batch read as a stop or a hand-off arrived is left to the next
        # owner, who reads it from the checkpoint.
        return self._guard() or batch

    def _process_in_lanes(self, lanes: LaneDriver) -> Step:
        """One step with lanes: take in what lanes finished, checkpoint the watermark when due, read one batch and
        deal it (unless the shard was read to its end or too many records are in flight), or wait for lanes."""
        source = self._source
        assert source is not None
        ended = lanes.finished()
        if ended is not None:
            return self._lane_ended(ended)
        if not lanes.write_watermark(due_only=True):
            return ConsumerState.LEASE_LOST
        if lanes.read_to_end:
            if lanes.in_flight:
                lanes.wait()
                return ConsumerState.PROCESSING
            return ConsumerState.SHARD_END if lanes.write_watermark(due_only=False) else ConsumerState.LEASE_LOST
        if lanes.full:
            lanes.wait()  # backpressure: the reader waits for lanes to catch up
            return ConsumerState.PROCESSING
        delay = source.seconds_until_next_call()
        if delay > 0:
            lanes.wait(delay)
            return ConsumerState.PROCESSING
        batch = self._read(source)
        if not isinstance(batch, RecordBatch):
            return batch
        lanes.deal(batch)
        if not batch.records and batch.millis_behind_latest is not None:
            self.millis_behind_latest = batch.millis_behind_latest
        if batch.end_of_shard:
            self._children = tuple(batch.child_shards)
        return ConsumerState.PROCESSING

    def _lane_ended(self, result: LaneResult) -> Step:
        """A lane's delivery ended otherwise than done: the lease goes as the policy (or the error) says."""
        error = result.error
        if isinstance(error, ShutdownError):
            return ConsumerState.LEASE_LOST
        self._settle_lanes(write=True)
        if result.delivered is Delivered.STOP_SHARD and result.delivery is not None:
            self._deliveries.stop_shard(result.delivery)
            return ConsumerOutcome.STOPPED
        if isinstance(error, ProcessorFailedError):
            return self._processor_failed(error)
        if error is not None:
            log.error("a lane of %s failed: %s", self.lease_key, one_line(error))
        self._holder.evict(self.lease_key)
        return ConsumerOutcome.GAVE_UP

    def _settle_lanes(self, *, write: bool) -> None:
        if self._lanes is not None:
            self._lanes.settle(write=write)

    def _read_failed(self, exc: Exception) -> Step:
        log.warning("reading %s failed: %s", self.lease_key, exc)
        self._pause.failed_and_wait()
        return ConsumerState.PROCESSING

    def _deliver(self, batch: RecordBatch, checkpointer: LeaseCheckpointer) -> Step | None:
        """Deliver one batch under the failure policy; None to read on."""
        try:
            delivered = self._deliveries.deliver(batch, checkpointer)
        except ShutdownError:
            return ConsumerState.LEASE_LOST
        except ProcessorFailedError as exc:
            return self._processor_failed(exc)
        if delivered is Delivered.INTERRUPTED:
            # The source is past a batch not wholly delivered: never read on. The guard tells why the wait ended (a
            # lease valid again by now still counts as lost); nothing past the last checkpoint is lost.
            return self._guard() or ConsumerState.LEASE_LOST
        if delivered is Delivered.GIVE_UP:
            self._holder.evict(self.lease_key)
            return ConsumerOutcome.GAVE_UP
        if delivered is Delivered.STOP_SHARD:
            return ConsumerOutcome.STOPPED  # the lease was given up marked stopped
        self._delivered(batch, batch.records)
        return None

    def _delivered(self, batch: RecordBatch, records: Sequence[KinesisRecord]) -> None:
        """``records`` (of ``batch``) were delivered: count them."""
        size = sum(len(r.data) for r in records)
        self.records_delivered += len(records)
        self.bytes_delivered += size
        self.millis_behind_latest = batch.millis_behind_latest
        if self._on_bytes is not None:
            self._on_bytes(self.lease_key, size)
        if self._on_records is not None:
            self._on_records(self.lease_key, records, batch.millis_behind_latest)

    def _end_shard(self) -> Step:
        """One attempt at the shard's end: child leases, childShardIds, ``shard_ended`` (which must checkpoint
        SHARD_END); retried every ``shard_end_retry_interval_ms`` until it succeeds."""
        checkpointer = self._checkpointer
        assert checkpointer is not None
        children = list(self._children)
        try:
            ready = ensure_child_leases(self._store, self.lease_key, children, self._list_shards)
            if ready and children:
                self._holder.update_child_shard_ids(self.lease_key, children)
            if ready:
                checkpointer.end_shard()
                self._lifecycle.shard_ended(checkpointer, children)
                if checkpointer.last_checkpoint == SHARD_END:
                    self._holder.drop(self.lease_key)
                    log.info("shard ended lease=%s children=%s", self.lease_key, ",".join(children) or "-")
                    return ConsumerOutcome.FINISHED
                log.error(
                    "processor did not checkpoint SHARD_END on %s: its children cannot start; retrying", self.lease_key
                )
        except ShutdownError:
            return ConsumerState.LEASE_LOST
        except ProcessorFailedError as exc:
            return self._processor_failed(exc)
        except DependencyError as exc:
            log.warning("SHARD_END handling for %s failed: %s", self.lease_key, exc)
        except Exception as exc:
            log.error("processor.shard_ended raised on %s: %s", self.lease_key, one_line(exc))
        self._pause.wait(self._config.shard_end_retry_interval_ms / 1000)
        return ConsumerState.SHARD_END

    # --- ending states --------------------------------------------------------------------------------------

    def _shut_down(self) -> Step:
        self._let_go()
        self._holder.evict(self.lease_key)
        log.info("lease given up at shutdown lease=%s checkpoint=%s", self.lease_key, self._last_checkpoint())
        return ConsumerOutcome.SHUTDOWN

    def _hand_off(self) -> Step:
        self._let_go()
        self._holder.complete_handoff(self.lease_key)
        return ConsumerOutcome.HANDED_OFF

    def _let_go(self) -> None:
        """Before a stop or a hand-off moves the lease: lanes settled, the processor's last checkpoint, no source."""
        self._settle_lanes(write=True)
        self._lifecycle.shutdown_requested(self._checkpointer)
        self._close_source()

    def _lose_lease(self) -> Step:
        log.info("lease lost lease=%s: stopping processing", self.lease_key)
        self._settle_lanes(write=False)  # the processor hears of the loss once no lane delivers any more
        self._lifecycle.lease_lost()
        return ConsumerOutcome.LOST

    def _processor_failed(self, exc: ProcessorFailedError) -> ConsumerOutcome:
        """The processor can do nothing more: no retry, no checkpoint (but the watermark's); the lease goes back to
        the leader at once."""
        self._settle_lanes(write=True)
        log.error(
            "%s; lease %s given up without checkpointing: it resumes from checkpoint %s",
            exc,
            self.lease_key,
            self._last_checkpoint(),
        )
        self._holder.evict(self.lease_key)
        return ConsumerOutcome.GAVE_UP

    # --- helpers --------------------------------------------------------------------------------------------

    def _close_source(self) -> None:
        """Before the lease moves: the next owner's subscription must not find ours open."""
        if self._source is not None:
            self._source.close()

    def _last_checkpoint(self) -> Checkpoint | None:
        if self._checkpointer is not None:
            return self._checkpointer.last_checkpoint
        return None if self._lease is None else self._lease.checkpoint

    def _lease_deleted(self) -> bool:
        try:
            return self._store.get_lease(self.lease_key) is None
        except DependencyError:
            return False
