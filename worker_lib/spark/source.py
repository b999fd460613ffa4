"""The ``shardlease`` Structured Streaming source (PySpark Python Data Source API, Spark ≥ 4.2).

Spark constructs the stream reader in more than one process: in the long-lived "streaming source runner" that
calls ``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit`` (the driver side), and once more at
planning time only to ship the ``read`` function to executors. Constructing a reader therefore only parses its
options; the lease coordinator (heartbeat, renewal thread, metrics) starts with the first driver-side call, which
Spark makes as soon as the query starts. ``read`` uses nothing but its partition.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from worker_lib.core.env import env_str, environ
from worker_lib.core.streams import stream_name_of
from worker_lib.spark import trace
from worker_lib.spark.driver import SparkLeaseCoordinator
from worker_lib.spark.options import SourceOptions
from worker_lib.spark.planning import ShardReadTask, SourceOffset, plan_partitions
from worker_lib.spark.reading import read_task, to_arrow

SCHEMA = (
    "data binary, partition_key string, sequence_number string, sub_sequence_number long, shard_id string, "
    "approximate_arrival_timestamp timestamp, stream string"
)


DEPARTURE_TIMEOUT_S = 10.0


def depart_on_termination(coordinator: SparkLeaseCoordinator) -> None:
    """When the query stops, Spark ends the source runner process with SIGTERM and does not call the reader's
    ``stop()``: leave the way a worker's SIGTERM does (DEPARTING, leases given up, STOPPED), then exit quietly.

    The signal arrives in the main thread, which may be inside a call holding the coordinator's locks (Spark may stop
    a query while it asks for the next offset). So the handler only starts the departure, on a thread of its own,
    and returns: the main thread finishes its call (or finds Spark's socket closed and unwinds; interpreter shutdown
    waits for the departure, which is not a daemon), and the departure ends the process with ``os._exit(0)`` once it
    is done — or after ``DEPARTURE_TIMEOUT_S`` whatever happens — so Spark sees nothing but the end it asked for."""
    if threading.current_thread() is not threading.main_thread():
        return

    def depart() -> None:
        try:
            coordinator.stop()
        finally:
            logging.shutdown()
            os._exit(0)

    def on_terminate(signum: int, frame: Any) -> None:
        deadline = threading.Timer(DEPARTURE_TIMEOUT_S, os._exit, args=(0,))
        deadline.daemon = True
        deadline.start()
        threading.Thread(target=depart, name="shardlease-departure", daemon=False).start()

    signal.signal(signal.SIGTERM, on_terminate)


class ShardPartition(InputPartition):
    """One shard of one micro-batch (``value`` is a :class:`ShardReadTask`)."""

    def __init__(self, task: ShardReadTask) -> None:
        super().__init__(task)
        self.task = task


class ShardleaseStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = SourceOptions.parse(options)
        self._coordinator: SparkLeaseCoordinator | None = None
        trace.event("reader_made")

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_coordinator": None}

    def _driver(self) -> SparkLeaseCoordinator:
        if self._coordinator is None:
            level = env_str(environ(), "SHARDLEASE_SPARK_LOG_LEVEL")
            if level:  # the source runner is a Python process of its own: nobody configured its logging
                logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
            with trace.step("coordinator_start"):
                self._coordinator = SparkLeaseCoordinator(self.options)
                depart_on_termination(self._coordinator)
                self._coordinator.start()
        else:
            self._coordinator.start()  # at once when started; again after a start that raised
        return self._coordinator

    def initialOffset(self) -> dict[str, Any]:
        return self._driver().initial_offset().to_json()

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        offset = SourceOffset.from_json(start)
        with trace.step("latest_offset", batch=offset.batch) as noted:
            latest = self._driver().latest_offset(offset)
            noted.update(next_batch=latest.batch, shards=len(latest.shards))
        return latest.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ShardPartition]:
        offset = SourceOffset.from_json(end)
        with trace.step("partitions", batch=offset.batch):
            driver = self._driver()
            driver.planned(offset)
            return [ShardPartition(task) for task in plan_partitions(offset, driver.read_settings())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        task: ShardReadTask = partition.value
        with trace.step("task", batch=task.batch, lease=task.lease_key) as noted:
            result = read_task(task)
            converting = time.perf_counter()
            batches = to_arrow(
                task.lease_key, result.records, stream=stream_name_of(task.lease_key, task.settings.stream)
            )
            noted.update(
                records=len(result.records),
                caught_up=result.end.caught_up,
                convert_s=time.perf_counter() - converting,
            )
        return iter(batches)

    def commit(self, end: dict[str, Any]) -> None:
        self._driver().commit(SourceOffset.from_json(end))

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_available_now()

    def stop(self) -> None:
        if self._coordinator is not None:
            self._coordinator.stop()


class ShardleaseDataSource(DataSource):
    """``spark.readStream.format("shardlease").option("app", ...).option("stream", ...).load()``."""

    @classmethod
    def name(cls) -> str:
        return "shardlease"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> ShardleaseStreamReader:
        return ShardleaseStreamReader(dict(self.options))
