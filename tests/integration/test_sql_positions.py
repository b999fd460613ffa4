"""Shard positions held in the sink's own database, fenced by the lease's token: sqlite3 and a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_worker import FAST_LEASES, READ_BOUND_S, put
from tests.support.recording import stream_with_leases
from tests.support.stalls import eventually
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Checkpoint, KinesisRecord
from worker_lib.processing.config import ConsumerConfig
from worker_lib.processing.positions import PositionFencedError, SqlPositions
from worker_lib.processing.processor import ExactlyOnceCheckpointer, FunctionProcessor
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.worker.worker import Worker, WorkerConfig

Connect = Callable[[], Any]


@pytest.fixture(params=["sqlite3", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Connect]:
    """A dialect and a connection factory for a fresh database of that kind."""
    if request.param == "sqlite3":
        import sqlite3

        path = tmp_path / "sink.db"
        return "sqlite3", lambda: sqlite3.connect(path, timeout=30)
    import psycopg

    dsn = request.getfixturevalue("postgres_dsn")
    return "postgresql", lambda: psycopg.connect(dsn)


def sink(database: tuple[str, Connect], app: str) -> SqlPositions:
    dialect, connect = database
    positions = SqlPositions(connect, application=app, dialect=dialect)
    positions.create_table()
    connection = connect()
    connection.cursor().execute("CREATE TABLE IF NOT EXISTS outputs (seq TEXT PRIMARY KEY, data TEXT NOT NULL)")
    connection.commit()
    connection.close()
    return positions


class Owner:
    """What SqlPositions.save reads from a checkpointer."""

    def __init__(self, lease_key: str, fencing_token: int) -> None:
        self.lease_key = lease_key
        self.fencing_token = fencing_token


def record(n: int) -> KinesisRecord:
    return KinesisRecord(data=f"d{n}".encode(), partition_key="k", sequence_number=str(500 + n))


def write(
    positions: SqlPositions, connect: Connect, owner: Owner | ExactlyOnceCheckpointer, records: Sequence[KinesisRecord]
) -> None:
    """One sink transaction: the records' outputs and the shard's position."""
    connection = connect()
    try:
        cursor = connection.cursor()
        for r in records:
            cursor.execute(
                positions.dialect.sql("INSERT INTO outputs (seq, data) VALUES (?, ?)"),
                (r.sequence_number, r.data.decode()),
            )
        positions.save(cursor, owner, records[-1])
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    finally:
        connection.close()


def outputs(connect: Connect) -> list[str]:
    connection = connect()
    try:
        cursor = connection.cursor()
        cursor.execute("SELECT seq FROM outputs ORDER BY seq")
        return [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()


def test_a_claim_returns_the_position_and_fences_every_earlier_owner(database: tuple[str, Connect]) -> None:
    # GIVEN a sink with no position yet for the shard
    positions = sink(database, "app")
    connect = database[1]
    # WHEN owner A (token 3) claims it and commits records 1..2 with their position
    assert positions.claim("shard-a", 3) is None
    write(positions, connect, Owner("shard-a", 3), [record(1), record(2)])
    # THEN owner B (token 7) claiming next starts after record 2
    assert positions.claim("shard-a", 7) == record(2).checkpoint
    # WHEN A, a zombie now, commits record 3
    with pytest.raises(PositionFencedError, match="a later owner claimed"):
        write(positions, connect, Owner("shard-a", 3), [record(3)])
    # THEN nothing of its transaction landed, and the refusal is counted
    assert outputs(connect) == [record(1).sequence_number, record(2).sequence_number]
    assert positions.refused == 1
    # AND B commits on
    write(positions, connect, Owner("shard-a", 7), [record(3)])
    assert positions.claim("shard-a", 8) == record(3).checkpoint
    # AND an owner with an older token than the sink holds cannot claim at all
    with pytest.raises(PositionFencedError, match="later than ours"):
        positions.claim("shard-a", 5)
    # AND another application's positions are its own
    assert SqlPositions(connect, application="other", dialect=database[0]).claim("shard-a", 1) is None


def test_bad_settings_are_one_clear_error() -> None:
    # GIVEN/WHEN/THEN: an unknown dialect, a table name that is not an identifier, no application
    with pytest.raises(ConfigError, match="unknown SQL dialect"):
        SqlPositions(lambda: None, application="a", dialect="oracle")
    with pytest.raises(ConfigError, match="not a plain SQL identifier"):
        SqlPositions(lambda: None, application="a", table="x; DROP TABLE y")
    with pytest.raises(ConfigError, match="application"):
        SqlPositions(lambda: None, application="")


def sql_worker(
    app: str, stream: str, positions: SqlPositions, connect: Connect, seen: list[bytes], *, ddb: Any, kinesis: Any
) -> Worker:
    """w1 whose processor writes each batch's outputs and the position in one sink transaction (the lease's
    checkpoint is left to the worker's shutdown)."""

    def handle(records: Sequence[KinesisRecord], checkpointer: ExactlyOnceCheckpointer) -> None:
        seen.extend(r.data for r in records)
        write(positions, connect, checkpointer, records)

    config = WorkerConfig(
        app=app,
        stream=stream,
        worker_id="w1",
        lease=FAST_LEASES,
        retrieval=RetrievalConfig(idle_time_between_reads_ms=100),
        discovery_interval_ms=200,
    )
    return Worker(config, lambda: FunctionProcessor(handle), dynamodb=ddb, kinesis=kinesis, position_sink=positions)


def test_a_worker_resumes_after_the_sinks_position_when_it_is_ahead_of_the_checkpoint(
    database: tuple[str, Connect], moto_aws: AwsConfig, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN one lease with 20 records and a processor that keeps its progress in the sink only
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb)
    stream, store, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    produced = put(kinesis, stream, 0, 20)
    positions = sink(database, app_name)
    connect = database[1]
    seen: list[bytes] = []
    first = sql_worker(app_name, stream, positions, connect, seen, ddb=ddb, kinesis=kinesis)
    workers.append(first)
    first.start()
    eventually(lambda: len(outputs(connect)) >= 20, bound_s=READ_BOUND_S, what="20 outputs")
    # WHEN it stops, its lease checkpoint is set back (as if it had crashed between the sink's commit and the lease
    # checkpoint), and a new worker takes the lease, with 10 more records
    assert first.shutdown(timeout_s=FAST_LEASES.failover_time_ms / 1000 * 3)
    ddb.update_item(
        TableName=store.table_name,
        Key={"leaseKey": {"S": key}},
        UpdateExpression="SET checkpoint = :th",
        ExpressionAttributeValues={":th": {"S": "TRIM_HORIZON"}},
    )
    lease = store.get_lease(key)
    assert lease is not None and not lease.checkpoint.is_real
    produced += put(kinesis, stream, 20, 10)
    assert store.assign_lease(lease, "w1") is not None
    seen.clear()
    second = sql_worker(app_name, stream, positions, connect, seen, ddb=ddb, kinesis=kinesis)
    workers.append(second)
    second.start()
    eventually(lambda: len(outputs(connect)) >= 30, bound_s=READ_BOUND_S, what="30 outputs")
    assert second.shutdown(timeout_s=FAST_LEASES.failover_time_ms / 1000 * 3)
    # THEN it read from after the sink's position: only the 10 new records, and every output is there once
    assert seen == produced[20:]
    assert len(outputs(connect)) == 30
    assert positions.claim(key, 10_000) == Checkpoint(sequence=max(outputs(connect), key=int))


def test_a_position_sink_with_lanes_is_refused(moto_aws: AwsConfig) -> None:
    # GIVEN parallelism 8 WHEN a worker is made with a position sink THEN one clear error says why
    config = WorkerConfig(app="orders", stream="orders-stream", consumer=ConsumerConfig(parallelism=8))
    with pytest.raises(ConfigError, match="parallelism 1"):
        Worker(
            config,
            lambda: FunctionProcessor(lambda r, c: None),
            position_sink=SqlPositions(lambda: None, application="a"),
        )


class BrokenSink:
    """A PositionSink whose database cannot be reached, or that a later owner claimed."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.claims = 0

    def claim(self, lease_key: str, fencing_token: int) -> Checkpoint | None:
        self.claims += 1
        raise self.error


@pytest.mark.parametrize(
    ("error", "outcome", "line"),
    [
        (ConnectionRefusedError("connection refused"), "gave_up", "position sink: ConnectionRefusedError"),
        (PositionFencedError("lease x: the position sink holds token 9, later than ours"), "lost", "later than ours"),
    ],
    ids=["unreachable", "claimed-by-a-later-owner"],
)
def test_a_sink_that_cannot_be_claimed_gives_the_lease_up_with_one_line(  # noqa: PLR0917 - fixtures and parameters
    moto_aws: AwsConfig,
    app_name: str,
    workers: list[Worker],
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    outcome: str,
    line: str,
) -> None:
    # GIVEN one lease with records, and a position sink whose claim fails
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb)
    stream, _, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    put(kinesis, stream, 0, 5)
    seen: list[KinesisRecord] = []
    sink = BrokenSink(error)
    config = WorkerConfig(app=app_name, stream=stream, worker_id="w1", lease=FAST_LEASES, discovery_interval_ms=200)
    worker = Worker(
        config,
        lambda: FunctionProcessor(lambda records, checkpointer: seen.extend(records)),
        dynamodb=ddb,
        kinesis=kinesis,
        position_sink=sink,
    )
    workers.append(worker)
    # WHEN the worker takes the lease
    worker.start()
    # THEN it processes nothing: the consumer ends (given up, or lost to the later owner) with one log line
    eventually(lambda: key in worker.outcomes, bound_s=READ_BOUND_S, what="the consumer's outcome")
    assert worker.outcomes[key].value == outcome
    assert seen == [] and sink.claims >= 1
    assert line in caplog.text
    assert "Traceback" not in caplog.text


def test_a_save_without_a_claimed_row_says_the_worker_was_not_given_the_sink(database: tuple[str, Connect]) -> None:
    # GIVEN a sink whose shard was never claimed (the worker was not given the sink)
    positions = sink(database, "app")
    # WHEN a processor saves a position THEN one clear error says what is missing, and nothing lands
    with pytest.raises(ConfigError, match="position_sink"):
        write(positions, database[1], Owner("shard-a", 3), [record(1)])
    assert outputs(database[1]) == []
    assert positions.refused == 0
