"""One local[2] SparkSession for the whole test session (it takes seconds to start, warmed up before the first test),
and an emulated application per test."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import SHARDS, Env, Sink, run_to_end, start_query
from tests.support.recording import assign_unowned, create_leases_for_open_shards
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream

pyspark = pytest.importorskip("pyspark")

WARM_UP_S = 15.0
"""Not a setting: the session's first query of a Python data source. PySpark starts a Python daemon per kind of work
(looking the source up, creating it, planning the reads, the tasks), each importing PySpark, and the source runner —
costs every later query finds paid. Without this warm-up the first test's query paid them inside its wait: 22 s to
its first 300 records at a load average of 17, against 4–6 s after it (2026-11-27)."""


@pytest.fixture(scope="session")
def spark(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
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
    warm_up(session, moto_endpoint, tmp_path_factory.mktemp("warm-up"))
    yield session
    session.stop()


def warm_up(spark: Any, endpoint: str, work: Path) -> None:
    """One availableNow query of the source to its end, so that no test's liveness bound pays the session's one-time
    costs (WARM_UP_S): each test's query then starts as bench/spark.py measures a query's start (QUERY_START_S)."""
    env = make_env(endpoint, f"warm-up-{uuid.uuid4().hex[:8]}")
    assign_unowned(env.store, lambda lease: "warm-up")
    env.produce(SHARDS)
    sink = Sink()
    query = start_query(spark, env, sink, work / "ckpt", "warm-up", available_now=True, metrics="false")
    run_to_end(query, WARM_UP_S, "the session's warm-up query")
    assert sorted(sink.datas()) == sorted(env.produced), "the session's warm-up query read what it was given"


@pytest.fixture
def env(moto_endpoint: str, app_name: str) -> Env:
    """Tables, a stream of SHARDS shards and a TRIM_HORIZON lease per shard (no owner yet)."""
    return make_env(moto_endpoint, app_name)


def make_env(moto_endpoint: str, app_name: str) -> Env:
    config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=2)
    ddb = aws.client("dynamodb", config)
    kinesis = aws.client("kinesis", config)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-stream"
    create_stream(kinesis, stream, SHARDS)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    create_leases_for_open_shards(store, kinesis, stream)
    return Env(app=app_name, stream=stream, endpoint=moto_endpoint, ddb=ddb, kinesis=kinesis, store=store)
