"""Shared fixtures of the chaos suite.

* ``rig``: for the in-process chaos tests, two Workers with embedded leaders on moto, a 2-shard stream, in the
  liveness mode the test asks for (``@pytest.mark.parametrize("rig", LIVENESS_MODES, indirect=True)``; ``lease``
  when it does not ask).
* ``app``: for the process tests, an application's tables on moto, its clients and stores, a journal file and
  the arguments every ``shardlease`` process of it gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import ChaosProcessor, Timings
from tests.support.chaos_fleet import ChaosFleet
from tests.support.processes import liveness_env, shardlease_liveness
from tests.support.recording import Journal, RecordingProcessor
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.processing.config import ConsumerConfig, FailureConfig
from worker_lib.processing.processor import RecordProcessor
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

FAILOVER_MS = 6_000  # lease duration; every fault window in the chaos tests is shorter
RIG_SHUTDOWN_TIMEOUT_MS = 10_000  # the rig's workers' shutdown timeout: a graceful stop ends by then
RIG_IDLE_MS = 100  # the rig's workers' pause between reads

LEADER_ENV = {
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
    "SHARDLEASE_FAILOVER_TIME_MS": str(FAILOVER_MS),
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
    "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
    "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "500",
    "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "1000",
    "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "1000",
    # Two in-process workers share one process's CPU: balance by lease count, so that each surely holds a shard.
    "SHARDLEASE_ASSIGNMENT_STRATEGY": "count",
}


def put(kinesis: Any, stream: str, start: int, count: int) -> list[bytes]:
    datas = [f"f{n:06d}".encode() for n in range(start, start + count)]
    kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": d.decode()} for d in datas])
    return datas


class Rig:
    """Two in-process workers (embedded leaders) sharing one DynamoDB and one Kinesis client, a 2-shard stream.

    ``liveness``: the application's mode, recorded before the workers start (``shardlease liveness --set``), as
    every worker and embedded leader is configured. ``discovery_interval_ms``: the workers' index query (200 ms:
    new leases are found at once even without the leader's notice; ``None``: the production default)."""

    def __init__(self, ddb: Any, kinesis: Any, app: str, endpoint: str, *, liveness: str = "lease") -> None:
        self.ddb, self.kinesis, self.app, self.endpoint, self.liveness = ddb, kinesis, app, endpoint, liveness
        self.consumer = ConsumerConfig()
        self.failures = FailureConfig()
        self.processor: Callable[[Journal], RecordProcessor] = RecordingProcessor
        self.discovery_interval_ms: int | None = 200
        self.chaos_journal: Path | None = None  # set: every worker journals with the chaos processor, tagged 1, 2
        self.stream = f"{app}-s"
        self.journal = Journal()
        self.workers: list[Worker] = []
        create_stream(kinesis, self.stream, 2)

    def start(self) -> None:
        if self.liveness != "lease":  # lease is what the first leader records anyway
            shardlease_liveness(self.app, self.endpoint, target=self.liveness)
        for name in ("w1", "w2"):
            config = WorkerConfig(
                app=self.app,
                stream=self.stream,
                worker_id=name,
                lease=LeaseConfig(failover_time_ms=FAILOVER_MS, liveness_mode=self.liveness),
                retrieval=RetrievalConfig(idle_time_between_reads_ms=RIG_IDLE_MS),
                discovery_interval_ms=self.discovery_interval_ms,
                shutdown_timeout_ms=RIG_SHUTDOWN_TIMEOUT_MS,
                leader_mode="embedded",
                consumer=self.consumer,
                failures=self.failures,
                worker_metrics=WorkerMetricsConfig(
                    sample_interval_ms=200, report_interval_ms=1_000, first_report_delay_ms=200
                ),
            )
            worker = Worker(config, self._factory(len(self.workers) + 1), dynamodb=self.ddb, kinesis=self.kinesis)
            self.workers.append(worker)
            worker.start()

    @property
    def timings(self) -> Timings:
        """What the rig's workers and embedded leaders run with (the leader's from LEADER_ENV, the workers' from
        their configuration): the rig tests' liveness bounds are derived from it."""
        return Timings.of(
            {
                **LEADER_ENV,
                **liveness_env(self.liveness),
                "SHARDLEASE_DISCOVERY_INTERVAL_MS": str(self.discovery_interval_ms or 0),
                "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": str(RIG_IDLE_MS),
                "SHARDLEASE_SHUTDOWN_TIMEOUT_MS": str(RIG_SHUTDOWN_TIMEOUT_MS),
            }
        )

    def stop(self) -> bool:
        """Shut every worker down gracefully; whether each one's consumers all finished — waited for up to the
        liveness bound of the workers' shutdown timeout (by design a graceful stop ends by then)."""
        bound = hang_bound_s(self.timings.shutdown_s)
        return all([worker.shutdown(timeout_s=bound) for worker in self.workers])

    def _factory(self, tag: int) -> Callable[[], RecordProcessor]:
        journal = self.chaos_journal
        if journal is not None:
            return lambda: ChaosProcessor(str(journal), tag=tag)
        return lambda: self.processor(self.journal)

    def processed(self) -> list[bytes]:
        return self.journal.datas()

    def lost(self) -> list[str]:
        with self.journal.lock:
            return [shard for kind, shard in self.journal.events if kind == "lease_lost"]


@pytest.fixture
def rig(
    moto_endpoint: str, app_name: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Rig]:
    liveness = str(getattr(request, "param", "lease"))
    for name, value in {**LEADER_ENV, **liveness_env(liveness)}.items():
        monkeypatch.setenv(name, value)  # the embedded leader reads its timings and mode from the environment
    cfg = AwsConfig(endpoint_url=moto_endpoint, max_attempts=3, connect_timeout_s=2, read_timeout_s=10)
    ddb = aws.client("dynamodb", cfg)
    ensure_tables(app_name, ddb)
    made = Rig(ddb, aws.client("kinesis", cfg), app_name, moto_endpoint, liveness=liveness)
    try:
        yield made
    finally:
        for worker in made.workers:
            worker.shutdown(timeout_s=5)


@dataclass
class App:
    """One application on moto for the process tests: its tables (created), clients and stores, the journal file
    its workers write (``SHARDLEASE_CHAOS_JOURNAL``) and its stream's name (create it with :meth:`create_stream`)."""

    name: str
    endpoint: str
    ddb: Any
    kinesis: Any
    store: DynamoDBLeaseStore
    rows: WorkerMetricsStore
    journal: Path

    @property
    def stream(self) -> str:
        return f"{self.name}-s"

    @property
    def args(self) -> list[str]:
        """What every `shardlease` process of the application gets: app, stream, DynamoDB endpoint."""
        return ["--app", self.name, "--stream", self.stream, "--endpoint-url", self.endpoint]

    def create_stream(self, shards: int) -> None:
        create_stream(self.kinesis, self.stream, shards)

    def fleet(
        self,
        log_dir: Path,
        env: Mapping[str, str],
        *,
        worker_env: Mapping[str, str] | None = None,
        labels: Mapping[str, Any] | None = None,
    ) -> ChaosFleet:
        """A process fleet of this application (use it as a context manager: it kills what is left)."""
        return ChaosFleet(log_dir, args=self.args, env=env, journal=self.journal, worker_env=worker_env, labels=labels)


@pytest.fixture
def app(moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path) -> App:
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    journal = tmp_path / "journal.txt"
    journal.touch()
    return App(
        name=app_name,
        endpoint=moto_endpoint,
        ddb=ddb,
        kinesis=aws.client("kinesis", moto_aws),
        store=DynamoDBLeaseStore(app_name, client=ddb),
        rows=WorkerMetricsStore(app_name, client=ddb),
        journal=journal,
    )
