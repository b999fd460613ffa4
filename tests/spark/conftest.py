"""One local[2] SparkSession for the whole test session (it takes seconds to start), and an emulated application
per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.support import SHARDS, Env
from tests.support.recording import create_leases_for_open_shards
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from worker_lib.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("shardlease-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "20s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def env(moto_endpoint: str, app_name: str) -> Env:
    """Tables, a stream of SHARDS shards and a TRIM_HORIZON lease per shard (no owner yet)."""
    config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=2)
    ddb = aws.client("dynamodb", config)
    kinesis = aws.client("kinesis", config)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-stream"
    create_stream(kinesis, stream, SHARDS)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    create_leases_for_open_shards(store, kinesis, stream)
    return Env(app=app_name, stream=stream, endpoint=moto_endpoint, ddb=ddb, kinesis=kinesis, store=store)
