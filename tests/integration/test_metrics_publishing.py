"""Worker metrics publishing: EMF documents, PutMetricData against a moto server through a real Worker, and the
lanes a worker reports in its worker-metrics item."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.recording import (
    Journal,
    RecordingProcessor,
    stream_with_leases,
)
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.cli.status import collect, render
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import KinesisRecord, LaneStats
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.processor import Checkpointer, FunctionProcessor
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.telemetry.publisher import EmfPublisher, MetricsConfig, make_publisher
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

READ_MS, DISCOVERY_MS, FLUSH_MS = 100, 200, 1_000  # the publishing worker's timings


def test_emf_document_aggregates_between_flushes() -> None:
    # GIVEN an EMF publisher writing to a buffer
    out = io.StringIO()
    publisher = EmfPublisher(namespace="NS", app="orders", worker_id="w1", stream=out, clock=ManualClock())
    # WHEN counts, a lag and a gauge are added several times and flushed once
    for n in (10, 20, 30):
        publisher.add("RecordsProcessed", n)
        publisher.add("MillisBehindLatest", n * 100, unit="Milliseconds", aggregation="max")
        publisher.add("LeasesHeld", n // 10, aggregation="last")
    publisher.flush()
    publisher.flush()  # nothing new: no second line
    # THEN one EMF line carries sum / max / last with the two dimensions
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["RecordsProcessed"] == 60 and doc["MillisBehindLatest"] == 3000 and doc["LeasesHeld"] == 3
    assert doc["Application"] == "orders" and doc["WorkerId"] == "w1"
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "NS" and directive["Dimensions"] == [["Application", "WorkerId"]]
    assert {m["Name"] for m in directive["Metrics"]} == {"RecordsProcessed", "MillisBehindLatest", "LeasesHeld"}


def test_metrics_are_off_by_default_and_bad_modes_are_one_line() -> None:
    assert MetricsConfig.from_env({}).mode == "off"
    assert type(make_publisher(MetricsConfig(), app="a", worker_id="w")).__name__ == "NullPublisher"
    with pytest.raises(ConfigError, match="SHARDLEASE_METRICS"):
        MetricsConfig.from_env({"SHARDLEASE_METRICS": "statsd"})


def test_a_worker_publishes_put_metric_data_to_cloudwatch(moto_aws: AwsConfig, app_name: str) -> None:
    # GIVEN a worker configured for PutMetricData with a 1 s flush, and records to process
    ddb: Any = aws.client("dynamodb", moto_aws)
    kinesis: Any = aws.client("kinesis", moto_aws)
    cloudwatch: Any = aws.client("cloudwatch", moto_aws)
    ensure_tables(app_name, ddb)
    stream, _, _ = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    kinesis.put_records(StreamName=stream, Records=[{"Data": b"x" * 100, "PartitionKey": str(n)} for n in range(25)])
    namespace = f"test-{app_name}"
    config = WorkerConfig(
        app=app_name,
        stream=stream,
        metrics=MetricsConfig(mode="cloudwatch", namespace=namespace, flush_interval_ms=FLUSH_MS),
        worker_id="w1",
        lease=LeaseConfig(failover_time_ms=3_000),
        retrieval=RetrievalConfig(idle_time_between_reads_ms=READ_MS),
        discovery_interval_ms=DISCOVERY_MS,
    )
    journal = Journal()
    worker = Worker(config, lambda: RecordingProcessor(journal), aws_config=moto_aws, dynamodb=ddb, kinesis=kinesis)
    worker.start()
    try:
        eventually(
            lambda: len(journal.datas()) >= 25,
            bound_s=hang_bound_s((DISCOVERY_MS + READ_MS) / 1000),
            what="25 records processed",
        )
    finally:
        worker.shutdown(timeout_s=hang_bound_s(FLUSH_MS / 1000))  # flushes what is left (liveness bound)
    # THEN CloudWatch holds the worker's metrics with Application / WorkerId dimensions
    metrics = cloudwatch.list_metrics(Namespace=namespace)["Metrics"]
    names = {m["MetricName"] for m in metrics}
    assert {"RecordsProcessed", "BytesProcessed", "LeasesHeld"} <= names
    dims = next(m["Dimensions"] for m in metrics if m["MetricName"] == "RecordsProcessed")
    assert {d["Name"]: d["Value"] for d in dims} == {"Application": app_name, "WorkerId": "w1"}


REPORT_MS = 200  # the lanes worker's metrics report interval


def test_a_worker_reports_the_records_in_flight_and_watermark_lag_of_its_shard_in_lanes_and_status_shows_them(
    moto_aws: AwsConfig, app_name: str
) -> None:
    # GIVEN one shard read in 4 lanes whose first record (key "held") is held by the processor, 10 others after it
    ddb: Any = aws.client("dynamodb", moto_aws)
    kinesis: Any = aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb)
    stream, _, (lease_key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    keys = ["held", *(f"k{n}" for n in range(10))]
    kinesis.put_records(StreamName=stream, Records=[{"Data": key.encode(), "PartitionKey": key} for key in keys])
    bound_s = hang_bound_s((DISCOVERY_MS + READ_MS + 2 * REPORT_MS) / 1000)
    release = threading.Event()

    def handle(records: Sequence[KinesisRecord], checkpointer: Checkpointer) -> None:
        if any(record.partition_key == "held" for record in records):
            release.wait(bound_s)  # a missed release ends in a failed assertion, never a hang

    config = WorkerConfig(
        app=app_name,
        stream=stream,
        worker_id="w1",
        parallelism=4,
        lease=LeaseConfig(failover_time_ms=3_000),
        retrieval=RetrievalConfig(idle_time_between_reads_ms=READ_MS),
        discovery_interval_ms=DISCOVERY_MS,
        worker_metrics=WorkerMetricsConfig(
            sample_interval_ms=REPORT_MS, report_interval_ms=REPORT_MS, first_report_delay_ms=REPORT_MS
        ),
    )
    worker = Worker(config, lambda: FunctionProcessor(handle), aws_config=moto_aws, dynamodb=ddb, kinesis=kinesis)
    store = WorkerMetricsStore(app_name, client=ddb)

    def reported() -> LaneStats | None:
        row = store.get("w1")
        return row.lanes.get(lease_key) if row is not None else None

    worker.start()
    try:
        # WHEN every record was read and the held one is not done
        eventually(
            lambda: (lane := reported()) is not None and lane.in_flight == len(keys) and lane.watermark_lag_ms > 0,
            bound_s=bound_s,
            what="the held shard's lanes reported",
        )
        # THEN status shows them beside the shard's lag (the lanes that finished reported it)
        (lag,) = collect(app_name, ddb).lags
        assert (lag.lease, lag.in_flight) == (lease_key, len(keys)) and (lag.watermark_lag_ms or 0) > 0
        assert f"in flight {len(keys)}, watermark lag" in render(collect(app_name, ddb))
        # WHEN the held record is let go
        release.set()
        # THEN nothing is in flight any more, and the watermark waits for nothing
        eventually(
            lambda: reported() == LaneStats(in_flight=0, watermark_lag_ms=0),
            bound_s=bound_s,
            what="the shard's lanes reported empty",
        )
    finally:
        release.set()
        worker.shutdown(timeout_s=hang_bound_s(FLUSH_MS / 1000))
