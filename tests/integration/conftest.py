"""Fixtures shared by the integration tests (the emulators and their clients are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kinesis_faults import new_stream
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.worker.worker import Worker

SHUTDOWN_BOUND_S = hang_bound_s(0.0)
"""A test's leftover workers stop at its end (a liveness bound with no timing to derive it from: the floor; a worker
that does not stop in time is left to its daemon threads, as before)."""


@pytest.fixture
def ddb(moto_aws: AwsConfig, app_name: str) -> Any:
    """A DynamoDB client on moto, with the application's three tables created."""
    client = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, client)
    return client


@pytest.fixture
def kinesis(moto_aws: AwsConfig) -> Any:
    """A Kinesis client on moto (a module that needs another one defines its own)."""
    return aws.client("kinesis", moto_aws)


@pytest.fixture
def stream(kinesis: Any) -> str:
    """A new one-shard stream, ACTIVE, on the module's ``kinesis`` client."""
    return new_stream(kinesis, "stream")


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """In-process workers a test started: each is shut down at the end."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.shutdown(timeout_s=SHUTDOWN_BOUND_S)
