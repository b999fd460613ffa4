"""The Spark source's planning (worker_lib/spark/planning.py, docs/spark.md "Offsets", "Commits", "Restarts") on
thousands of seeded random lineages of micro-batches over random shard graphs (issue 36).

A stream of 1-4 shards is split and merged at random while records arrive. The driver holds a random, changing set
of the leases: it loses some between a batch's read and its commit (another owner may then process the shard from
the lease table's checkpoint and move it), takes some (again), and has hand-offs requested on some; a child is
readable only once its parents ended. Each micro-batch is planned from the previous one's recorded ends
(:func:`plan_next_offset`), split into read tasks (:func:`plan_partitions`), read by executors that stop anywhere
(record cap, tip, end of shard) or — rarely — record no end (a sink that evaluated only part of the DataFrame), and
committed at the next planning (:func:`commit_actions`), remembering how far committed batches read each shard as
``SparkLeaseCoordinator.commit`` does. Nothing here has a clock: ``now_epoch_s`` is passed in.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass, field

from worker_lib.core.models import SHARD_END, TRIM_HORIZON, Checkpoint
from worker_lib.spark.planning import (
    BatchEnd,
    LeaseForPlanning,
    ReadSettings,
    ShardOffset,
    SourceOffset,
    commit_actions,
    later_of,
    plan_next_offset,
    plan_partitions,
    remember_delivered,
)

SCHEDULES = 600
BATCHES = 20
END = SHARD_END.sequence
SETTINGS = ReadSettings(app="orders", stream="orders-stream", worker_id="spark-1", region="us-east-1")


@dataclass
class Shard:
    key: str
    parents: tuple[str, ...]
    records: list[int] = field(default_factory=list)  # sequence numbers arrived so far
    closed: bool = False  # resharded: no more records; it ends after the last one

    def after(self, position: Checkpoint) -> list[int]:
        if position.sequence == END:
            return []
        if position.is_sentinel:
            return list(self.records)
        return self.records[bisect_right(self.records, int(position.sequence)) :]


@dataclass
class Held:
    epoch: str
    checkpoint: Checkpoint  # the holder's copy of the lease
    handoff: bool = False


@dataclass
class Stream:
    rng: random.Random
    shards: dict[str, Shard] = field(default_factory=dict)
    table: dict[str, Checkpoint] = field(default_factory=dict)  # the lease table's checkpoints
    held: dict[str, Held] = field(default_factory=dict)
    others: dict[str, list[int]] = field(default_factory=dict)  # records other owners processed, per shard
    sequence: int = 49_000_000_000
    takes: int = 0

    def add_shard(self, parents: tuple[str, ...] = ()) -> None:
        key = f"shardId-{len(self.shards):012d}"
        self.shards[key] = Shard(key, parents)
        self.table[key] = TRIM_HORIZON

    def ended(self, key: str) -> bool:
        return self.table[key].sequence == END

    def readable_by_anyone(self, key: str) -> bool:
        return not self.ended(key) and all(self.ended(parent) for parent in self.shards[key].parents)

    def arrive(self) -> None:
        for shard in list(self.shards.values()):
            if shard.closed:
                continue
            for _ in range(self.rng.choice((0, 1, 2, 6))):
                self.sequence += self.rng.randint(1, 1_000)
                shard.records.append(self.sequence)
        open_shards = [s.key for s in self.shards.values() if not s.closed]
        roll = self.rng.random()
        if roll < 0.06 and open_shards:  # split
            parent = self.rng.choice(open_shards)
            self.shards[parent].closed = True
            self.add_shard((parent,))
            self.add_shard((parent,))
        elif roll < 0.09 and len(open_shards) >= 2:  # merge
            pair = tuple(self.rng.sample(open_shards, 2))
            for parent in pair:
                self.shards[parent].closed = True
            self.add_shard(pair)

    def write(self, key: str, position: Checkpoint) -> str | None:
        """A checkpoint write to the lease table: what is wrong with it, if anything (it must move forward)."""
        before = self.table[key]
        if later_of(before, position) != position or before == position:
            return f"{key}: checkpoint {position} does not move forward from {before}"
        self.table[key] = position
        if key in self.held:
            self.held[key].checkpoint = position
        return None

    def others_process(self, key: str) -> None:
        """Another owner serves the shard for a while: from the table's checkpoint, in order, checkpointing."""
        shard = self.shards[key]
        remaining = shard.after(self.table[key])
        count = self.rng.randint(0, len(remaining))
        self.others.setdefault(key, []).extend(remaining[:count])
        if count == len(remaining) and shard.closed:
            self.table[key] = SHARD_END
        elif count:
            self.table[key] = at(remaining[count - 1])

    def take(self, key: str) -> None:
        self.takes += 1
        self.held[key] = Held(epoch=f"epoch-{self.takes}", checkpoint=self.table[key])

    def leases_change(self) -> None:
        for key in self.shards:
            if key in self.held:
                if self.rng.random() < 0.1:  # lost (renewal or heartbeat failed, the leader moved it) …
                    del self.held[key]
                    if self.readable_by_anyone(key) and self.rng.random() < 0.5:
                        self.others_process(key)
                    if self.rng.random() < 0.3 and not self.ended(key):
                        self.take(key)  # … and taken again before the next planning
                else:
                    self.held[key].handoff = self.rng.random() < 0.05
            elif self.rng.random() < 0.35 and not self.ended(key):
                self.take(key)
            elif self.readable_by_anyone(key) and self.rng.random() < 0.5:
                self.others_process(key)

    def planning_view(self) -> list[LeaseForPlanning]:
        return [
            LeaseForPlanning(
                lease_key=key,
                checkpoint=held.checkpoint,
                epoch=held.epoch,
                readable=not held.handoff and self.readable_by_anyone(key),
            )
            for key, held in sorted(self.held.items())
        ]


def at(sequence: int) -> Checkpoint:
    return Checkpoint(sequence=str(sequence))


def extreme(rng: random.Random, most: int) -> int:
    """A value in [0, most]: either end of it half the time, else uniform."""
    roll = rng.random()
    return 0 if roll < 0.25 else most if roll < 0.5 else rng.randint(0, most)


def run_lineage(seed: int) -> tuple[list[str], int]:
    """One lineage: what went wrong (nothing, we expect), and how many records were read twice because of the
    known bug pinned by the reproducer below (a read to the end of a shard committed without the lease)."""
    rng = random.Random(seed)
    stream = Stream(rng)
    for _ in range(rng.randint(1, 4)):
        stream.add_shard()
    problems: list[str] = []
    start = SourceOffset(run="r1", batch=0)
    ends: dict[str, BatchEnd] = {}
    delivered: dict[str, Checkpoint] = {}
    sink: dict[str, list[int]] = {}  # records of committed batches, per shard
    read: dict[str, list[int]] = {}  # records of the batch being read (committed at the next planning)
    ended_unheld: set[int] = set()  # records of reads to SHARD_END that Spark committed without the lease
    for _ in range(BATCHES):
        stream.arrive()
        stream.leases_change()  # between the read of ``start`` and its commit
        # Spark committed ``start``: remember how far it read (SparkLeaseCoordinator.commit), write checkpoints.
        for key, records in read.items():
            sink.setdefault(key, []).extend(records)
        remember_delivered(delivered, ends)
        held_epochs = {key: held.epoch for key, held in stream.held.items()}
        lease_checkpoints = {key: held.checkpoint for key, held in stream.held.items() if key in start.shards}
        for action in commit_actions(start, ends, held_epochs=held_epochs, lease_checkpoints=lease_checkpoints):
            if action.skipped in ("lease lost", "lease re-taken") and ends[action.lease_key].ended:
                ended_unheld.update(read.get(action.lease_key, []))
            if action.checkpoint is not None:
                if held_epochs.get(action.lease_key) != start.shards[action.lease_key].epoch:
                    problems.append(f"batch {start.batch}: {action.lease_key} checkpointed under another epoch")
                wrong = stream.write(action.lease_key, SHARD_END if action.shard_end else action.checkpoint)
                problems += [wrong] if wrong else []
        # Plan the next batch and its partitions.
        view = stream.planning_view()
        offset = plan_next_offset(start, ends, view, now_epoch_s=1_700_000_000.0, delivered=delivered)
        tasks = plan_partitions(offset, SETTINGS)
        readable = {lease.lease_key for lease in view if lease.readable}
        keys = [task.lease_key for task in tasks]
        if keys != sorted(set(keys)) or set(keys) != set(offset.shards) or not set(keys) <= readable:
            problems.append(f"batch {offset.batch}: partitions {keys} for offset {sorted(offset.shards)}")
        replayed = plan_partitions(SourceOffset.from_json(offset.to_json()), SETTINGS)
        if replayed != tasks:
            problems.append(f"batch {offset.batch}: a replay from the offset log plans other partitions")
        for task in tasks:
            key, held = task.lease_key, stream.held[task.lease_key]
            floor = later_of(held.checkpoint, delivered.get(key, held.checkpoint))
            if later_of(task.position, floor) != task.position:  # never before what is checkpointed or delivered
                problems.append(f"batch {offset.batch}: {key} starts at {task.position}, before {floor}")
            # Contiguous: the next read starts at the previous one's recorded end, unless the table is ahead of it.
            previous = ends.get(key) if key in start.shards else None
            behind = (
                previous is not None and not previous.ended and later_of(previous.position, floor) == previous.position
            )
            if behind and previous is not None and task.position != previous.position:
                problems.append(f"batch {offset.batch}: {key} starts at {task.position}, not {previous.position}")
        # The executors read: each task from its position to where it stops; a few record no end.
        ends, read = {}, {}
        for task in tasks:
            shard = stream.shards[task.lease_key]
            remaining = shard.after(task.position)
            count = extreme(rng, len(remaining))
            if count == len(remaining) and shard.closed:
                position = SHARD_END
            elif count:
                position = at(remaining[count - 1])
            else:
                position = task.position
            if rng.random() < 0.04:
                continue  # no end recorded: the sink evaluated only part of the DataFrame; nothing delivered
            ends[task.lease_key] = BatchEnd(
                lease_key=task.lease_key, position=position, records=count, caught_up=count == len(remaining)
            )
            read[task.lease_key] = remaining[:count]
        start = offset
    for key, records in read.items():  # the last batch is committed too
        sink.setdefault(key, []).extend(records)
    known = 0
    for key, shard in stream.shards.items():
        ours, theirs = sink.get(key, []), stream.others.get(key, [])
        if len(ours) != len(set(ours)):
            twice = {seq for seq in ours if ours.count(seq) > 1}
            known += len(twice & ended_unheld)
            if twice - ended_unheld:
                problems.append(f"{key}: committed batches of one lineage read {sorted(twice)} more than once")
        handled = set(ours) | set(theirs)
        furthest = max(handled, default=0)
        dropped = [seq for seq in shard.records if seq <= furthest and seq not in handled]
        if dropped or (stream.ended(key) and len(handled) != len(shard.records)):
            problems.append(f"{key}: records {dropped or sorted(set(shard.records) - handled)} were dropped")
    return [f"seed {seed}: {problem}" for problem in problems], known


def test_every_batch_reads_each_shard_once_contiguously_and_a_lineage_drops_nothing() -> None:
    # GIVEN 600 seeded lineages of 20 micro-batches over streams split and merged at random, leases lost, taken
    # again, handed off and served by other owners meanwhile, executors stopping anywhere or recording no end
    problems: list[str] = []
    for seed in range(SCHEDULES):
        # WHEN each batch is planned, read and committed
        problems += run_lineage(seed)[0]
    # THEN each batch reads every shard it plans with exactly one partition, only from readable held leases, the same
    # partitions when replayed from the offset log, each starting where the previous batch's recorded end left it
    # (unless the lease table is ahead), never before the lease's checkpoint or what committed batches read;
    # checkpoints are written only under the epoch that planned the read and only move forward; no committed batch of
    # the lineage reads a record twice (but for the case of the reproducer below); and nothing is dropped: every record
    # up to the furthest one handled was read by a committed batch or processed by another owner, all of them for a
    # shard that ended
    assert problems == []


def test_a_shard_read_to_its_end_by_a_batch_committed_without_its_lease_is_not_read_again_after_a_retake() -> None:
    """The lineages above found it (seed 20 first; 139 records in 600 lineages were read twice): a batch Spark commits
    while the runner does not hold the shard's lease gets no checkpoint, and docs/spark.md ("Restarts") says the next
    batch that reads the shard starts after what committed batches read. ``remember_delivered`` once left out a read
    that reached SHARD_END, so a lease taken again was read again from the table's older checkpoint and the sink got
    the shard's last records twice. Such a shard is now finished (SHARD_END written once its lease is held again),
    never read again."""
    # GIVEN batch 5 read shard s from record 100 to its end, and Spark committed it after the lease was lost
    shard = "shardId-000000000009"
    batch5 = SourceOffset(run="r1", batch=5, shards={shard: ShardOffset(position=at(100), epoch="epoch-1")})
    ends = {shard: BatchEnd(lease_key=shard, position=SHARD_END, records=3, caught_up=True)}
    (action,) = commit_actions(batch5, ends, held_epochs={}, lease_checkpoints={})
    assert action.checkpoint is None and action.skipped == "lease lost"
    delivered: dict[str, Checkpoint] = {}
    remember_delivered(delivered, ends)  # what SparkLeaseCoordinator.commit remembers of a committed batch
    # WHEN the lease is taken again from the table's checkpoint (record 100) and the next two batches are planned
    held = [LeaseForPlanning(lease_key=shard, checkpoint=at(100), epoch="epoch-2")]
    batch6 = plan_next_offset(batch5, ends, held, now_epoch_s=1_700_000_000.0, delivered=delivered)
    batch7 = plan_next_offset(batch6, {}, held, now_epoch_s=1_700_000_000.0, delivered=delivered)
    # THEN neither reads the shard again from record 100: those records reached the sink with batch 5
    rereads = [offset.batch for offset in (batch6, batch7) if shard in offset.shards]
    assert rereads == [], f"batch(es) {rereads} read {shard} again from record 100"
