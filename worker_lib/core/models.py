"""Value types shared by the stores, the leader and the workers. No I/O here."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any


class SentinelCheckpoint(enum.Enum):
    """Checkpoint values that are not sequence numbers (KCL's ExtendedSequenceNumber sentinels)."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    SHARD_END = "SHARD_END"


SENTINELS = frozenset(s.value for s in SentinelCheckpoint)


@dataclass(frozen=True, kw_only=True, order=True)
class Checkpoint:
    """A position in a shard: a sequence number or sentinel, plus the KPL sub-sequence number.

    Ordering is only meaningful between two real sequence numbers of one shard.
    """

    sequence: str
    sub_sequence: int = 0

    @property
    def is_sentinel(self) -> bool:
        return self.sequence in SENTINELS

    @property
    def is_shard_end(self) -> bool:
        return self.sequence == SentinelCheckpoint.SHARD_END.value

    @property
    def is_real(self) -> bool:
        """True once processing has actually moved (a sequence number or SHARD_END).

        Lease cleanup uses this: a child whose checkpoint is still TRIM_HORIZON / LATEST / AT_TIMESTAMP has not
        started, so its parent's lease must stay.
        """
        return not self.is_sentinel or self.is_shard_end

    def is_after(self, other: Checkpoint) -> bool:
        """Whether ``self`` is strictly later than ``other`` (sequence numbers compare as integers)."""
        if self.is_shard_end:
            return not other.is_shard_end
        if self.is_sentinel or other.is_sentinel:
            return False
        a, b = int(self.sequence), int(other.sequence)
        return a > b or (a == b and self.sub_sequence > other.sub_sequence)

    @classmethod
    def sentinel(cls, value: SentinelCheckpoint) -> Checkpoint:
        return cls(sequence=value.value)

    def __str__(self) -> str:
        return self.sequence if not self.sub_sequence else f"{self.sequence}/{self.sub_sequence}"


TRIM_HORIZON = Checkpoint.sentinel(SentinelCheckpoint.TRIM_HORIZON)
LATEST = Checkpoint.sentinel(SentinelCheckpoint.LATEST)
AT_TIMESTAMP = Checkpoint.sentinel(SentinelCheckpoint.AT_TIMESTAMP)
SHARD_END = Checkpoint.sentinel(SentinelCheckpoint.SHARD_END)


SHARD_BLOCK_ATTRIBUTE = "shardleaseFailure"  # LeaseAttr.FAILURE: a map on the lease item, ours alone (KCL ignores it)


@dataclass(frozen=True, kw_only=True)
class ShardBlock:
    """A shard held up by its processor's failures: the lease item's ``shardleaseFailure`` map.

    The owner writes it at a batch's first failure (``retrying``) and removes it once the batch is through; with
    the ``stop-shard`` policy it writes ``stopped`` as it gives the lease up, and the leader assigns the lease to
    nobody until ``shardlease resume-shard`` removes it. ``shardlease status`` shows both.
    """

    state: str  # RETRYING | STOPPED
    since: float  # wall-clock seconds of the first failure
    attempts: int  # failed deliveries so far (of the records at ``at``)
    error: str  # the error's type name (never its message: it may quote a record)
    at: Checkpoint  # the first record that fails
    worker: str

    RETRYING = "retrying"
    STOPPED = "stopped"

    @property
    def stopped(self) -> bool:
        return self.state == self.STOPPED

    def to_attribute(self) -> dict[str, Any]:
        return {
            "M": {
                "state": {"S": self.state},
                "since": {"N": str(int(self.since * 1000))},
                "attempts": {"N": str(self.attempts)},
                "error": {"S": self.error or "-"},
                "sequence": {"S": self.at.sequence},
                "subSequence": {"N": str(self.at.sub_sequence)},
                "worker": {"S": self.worker},
            }
        }

    @classmethod
    def from_attribute(cls, raw: Any) -> ShardBlock | None:
        """The marker in a raw attribute value; None if absent or not one of ours (a foreign or damaged value is
        ignored rather than stopping a shard)."""
        try:
            fields = raw["M"]
            state = str(fields["state"]["S"])
            if state not in (cls.RETRYING, cls.STOPPED):
                return None
            return cls(
                state=state,
                since=int(fields["since"]["N"]) / 1000,
                attempts=int(fields["attempts"]["N"]),
                error=str(fields["error"]["S"]),
                at=Checkpoint(sequence=str(fields["sequence"]["S"]), sub_sequence=int(fields["subSequence"]["N"])),
                worker=str(fields["worker"]["S"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, kw_only=True)
class Lease:
    """One item of the lease table, as KCL 3.x writes it (docs/kcl-compatibility.md, "Lease table").

    ``extra`` keeps attributes this version does not model (as raw DynamoDB attribute values) so that a table
    written by another KCL version round-trips unchanged.
    """

    lease_key: str
    lease_counter: int = 0
    lease_owner: str | None = None
    checkpoint: Checkpoint = TRIM_HORIZON
    pending_checkpoint: Checkpoint | None = None
    owner_switches_since_checkpoint: int = 0
    parent_shard_ids: frozenset[str] = frozenset()
    child_shard_ids: frozenset[str] = frozenset()
    starting_hash_key: str | None = None
    ending_hash_key: str | None = None
    throughput_kbps: float | None = None
    checkpoint_owner: str | None = None
    entity_type: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def shard_id(self) -> str:
        """The shard id; in multi-stream keys (``account:stream:epoch:shardId``) the last component."""
        return self.lease_key.rsplit(":", 1)[-1]

    @property
    def actual_owner(self) -> str | None:
        """Who is really processing the shard: the old owner while a graceful handoff is in progress."""
        return self.checkpoint_owner or self.lease_owner

    @property
    def is_handoff_in_progress(self) -> bool:
        return self.checkpoint_owner is not None

    @property
    def is_finished(self) -> bool:
        return self.checkpoint.is_shard_end

    @property
    def block(self) -> ShardBlock | None:
        """The failure marker (:class:`ShardBlock`), if the shard is held up by its processor's failures."""
        raw = self.extra.get(SHARD_BLOCK_ATTRIBUTE)
        return None if raw is None else ShardBlock.from_attribute(raw)

    @property
    def is_stopped(self) -> bool:
        """Stopped by the ``stop-shard`` failure policy: assigned to nobody until resumed."""
        block = self.block
        return block is not None and block.stopped

    def with_(self, **changes: Any) -> Lease:
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """What ListShards tells us about one shard."""

    shard_id: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    starting_hash_key: str = "0"
    ending_hash_key: str = str(2**128 - 1)
    starting_sequence_number: str = "0"
    ending_sequence_number: str | None = None

    @property
    def is_open(self) -> bool:
        return self.ending_sequence_number is None

    @property
    def parent_ids(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)


class WorkerState(enum.Enum):
    """What a heartbeating worker says about itself (``wst``)."""

    ACTIVE = "ACTIVE"
    DEPARTING = "DEPARTING"
    """Shutting down: finishing batches and giving its leases up. The leader assigns it nothing more."""
    STOPPED = "STOPPED"
    """Gone: it fenced itself (processes nothing) before writing this, so whatever it still owns may move now."""


@dataclass(frozen=True, kw_only=True)
class WorkerHeartbeat:
    """A worker's heartbeat attributes: ``hbc`` (counter, +1 per beat), ``hbt`` (its wall clock at sending, ms),
    ``hbi`` (its beat interval, ms), ``wst`` (state), ``evc`` (a counter it bumps when it released or created
    leases the leader should look at) and ``lvm`` (the liveness mode it runs in: ``lease`` = renewing, ``worker``;
    ``None`` for a worker older than liveness modes, which always renews), ``hbs`` (the session of the process
    that beat: its start time in ms, zero-padded, and a random suffix — a newer process under the same worker id
    supersedes an older one; ``None`` from a worker older than sessions) and ``hbg`` (the leader's certificate: the
    counter at which it declared this worker gone, 0 if never; ``None`` under a leader that writes none)."""

    counter: int
    wall_ms: int
    interval_ms: int
    state: WorkerState = WorkerState.ACTIVE
    events: int = 0
    liveness: str | None = None
    session: str | None = None
    gone_counter: int | None = None

    @property
    def renews(self) -> bool:
        return self.liveness != "worker"


MAX_REPORTED_LAGS = 100
"""A worker reports the lag of at most this many leases (its worst), and the lanes of as many: the item stays
small."""


@dataclass(frozen=True, kw_only=True)
class LaneStats:
    """A lease processed in lanes, as its worker last reported it (ours, ``lanes``; docs/attributes.md)."""

    in_flight: int  # records read and not yet done
    watermark_lag_ms: int  # how long the first record not yet done has waited


@dataclass(frozen=True, kw_only=True)
class WorkerMetricStats:
    """One item of ``<app>-WorkerMetricStats`` (docs/kcl-compatibility.md, "Worker-metrics table").

    stats: metric name (``C`` CPU, ``M`` memory, ``NI``/``NO`` network, ...) → last ≤ 10 window averages,
      newest last; −1 marks a window with no samples.
    operating_range: metric name → list whose first value is the maximum utilisation (default 100).
    heartbeat: the worker's liveness attributes (ours, docs/failover.md); ``None`` for a worker that does not
      heartbeat (a KCL worker, or ``SHARDLEASE_HEARTBEAT_INTERVAL_MS=0``).
    assignment_version / assigned_keys: the leader's notice of new leases for this worker (ours).
    handoff_requests: in ``worker`` liveness mode, the graceful hand-offs the leader asked this worker for, as
      ``"<timeout ms>:<lease key>"`` (ours; kept until the worker no longer holds the lease, docs/liveness-modes.md).
    capacity: what the worker can spend on its leases, in CPUs (a worker's available cores, a Spark application's
      executor slots; ours, ``cap``; ``None`` when not reported). A lightly loaded fleet is evened by lease count
      in proportion to it (docs/assignment.md).
    lag_ms: per lease this worker reads, how far behind the tip its last batch was (``MillisBehindLatest``; ours,
      ``lag``; at most :data:`MAX_REPORTED_LAGS` leases, the worst): what ``shardlease status`` shows per shard.
    lanes: per lease this worker processes in lanes, its records in flight and its watermark's lag (ours, ``lanes``;
      at most :data:`MAX_REPORTED_LAGS` leases, the worst watermark lags): shown by ``shardlease status`` too.
    """

    worker_id: str
    last_update_epoch_s: int
    stats: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    entity_type: str | None = None
    heartbeat: WorkerHeartbeat | None = None
    assignment_version: int = 0
    assigned_keys: tuple[str, ...] = ()
    handoff_requests: tuple[str, ...] = ()
    capacity: float | None = None
    lag_ms: Mapping[str, int] = field(default_factory=dict)
    lanes: Mapping[str, LaneStats] = field(default_factory=dict)

    @property
    def state(self) -> WorkerState:
        """ACTIVE unless the worker announced its shutdown (heartbeating workers only)."""
        return self.heartbeat.state if self.heartbeat is not None else WorkerState.ACTIVE

    @property
    def is_default_metric_worker(self) -> bool:
        """KCL: a worker reporting no metrics at all is balanced by throughput alone."""
        return not self.stats and not self.operating_range

    def latest(self, metric: str = "C") -> float | None:
        """The newest real window of ``metric`` (−1 marks a window with no samples), or None if there is none."""
        values = [v for v in self.stats.get(metric, ()) if v >= 0]
        return values[-1] if values else None

    def has_failed_metric(self) -> bool:
        """KCL excludes a worker from assignment when any metric list ends in −1."""
        return any(values and values[-1] == -1 for values in self.stats.values())


@dataclass(frozen=True, kw_only=True)
class KinesisRecord:
    """One user record as delivered to a processor.

    For a KPL aggregate, every user record inside it shares the aggregate's ``sequence_number`` and carries its
    index in the aggregate as ``sub_sequence_number`` (``aggregated`` is True); a plain record has sub-sequence 0.
    ``data`` is excluded from ``repr`` so that records can be logged without their payload.
    """

    data: bytes = field(repr=False)
    partition_key: str
    sequence_number: str
    sub_sequence_number: int = 0
    approximate_arrival_timestamp: datetime | None = None
    explicit_hash_key: str | None = None
    aggregated: bool = False
    encryption_type: str | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint value that marks this record (and everything before it) as processed."""
        return Checkpoint(sequence=self.sequence_number, sub_sequence=self.sub_sequence_number)
