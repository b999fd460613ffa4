"""The driver side of the Spark source: the application's lease holder, planner and committer.

One :class:`SparkLeaseCoordinator` lives in the process where Spark runs the source's driver-side methods (the
JVM's long-lived Python "streaming source runner"). It heartbeats for the application, renews (``lease`` liveness
mode) and discovers leases on a background thread, writes the load metric, plans micro-batches from the leases it
holds, and writes checkpoints once Spark has committed a batch. See :mod:`worker_lib.spark.planning` for the offset
and commit rules, and :mod:`worker_lib.spark.driver_reads` for the fan-out consumers and the probe of idle shards.

Its leases are kept by the same :class:`~worker_lib.leases.keeper.LeaseKeeper` as a worker's (docs/failover.md,
docs/liveness-modes.md): the heartbeat is one UpdateItem per interval on the application's own
``<app>-WorkerMetricStats`` row (the row its load metric goes to), the keeper's :class:`LeaseHolder` is its fence,
leases are taken only once a beat landed, and the stored liveness mode decides whether leases are renewed at all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import SHARD_END, Checkpoint, Lease, ShardInfo
from worker_lib.core.streams import stream_name_of
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.keeper import KeeperOptions, LeaseKeeper
from worker_lib.leases.mode import StoredMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.shardsync.children import ParentsEnded, ensure_child_leases
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.spark import trace
from worker_lib.spark.batches import BatchEndStore
from worker_lib.spark.driver_reads import DriverReads
from worker_lib.spark.load import ExecutorCpu
from worker_lib.spark.options import SourceOptions
from worker_lib.spark.planning import (
    BatchEnd,
    LeaseForPlanning,
    ReadSettings,
    SourceOffset,
    batch_item_key,
    caught_up_shards,
    commit_actions,
    handoffs_to_complete,
    is_idle,
    new_run_id,
    plan_next_offset,
    remember_delivered,
    without_shards,
)
from worker_lib.spark.telemetry import SparkWorkerMetrics
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.telemetry.publisher import make_publisher
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.reporter import WorkerMetricsReporter
from worker_lib.workermetrics.stats_store import WorkerMetricsStore
from worker_lib.workermetrics.throughput import ThroughputRecorder

log = logging.getLogger(__name__)

# Trigger.AvailableNow: how long a run that holds nothing to read waits for leases assigned to it that it cannot
# take yet (a previous runner under the same worker id still leaving), before it ends with what it read.
AVAILABLE_NOW_TAKE_WAIT_S = 20.0
AVAILABLE_NOW_RETRY_S = 0.5


class SparkLeaseCoordinator:
    """Leases, planning and checkpoints of one Spark application (one streaming query)."""

    def __init__(
        self,
        options: SourceOptions,
        *,
        dynamodb: Any = None,
        kinesis: Any = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.options = options
        self.worker_id = options.worker_id
        self._clock = clock
        self._dynamodb = dynamodb or trace.attach(aws.client("dynamodb", options.aws))
        # Kinesis is needed on the driver only to probe idle shards and at a shard's end: made on first use, it
        # keeps a client's creation (~60 ms of model loading) off every query's start.
        self._kinesis_client = kinesis
        self._reads = DriverReads(options, lambda: self._kinesis, clock=clock)
        self._store = DynamoDBLeaseStore(options.app, client=self._dynamodb, clock=clock)
        self._batches = BatchEndStore(options.app, self._dynamodb, layout=options.table_layout)
        self._throughput = ThroughputRecorder(window_ms=options.lease.renewer_interval_ms, clock=clock)
        # One row per application in <app>-WorkerMetricStats: the heartbeat's UpdateItem and the load metric's
        # (WorkerMetricsStore.put, also an UpdateItem) each keep the other's attributes.
        self._rows = WorkerMetricsStore(options.app, client=self._dynamodb, clock=clock, layout=options.table_layout)
        self._stop = threading.Event()
        self._stopping = threading.Lock()
        discovery_s = options.discovery_interval_ms / 1000
        self._keeper = LeaseKeeper(
            self._store,
            self._rows,
            self.worker_id,
            config=options.lease,
            options=KeeperOptions(
                discovery_interval_s=lambda _notices_seen: discovery_s,
                on_superseded=self._superseded,
            ),
            modes=LivenessModeStore(
                CoordinatorStateStore(options.app, client=self._dynamodb, clock=clock, layout=options.table_layout),
                clock=clock,
            ),
            who=f"spark source {self.worker_id} (shardlease option liveness_mode)",
            default_stream=options.stream,
            clock=clock,
            throughput=self._throughput,
            on_taken=self._taken,
        )
        self._holder = self._keeper.holder
        self._parents = ParentsEnded(self._store)
        self.executor_cpu = ExecutorCpu(slots=options.executor_slots, clock=clock, own_cpu_seconds=time.process_time)
        self._published = SparkWorkerMetrics(
            make_publisher(options.publishing, app=options.app, worker_id=self.worker_id, aws_config=options.aws),
            flush_interval_ms=options.publishing.flush_interval_ms,
            leases_held=lambda: len(self._holder.held_keys()),
            cpu_percent=lambda: self.executor_cpu.last_sample,
            clock=clock,
        )
        self._reporter: WorkerMetricsReporter | None = None
        if options.metrics:
            self._reporter = WorkerMetricsReporter(
                self.worker_id,
                [self.executor_cpu],
                self._rows,
                config=WorkerMetricsConfig(
                    report_interval_ms=options.metrics_report_interval_ms,
                    first_report_delay_ms=options.metrics_first_report_delay_ms,
                ),
                clock=clock,
                capacity=lambda: float(self.executor_cpu.slots),  # executor slots: the application's CPUs
                lags=self.lags,  # MillisBehindLatest per shard: shardlease status, the leader's lag metric, alarm
            )
        self._session = new_run_id()[:6]
        self._takes = 0
        self._epochs: dict[str, str] = {}
        self._guard = threading.Lock()
        self._last_planned: dict[str, int] = {}
        self._planned_shards: dict[tuple[str, int], list[str]] = {}
        self._ends: dict[tuple[str, int], dict[str, BatchEnd]] = {}
        self._committed: tuple[str, int] = ("", -1)
        self._delivered: dict[str, Checkpoint] = {}  # per shard, how far batches Spark committed have read
        self._pending_shard_ends: dict[str, BatchEnd] = {}
        # Shards a committed batch read to their end, held or not then: finished once their lease is held
        self._read_to_end: dict[str, BatchEnd] = {}
        self._lags: dict[str, int] = {}  # per shard, MillisBehindLatest of its last committed read
        self._available_now_until: float | None = None
        self._done_for_trigger: set[str] = set()  # AvailableNow: shards read up to the tip since the trigger
        self._initial: SourceOffset | None = None
        self.started = False
        self.checkpoints_written = 0
        self.commits_skipped: dict[str, int] = {}

    @property
    def _kinesis(self) -> Any:
        if self._kinesis_client is None:
            self._kinesis_client = trace.attach(aws.client("kinesis", self.options.aws))
        return self._kinesis_client

    # --- lifecycle ------------------------------------------------------------------------------------------

    @property
    def liveness(self) -> StoredMode:
        """The liveness mode this coordinator follows (``lease`` until it has read one)."""
        return self._keeper.liveness

    @property
    def renewing(self) -> bool:
        """Whether held leases are renewed (``lease`` mode) or kept by the heartbeat alone (``worker`` mode)."""
        return self._holder.renewing

    def start(self) -> None:
        """Read the liveness mode (a configured mode the application does not run in raises
        :class:`~worker_lib.leases.mode.LivenessModeMismatchError` before anything starts), beat once, take the
        leases assigned to us now (so the first batch sees them), then heartbeat, renew and discover in the
        background."""
        if self.started:
            return
        # The first beat from this thread: no lease may be taken before one landed (from then on the fence protects
        # them), and the first batch should see the leases. The loop then beats on its own (one extra write per
        # query start).
        self._keeper.start_heartbeat(beat_now=True)
        self.started = True
        try:
            self._keeper.discover()
        except DependencyError as exc:
            log.warning("initial lease discovery for %s failed: %s", self.worker_id, exc)
        self._keeper.start(name=f"spark-leases-{self.worker_id}")
        if self._reporter is not None:
            self._reporter.start()
        log.info(
            "spark source started worker=%s app=%s stream=%s liveness=%s",
            self.worker_id,
            self.options.app,
            ",".join(self.options.streams),
            self._keeper.liveness.describe(),
        )

    def stop(self) -> None:
        """Leave at once, as a worker's shutdown does without its batch to finish: say DEPARTING (the leader
        assigns us nothing more), give every lease up (uncommitted batches are read again by the next owner),
        then fence and say STOPPED, so the leader moves anything left without waiting for the failover time."""
        # One departure at a time, and a second caller returns only once the first is done: the runner's SIGTERM
        # handler ends the process when its stop() returns, which must not cut short one the main thread began.
        with self._stopping:
            self._depart()

    def _depart(self) -> None:
        if not self.started or self._stop.is_set():
            return  # stopped already, or stood down for a newer runner under our worker id (the row is its own)
        log.info("spark source %s departing: giving up %d leases", self.worker_id, len(self._holder.held_keys()))
        self._keeper.depart()
        self._stop.set()
        # Bounded well inside the runner's departure deadline (DEPARTURE_TIMEOUT_S): giving up is safe beside a last
        # renewal (both are conditional writes on the lease, serialised per lease by the holder).
        self._keeper.stop(timeout_s=3)
        self._keeper.give_up(self._holder.held_keys())
        # Unlike a worker, leases assigned to us that we do not hold are not given up: a query's worker id is the
        # same across restarts, and a restarted query (a new runner, started while this one is still leaving) holds
        # them under that same id. The leader moves what is left once it reads STOPPED.
        self._keeper.leave("spark source stopped")
        if self._reporter is not None:
            self._reporter.stop()
        self._published.flush()
        self._keeper.close()
        log.info("spark source stopped worker=%s", self.worker_id)

    def _superseded(self) -> None:
        """A restarted query's runner took over our worker id (the heartbeat fenced us): stop coordinating."""
        self._stop.set()
        self._keeper.stop(timeout_s=0)

    def _taken(self, lease: Lease) -> None:
        with self._guard:
            self._takes += 1
            self._epochs[lease.lease_key] = f"{self._session}:{self._takes}"

    def _held_epochs(self) -> dict[str, str]:
        held = set(self._holder.held_keys())
        with self._guard:
            return {key: epoch for key, epoch in self._epochs.items() if key in held}

    # --- planning -------------------------------------------------------------------------------------------

    def read_settings(self) -> ReadSettings:
        aws_config = self.options.aws
        return ReadSettings(
            app=self.options.app,
            stream=self.options.stream,
            worker_id=self.worker_id,
            region=aws_config.region,
            endpoint_url=aws_config.endpoint_url,
            kinesis_endpoint_url=aws_config.service_endpoints.get("kinesis"),
            dynamodb_endpoint_url=aws_config.service_endpoints.get("dynamodb"),
            max_records=self.options.max_records_per_shard,
            max_read_ms=self.options.max_read_ms,
            until_epoch_s=self._available_now_until,
            table_layout=self.options.table_layout.value,
            fanout_consumers=self._reads.fanout_consumers(),
        )

    def held_leases(self) -> list[LeaseForPlanning]:
        epochs = self._held_epochs()
        views: list[LeaseForPlanning] = []
        for key in self._holder.held_keys():
            lease = self._holder.lease(key)
            epoch = epochs.get(key)
            if lease is None or epoch is None:
                continue
            readable = (
                self._holder.is_valid(key)
                and not self._holder.handoff_requested(key)
                and not lease.is_finished
                and key not in self._pending_shard_ends
                and self._parents.ended(lease)
            )
            views.append(LeaseForPlanning(lease_key=key, checkpoint=lease.checkpoint, epoch=epoch, readable=readable))
        return views

    def initial_offset(self) -> SourceOffset:
        """Batch 0 of a new lineage (never read). Spark may ask more than once; the answer stays the same."""
        self.start()
        if self._initial is None:
            self._initial = SourceOffset(run=new_run_id(), batch=0, shards={})
            log.info("spark source %s: new offset lineage run=%s", self.worker_id, self._initial.run)
        return self._initial

    def latest_offset(self, start: SourceOffset) -> SourceOffset:
        """Spark asks for the offset after ``start`` only once batch ``start`` is in its commit log: commit it,
        then plan the next batch (or return ``start`` when nothing new is there)."""
        self.start()
        ends = self.commit(start)
        self._published.tick()  # an idle stream commits nothing, but LeasesHeld and the CPU gauge go on
        self._retry_shard_ends()
        self._complete_handoffs()
        candidate = self._plan(start, ends)
        if self._available_now_until is None and not candidate.shards and not start.shards:
            return start
        if self._available_now_until is not None:
            self._done_for_trigger |= caught_up_shards(start, ends)
            candidate = without_shards(candidate, self._done_for_trigger)
            if not candidate.shards or is_idle(start, ends, candidate):
                # Before declaring the trigger done, make sure no lease assigned to us is still waiting to be
                # taken (a take can lose a race with the previous holder's last renewal and only succeed a moment
                # later; a previous runner under our worker id may still be leaving — on a loaded machine for
                # seconds — and nothing is taken until it has stood down). The first batch too: a query that holds
                # nothing yet must not end before it could take what is assigned to it.
                deadline = self._clock.monotonic() + AVAILABLE_NOW_TAKE_WAIT_S
                while True:
                    self._keeper.wait_to_take()
                    self._keeper.discover()
                    candidate = without_shards(self._plan(start, ends), self._done_for_trigger)
                    if candidate.shards and not is_idle(start, ends, candidate):
                        break
                    waiting = self._assigned_not_held()
                    if not waiting or self._clock.monotonic() >= deadline:
                        if waiting:
                            log.warning(
                                "spark source %s: availableNow ends without %d leases assigned to it that it could "
                                "not take within %.0f s: %s",
                                self.worker_id,
                                len(waiting),
                                AVAILABLE_NOW_TAKE_WAIT_S,
                                ", ".join(waiting[:5]),
                            )
                        return start
                    # A fixed poll, not a backoff: nothing failed, a previous holder is still leaving
                    self._clock.sleep(AVAILABLE_NOW_RETRY_S)
        elif is_idle(start, ends, candidate) and not self._reads.any_new(candidate, self.read_settings()):
            return start
        for key in candidate.shards:
            self._last_planned[key] = candidate.batch
        return candidate

    def _plan(self, start: SourceOffset, ends: dict[str, BatchEnd]) -> SourceOffset:
        """The next batch's offset from the leases held now (:func:`plan_next_offset`)."""
        initial = self.options.initial_timestamp
        return plan_next_offset(
            start,
            ends,
            self.held_leases(),
            now_epoch_s=self._clock.wall(),
            initial_timestamp_epoch_s=initial.timestamp() if initial else None,
            delivered=self._delivered,
        )

    def _assigned_not_held(self) -> list[str]:
        """Unfinished leases the table assigns to us that we do not hold (yet), and that this trigger has not read."""
        try:
            keys = set(self._store.list_lease_keys_for_owner(self.worker_id)) - set(self._holder.held_keys())
            leases = self._store.get_leases(sorted(keys - self._done_for_trigger)).values()
        except DependencyError as exc:
            log.warning("spark source %s: lease lookup failed: %s", self.worker_id, exc)
            return []
        return sorted(lease.lease_key for lease in leases if not lease.is_finished and not lease.is_stopped)

    def planned(self, end: SourceOffset) -> None:
        """``partitions(start, end)`` was called: batch ``end`` starts now (also after a restart's replay)."""
        self._planned_shards[(end.run, end.batch)] = sorted(end.shards)
        for key in end.shards:
            self._last_planned[key] = max(self._last_planned.get(key, -1), end.batch)

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: records arriving from now on are left for a later query."""
        self._available_now_until = self._clock.wall()
        self._done_for_trigger = set()

    # --- committing -----------------------------------------------------------------------------------------

    def _load_ends(self, offset: SourceOffset) -> dict[str, BatchEnd]:
        cached = self._ends.get((offset.run, offset.batch))
        if cached is not None:
            return cached
        keys = {batch_item_key(self.worker_id, offset.run, offset.batch, key): key for key in offset.shards}
        found = self._batches.get_many(sorted(keys))
        ends = {keys[item_key]: end for item_key, end in found.items()}
        self._ends = {(offset.run, offset.batch): ends}  # only the newest is ever needed again
        return ends

    def commit(self, offset: SourceOffset) -> dict[str, BatchEnd]:
        """Write the checkpoints of batch ``offset.batch`` (Spark committed it); idempotent. Returns its ends."""
        if offset.batch == 0:
            return {}
        ends = self._load_ends(offset)
        if self._committed == (offset.run, offset.batch):
            return ends
        lease_checkpoints: dict[str, Checkpoint] = {}
        for key in offset.shards:
            lease = self._holder.lease(key)
            if lease is not None:
                lease_checkpoints[key] = lease.checkpoint
        remember_delivered(self._delivered, ends)
        for key, end in ends.items():
            if end.ended and key not in self._pending_shard_ends:
                self._read_to_end.setdefault(key, end)
            if end.millis_behind_latest is not None:
                self._lags[key] = end.millis_behind_latest
        actions = commit_actions(offset, ends, held_epochs=self._held_epochs(), lease_checkpoints=lease_checkpoints)
        for action in actions:
            if action.bytes:
                self._throughput.record(action.lease_key, action.bytes)
            if action.checkpoint is None:
                if action.skipped not in ("already checkpointed", "nothing read"):
                    self.commits_skipped[action.skipped] = self.commits_skipped.get(action.skipped, 0) + 1
                    log.info("batch %d: no checkpoint for %s (%s)", offset.batch, action.lease_key, action.skipped)
                continue
            if action.shard_end:
                self._pending_shard_ends[action.lease_key] = ends[action.lease_key]
                continue
            if self._holder.checkpoint(action.lease_key, action.checkpoint) is None:
                self.commits_skipped["lease lost"] = self.commits_skipped.get("lease lost", 0) + 1
                self._published.lease_lost()
                log.info("batch %d: checkpoint of %s refused: lease lost", offset.batch, action.lease_key)
            else:
                self.checkpoints_written += 1
        self._retry_shard_ends()
        self.executor_cpu.add_batch(list(ends.values()))
        self._published.committed(ends.values())
        self._committed = (offset.run, offset.batch)
        previous = self._planned_shards.pop((offset.run, offset.batch - 1), None)
        if previous:
            self._batches.delete(batch_item_key(self.worker_id, offset.run, offset.batch - 1, key) for key in previous)
        return ends

    def lags(self) -> dict[str, int]:
        """MillisBehindLatest of each held shard's last committed read, for the worker-metrics report (as a worker
        reports its consumers' lags: ``shardlease status``, the leader's ``MillisBehindLatestMax`` and its alarm)."""
        held = set(self._holder.held_keys())
        return {key: millis for key, millis in self._lags.items() if key in held}

    def _complete_handoffs(self) -> None:
        requested = [key for key in self._holder.held_keys() if self._holder.handoff_requested(key)]
        committed = self._committed[1]
        for key in handoffs_to_complete(requested, self._last_planned, committed):
            self._holder.complete_handoff(key)
            self._throughput.forget(key)
            log.info("spark source %s handed %s off at a batch boundary", self.worker_id, key)

    # --- SHARD_END ------------------------------------------------------------------------------------------

    def _retry_shard_ends(self) -> None:
        for key, end in list(self._read_to_end.items()):
            if key in self._pending_shard_ends or self._holder.lease(key) is not None:
                self._pending_shard_ends.setdefault(key, end)  # held (again): its records are in the sink, finish it
                del self._read_to_end[key]
        for key, end in sorted(self._pending_shard_ends.items()):
            if self._holder.lease(key) is None:
                self._pending_shard_ends.pop(key, None)
                continue
            try:
                if not self._child_leases_ready(key, end.children):
                    continue
                if end.children:
                    self._holder.update_child_shard_ids(key, list(end.children))
                if self._holder.checkpoint(key, SHARD_END) is not None:
                    self.checkpoints_written += 1
                    self._holder.drop(key)
                    self._throughput.forget(key)
                    self._keeper.note_event()  # child leases exist now: the leader assigns them at once
                    log.info("shard ended lease=%s children=%s", key, ",".join(end.children) or "-")
                self._pending_shard_ends.pop(key, None)
            except DependencyError as exc:
                log.warning("SHARD_END handling for %s failed (retrying next batch): %s", key, exc)

    def _list_shards(self, stream: str) -> Mapping[str, ShardInfo]:
        listing = KinesisShardDetector(stream, client=self._kinesis, clock=self._clock).list_shards()
        return {shard.shard_id: shard for shard in listing.shards}

    def _child_leases_ready(self, lease_key: str, children: tuple[str, ...]) -> bool:
        """The consumer's rule (:func:`~worker_lib.shardsync.children.ensure_child_leases`)."""
        stream = stream_name_of(lease_key, self.options.stream)
        return ensure_child_leases(self._store, lease_key, children, lambda: self._list_shards(stream).values())
