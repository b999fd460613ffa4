"""Fixtures shared by the integration tests (the emulators and their clients are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.worker.worker import Worker


@pytest.fixture
def ddb(moto_aws: AwsConfig, app_name: str) -> Any:
    """A DynamoDB client on moto, with the application's three tables created."""
    client = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, client)
    return client


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """In-process workers a test started: each is shut down at the end."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.shutdown(timeout_s=5)
