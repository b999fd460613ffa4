"""The tests' PostgreSQL (worker_lib/testing/postgres.py, tests/support/postgres.py): a real server on loopback that
psycopg connects to, a database of its own per test, and nothing left running once it is stopped."""

from __future__ import annotations

from pathlib import Path

import psutil
import psycopg
import pytest

from tests.support.postgres import POSTGRES_START_S
from tests.support.stalls import hang_bound_s
from worker_lib.testing.postgres import PostgresError, PostgresServer, find_binaries

CONNECT_TIMEOUT_S = 10  # a connection to a local server that hangs, not a slow one


def test_a_committed_transaction_is_seen_by_another_connection(postgres_dsn: str) -> None:
    # GIVEN a fresh database of this test's own
    # WHEN a table is created and a row inserted in one transaction that commits
    with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_TIMEOUT_S) as writer, writer.transaction():
        writer.execute("CREATE TABLE effects (id text PRIMARY KEY, amount int NOT NULL)")
        writer.execute("INSERT INTO effects VALUES (%s, %s)", ("order-1", 42))

    # THEN a new connection reads the row
    with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_TIMEOUT_S) as reader:
        assert reader.execute("SELECT id, amount FROM effects").fetchall() == [("order-1", 42)]


def test_two_databases_do_not_see_each_other(postgres_server: PostgresServer, postgres_dsn: str) -> None:
    # GIVEN the test's database and a second one on the same server
    other_dsn = postgres_server.create_database("isolation_other")
    try:
        # WHEN a table with a row is created in the first
        with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_TIMEOUT_S) as first:
            first.execute("CREATE TABLE effects (id text PRIMARY KEY)")
            first.execute("INSERT INTO effects VALUES ('order-1')")

        # THEN the second has no such table, and a table of that name there starts empty
        with psycopg.connect(other_dsn, connect_timeout=CONNECT_TIMEOUT_S) as second:
            assert second.execute("SELECT to_regclass('effects')").fetchone() == (None,)
            second.execute("CREATE TABLE effects (id text PRIMARY KEY)")
            assert second.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    finally:
        postgres_server.drop_database("isolation_other")


def test_stop_leaves_no_process_of_the_server() -> None:
    # GIVEN a server of this test's own, with a client connection still open (it must not hold up the stop)
    server = PostgresServer.start(timeout_s=hang_bound_s(POSTGRES_START_S))
    client = psycopg.connect(server.dsn, connect_timeout=CONNECT_TIMEOUT_S)
    pid, directory = server.pid, server.directory
    backends = psutil.Process(pid).children(recursive=True)
    assert backends  # the checkpointer, the WAL writer, the client's backend …
    try:
        # WHEN it is stopped
        server.stop()

        # THEN neither the postmaster's PID nor any of its backends' is a process any more, it shut down cleanly
        # (a fast shutdown, not the SIGKILL fallback), and its data directory is gone
        assert not psutil.pid_exists(pid)
        assert [b.pid for b in backends if b.is_running()] == []
        assert server.process.returncode == 0
        assert not directory.exists()
        # AND stopping again is no error
        server.stop()
    finally:
        client.close()
        server.stop()


def test_missing_binaries_say_how_to_install_them(tmp_path: Path) -> None:
    # GIVEN neither PATH nor the Debian directory holds PostgreSQL
    # WHEN the binaries are looked for
    # THEN the error says which command installs them
    with pytest.raises(PostgresError, match=r"run `bash \.ci/bootstrap`"):
        find_binaries(path=str(tmp_path), debian_root=tmp_path)
