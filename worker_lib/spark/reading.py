"""The executor side: read one shard for one micro-batch and record where the read ended.

A read stops at the first of: ``max_records`` user records, the tip of the shard (a read returning fewer records
than asked with ``MillisBehindLatest`` 0, or none), the end of the shard, the ``max_read_ms`` budget, or
(``Trigger.AvailableNow``) a record that arrived after the trigger started. Its end is then recorded (first writer
wins, one conditional PutItem) *before* any row is returned. A task retry, a speculative copy or a replay after a
driver restart finds an end recorded already (the PutItem's condition fails and returns it): it returns exactly the
records up to that end — the prefix of what it read, or, when it read less, a re-read up to the end.

Records come through the retrieval seam (:class:`~worker_lib.retrieval.RecordSources`): polling, or enhanced fan-out
through the stream consumer the driver resolved (an executor registers nothing).

Rows leave as Arrow record batches (the PySpark Python Data Source API takes ``pyarrow.RecordBatch`` from ``read``
as is, skipping its per-value conversion of tuples), and clients are made once per Python worker process (Spark
reuses the process for later tasks).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from worker_lib.core import aws
from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import CredentialsError, DependencyError, StreamMissingError
from worker_lib.core.models import SHARD_END, Checkpoint, KinesisRecord
from worker_lib.core.streams import stream_name_of
from worker_lib.retrieval import KnownConsumerArns, RecordSource, RecordSources, RetrievalConfig, RetrievalMode
from worker_lib.retrieval.config import GET_RECORDS_LIMIT
from worker_lib.retrieval.fanout import subscription_config
from worker_lib.spark import trace
from worker_lib.spark.batches import BatchEndStore
from worker_lib.spark.planning import BatchEnd, ReadSettings, ShardReadTask
from worker_lib.tables.schema import TableLayout

log = logging.getLogger(__name__)

# A failed read is retried from a fresh iterator: exact (one task reads one shard; the budget bounds the retries).
READ_RETRY_BACKOFF = Backoff(base_s=0.1, max_s=1.6)


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


_CLIENTS: dict[tuple[str, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def cached_client(service: str, config: AwsConfig) -> Any:
    """One client per service and settings per process: a Python worker runs many tasks, and making a boto3
    client (a session, the service model) costs more than a small shard read."""
    key = (service, repr(config))
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            found = _CLIENTS[key] = trace.attach(aws.client(service, config))
        return found


def subscription_client(settings: ReadSettings) -> Any:
    """The Kinesis client of fan-out reads: a subscription may be quiet for seconds between events."""
    return cached_client("kinesis", subscription_config(aws_config(settings)))


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
    cpu_started = time.process_time()
    if bound is not None and bound.is_sentinel and not bound.is_shard_end:
        # The recorded read found nothing: a replay must find nothing too.
        return ShardRead(
            records=(),
            end=BatchEnd(lease_key=task.lease_key, position=task.position, started_at=started, finished_at=started),
        )
    limit = min(GET_RECORDS_LIMIT, settings.max_records)
    source = record_source(task, kinesis, max_records=limit, clock=clock)
    try:
        return _read(task, source, bound=bound, limit=limit, started=started, cpu_started=cpu_started, clock=clock)
    finally:
        source.close()


def record_source(task: ShardReadTask, kinesis: Any, *, max_records: int, clock: Clock) -> RecordSource:
    """The source of one read: enhanced fan-out through the consumer the driver resolved for the task's stream (an
    executor registers nothing), else polling."""
    settings = task.settings
    stream = stream_name_of(task.lease_key, settings.stream)
    consumers = dict(settings.fanout_consumers)
    fanout = stream in consumers
    sources = RecordSources(
        RetrievalConfig(max_records=max_records, mode=RetrievalMode.FANOUT if fanout else RetrievalMode.POLLING),
        kinesis_client=kinesis,
        subscription_client=subscription_client(settings) if fanout else None,
        consumers=KnownConsumerArns(consumers),
        clock=clock,
    )
    return sources.open(stream, task.shard_id, start=task.position, timestamp=start_timestamp(task))


def _read(
    task: ShardReadTask,
    source: RecordSource,
    *,
    bound: Checkpoint | None,
    limit: int,
    started: float,
    cpu_started: float,
    clock: Clock,
) -> ShardRead:
    settings = task.settings
    records: list[KinesisRecord] = []
    millis_behind: int | None = None  # the last read's MillisBehindLatest: the shard's lag, for the driver's report
    caught_up = False
    ended = False
    deadline = clock.monotonic() + settings.max_read_ms / 1000
    # A bounded re-read must reach its bound whatever the budget; give up (task fails, Spark retries) only far
    # beyond it.
    hard_deadline = clock.monotonic() + 10 * max(settings.max_read_ms / 1000, 30.0)
    retry = Retry(backoff=READ_RETRY_BACKOFF, clock=clock)
    while True:
        try:
            batch = source.fetch()
        except (CredentialsError, StreamMissingError):
            raise  # not transient: the query fails with the reason
        except DependencyError as exc:
            # Kinesis failed past the client's retries (an outage, an internal error). Ride it out within the read's
            # budget, from a fresh iterator; an unbounded read that runs out of budget ends where it got (its end
            # is recorded as usual and the next micro-batch goes on from there), so a passing failure costs a
            # shorter batch, not the query. A bounded re-read must reach its recorded end: it fails the task only
            # after the hard deadline (Spark retries the task or reports the query's failure).
            give_up_at = deadline if bound is None else hard_deadline
            now = clock.monotonic()
            if now >= give_up_at:
                if bound is not None:
                    raise
                log.warning(
                    "reading %s for batch %d ended early after %d records: %s",
                    task.lease_key,
                    task.batch,
                    len(records),
                    exc,
                )
                break
            pause = retry.failed()
            log.info("reading %s failed (%s); again in %.1f s", task.lease_key, exc, pause)
            retry.wait(min(pause, max(0.0, give_up_at - now)))
            source.restart()
            continue
        retry.succeeded()
        if batch.millis_behind_latest is not None:
            millis_behind = batch.millis_behind_latest
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
        # Fewer Kinesis records than asked for (not user records: de-aggregation adds some, the starting point's
        # own record is dropped) with nothing behind: the tip.
        at_tip = not batch.throttled and not batch.pending and not batch.millis_behind_latest and batch.fetched < limit
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
        children=source.child_shards if ended else (),
        started_at=started,
        finished_at=finished,
        cpu_seconds=time.process_time() - cpu_started,
        millis_behind_latest=0 if caught_up or ended else millis_behind,
    )
    return ShardRead(records=tuple(records), end=end)


def records_up_to(records: Sequence[KinesisRecord], bound: Checkpoint) -> tuple[KinesisRecord, ...] | None:
    """The records of a read up to ``bound`` (a recorded end), when the read got that far; None when it stopped
    short of it (the caller reads again, bounded)."""
    if bound.is_shard_end:
        return None
    if bound.is_sentinel:  # the recorded read found nothing
        return ()
    if not records or bound.is_after(records[-1].checkpoint):
        return None
    return tuple(record for record in records if not record.checkpoint.is_after(bound))


def read_task(
    task: ShardReadTask,
    *,
    kinesis: Any = None,
    batch_store: BatchEndStore | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ShardRead:
    """Read one input partition deterministically (see the module documentation)."""
    config = aws_config(task.settings)
    kinesis = kinesis or cached_client("kinesis", replace(config, max_attempts=2))
    store = batch_store or BatchEndStore(
        task.settings.app, cached_client("dynamodb", config), layout=TableLayout.parse(task.settings.table_layout)
    )
    first = read_up_to(task, kinesis, bound=None, clock=clock)
    standing, recorded_now = store.put_if_absent(task.item_key, first.end, now_epoch_s=clock.wall())
    if recorded_now:
        return first
    # Read before (a retry, a speculative copy, a second action on the DataFrame, a replay after a restart):
    # return exactly the recorded records.
    store.touch(task.item_key, clock.wall())
    if first.end.ended and standing.ended:
        return ShardRead(records=first.records, end=standing)
    records = records_up_to(first.records, standing.position)
    if records is None:
        log.info("batch %d of %s: recorded end lies further; re-reading to it", task.batch, task.lease_key)
        records = read_up_to(task, kinesis, bound=standing.position, clock=clock).records
    return ShardRead(records=records, end=standing)


ARROW_ROWS_PER_BATCH = 10_000


def arrow_schema() -> Any:
    """The source's schema as PySpark expects Arrow batches from ``read`` (``to_arrow_schema`` of it, UTC)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data", pa.binary()),
            ("partition_key", pa.string()),
            ("sequence_number", pa.string()),
            ("sub_sequence_number", pa.int64()),
            ("shard_id", pa.string()),
            ("approximate_arrival_timestamp", pa.timestamp("us", tz="UTC")),
            ("stream", pa.string()),
        ]
    )


def to_arrow(lease_key: str, records: Sequence[KinesisRecord], *, stream: str) -> list[Any]:
    """Records as ``pyarrow.RecordBatch``es in the source schema (data, partition_key, sequence_number,
    sub_sequence_number, shard_id (the lease key), approximate_arrival_timestamp, stream), at most
    ``ARROW_ROWS_PER_BATCH`` rows each."""
    import pyarrow as pa

    if not records:
        return []
    schema = arrow_schema()
    columns = [
        pa.array([r.data for r in records], pa.binary()),
        pa.array([r.partition_key for r in records], pa.string()),
        pa.array([r.sequence_number for r in records], pa.string()),
        pa.array([r.sub_sequence_number for r in records], pa.int64()),
        pa.array([lease_key] * len(records), pa.string()),
        pa.array([r.approximate_arrival_timestamp for r in records], schema.field(5).type),
        pa.array([stream] * len(records), pa.string()),
    ]
    whole = pa.RecordBatch.from_arrays(columns, schema=schema)
    return [whole.slice(i, ARROW_ROWS_PER_BATCH) for i in range(0, whole.num_rows, ARROW_ROWS_PER_BATCH)]
