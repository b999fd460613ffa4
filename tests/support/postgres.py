"""PostgreSQL for tests (registered for every test by tests/conftest.py's ``pytest_plugins``).

* ``postgres_server``: a :class:`~worker_lib.testing.postgres.PostgresServer` on loopback for the whole session, one
  per test process (each xdist worker starts its own), stopped by PID at the end.
* ``postgres_dsn``: a database of the test's own on that server, as a connection string; dropped after the test.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from tests.support.stalls import hang_bound_s
from worker_lib.testing.postgres import PostgresServer

POSTGRES_START_S = 2.0
"""Not a setting: initdb and the server's start until it accepts connections (0.7 s measured on an idle 2-core
machine: 0.68 s median, 0.87 s at most over five starts)."""

_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with PostgresServer.start(timeout_s=hang_bound_s(POSTGRES_START_S)) as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new database for this test, named after it (for reading the server's log), e.g.
    ``postgresql://postgres@127.0.0.1:41234/t7_test_effects_commit``."""
    slug = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())
    name = f"t{next(_databases)}_{slug}"[:63]
    dsn = postgres_server.create_database(name)
    yield dsn
    postgres_server.drop_database(name)
