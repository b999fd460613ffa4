"""The foreachBatch sink of docs/spark.md, "Exactly-once effects with foreachBatch" (its statements, split so that a
test sees each call): a micro-batch's rows and the query's progress row (query name, batch id) are written in one
sqlite3 transaction, and a batch id at or below the recorded one writes nothing.

``events`` has no unique key on purpose: a record written twice shows up as a duplicate instead of failing the
insert, so a test can count it.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

Row = tuple[str, str, int, bytes]
"""shard_id, sequence_number, sub_sequence_number, data."""
RecordKey = tuple[str, str, int]
"""What identifies a Kinesis user record: shard_id, sequence_number, sub_sequence_number."""

TABLES = (
    "CREATE TABLE IF NOT EXISTS events (shard_id TEXT, sequence_number TEXT, sub_sequence_number INTEGER, data BLOB)",
    "CREATE TABLE IF NOT EXISTS progress (query_name TEXT PRIMARY KEY, batch_id INTEGER NOT NULL)",
)

ADVANCE = (
    "INSERT INTO progress (query_name, batch_id) VALUES (?, ?) "
    "ON CONFLICT (query_name) DO UPDATE SET batch_id = excluded.batch_id WHERE excluded.batch_id > progress.batch_id "
    "RETURNING batch_id"
)
"""Moves the query's progress row forward and returns it; returns no row when ``batch_id`` is recorded already."""


def create_tables(db_path: Path) -> None:
    with closing(sqlite3.connect(db_path)) as db, db:
        for statement in TABLES:
            db.execute(statement)


def rows_of(df: Any) -> list[Row]:
    """A micro-batch's rows, read once (each action on ``df`` runs the batch's reads again)."""
    picked = df.select("shard_id", "sequence_number", "sub_sequence_number", "data").collect()
    return [(r.shard_id, r.sequence_number, r.sub_sequence_number, bytes(r.data)) for r in picked]


def write_batch(db_path: Path, query_name: str, rows: Sequence[Row], batch_id: int) -> bool:
    """Write ``rows`` and record ``batch_id`` as ``query_name``'s progress in one transaction. Returns False, having
    written nothing, when ``batch_id`` is at or below the recorded one (a batch Spark runs again)."""
    with closing(sqlite3.connect(db_path)) as db, db:  # `with db`: commit at the end, roll back on an exception
        if not db.execute(ADVANCE, (query_name, batch_id)).fetchall():
            return False
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", rows)
    return True


def recorded_batch(db_path: Path, query_name: str) -> int | None:
    with closing(sqlite3.connect(db_path)) as db:
        row = db.execute("SELECT batch_id FROM progress WHERE query_name = ?", (query_name,)).fetchone()
    return None if row is None else int(row[0])


def stored_records(db_path: Path) -> Counter[RecordKey]:
    """How many times each record is in ``events``."""
    with closing(sqlite3.connect(db_path)) as db:
        found = db.execute("SELECT shard_id, sequence_number, sub_sequence_number FROM events").fetchall()
    return Counter((str(shard), str(sequence), int(sub)) for shard, sequence, sub in found)
