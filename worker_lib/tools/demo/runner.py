"""``shardlease demo``: the system on local emulators, no AWS account needed.

Scenario ``shard-sync`` walks a lease table through a stream's whole lease lifecycle (docs/shard-sync.md) with the
real leader code: discovery and creation, resharding (a split and a merge on kinesalite, whose resharding data
flow is faithful), consumers reading parents to SHARD_END, the leader creating the child leases, children
checkpointing, and the cleanup of finished parents. Every step prints what the lease table now holds.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import SHARD_END, Checkpoint
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leader.factory import LeaderParts, build_leader
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.emulators import Emulator
from worker_lib.testing.local import LocalEmulators
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, put_records, split_shard
from worker_lib.tools.demo import (
    DURATION_MAX_S,
    DURATION_MIN_DEFAULT_S,
    SCENARIOS,
    SHARDS_MAX,
    SHARDS_MIN,
    WORKERS_MAX,
    WORKERS_MIN,
)
from worker_lib.tools.demo.output import DemoOutput

log = logging.getLogger(__name__)

Printer = Callable[[str], None]


@contextlib.contextmanager
def _emulators(say: Printer) -> Iterator[tuple[Emulator, Emulator]]:
    local = LocalEmulators().start()
    assert local.moto is not None and local.kinesalite is not None
    moto, kinesalite = local.moto, local.kinesalite
    try:  # a say() that fails (stdout closed) must still stop both emulators
        say(f"emulators: moto (DynamoDB) pid {moto.pid} at {moto.endpoint_url}; ")
        say(f"           kinesalite (Kinesis) pid {kinesalite.pid} at {kinesalite.endpoint_url}")
        say(f"           kinesalite from {kinesalite.source}; {moto.source}")
        yield moto, kinesalite
    finally:
        local.stop()
        say(f"emulators stopped (pids {moto.pid}, {kinesalite.pid})")


def _lease_table(store: DynamoDBLeaseStore) -> str:
    leases = sorted(store.list_leases(), key=lambda lease: lease.lease_key)
    rows = []
    for lease in leases:
        parents = ",".join(sorted(p[-4:] for p in lease.parent_shard_ids)) or "-"
        checkpoint = str(lease.checkpoint)
        if len(checkpoint) > 14:
            checkpoint = "…" + checkpoint[-12:]
        rows.append(
            f"    {lease.lease_key:<22} owner={lease.lease_owner or '-':<9} ckpt={checkpoint:<14} parents={parents}"
        )
    return "\n".join(rows) if rows else "    (empty)"


def _read_to_end(kinesis: Any, stream: str, shard_id: str, after: Checkpoint | None) -> tuple[int, str | None, bool]:
    """Read a shard from ``after`` (or its start); returns (records, last sequence, reached the shard's end)."""
    kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id}
    if after is not None and after.is_real:
        kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=after.sequence)
    else:
        kwargs.update(ShardIteratorType="TRIM_HORIZON")
    with aws.translated("kinesis GetShardIterator", stream):
        iterator: str | None = kinesis.get_shard_iterator(**kwargs)["ShardIterator"]
    count, last = 0, None
    while iterator:
        with aws.translated("kinesis GetRecords", stream):
            response = kinesis.get_records(ShardIterator=iterator, Limit=1000)
        records = response.get("Records", [])
        count += len(records)
        if records:
            last = records[-1]["SequenceNumber"]
        iterator = response.get("NextShardIterator")
        if not records and iterator:  # an open shard: caught up
            return count, last, False
    return count, last, True


def _consume(store: DynamoDBLeaseStore, kinesis: Any, stream: str, owner: str, say: Printer) -> int:
    """A minimal consumer standing in for the worker: take each lease, read, checkpoint (fenced)."""
    total = 0
    for lease in sorted(store.list_leases(), key=lambda item: item.lease_key):
        if lease.is_finished:
            continue
        taken = store.assign_lease(lease, owner, expected_counter=lease.lease_counter)
        if taken is None:
            continue
        count, last, ended = _read_to_end(kinesis, stream, lease.shard_id, lease.checkpoint)
        total += count
        checkpoint = SHARD_END if ended else (Checkpoint(sequence=last) if last else None)
        if checkpoint is not None:
            store.checkpoint(taken, owner, checkpoint)
        say(f"  consumer read {count:>3} records from {lease.lease_key} → checkpoint {checkpoint or '(unchanged)'}")
    return total


def _shard_sync_scenario(*, shards: int, say: Printer, clock: Clock) -> int:
    app = f"shardlease-demo-{uuid.uuid4().hex[:8]}"
    stream = f"{app}-stream"
    with _emulators(say) as (moto, kinesalite):
        ddb_config = AwsConfig(endpoint_url=moto.endpoint_url)
        kinesis_config = AwsConfig(endpoint_url=kinesalite.endpoint_url)
        ddb = aws.client("dynamodb", ddb_config)
        kinesis = aws.client("kinesis", kinesis_config)
        ensure_tables(app, ddb)
        say(f"\n1. tables for app {app} created (leases, worker metrics, coordinator state)")
        create_stream(kinesis, stream, shards, clock=clock)
        produced = _produce(kinesis, stream, 40 * shards)
        say(f"2. stream {stream}: {shards} shards, {produced} records produced")

        parts = _leader(app, stream, ddb, kinesis, clock)
        store = parts.lease_store
        report = parts.leader.run_once()
        say(f"3. leader {report.owner} ran one cycle (TRIM_HORIZON): {_sync_line(report.shard_sync)}")
        say(_lease_table(store))

        listing = sorted(list_all_shards(kinesis, stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
        to_split = listing[0]["ShardId"]
        lower, upper = listing[-2]["ShardId"], listing[-1]["ShardId"]
        split_shard(kinesis, stream, to_split, clock=clock)
        merge_shards(kinesis, stream, lower, upper, clock=clock)
        produced += _produce(kinesis, stream, 40 * shards)
        say(f"\n4. resharded: split {to_split}; merged {lower} + {upper}; {produced} records produced in all")
        report = parts.leader.run_once()
        say(f"   leader sync: {_sync_line(report.shard_sync)} (children wait for their parents to finish)")

        consumed = _consume(store, kinesis, stream, "demo-consumer", say)
        say("\n5. consumers read every leased shard; the resharded parents reached SHARD_END")
        report = parts.leader.run_once()
        say(f"   leader sync: {_sync_line(report.shard_sync)}")
        say(_lease_table(store))

        consumed += _consume(store, kinesis, stream, "demo-consumer", say)
        report = parts.leader.run_once()
        say(f"\n6. children checkpointed; leader sync and cleanup: {_sync_line(report.shard_sync)}")
        say(_lease_table(store))

        say(f"\nrecords produced {produced}, consumed {consumed}: {'all read' if consumed == produced else 'MISMATCH'}")
        return 0 if consumed == produced else 1


def _leader(app: str, stream: str, ddb: Any, kinesis: Any, clock: Clock) -> LeaderParts:
    # Each run_once releases the lock, so the demo's repeated single cycles each take it at once.
    parts = build_leader(
        app=app,
        stream=stream,
        aws_config=AwsConfig(),
        shard_sync=ShardSyncConfig(initial_position=InitialPosition.TRIM_HORIZON),
        owner="demo-leader",
        leader_config=LeaderConfig(),
        lock_config=LeaderLockConfig(),
        clock=clock,
        with_assignment=False,  # this scenario's consumer takes leases itself
        dynamodb=ddb,
        kinesis=kinesis,
    )
    return parts


def _produce(kinesis: Any, stream: str, count: int) -> int:
    return len(put_records(kinesis, stream, (f"demo record {i}".encode() for i in range(count))))


def _sync_line(result: Any) -> str:
    if result is None:
        return "no shard sync ran"
    created = list(getattr(result, "created", ()))
    deleted = list(getattr(result, "deleted", ()))
    return f"{getattr(result, 'shards_seen', '?')} shards seen, created {len(created)} lease(s), deleted {len(deleted)}"


def validate(*, workers: int, shards: int, duration_s: float, scenario: str) -> None:
    """Raise :class:`ConfigError` (one line) for arguments outside the documented bounds."""
    if scenario not in SCENARIOS:
        raise ConfigError(f"unknown scenario {scenario!r}: choose one of {', '.join(SCENARIOS)}")
    if not WORKERS_MIN <= workers <= WORKERS_MAX:
        raise ConfigError(f"--workers {workers} is out of range: the demo runs {WORKERS_MIN} to {WORKERS_MAX} workers")
    if not SHARDS_MIN <= shards <= SHARDS_MAX:
        raise ConfigError(
            f"--shards {shards} is out of range: the demo needs {SHARDS_MIN} to {SHARDS_MAX} shards "
            "(it splits one and merges two)"
        )
    if not 0 < duration_s <= DURATION_MAX_S:
        raise ConfigError(f"--duration {duration_s:g} is out of range: more than 0 and at most {DURATION_MAX_S:g} s")
    if scenario == "default" and duration_s < DURATION_MIN_DEFAULT_S:
        raise ConfigError(f"the default scenario needs --duration of at least {DURATION_MIN_DEFAULT_S:g} seconds")


def run_demo(
    *, workers: int, shards: int, duration_s: float, scenario: str, out: DemoOutput, clock: Clock = SYSTEM_CLOCK
) -> int:
    """Run one scenario; its narrative goes to ``out`` (worker_lib/cli/demo.py prints it)."""
    validate(workers=workers, shards=shards, duration_s=duration_s, scenario=scenario)
    out.say(f"shardlease demo — scenario {scenario}")
    if scenario == "shard-sync":
        return _shard_sync_scenario(shards=shards, say=out.say, clock=clock)
    from worker_lib.tools.demo.scenario import run_fleet_demo

    return run_fleet_demo(workers=workers, shards=shards, duration_s=duration_s, out=out, clock=clock)
