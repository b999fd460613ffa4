"""Shard positions held by the sink (docs/exactly-once.md): the processor writes its output and the shard's position
in one transaction of its own database; a fencing token on the position row refuses an earlier owner's writes.

On taking a lease the consumer *claims* the shard's position row with its fencing token (the lease counter at the
take, which grows with every change of owner) and starts after the later of the lease's checkpoint and the row's
position; from then on a write conditioned on an older token changes nothing, so a zombie's transaction fails in
the sink as its checkpoint fails in the lease table. :class:`SqlPositions` does this for any DB-API database
(statements for sqlite3 and PostgreSQL); :class:`PositionSink` is the seam for anything else.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from worker_lib.core.errors import ConfigError
from worker_lib.core.imports import import_attr
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.processor import ShutdownError

__all__ = ["POSTGRESQL", "SQLITE", "PositionFencedError", "PositionSink", "SqlDialect", "SqlPositions"]

log = logging.getLogger(__name__)


class PositionFencedError(ShutdownError):
    """The sink holds a later owner's fencing token for this shard: the lease moved, and the write was refused.
    Roll the transaction back; the consumer then gives the lease up as lost."""


@runtime_checkable
class PositionSink(Protocol):
    """Where a sink keeps the shard positions it committed with its outputs."""

    def claim(self, lease_key: str, fencing_token: int) -> Checkpoint | None:
        """Make ``fencing_token`` the shard's token (writes with an earlier one must fail from now on) and return
        the position the sink holds (None: none yet). Raises :class:`PositionFencedError` if the sink already
        holds a later token."""
        ...


class _Positioned(Protocol):
    """What a position write needs from the checkpointer it was handed."""

    lease_key: str
    fencing_token: int


@dataclass(frozen=True, kw_only=True)
class SqlDialect:
    """How one database spells the position statements: its DB-API parameter style."""

    name: str
    paramstyle: str  # "qmark" (?) or "format" (%s)

    def sql(self, statement: str) -> str:
        """``statement`` written with ``?`` placeholders, in this dialect's style."""
        return statement if self.paramstyle == "qmark" else statement.replace("?", "%s")


SQLITE = SqlDialect(name="sqlite3", paramstyle="qmark")
POSTGRESQL = SqlDialect(name="postgresql", paramstyle="format")
_DIALECTS = {dialect.name: dialect for dialect in (SQLITE, POSTGRESQL)} | {"sqlite": SQLITE, "postgres": POSTGRESQL}
_WHERE = "WHERE application = ? AND lease_key = ?"  # a position row's key
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class SqlPositions:
    """:class:`PositionSink` over a DB-API database (sqlite3, PostgreSQL through psycopg, ...).

    ``connect`` opens a connection for :meth:`claim` (once per lease taken); :meth:`save` runs inside the caller's
    own transaction, beside its outputs. The table (:meth:`schema`) is keyed by application and lease key."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        application: str,
        dialect: SqlDialect | str = SQLITE,
        table: str = "shardlease_positions",
    ) -> None:
        if isinstance(dialect, str):
            if dialect not in _DIALECTS:
                raise ConfigError(f"unknown SQL dialect {dialect!r}: use sqlite3 or postgresql")
            dialect = _DIALECTS[dialect]
        if not _IDENTIFIER.fullmatch(table):
            raise ConfigError(f"position table name {table!r} is not a plain SQL identifier")
        if not application:
            raise ConfigError("SqlPositions needs the application name")
        self._connect = connect
        self.application = application
        self.dialect = dialect
        self.table = table
        self.refused = 0  # writes refused by the fence (a zombie's), since start

    def schema(self) -> str:
        """The position table's ``CREATE TABLE`` (the same for sqlite3 and PostgreSQL)."""
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            "application TEXT NOT NULL, lease_key TEXT NOT NULL, "
            "sequence_number TEXT, sub_sequence_number BIGINT NOT NULL DEFAULT 0, "
            "fencing_token BIGINT NOT NULL, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, "
            "PRIMARY KEY (application, lease_key))"
        )

    def create_table(self) -> None:
        """Create the position table if it does not exist."""
        with contextlib.closing(self._connect()) as connection:
            connection.cursor().execute(self.schema())
            connection.commit()

    def claim(self, lease_key: str, fencing_token: int) -> Checkpoint | None:
        key = (self.application, lease_key)
        with contextlib.closing(self._connect()) as connection:
            cursor = connection.cursor()
            # Raise the token in place; under PostgreSQL's row lock this waits for a zombie's open transaction, then
            # sees its commit, so the position read below includes whatever it wrote.
            cursor.execute(
                self.dialect.sql(f"UPDATE {self.table} SET fencing_token = ? {_WHERE} AND fencing_token <= ?"),
                (fencing_token, *key, fencing_token),
            )
            if cursor.rowcount != 1:
                held = self._held_token(cursor, lease_key)
                if held is not None:
                    connection.rollback()
                    raise PositionFencedError(
                        f"lease {lease_key}: the position sink holds token {held}, later than ours "
                        f"({fencing_token}): another owner has the shard"
                    )
                cursor.execute(
                    self.dialect.sql(
                        f"INSERT INTO {self.table} (application, lease_key, fencing_token) VALUES (?, ?, ?)"
                    ),
                    (*key, fencing_token),
                )
            cursor.execute(
                self.dialect.sql(f"SELECT sequence_number, sub_sequence_number FROM {self.table} {_WHERE}"), key
            )
            row = cursor.fetchone()
            connection.commit()
        if row is None or row[0] is None:
            return None
        return Checkpoint(sequence=str(row[0]), sub_sequence=int(row[1] or 0))

    def _held_token(self, cursor: Any, lease_key: str) -> int | None:
        """The fencing token the shard's row holds (None: no row)."""
        cursor.execute(
            self.dialect.sql(f"SELECT fencing_token FROM {self.table} {_WHERE}"), (self.application, lease_key)
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def save(self, transaction: Any, checkpointer: _Positioned, record: KinesisRecord) -> None:
        """Write the shard's position at ``record`` in ``transaction`` (a DB-API connection or cursor with the
        outputs' transaction open), conditioned on the checkpointer's fencing token. Raises
        :class:`PositionFencedError` when a later owner claimed the shard: roll the transaction back."""
        cursor = transaction.cursor() if hasattr(transaction, "cursor") else transaction
        cursor.execute(
            self.dialect.sql(
                f"UPDATE {self.table} SET sequence_number = ?, sub_sequence_number = ?, "
                f"updated_at = CURRENT_TIMESTAMP {_WHERE} AND fencing_token = ?"
            ),
            (
                record.sequence_number,
                record.sub_sequence_number,
                self.application,
                checkpointer.lease_key,
                checkpointer.fencing_token,
            ),
        )
        if cursor.rowcount != 1:
            if self._held_token(cursor, checkpointer.lease_key) is None:
                raise ConfigError(
                    f"no position row for {checkpointer.lease_key} in {self.table}: the worker claims it when it takes "
                    "the lease, so give it this sink (Worker(position_sink=...) or --position-sink)"
                )
            self.refused += 1
            log.warning(
                "transaction refused on %s: the position sink holds a later owner's token than ours (%d); "
                "roll it back, nothing of it may land (fenced)",
                checkpointer.lease_key,
                checkpointer.fencing_token,
            )
            raise PositionFencedError(
                f"lease {checkpointer.lease_key}: position not written, a later owner claimed the shard"
            )


def load_position_sink(spec: str) -> PositionSink:
    """``module:attr`` naming a :class:`PositionSink`, or a function that makes one (``shardlease worker
    --position-sink``, ``SHARDLEASE_POSITION_SINK``)."""
    found = import_attr(spec, what="position sink", example="mypkg.sinks:positions")
    sink = found() if callable(found) and not isinstance(found, PositionSink) else found
    if not isinstance(sink, PositionSink):
        raise ConfigError(f"position sink {spec!r} is a {type(sink).__name__}, not a PositionSink (it needs claim())")
    return sink


def later_start(lease_checkpoint: Checkpoint, held: Checkpoint | None) -> Checkpoint:
    """Where a consumer starts: after the later of the lease's checkpoint and the sink's position."""
    if held is None or lease_checkpoint.is_shard_end:
        return lease_checkpoint
    if lease_checkpoint.is_sentinel or held.is_after(lease_checkpoint):
        return held
    return lease_checkpoint
