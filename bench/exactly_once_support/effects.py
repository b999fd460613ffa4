"""What bench/exactly_once.py's processors write: one effect per record, in DynamoDB or PostgreSQL.

Two shapes. **Items** (the throughput runs): one item per record, keyed by ``<shard>:<sequence number>``, with the
shard, the sequence number, the partition key and the data (100 bytes) — the same item in every mode, as a DynamoDB
item or a PostgreSQL row. **Counts** (the kill runs): effects that are not idempotent, so that a record applied twice
shows: an appended DynamoDB item per record and delivery (BatchWriteItem has no ``ADD``), an ``ADD n 1`` on the
record's item (in the transaction), an appended PostgreSQL row.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from worker_lib.core.models import KinesisRecord
from worker_lib.processing.outputs import Write, update_item

AT_LEAST_ONCE = "at-least-once"  # DynamoDB BatchWriteItem, then the checkpoint
DYNAMODB_TRANSACTION = "dynamodb-transaction"  # staged outputs, committed with the checkpoint
SQL_POSITION = "sql-position"  # PostgreSQL rows and the shard's position in one transaction, then the checkpoint
AT_LEAST_ONCE_SQL = "at-least-once-sql"  # PostgreSQL rows in one transaction, then the checkpoint
MODES = (AT_LEAST_ONCE, DYNAMODB_TRANSACTION, SQL_POSITION, AT_LEAST_ONCE_SQL)
SQL_MODES = frozenset({SQL_POSITION, AT_LEAST_ONCE_SQL})

BATCH_WRITE_LIMIT = 25  # items per BatchWriteItem (DynamoDB's limit)
_UNPROCESSED_BACKOFF_S = (0.05, 1.0)  # first wait and cap before sending UnprocessedItems again


def record_id(record: KinesisRecord) -> str:
    """The producer's id of a record of the kill runs: its data up to ``|``."""
    return record.data.split(b"|", 1)[0].decode()


# --- items (throughput) ------------------------------------------------------------------------------------------


def item_of(shard_id: str, record: KinesisRecord) -> dict[str, Any]:
    """The output item of ``record``: the same in every mode."""
    return {
        "pk": f"{shard_id}:{record.sequence_number}",
        "shard": shard_id,
        "seq": record.sequence_number,
        "partition_key": record.partition_key,
        "data": record.data.decode(),
    }


ITEM_COLUMNS = ("pk", "shard", "seq", "partition_key", "data")


def item_table_sql(table: str) -> str:
    return (
        f"CREATE TABLE {table} (pk TEXT PRIMARY KEY, shard TEXT NOT NULL, seq TEXT NOT NULL, "
        "partition_key TEXT NOT NULL, data TEXT NOT NULL)"
    )


# --- counts (kills) ----------------------------------------------------------------------------------------------


def appended_item(shard_id: str, record: KinesisRecord, delivery: str) -> dict[str, Any]:
    """At-least-once in DynamoDB: an item of its own per record and delivery (``<id>#<delivery>``)."""
    return {"pk": f"{record_id(record)}#{delivery}", "rid": record_id(record), "shard": shard_id}


def counted_update(table: str, shard_id: str, record: KinesisRecord) -> Write:
    """Exactly-once in DynamoDB: ``ADD n 1`` on the record's item, in the checkpoint's transaction."""
    return update_item(
        table,
        {"pk": record_id(record)},
        "ADD #n :one SET #shard = :shard",
        names={"#n": "n", "#shard": "shard"},
        values={":one": 1, ":shard": shard_id},
    )


COUNT_COLUMNS = ("rid", "shard", "seq")


def count_table_sql(table: str) -> str:
    """Append-only: a row per record and delivery applied."""
    return f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, rid TEXT NOT NULL, shard TEXT NOT NULL, seq TEXT NOT NULL)"


def count_row(shard_id: str, record: KinesisRecord) -> tuple[str, str, str]:
    return (record_id(record), shard_id, record.sequence_number)


# --- writing -----------------------------------------------------------------------------------------------------


def create_output_table(dynamodb: Any, table: str) -> None:
    """An on-demand table keyed by ``pk`` (a string)."""
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def batch_write(dynamodb: Any, table: str, items: Iterable[Mapping[str, Any]]) -> int:
    """Put ``items`` with BatchWriteItem, 25 a request, sending UnprocessedItems again (with a backoff) until none
    is left; the number of requests."""
    from boto3.dynamodb.types import TypeSerializer

    serializer = TypeSerializer()
    puts = [{"PutRequest": {"Item": {k: serializer.serialize(v) for k, v in item.items()}}} for item in items]
    requests = 0
    for start in range(0, len(puts), BATCH_WRITE_LIMIT):
        pending: Mapping[str, Any] = {table: puts[start : start + BATCH_WRITE_LIMIT]}
        wait_s = _UNPROCESSED_BACKOFF_S[0]
        while pending:
            requests += 1
            pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
            if pending:
                time.sleep(wait_s)  # throttled: DynamoDB asks for a backoff before the retry
                wait_s = min(wait_s * 2, _UNPROCESSED_BACKOFF_S[1])
    return requests


def insert_sql(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
