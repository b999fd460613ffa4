"""Pure planning logic of the Spark source: offsets, partitions and commit decisions. No I/O, no pyspark.

Offsets (the JSON Spark writes to its offset log)::

    {"v": 1, "run": "4f1c0a9e2b7d", "batch": 7,
     "shards": {"shardId-000000000001": {"seq": "4959...", "sub": 0, "e": "a1b2c3:2"}, ...}}

``batch`` counts the offsets this lineage produced (0 for the initial offset, +1 for each new micro-batch), so it
is Spark's batch id + 1. ``shards`` lists every shard that micro-batch ``batch`` reads, each with the position it
reads *after* (a sequence number + KPL sub-sequence number, or a sentinel such as ``TRIM_HORIZON``), and the
driver's lease *epoch* at planning time (which take of the lease planned it). Kinesis cannot say where a shard
ends without reading it, so the end of each shard's read is decided by the executor and recorded in the
coordinator-state table as a :class:`BatchEnd` (first writer wins); a replayed batch reads exactly up to the
recorded end, which makes every batch deterministic. The next offset starts each shard at that recorded end.

Commit rule: checkpoints of batch ``k`` are written once Spark has committed it — when Spark asks for the offset
after ``k`` (it only does so after writing batch ``k`` to its commit log) or calls ``commit`` — and only for
leases still held under the epoch that planned the read (a lease lost mid-batch never commits that shard).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from worker_lib.core.errors import ConfigError
from worker_lib.core.models import AT_TIMESTAMP, SENTINELS, SHARD_END, Checkpoint

OFFSET_VERSION = 1


def new_run_id() -> str:
    """A short random id that keys one offset lineage (a fresh Spark checkpoint starts a new one)."""
    return uuid.uuid4().hex[:12]


# --- positions --------------------------------------------------------------------------------------------------


def position_to_json(position: Checkpoint) -> dict[str, Any]:
    return {"seq": position.sequence, "sub": position.sub_sequence}


def position_from_json(raw: Mapping[str, Any]) -> Checkpoint:
    sequence = str(raw["seq"])
    if sequence not in SENTINELS and not sequence.isdigit():
        raise ConfigError(f"invalid position {sequence!r} in a shardlease offset")
    return Checkpoint(sequence=sequence, sub_sequence=int(raw.get("sub", 0)))


def later_of(a: Checkpoint, b: Checkpoint) -> Checkpoint:
    """The later of two positions of one shard: SHARD_END beats everything, a real position beats a sentinel."""
    if a.is_shard_end or b.is_shard_end:
        return SHARD_END
    if a.is_sentinel:
        return b if not b.is_sentinel else a
    if b.is_sentinel:
        return a
    return b if b.is_after(a) else a


# --- offsets ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ShardOffset:
    """position: where the read starts (after it). timestamp: epoch seconds for an ``AT_TIMESTAMP`` position —
    a ``LATEST`` lease is pinned to ``AT_TIMESTAMP`` of the moment it was first planned, so that records arriving
    between two batches that both found nothing are not skipped (and a replay reads the same records)."""

    position: Checkpoint
    epoch: str = ""
    timestamp: float | None = None


@dataclass(frozen=True, kw_only=True)
class SourceOffset:
    run: str
    batch: int
    shards: Mapping[str, ShardOffset] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": OFFSET_VERSION,
            "run": self.run,
            "batch": self.batch,
            "shards": {key: _shard_json(shard) for key, shard in sorted(self.shards.items())},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SourceOffset:
        if int(raw.get("v", 0)) != OFFSET_VERSION:
            raise ConfigError(f"unsupported shardlease offset version {raw.get('v')!r} (expected {OFFSET_VERSION})")
        shards = {
            str(key): ShardOffset(
                position=position_from_json(value),
                epoch=str(value.get("e", "")),
                timestamp=float(value["ts"]) if value.get("ts") is not None else None,
            )
            for key, value in dict(raw.get("shards", {})).items()
        }
        return cls(run=str(raw["run"]), batch=int(raw["batch"]), shards=shards)

    def positions(self) -> dict[str, Checkpoint]:
        return {key: shard.position for key, shard in self.shards.items()}


def _shard_json(shard: ShardOffset) -> dict[str, Any]:
    raw: dict[str, Any] = {**position_to_json(shard.position), "e": shard.epoch}
    if shard.timestamp is not None:
        raw["ts"] = shard.timestamp
    return raw


def batch_item_key(worker_id: str, run: str, batch: int, lease_key: str) -> str:
    """Key of one recorded batch end in ``<app>-CoordinatorState``."""
    return f"spark-batch#{worker_id}#{run}#{batch}#{lease_key}"


# --- what executors record --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BatchEnd:
    """Where one shard's read in one micro-batch ended, as recorded by the executor that read it first.

    position: the last record delivered, or the start position when nothing was; ``SHARD_END`` once the shard
      ended and every record in it was delivered.
    caught_up: the read stopped because it reached the tip of the shard (not because of the record cap or the
      time budget); with ``records == 0`` this means the shard had nothing new.
    started_at / finished_at: wall epoch seconds of the read.
    cpu_seconds: CPU time the executor's Python process spent on the read (the load metric).
    millis_behind_latest: how far behind the tip of the shard the read's last GetRecords was (None: unknown).
    """

    lease_key: str
    position: Checkpoint
    records: int = 0
    bytes: int = 0
    caught_up: bool = False
    children: tuple[str, ...] = ()
    started_at: float = 0.0
    finished_at: float = 0.0
    cpu_seconds: float = 0.0
    millis_behind_latest: int | None = None

    @property
    def ended(self) -> bool:
        return self.position.is_shard_end

    @property
    def idle(self) -> bool:
        return self.records == 0 and self.caught_up and not self.ended


# --- planning ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LeaseForPlanning:
    """The driver's view of one lease it holds, at planning time.

    readable: valid (renewed and heartbeat in time), no handoff requested, not finished, and every parent shard
    finished.
    """

    lease_key: str
    checkpoint: Checkpoint
    epoch: str
    readable: bool = True


def positions_after(start: SourceOffset, ends: Mapping[str, BatchEnd]) -> dict[str, Checkpoint]:
    """Where each shard of ``start`` stands once batch ``start.batch`` has been read.

    The initial offset (batch 0) is never read: its positions stand. A shard without a recorded end was not read
    to completion in that batch (a sink that evaluated only part of the DataFrame): it stays where it was, so
    nothing the sink did not see is skipped.
    """
    after: dict[str, Checkpoint] = {}
    for key, shard in start.shards.items():
        end = ends.get(key) if start.batch > 0 else None
        after[key] = end.position if end is not None else shard.position
    return after


def plan_next_offset(
    start: SourceOffset,
    ends: Mapping[str, BatchEnd],
    held: Iterable[LeaseForPlanning],
    *,
    now_epoch_s: float,
    initial_timestamp_epoch_s: float | None = None,
    delivered: Mapping[str, Checkpoint] | None = None,
) -> SourceOffset:
    """The offset of the next micro-batch: every readable held lease, from the latest of where the previous batch
    ended, the lease table's checkpoint (another owner may have moved it while we did not hold the lease) and
    ``delivered`` — how far batches Spark committed have read the shard, remembered across batches that left it
    out: a batch committed while we did not hold its lease (a restarted query replaying its last batch before the
    lease is taken again) got no checkpoint, and its records must not be read again.
    Shards whose lease we no longer hold are dropped; finished shards are not read again. A ``LATEST`` start is
    pinned to ``AT_TIMESTAMP`` ``now_epoch_s``; an ``AT_TIMESTAMP`` checkpoint uses ``initial_timestamp_epoch_s``."""
    after = positions_after(start, ends)
    shards: dict[str, ShardOffset] = {}
    for lease in held:
        if not lease.readable:
            continue
        previous = after.get(lease.lease_key)
        position = lease.checkpoint if previous is None else later_of(previous, lease.checkpoint)
        if delivered is not None and lease.lease_key in delivered:
            position = later_of(position, delivered[lease.lease_key])
        if position.is_shard_end:
            continue
        timestamp: float | None = None
        kept = start.shards.get(lease.lease_key)
        if kept is not None and previous == position and position.is_sentinel:
            position, timestamp = kept.position, kept.timestamp  # unchanged sentinel: keep its pinned time
        elif position.sequence == "LATEST":
            position, timestamp = AT_TIMESTAMP, now_epoch_s
        elif position.sequence == "AT_TIMESTAMP":
            timestamp = initial_timestamp_epoch_s
        shards[lease.lease_key] = ShardOffset(position=position, epoch=lease.epoch, timestamp=timestamp)
    return SourceOffset(run=start.run, batch=start.batch + 1, shards=shards)


def remember_delivered(delivered: dict[str, Checkpoint], ends: Mapping[str, BatchEnd]) -> None:
    """Add what a batch Spark committed read to ``delivered``: how far each shard was read, ``SHARD_END`` for a read
    that reached the end of its shard. A committed batch's records are in the sink whether or not its lease was held
    then; planning never reads them again, and a shard read to its end is finished rather than read again."""
    for key, end in ends.items():
        if end.ended:
            delivered[key] = SHARD_END
        elif not end.position.is_sentinel:
            delivered[key] = later_of(delivered.get(key, end.position), end.position)


def idle_shards(start: SourceOffset, ends: Mapping[str, BatchEnd]) -> set[str]:
    """Shards of ``start`` whose read in batch ``start.batch`` found nothing new at the tip of the shard."""
    if start.batch == 0:
        return set()
    return {key for key in start.shards if (end := ends.get(key)) is not None and end.idle}


def is_idle(start: SourceOffset, ends: Mapping[str, BatchEnd], candidate: SourceOffset) -> bool:
    """Whether the candidate offset would only re-read shards that just found nothing: same shards at the same
    positions, each idle in the previous batch. Then the source may report no new data (Spark skips the batch),
    unless a probe finds records."""
    if start.batch == 0 or set(candidate.shards) != set(start.shards):
        return False
    idle = idle_shards(start, ends)
    return all(
        key in idle and shard.position == ends[key].position and shard.epoch == start.shards[key].epoch
        for key, shard in candidate.shards.items()
    )


def caught_up_shards(start: SourceOffset, ends: Mapping[str, BatchEnd]) -> set[str]:
    """Shards of ``start`` whose read in batch ``start.batch`` stopped at the tip of the shard, or (under
    ``Trigger.AvailableNow``) at a record that arrived after the trigger started. Under ``AvailableNow`` such a
    shard has nothing more for this run: its read was made after the trigger started. Leaving it out of later
    batches saves the last micro-batch, which would read nothing."""
    if start.batch == 0:
        return set()
    return {key for key in start.shards if (end := ends.get(key)) is not None and end.caught_up}


def without_shards(offset: SourceOffset, keys: Iterable[str]) -> SourceOffset:
    left_out = set(keys)
    return replace(offset, shards={key: shard for key, shard in offset.shards.items() if key not in left_out})


# --- partitions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReadSettings:
    """Everything an executor needs besides the shard and position (picklable, no clients)."""

    app: str
    stream: str
    worker_id: str
    region: str
    endpoint_url: str | None = None
    kinesis_endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    max_records: int = 10_000
    max_read_ms: int = 10_000
    until_epoch_s: float | None = None  # Trigger.AvailableNow: records that arrived later are left for later
    table_layout: str = "three-tables"  # where batch ends are recorded (TableLayout; KCL 3.5 single-table mode)
    fanout_consumers: tuple[tuple[str, str], ...] = ()  # (stream, consumer ARN): read by enhanced fan-out


@dataclass(frozen=True, kw_only=True)
class ShardReadTask:
    """One input partition: read ``lease_key`` after ``position`` for micro-batch ``batch``."""

    lease_key: str
    position: Checkpoint
    batch: int
    run: str
    settings: ReadSettings
    timestamp: float | None = None  # epoch seconds, with an AT_TIMESTAMP position

    @property
    def shard_id(self) -> str:
        return self.lease_key.rsplit(":", 1)[-1]

    @property
    def item_key(self) -> str:
        return batch_item_key(self.settings.worker_id, self.run, self.batch, self.lease_key)


def plan_partitions(end: SourceOffset, settings: ReadSettings) -> list[ShardReadTask]:
    """One read task per shard of the micro-batch ending at ``end`` (a pure function of ``end``: a replay after
    a restart plans the same tasks)."""
    return [
        ShardReadTask(
            lease_key=key,
            position=shard.position,
            batch=end.batch,
            run=end.run,
            settings=settings,
            timestamp=shard.timestamp,
        )
        for key, shard in sorted(end.shards.items())
        if not shard.position.is_shard_end
    ]


# --- commit decisions -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CommitAction:
    """What to write for one shard once its batch is committed.

    checkpoint: the position to write (None: nothing to write).
    shard_end: create child leases and record ``childShardIds`` before writing ``SHARD_END``.
    skipped: why nothing is written ("" when something is).
    """

    lease_key: str
    checkpoint: Checkpoint | None
    shard_end: bool = False
    children: tuple[str, ...] = ()
    bytes: int = 0
    skipped: str = ""


def commit_actions(
    offset: SourceOffset,
    ends: Mapping[str, BatchEnd],
    *,
    held_epochs: Mapping[str, str],
    lease_checkpoints: Mapping[str, Checkpoint],
) -> list[CommitAction]:
    """Checkpoints for the shards read in batch ``offset.batch`` (Spark has committed it).

    A shard is checkpointed only if we still hold its lease under the epoch that planned the read (a lease lost
    and possibly taken by someone else meanwhile never gets our checkpoint), it recorded an end, and that end is
    later than the lease's checkpoint (checkpoints never move backwards, and an unchanged one costs no write).
    """
    actions: list[CommitAction] = []
    if offset.batch == 0:
        return actions
    for key, shard in sorted(offset.shards.items()):
        end = ends.get(key)
        if end is None:
            actions.append(CommitAction(lease_key=key, checkpoint=None, skipped="not read"))
            continue
        epoch = held_epochs.get(key)
        if epoch is None:
            actions.append(CommitAction(lease_key=key, checkpoint=None, skipped="lease lost", bytes=end.bytes))
            continue
        if epoch != shard.epoch:
            actions.append(CommitAction(lease_key=key, checkpoint=None, skipped="lease re-taken", bytes=end.bytes))
            continue
        current = lease_checkpoints.get(key)
        if end.position.is_sentinel and not end.ended:
            actions.append(CommitAction(lease_key=key, checkpoint=None, skipped="nothing read", bytes=end.bytes))
            continue
        if current is not None and later_of(current, end.position) == current:
            actions.append(CommitAction(lease_key=key, checkpoint=None, skipped="already checkpointed"))
            continue
        actions.append(
            CommitAction(
                lease_key=key,
                checkpoint=end.position,
                shard_end=end.ended,
                children=end.children,
                bytes=end.bytes,
            )
        )
    return actions


def handoffs_to_complete(
    requested: Iterable[str], last_planned_batch: Mapping[str, int], committed_batch: int
) -> list[str]:
    """Leases whose graceful handoff can complete now: no planned, uncommitted batch still reads them."""
    return sorted(key for key in requested if last_planned_batch.get(key, -1) <= committed_batch)


# --- load -------------------------------------------------------------------------------------------------------


def peak_concurrency(ends: Iterable[BatchEnd]) -> int:
    """The most shard reads of one micro-batch that ran at the same time (their executor slots, at least)."""
    events: list[tuple[float, int]] = []
    for end in ends:
        if end.finished_at > 0 and end.finished_at >= end.started_at > 0:
            events += [(end.started_at, 1), (end.finished_at, -1)]
    running = peak = 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):  # an end before a start at a tie
        running += step
        peak = max(peak, running)
    return peak
