"""bench/exactly_once.py's record processor: one effect per record in the mode it is given, then the checkpoint.

Per batch, by mode (:mod:`.effects`):

* ``at-least-once``: BatchWriteItem of the batch's items (25 a request), then ``checkpointer.checkpoint()``;
* ``dynamodb-transaction``: ``checkpointer.stage(record, ...)`` per record, then ``checkpointer.checkpoint()`` (the
  library commits the outputs with the checkpoint in TransactWriteItems of at most 99 outputs);
* ``sql-position``: the rows and ``SqlPositions.save(cursor, checkpointer, records[-1])`` in one PostgreSQL
  transaction, commit, then ``checkpointer.checkpoint()``;
* ``at-least-once-sql``: the same rows in one PostgreSQL transaction, commit, then ``checkpointer.checkpoint()``.

``hold_s`` sleeps between the write and the checkpoint (the kill runs: a kill then often lands after a batch's
effects and before its checkpoint). Observers see each delivery start and end (the end: after the checkpoint).

In ``shardlease worker`` processes (the kill runs) the processor comes from the environment:
``--processor exactly_once_support.processor:from_env`` and, in ``sql-position`` mode, ``--position-sink
exactly_once_support.processor:positions``, with ``PYTHONPATH`` holding the repository and ``bench/``.
``BENCH_MODE`` (a mode), ``BENCH_TABLE`` (the output table), ``BENCH_DSN`` (PostgreSQL, SQL modes), ``BENCH_APP``
(the application, for the position rows), ``BENCH_HOLD_MS``, ``BENCH_JOURNAL_DIR`` (a file per process, one line per
record delivered: ``<id>``, written at the start of the delivery). These write counts (non-idempotent effects).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import IO, Any, Protocol, cast

from exactly_once_support.effects import (
    AT_LEAST_ONCE,
    COUNT_COLUMNS,
    DYNAMODB_TRANSACTION,
    ITEM_COLUMNS,
    MODES,
    SQL_MODES,
    SQL_POSITION,
    appended_item,
    batch_write,
    count_row,
    counted_update,
    insert_sql,
    item_of,
    record_id,
)
from worker_lib.core.models import KinesisRecord
from worker_lib.processing.outputs import put_item
from worker_lib.processing.positions import SqlPositions
from worker_lib.processing.processor import (
    Checkpointer,
    ExactlyOnceCheckpointer,
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)

Connect = Callable[[], Any]


class Observer(Protocol):
    """Told of each delivery: at its start, and once its checkpoint returned."""

    def started(self, records: Sequence[KinesisRecord]) -> None: ...

    def ended(self, records: Sequence[KinesisRecord]) -> None: ...


class EffectsProcessor:
    """One lease's processor (see the module's docstring). ``counting``: the kill runs' non-idempotent effects
    instead of the throughput runs' items."""

    def __init__(
        self,
        mode: str,
        *,
        table: str,
        counting: bool = False,
        dynamodb: Any = None,
        connect: Connect | None = None,
        positions: SqlPositions | None = None,
        hold_s: float = 0.0,
        observers: Sequence[Observer] = (),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        if mode == AT_LEAST_ONCE and dynamodb is None:
            raise ValueError("at-least-once writes with a DynamoDB client")
        if mode in SQL_MODES and connect is None:
            raise ValueError(f"{mode} needs a PostgreSQL connection factory")
        if (mode == SQL_POSITION) != (positions is not None):
            raise ValueError("SqlPositions go with sql-position, and only with it")
        self.mode, self.table, self.counting = mode, table, counting
        self.dynamodb, self.connect, self.positions = dynamodb, connect, positions
        self.hold_s = hold_s
        self.observers = tuple(observers)
        self.shard_id = ""
        self.connection: Any = None
        columns = COUNT_COLUMNS if counting else ITEM_COLUMNS
        self.insert = insert_sql(table, columns)

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def initialize(self, input: InitializationInput) -> None:
        self.shard_id = input.shard_id
        if self.connect is not None:
            self.connection = self.connect()

    def process_records(self, input: ProcessRecordsInput) -> None:
        records = input.records
        if not records:
            return
        for observer in self.observers:
            observer.started(records)
        self._write(records, input.checkpointer)
        if self.hold_s:
            time.sleep(self.hold_s)  # the kill runs: a window between the effects and the checkpoint
        input.checkpointer.checkpoint()
        for observer in self.observers:
            observer.ended(records)

    def lease_lost(self, input: LeaseLostInput) -> None:
        self.close()

    def shard_ended(self, input: ShardEndedInput) -> None:
        input.checkpointer.checkpoint()
        self.close()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        input.checkpointer.checkpoint()
        self.close()

    # --- the effects ---------------------------------------------------------------------------------------------

    def _write(self, records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        shard = self.shard_id
        if self.mode == AT_LEAST_ONCE:
            delivery = uuid.uuid4().hex[:12]
            items = (
                [appended_item(shard, r, delivery) for r in records]
                if self.counting
                else [item_of(shard, r) for r in records]
            )
            batch_write(self.dynamodb, self.table, items)
        elif self.mode == DYNAMODB_TRANSACTION:
            staging = cast(ExactlyOnceCheckpointer, checkpointer)
            for r in records:
                write = (
                    counted_update(self.table, shard, r) if self.counting else put_item(self.table, item_of(shard, r))
                )
                staging.stage(r, write)
        else:
            self._sql(records, checkpointer)

    def _sql(self, records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        if self.connection is None:
            self.connection = cast(Connect, self.connect)()
        shard = self.shard_id
        if self.counting:
            rows: list[tuple[str, ...]] = [count_row(shard, r) for r in records]
        else:
            rows = [tuple(item_of(shard, r)[column] for column in ITEM_COLUMNS) for r in records]
        try:
            with self.connection.cursor() as cursor:
                cursor.executemany(self.insert, rows)
                if self.positions is not None:
                    self.positions.save(cursor, cast(ExactlyOnceCheckpointer, checkpointer), records[-1])
            self.connection.commit()
        except BaseException:
            self.connection.rollback()  # a fenced position (PositionFencedError): nothing of the batch lands
            raise

    def close(self) -> None:
        """Close the PostgreSQL connection, if any (idempotent)."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None


# --- in shardlease worker processes (the kill runs) ------------------------------------------------------------------


class Journal:
    """Every record delivered to this process, one id a line, appended at the start of each delivery."""

    _lock = threading.Lock()

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, f"{os.environ.get('BENCH_APP', 'app')}-{os.getpid()}.jnl")
        self._file: IO[str] | None = None

    def started(self, records: Sequence[KinesisRecord]) -> None:
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
            self._file.write("".join(f"{record_id(r)}\n" for r in records))
            self._file.flush()

    def ended(self, records: Sequence[KinesisRecord]) -> None:
        pass


@functools.cache
def _journal() -> Journal | None:
    directory = os.environ.get("BENCH_JOURNAL_DIR")
    return Journal(directory) if directory else None


@functools.cache
def _dynamodb() -> Any:
    from worker_lib.core import aws
    from worker_lib.core.config import AwsConfig

    return aws.client("dynamodb", AwsConfig.from_env())


def _connect() -> Any:
    import psycopg

    return psycopg.connect(os.environ["BENCH_DSN"])


def positions() -> SqlPositions:
    """``--position-sink``: the position rows of ``BENCH_APP`` in PostgreSQL at ``BENCH_DSN``."""
    return SqlPositions(_connect, application=os.environ["BENCH_APP"], dialect="postgresql")


def from_env() -> EffectsProcessor:
    """``--processor``: a counting :class:`EffectsProcessor` as the environment says (see the module's docstring)."""
    mode = os.environ["BENCH_MODE"]
    journal = _journal()
    return EffectsProcessor(
        mode,
        table=os.environ["BENCH_TABLE"],
        counting=True,
        dynamodb=_dynamodb() if mode == AT_LEAST_ONCE else None,
        connect=_connect if mode in SQL_MODES else None,
        positions=positions() if mode == SQL_POSITION else None,
        hold_s=int(os.environ.get("BENCH_HOLD_MS", "0")) / 1000,
        observers=[journal] if journal is not None else [],
    )
