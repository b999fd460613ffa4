"""The exactly-once chaos processor (tests/chaos/test_exactly_once_chaos.py; docs/exactly-once.md): every record's
effect committed with the shard's position, in DynamoDB or in a SQL database, so that the sink tells duplicates and
losses whatever the fleet went through.

    shardlease worker --processor tests.support.exactly_once_processor:ExactlyOnceProcessor
        [--position-sink tests.support.exactly_once_processor:positions]     # the SQL sinks

Environment (``SinkSpec.env()`` in tests/support/exactly_once_fleet.py writes it):

* ``SHARDLEASE_EO_SINK``: ``dynamodb`` — per record an ``Update`` of item ``pk = <lease>/<seq>/<sub>`` (``ADD n 1``)
  staged with ``checkpointer.stage``, committed with the batch's checkpoint in TransactWriteItems (a duplicate is
  an item with n > 1); ``sqlite3`` / ``postgresql`` — per batch one database transaction: a row per record in an
  outputs table without a unique constraint (a duplicate is two rows) and ``SqlPositions.save``, committed, then the
  lease's checkpoint;
* ``SHARDLEASE_EO_TABLE``: the outputs table (DynamoDB: the prefix of :data:`DYNAMODB_TABLES` tables, see
  :func:`dynamodb_table`); ``SHARDLEASE_EO_SQLITE``: the sqlite3 file; ``SHARDLEASE_EO_DSN``: the PostgreSQL
  connection string; ``SHARDLEASE_EO_APP``: the application the SQL positions are kept under;
* ``SHARDLEASE_EO_GATE_DIR``: the test's gates (:class:`Gate`: a deterministic zombie, a kill at the worst moment);
* ``SHARDLEASE_CHAOS_JOURNAL``: the chaos journal (INIT/REC/LOST/END/SHUTDOWN lines, tests/support/chaos.py), which
  the fleet's waits read (who processes what, failovers). REC lines are deliveries, not effects: the sink is the
  truth about effects.

Every sink transaction of a process (and every position claim) runs under one process lock, :data:`TRANSACTIONS`:
a worker frozen by SIGSTOP then holds no database lock another worker waits for (sqlite3 locks the whole file for
a write transaction; PostgreSQL locks the position row from ``save`` to the commit), except on purpose at a gate.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.chaos import ChaosProcessor
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.outputs import update_item
from worker_lib.processing.positions import SqlPositions
from worker_lib.processing.processor import (
    ExactlyOnceCheckpointer,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)

PROCESSOR = "tests.support.exactly_once_processor:ExactlyOnceProcessor"
POSITIONS = "tests.support.exactly_once_processor:positions"

SINK_ENV = "SHARDLEASE_EO_SINK"
TABLE_ENV = "SHARDLEASE_EO_TABLE"
SQLITE_ENV = "SHARDLEASE_EO_SQLITE"
DSN_ENV = "SHARDLEASE_EO_DSN"
APP_ENV = "SHARDLEASE_EO_APP"
GATE_ENV = "SHARDLEASE_EO_GATE_DIR"

SINKS = ("dynamodb", "sqlite3", "postgresql")
DYNAMODB_TABLES = 64
"""The DynamoDB sink spreads its items over this many tables. moto (5.x) deep-copies an action's whole table for
every action of a TransactWriteItems (its rollback copy): with one table of thousands of items each transaction
took seconds and stalled the one server every worker renews on; a few dozen items per table keep it milliseconds."""
SQLITE_BUSY_TIMEOUT_S = 60.0  # concurrent writers wait for each other's transaction (milliseconds each) this long
GATE_POLL_S = 0.05
GATE_MAX_S = 300.0  # a gate the test never opened (it failed): the worker goes on rather than hang for ever

log = logging.getLogger(__name__)

TRANSACTIONS = threading.Lock()
"""One sink transaction (or position claim) at a time in this process (the module docstring says why)."""


# --- the SQL sinks' schema and connections (both sides: the workers and the test) ----------------------------------


def sql_connect(sink: str, *, sqlite_path: str | None = None, dsn: str | None = None) -> Callable[[], Any]:
    """A DB-API connection factory for the ``sqlite3`` or ``postgresql`` sink."""
    if sink == "sqlite3":
        assert sqlite_path, "the sqlite3 sink needs its file"
        return lambda: sqlite3.connect(sqlite_path, timeout=SQLITE_BUSY_TIMEOUT_S)
    if sink == "postgresql":
        import psycopg

        assert dsn, "the postgresql sink needs its connection string"
        return lambda: psycopg.connect(dsn)
    raise ValueError(f"not a SQL sink: {sink!r}")


def outputs_schema(table: str) -> str:
    """The outputs table: one row per record's effect, no unique constraint (a duplicate is a second row)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (lease_key TEXT NOT NULL, seq TEXT NOT NULL, sub BIGINT NOT NULL, "
        "data TEXT NOT NULL, token BIGINT NOT NULL, pid BIGINT NOT NULL)"
    )


class SerialPositions(SqlPositions):
    """:class:`SqlPositions` whose claims run under :data:`TRANSACTIONS`: a frozen worker is never caught holding
    the position row (or, in sqlite3, the file) in the middle of a claim."""

    def claim(self, lease_key: str, fencing_token: int) -> Checkpoint | None:
        with TRANSACTIONS:
            return super().claim(lease_key, fencing_token)


def sql_positions(sink: str, *, app: str, sqlite_path: str | None = None, dsn: str | None = None) -> SqlPositions:
    return SerialPositions(
        sql_connect(sink, sqlite_path=sqlite_path, dsn=dsn), application=app, dialect=sink, table="eo_positions"
    )


@functools.cache
def positions() -> SqlPositions:
    """``--position-sink tests.support.exactly_once_processor:positions``: the process's one SqlPositions, from the
    environment; the processor saves through the same object."""
    sink = os.environ[SINK_ENV]
    return sql_positions(
        sink, app=os.environ[APP_ENV], sqlite_path=os.environ.get(SQLITE_ENV), dsn=os.environ.get(DSN_ENV)
    )


# --- the gates: a deterministic zombie, a kill at the worst moment ---------------------------------------------

BEFORE = "before"
"""The gate before a batch's commit: DynamoDB outputs staged, not committed; PostgreSQL rows written, neither the
position nor the commit yet; sqlite3 (which locks the whole file from the first write) before the transaction."""
AFTER = "after"
"""The SQL sinks' gate after the database's commit, before the lease's checkpoint: the sink is ahead of the lease."""


class Gate:
    """While the file ``<gate dir>/<pid>.<point>`` exists, a delivery of this process stops at ``point``, writes the
    marker ``<pid>.<point>.held.<lease>`` and waits until the file is gone. The test closes a gate, sees the marker,
    and freezes (SIGSTOP, then SIGCONT once the shards moved: its commit is a zombie's) or kills the process there."""

    def __init__(self, directory: str | None) -> None:
        self.directory = Path(directory) if directory else None

    def hold(self, point: str, lease_key: str, records: int) -> None:
        if self.directory is None:
            return
        pid = os.getpid()
        gate = self.directory / f"{pid}.{point}"
        if not gate.exists():
            return
        (self.directory / f"{pid}.{point}.held.{lease_key}").write_text(f"{records}\n", encoding="utf-8")
        log.warning("gate %s: %d records of %s wait", point, records, lease_key)
        deadline = time.monotonic() + GATE_MAX_S
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(GATE_POLL_S)
        log.warning("gate %s: %d records of %s go on", point, records, lease_key)


# --- the sinks (inside `shardlease worker`) -----------------------------------------------------------------------


def output_key(lease_key: str, record: KinesisRecord) -> str:
    """A record's effect's key: its shard and position (unique per Kinesis record)."""
    return f"{lease_key}/{record.sequence_number}/{record.sub_sequence_number}"


def dynamodb_table(prefix: str, key: str) -> str:
    """The DynamoDB sink's table for the effect ``key`` (:data:`DYNAMODB_TABLES`)."""
    return f"{prefix}-{zlib.crc32(key.encode()) % DYNAMODB_TABLES:02d}"


def dynamodb_tables(prefix: str) -> list[str]:
    return [f"{prefix}-{n:02d}" for n in range(DYNAMODB_TABLES)]


class DynamoDBSink:
    """Each record's effect staged (``ADD n 1`` on its item), committed with the checkpoint."""

    def __init__(self, table: str, gate: Gate) -> None:
        self.table, self.gate = table, gate

    def commit(self, records: Sequence[KinesisRecord], checkpointer: ExactlyOnceCheckpointer) -> None:
        for record in records:
            key = output_key(checkpointer.lease_key, record)
            checkpointer.stage(
                record,
                update_item(
                    dynamodb_table(self.table, key),
                    {"pk": key},
                    "SET #d = :d ADD #n :one",
                    names={"#d": "data", "#n": "n"},
                    values={":d": record.data.decode(), ":one": 1},
                ),
            )
        self.gate.hold(BEFORE, checkpointer.lease_key, len(records))  # staged, not committed
        checkpointer.checkpoint()

    def close(self) -> None:
        pass


class SqlSink:
    """Each batch in one transaction of the database: a row per record and the shard's position; then the lease's
    checkpoint. One connection per lease's processor."""

    def __init__(self, sink: str, table: str, gate: Gate) -> None:
        self.table, self.gate = table, gate
        self.positions = positions()
        self.sqlite = sink == "sqlite3"
        self._connect = sql_connect(sink, sqlite_path=os.environ.get(SQLITE_ENV), dsn=os.environ.get(DSN_ENV))
        self._connection: Any = None

    def commit(self, records: Sequence[KinesisRecord], checkpointer: ExactlyOnceCheckpointer) -> None:
        rows = [
            (
                checkpointer.lease_key,
                r.sequence_number,
                r.sub_sequence_number,
                r.data.decode(),
                checkpointer.fencing_token,
                os.getpid(),
            )
            for r in records
        ]
        insert = self.positions.dialect.sql(
            f"INSERT INTO {self.table} (lease_key, seq, sub, data, token, pid) VALUES (?, ?, ?, ?, ?, ?)"
        )
        with TRANSACTIONS:
            if self.sqlite:
                # (sqlite3 locks the whole file from the first INSERT: a zombie frozen after it would stop every
                # worker's writes and claims, so its gate is before the transaction)
                self.gate.hold(BEFORE, checkpointer.lease_key, len(records))
            if self._connection is None:
                self._connection = self._connect()
            connection = self._connection
            try:
                cursor = connection.cursor()
                cursor.executemany(insert, rows)
                if not self.sqlite:
                    self.gate.hold(BEFORE, checkpointer.lease_key, len(records))  # outputs written, not committed
                self.positions.save(cursor, checkpointer, records[-1])
                connection.commit()
            except BaseException:
                self._drop()
                raise
        self.gate.hold(AFTER, checkpointer.lease_key, len(records))  # committed in the sink, not in the lease
        checkpointer.checkpoint()  # the lease follows the sink (a crash before it: the sink's position wins)

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.rollback()
            finally:
                connection.close()

    def close(self) -> None:
        with TRANSACTIONS:
            self._drop()


def make_sink() -> DynamoDBSink | SqlSink:
    sink, table, gate = os.environ[SINK_ENV], os.environ[TABLE_ENV], Gate(os.environ.get(GATE_ENV))
    if sink == "dynamodb":
        return DynamoDBSink(table, gate)
    if sink in ("sqlite3", "postgresql"):
        return SqlSink(sink, table, gate)
    raise ValueError(f"{SINK_ENV}={sink!r}: expected one of {', '.join(SINKS)}")


class ExactlyOnceProcessor(ChaosProcessor):
    """Journals each delivery (REC lines, before its commit) and commits its records' effects in the sink of
    ``$SHARDLEASE_EO_SINK``; the lease's own lifecycle lines and checkpoints are the chaos processor's."""

    def __init__(self) -> None:
        super().__init__()
        self.sink = make_sink()

    def process_records(self, input: ProcessRecordsInput) -> None:
        if not input.records:
            return
        self._append(self._records(input))
        checkpointer = input.checkpointer
        assert isinstance(checkpointer, ExactlyOnceCheckpointer)
        self.sink.commit(input.records, checkpointer)

    def lease_lost(self, input: LeaseLostInput) -> None:
        self.sink.close()
        super().lease_lost(input)

    def shard_ended(self, input: ShardEndedInput) -> None:
        self.sink.close()
        super().shard_ended(input)

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self.sink.close()
        super().shutdown_requested(input)
