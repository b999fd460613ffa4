"""Shared rig for the in-process chaos tests: two Workers with embedded leaders on moto, a 2-shard stream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.recording import Journal, RecordingProcessor
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.config import ConsumerConfig, RetrievalConfig
from worker_lib.processing.processor import RecordProcessor
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig

FAILOVER_MS = 6_000  # lease duration; every fault window in the chaos tests is shorter

LEADER_ENV = {
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
    "SHARDLEASE_FAILOVER_TIME_MS": str(FAILOVER_MS),
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
    "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
    "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "500",
    "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "1000",
    "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_S": "1",
}


def put(kinesis: Any, stream: str, start: int, count: int) -> list[bytes]:
    datas = [f"f{n:06d}".encode() for n in range(start, start + count)]
    kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": d.decode()} for d in datas])
    return datas


class Rig:
    """Two in-process workers (embedded leaders) sharing one DynamoDB and one Kinesis client, a 2-shard stream."""

    def __init__(self, ddb: Any, kinesis: Any, app: str) -> None:
        self.ddb, self.kinesis, self.app = ddb, kinesis, app
        self.consumer = ConsumerConfig()
        self.processor: Callable[[Journal], RecordProcessor] = RecordingProcessor
        self.stream = f"{app}-s"
        self.journal = Journal()
        self.workers: list[Worker] = []
        create_stream(kinesis, self.stream, 2)

    def start(self) -> None:
        for name in ("w1", "w2"):
            config = WorkerConfig(
                app=self.app,
                stream=self.stream,
                worker_id=name,
                lease=LeaseConfig(failover_time_ms=FAILOVER_MS),
                retrieval=RetrievalConfig(idle_time_between_reads_ms=100),
                discovery_interval_ms=200,
                shutdown_timeout_ms=10_000,
                leader_mode="embedded",
                consumer=self.consumer,
                worker_metrics=WorkerMetricsConfig(
                    sample_interval_ms=200, report_interval_ms=1_000, first_report_delay_ms=200
                ),
            )
            worker = Worker(config, lambda: self.processor(self.journal), dynamodb=self.ddb, kinesis=self.kinesis)
            self.workers.append(worker)
            worker.start()

    def processed(self) -> list[bytes]:
        return self.journal.datas()

    def lost(self) -> list[str]:
        with self.journal.lock:
            return [shard for kind, shard in self.journal.events if kind == "lease_lost"]


@pytest.fixture
def rig(moto_endpoint: str, app_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    for name, value in LEADER_ENV.items():
        monkeypatch.setenv(name, value)  # the embedded leader reads its timings from the environment
    cfg = AwsConfig(endpoint_url=moto_endpoint, max_attempts=3, connect_timeout_s=2, read_timeout_s=10)
    ddb = aws.client("dynamodb", cfg)
    ensure_tables(app_name, ddb)
    made = Rig(ddb, aws.client("kinesis", cfg), app_name)
    try:
        yield made
    finally:
        for worker in made.workers:
            worker.shutdown(timeout_s=5)
