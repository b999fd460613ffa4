"""Shard sync for a multi-stream application: every tracked stream into one lease table (docs/multi-stream.md).

One scan of the lease table per sync, split by stream; each tracked stream is then synced by the single-stream
:class:`~worker_lib.shardsync.syncer.ShardSyncer` through a :class:`StreamLeaseView`, which shows it that stream's
leases under their bare shard ids and puts the stream's prefix back on everything it writes, so the hierarchy
rules, lease cleanup and the "shard gone?" confirmation are the same code in both modes. A stream whose sync fails
(throttled, deleted a moment ago) is logged and skipped: the others are synced all the same.

Streams that have leases but are not tracked any more are planned by :mod:`.former_streams` (deleted in Kinesis:
leases go now; untracked: after the grace period, whose start is kept in the CoordinatorState table).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError, StreamMissingError
from worker_lib.core.models import Lease
from worker_lib.core.streams import StreamIdentifier, StreamSelection, parse_stream_entry, split_lease_key
from worker_lib.leases.store import LeaseStore
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.shardsync.detector import KinesisShardDetector
from worker_lib.shardsync.former_streams import plan_former_streams
from worker_lib.shardsync.syncer import ShardSyncer, ShardSyncResult

log = logging.getLogger(__name__)

FORMER_STREAMS_KEY = "MultiStreamFormerStreams"
"""The CoordinatorState item holding, per untracked stream, the wall-clock millisecond it was first found so."""


class StateStore(Protocol):
    """The part of :class:`~worker_lib.tables.state_store.CoordinatorStateStore` this module uses."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, attrs: Mapping[str, Any]) -> None: ...


class StreamResolver:
    """A stream name's identifier (account, name, creation epoch) from DescribeStreamSummary."""

    def __init__(self, kinesis: Any) -> None:
        self._kinesis = kinesis

    def resolve(self, name: str) -> StreamIdentifier | None:
        """The identifier of the stream called ``name`` now; None if Kinesis does not know it. Other failures raise
        a :class:`~worker_lib.core.errors.DependencyError`."""
        try:
            with aws.translated("kinesis DescribeStreamSummary", name):
                summary = self._kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        except StreamMissingError:
            return None
        # arn:aws:kinesis:REGION:ACCOUNT:stream/NAME
        account = str(summary.get("StreamARN", "")).split(":")[4:5] or ["0"]
        created = summary.get("StreamCreationTimestamp")
        epoch = int(created.timestamp()) if created is not None else 0
        return StreamIdentifier(account_id=account[0] or "0", stream_name=name, creation_epoch=epoch)


class StreamLeaseView:
    """One stream's leases as a single-stream application's: keys are bare shard ids in, full keys out.

    ``leases`` is the snapshot of this stream's leases taken by the caller's one scan (full keys)."""

    def __init__(self, store: LeaseStore, stream: StreamIdentifier, leases: Iterable[Lease]) -> None:
        self._store = store
        self.stream = stream
        self._leases = [self._inside(lease) for lease in leases]

    def _inside(self, lease: Lease) -> Lease:
        return replace(lease, lease_key=split_lease_key(lease.lease_key)[1])

    def _outside(self, lease: Lease) -> Lease:
        return replace(lease, lease_key=self.stream.lease_key(lease.lease_key))

    def list_leases(self) -> list[Lease]:
        return list(self._leases)

    def create_lease_if_absent(self, lease: Lease) -> bool:
        return self._store.create_lease_if_absent(self._outside(lease))

    def update_child_shard_ids(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease | None:
        updated = self._store.update_child_shard_ids(self._outside(lease), child_shard_ids)
        return None if updated is None else self._inside(updated)

    def get_lease(self, lease_key: str) -> Lease | None:
        lease = self._store.get_lease(self.stream.lease_key(lease_key))
        return None if lease is None else self._inside(lease)

    def delete_lease(self, lease: Lease, *, only_if_finished: bool = True) -> bool:
        return self._store.delete_lease(self._outside(lease), only_if_finished=only_if_finished)


class MultiStreamShardSyncer:
    """``sync_once()`` for every stream of a :class:`StreamSelection` (the leader calls it as it calls
    :class:`ShardSyncer`)."""

    def __init__(
        self,
        lease_store: LeaseStore,
        kinesis: Any,
        streams: StreamSelection,
        *,
        state: StateStore,
        config: ShardSyncConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = lease_store
        self._kinesis = kinesis
        self._streams = streams
        self._state = state
        self._config = config or ShardSyncConfig()
        self._clock = clock
        self._resolver = StreamResolver(kinesis)
        self._detectors: dict[str, KinesisShardDetector] = {}
        self._warned_bare = False

    def sync_once(self) -> ShardSyncResult:
        started = self._clock.monotonic()
        leases = self._store.list_leases()
        by_stream: dict[str, list[Lease]] = {}
        for lease in leases:
            stream, _ = split_lease_key(lease.lease_key)
            if stream is None:
                if not self._warned_bare:
                    log.warning(
                        "lease %s has a single-stream key in a multi-stream application: left alone", lease.lease_key
                    )
                    self._warned_bare = True
                continue
            by_stream.setdefault(stream.serialize(), []).append(lease)
        try:
            entries = self._streams.current()
        except ValueError as exc:
            log.warning("%s: shard sync writes nothing this time", exc)
            return ShardSyncResult(
                shards_seen=0,
                open_shards=0,
                leases_before=len(leases),
                listing_complete=False,
                duration_ms=self._elapsed_ms(started),
            )

        tracked: dict[str, StreamIdentifier] = {}
        missing: list[str] = []
        unresolved: set[str] = set()  # names whose state is unknown this time: their leases are left as they are
        for entry in entries:
            name, identifier = parse_stream_entry(entry)
            if identifier is None:
                try:
                    identifier = self._resolver.resolve(name)
                except DependencyError as exc:
                    log.warning("stream %s skipped this sync: %s", name, exc)
                    unresolved.add(name)
                    continue
            if identifier is None:
                log.warning("tracked stream %s does not exist in Kinesis: skipped", name)
                missing.append(name)
                continue
            tracked[identifier.serialize()] = identifier

        results = [self._sync_stream(stream, by_stream.get(key, ())) for key, stream in sorted(tracked.items())]
        waiting, deleted = self._former_streams(by_stream, tracked, unresolved)
        done = [r for r in results if r is not None]
        return ShardSyncResult(
            shards_seen=sum(r.shards_seen for r in done),
            open_shards=sum(r.open_shards for r in done),
            leases_before=len(leases),
            created=tuple(key for r in done for key in r.created),
            deleted=tuple(key for r in done for key in r.deleted),
            children_recorded=tuple(key for r in done for key in r.children_recorded),
            skipped=tuple(key for r in done for key in r.skipped),
            unknown_pending=tuple(key for r in done for key in r.unknown_pending),
            listing_complete=len(done) == len(tracked) and not unresolved,
            duration_ms=self._elapsed_ms(started),
            streams_synced=tuple(sorted(key for key, r in zip(sorted(tracked), results, strict=True) if r)),
            streams_missing=tuple(missing),
            former_streams_waiting=waiting,
            former_streams_deleted=deleted,
        )

    def _sync_stream(self, stream: StreamIdentifier, leases: Iterable[Lease]) -> ShardSyncResult | None:
        """One stream's sync, its keys made full again; None (logged) when it failed."""
        detector = self._detectors.get(stream.stream_name)
        if detector is None:
            detector = KinesisShardDetector(
                stream.stream_name,
                client=self._kinesis,
                clock=self._clock,
                page_size=self._config.list_shards_page_size,
            )
            self._detectors[stream.stream_name] = detector
        view = StreamLeaseView(self._store, stream, leases)
        try:
            result = ShardSyncer(view, detector, config=self._config, clock=self._clock).sync_once()
        except DependencyError as exc:
            log.warning("shard sync of stream %s failed: %s; the other streams go on", stream.serialize(), exc)
            return None

        def full(keys: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(stream.lease_key(key) for key in keys)

        return replace(
            result,
            created=full(result.created),
            deleted=full(result.deleted),
            children_recorded=full(result.children_recorded),
            unknown_pending=full(result.unknown_pending),
            skipped=tuple(f"{stream.serialize()}:{entry}" for entry in result.skipped),
        )

    def _former_streams(
        self, by_stream: Mapping[str, list[Lease]], tracked: Mapping[str, StreamIdentifier], unresolved: set[str]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Plan and carry out what happens to untracked streams: (still waiting, deleted now)."""
        stored = self._state.get(FORMER_STREAMS_KEY) or {}
        since: dict[str, int] = {k: int(v) for k, v in dict(stored.get("since") or {}).items()}
        former = sorted(set(by_stream) - set(tracked))
        if not former and not since:
            return (), ()
        deleted: list[str] = []
        undecided: list[str] = []
        current: dict[str, StreamIdentifier | None] = {}
        for key in former:
            stream = StreamIdentifier.parse(key)
            if stream.stream_name in unresolved:
                undecided.append(key)
                continue
            if stream.stream_name not in current:
                try:
                    current[stream.stream_name] = self._resolver.resolve(stream.stream_name)
                except DependencyError as exc:
                    log.warning("could not tell whether stream %s still exists: %s", stream.stream_name, exc)
                    undecided.append(key)
                    continue
            now = current[stream.stream_name]
            if now is None or now.creation_epoch != stream.creation_epoch:
                deleted.append(key)
        now_ms = int(self._clock.wall() * 1000)
        plan = plan_former_streams(
            leased=former,
            tracked=tracked,
            deleted=deleted,
            undecided=undecided,
            untracked_since=since,
            now_ms=now_ms,
            grace_ms=self._config.former_stream_grace_ms,
        )
        waiting = dict(plan.waiting)
        gone: list[str] = []
        for key in plan.delete_now:
            log.warning("deleting the leases of stream %s: %s", key, plan.reasons[key])
            if self._delete_all(by_stream[key]):
                gone.append(key)
            else:  # some lease stayed: the next sync tries again, its clock unchanged
                waiting[key] = since.get(key, now_ms)
        for key in sorted(waiting.keys() - since.keys()):
            log.info("stream %s is no longer tracked: its leases are kept until its grace period ends", key)
        if waiting != since:
            self._state.put(FORMER_STREAMS_KEY, {"since": waiting})
        return tuple(sorted(waiting)), tuple(gone)

    def _delete_all(self, leases: Iterable[Lease]) -> bool:
        complete = True
        for lease in leases:
            try:
                if self._store.delete_lease(lease, only_if_finished=False):
                    log.info("lease deleted lease=%s reason=its stream is gone from the application", lease.lease_key)
                else:
                    complete = False
            except DependencyError as exc:
                log.warning("could not delete lease %s: %s", lease.lease_key, exc)
                complete = False
        return complete

    def _elapsed_ms(self, started: float) -> float:
        return round((self._clock.monotonic() - started) * 1000, 3)
