"""The executor side: read one shard for one micro-batch and record where the read ended.

A first read stops at the first of: ``max_records`` user records, the tip of the shard (a read returning fewer
records than asked with ``MillisBehindLatest`` 0, or none), the end of the shard, the ``max_read_ms`` budget, or
(``Trigger.AvailableNow``) a record that arrived after the trigger started. Its end is then recorded (first writer
wins) *before* any row is returned, so a task retry, a speculative copy or a replay after a driver restart reads
exactly the same records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import SHARD_END, Checkpoint
from worker_lib.processing.config import RetrievalConfig
from worker_lib.processing.processor import KinesisRecord
from worker_lib.processing.retrieval import ShardRecordFetcher
from worker_lib.spark.batches import BatchEndStore
from worker_lib.spark.planning import BatchEnd, ReadSettings, ShardReadTask

log = logging.getLogger("shardlease.spark.reading")

GET_RECORDS_LIMIT = 10_000

Row = tuple[bytes, str, str, int, str, datetime | None]


@dataclass(frozen=True, kw_only=True)
class ShardRead:
    records: tuple[KinesisRecord, ...]
    end: BatchEnd


def aws_config(settings: ReadSettings) -> AwsConfig:
    services = {
        name: url
        for name, url in (("kinesis", settings.kinesis_endpoint_url), ("dynamodb", settings.dynamodb_endpoint_url))
        if url
    }
    return AwsConfig(
        region=settings.region, endpoint_url=settings.endpoint_url, service_endpoints=services, max_attempts=3
    )


def start_timestamp(task: ShardReadTask) -> datetime | None:
    if task.position.sequence != "AT_TIMESTAMP":
        return None
    if task.timestamp is None:
        raise DependencyError(f"lease {task.lease_key} starts AT_TIMESTAMP but no initial_timestamp option was given")
    return datetime.fromtimestamp(task.timestamp, timezone.utc)


def _arrived_after(record: KinesisRecord, until: float | None) -> bool:
    arrival = record.approximate_arrival_timestamp
    return until is not None and arrival is not None and arrival.timestamp() > until


def read_up_to(
    task: ShardReadTask,
    kinesis: Any,
    *,
    bound: Checkpoint | None,
    clock: Clock = SYSTEM_CLOCK,
) -> ShardRead:
    """Read the shard after ``task.position``: exactly up to ``bound`` when given, else by the stop rules."""
    settings = task.settings
    started = clock.wall()
    if bound is not None and bound.is_sentinel and not bound.is_shard_end:
        # The recorded read found nothing: a replay must find nothing too.
        return ShardRead(
            records=(),
            end=BatchEnd(lease_key=task.lease_key, position=task.position, started_at=started, finished_at=started),
        )
    limit = min(GET_RECORDS_LIMIT, settings.max_records)
    fetcher = ShardRecordFetcher(
        settings.stream,
        task.shard_id,
        kinesis_client=kinesis,
        start=task.position,
        timestamp=start_timestamp(task),
        clock=clock,
        config=RetrievalConfig(max_records=limit),
    )
    records: list[KinesisRecord] = []
    caught_up = False
    ended = False
    deadline = clock.monotonic() + settings.max_read_ms / 1000
    # A bounded re-read must reach its bound whatever the budget; give up (task fails, Spark retries) only far
    # beyond it.
    hard_deadline = clock.monotonic() + 10 * max(settings.max_read_ms / 1000, 30.0)
    while True:
        batch = fetcher.fetch()
        done = False
        for record in batch.records:
            if bound is not None and not bound.is_shard_end and record.checkpoint.is_after(bound):
                done = True
                break
            if bound is None and (
                len(records) >= settings.max_records or _arrived_after(record, settings.until_epoch_s)
            ):
                done = True
                caught_up = len(records) < settings.max_records
                break
            records.append(record)
        if done:
            break
        if bound is not None:
            last = records[-1].checkpoint if records else None
            if batch.end_of_shard:
                ended = bound.is_shard_end
                break
            if last is not None and not bound.is_shard_end and not bound.is_after(last):
                break
            if clock.monotonic() > hard_deadline:
                raise DependencyError(f"re-reading {task.lease_key} up to its recorded end {bound} took too long")
            continue
        if batch.end_of_shard:
            ended = True
            break
        if len(records) >= settings.max_records:
            break
        at_tip = not batch.throttled and not batch.millis_behind_latest and len(batch.records) < limit
        if at_tip:
            caught_up = True
            break
        if clock.monotonic() >= deadline:
            break
    finished = clock.wall()
    if ended:
        position = SHARD_END
    elif records:
        position = records[-1].checkpoint
    else:
        position = task.position
    end = BatchEnd(
        lease_key=task.lease_key,
        position=position,
        records=len(records),
        bytes=sum(len(r.data) for r in records),
        caught_up=caught_up or ended,
        children=fetcher.child_shards if ended else (),
        started_at=started,
        finished_at=finished,
    )
    return ShardRead(records=tuple(records), end=end)


def read_task(
    task: ShardReadTask,
    *,
    kinesis: Any = None,
    batch_store: BatchEndStore | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ShardRead:
    """Read one input partition deterministically (see the module documentation)."""
    config = aws_config(task.settings)
    kinesis = kinesis or aws.client("kinesis", replace(config, max_attempts=2))
    store = batch_store or BatchEndStore(task.settings.app, aws.client("dynamodb", config))
    recorded = store.get(task.item_key)
    if recorded is not None:
        result = read_up_to(task, kinesis, bound=recorded.position, clock=clock)
        store.touch(task.item_key, clock.wall())
        return ShardRead(records=result.records, end=recorded)
    first = read_up_to(task, kinesis, bound=None, clock=clock)
    standing = store.put_if_absent(task.item_key, first.end, now_epoch_s=clock.wall())
    if standing.position == first.end.position:
        return ShardRead(records=first.records, end=standing)
    # Another attempt of this task recorded a different end first: return exactly its records.
    log.info("batch %d of %s: another attempt recorded its end first; re-reading to it", task.batch, task.lease_key)
    again = read_up_to(task, kinesis, bound=standing.position, clock=clock)
    return ShardRead(records=again.records, end=standing)


def to_rows(lease_key: str, records: tuple[KinesisRecord, ...]) -> Iterator[Row]:
    """Rows in the source schema (data, partition_key, sequence_number, sub_sequence_number, shard_id,
    approximate_arrival_timestamp)."""
    for record in records:
        yield (
            record.data,
            record.partition_key,
            record.sequence_number,
            record.sub_sequence_number,
            lease_key,
            record.approximate_arrival_timestamp,
        )
