"""The dashboard and alarms graph what actually runs (issue "Operate it", point 2).

A short fleet runs against moto with CloudWatch: two workers, each with an embedded leader (one leads, the other
finds the lock held), publishing with ``SHARDLEASE_METRICS=cloudwatch``. The metrics it really put (ListMetrics, and
GetMetricStatistics per unit) are compared both ways with what the synthesized CDK app's dashboard widgets and alarms
reference: every referenced metric of our namespace is emitted with the same name, dimensions and unit, and every
emitted metric is referenced or listed in docs/operations.md as deliberately off the dashboard.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_multi_stream import StreamRecorder
from tests.support.processes import (
    EMBEDDED_CYCLE_S,
    EMBEDDED_LEADER_ENV,
    REPORT_S,
    SHARD_SYNC_S,
    eventually_showing,
)
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.processing.processor import ProcessRecordsInput
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.telemetry.names import UNITS
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker, WorkerConfig
from worker_lib.workermetrics.config import WorkerMetricsConfig

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
Metric = tuple[str, frozenset[str]]  # (name, dimension names)

FLUSH_MS, READ_MS, DISCOVERY_MS = 1_000, 100, 200  # the fleet's timings (with EMBEDDED_LEADER_ENV's leader)


def off_dashboard() -> set[str]:
    """The metric names docs/operations.md lists as deliberately off the dashboard (its table of them)."""
    text = OPERATIONS.read_text()
    section = text.split("## Metrics off the dashboard", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z]+)` \|", section, flags=re.MULTILINE))


def synthesized(app: str, namespace: str) -> dict[str, Any]:
    import aws_cdk as cdk

    from worker_lib.cdk.coordination import ShardleaseCoordination

    stack = cdk.Stack(cdk.App(context={"aws:cdk:bundling-stacks": []}), "Contract")
    ShardleaseCoordination(
        stack,
        "Coordination",
        application_name=app,
        stream="arn:aws:kinesis:us-east-1:123456789012:stream/s",
        metrics_namespace=namespace,
    )
    from aws_cdk.assertions import Template

    return dict(Template.from_stack(stack).to_json())


def _flatten(value: Any) -> str:
    """A CloudFormation string (Fn::Join of strings and tokens) with every token as ``TOKEN``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_flatten(part) for part in parts)
    return "TOKEN"


def referenced(template: dict[str, Any], namespace: str) -> set[Metric]:
    """Every metric of ``namespace`` a dashboard widget or an alarm of the template references."""
    out: set[Metric] = set()
    search = re.compile(r"SEARCH\('\{([^}]*)\} MetricName=\"([^\"]+)\"")
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::CloudWatch::Dashboard":
            body = json.loads(_flatten(props["DashboardBody"]))
            for widget in body["widgets"]:
                for row in widget.get("properties", {}).get("metrics", []):
                    if isinstance(row[0], dict):  # an expression
                        for found in search.finditer(row[0].get("expression", "")):
                            ns, *dims = found.group(1).split(",")
                            if ns == namespace:
                                out.add((found.group(2), frozenset(dims)))
                    elif row[0] == namespace:
                        fields = [f for f in row[2:] if not isinstance(f, dict)]
                        out.add((row[1], frozenset(fields[0::2])))
        elif resource["Type"] == "AWS::CloudWatch::Alarm":
            stats = (
                [props]
                if "MetricName" in props
                else [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
            )
            for stat in stats:
                if stat.get("Namespace") == namespace:
                    out.add((stat["MetricName"], frozenset(d["Name"] for d in stat.get("Dimensions", []))))
    return out


class PoisonedRecorder(StreamRecorder):
    """Fails every batch that holds the record ``r7``."""

    def process_records(self, input: ProcessRecordsInput) -> None:
        if any(r.data == b"r7" for r in input.records):
            raise ValueError("r7 cannot be processed")
        super().process_records(input)


def emitted(cloudwatch: Any, namespace: str) -> dict[Metric, list[dict[str, str]]]:
    """Every metric put to ``namespace``, with the dimensions of one of its series."""
    out: dict[Metric, list[dict[str, str]]] = {}
    for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace=namespace):
        for metric in page["Metrics"]:
            key = (metric["MetricName"], frozenset(d["Name"] for d in metric["Dimensions"]))
            out.setdefault(key, metric["Dimensions"])
    return out


def test_every_graphed_metric_is_emitted_and_every_emitted_metric_is_graphed_or_listed(
    moto_aws: AwsConfig, app_name: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = f"Contract/{app_name}"
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    cloudwatch = aws.client("cloudwatch", moto_aws)
    queue = f"{app_name}-failed"
    aws.client("sqs", moto_aws).create_queue(QueueName=queue)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 2)
    kinesis.put_records(
        StreamName=stream, Records=[{"Data": f"r{n}".encode(), "PartitionKey": str(n)} for n in range(40)]
    )
    for name, value in {
        **EMBEDDED_LEADER_ENV,
        "SHARDLEASE_METRICS": "cloudwatch",
        "SHARDLEASE_METRICS_NAMESPACE": namespace,
        "SHARDLEASE_METRICS_FLUSH_INTERVAL_MS": str(FLUSH_MS),
        "SHARDLEASE_FAILURE_POLICY": "skip-and-record",
        "SHARDLEASE_FAILURE_DESTINATION": f"arn:aws:sqs:us-east-1:123456789012:{queue}",
        "SHARDLEASE_RETRY_BACKOFF_MS": "10",
    }.items():
        monkeypatch.setenv(name, value)
    # GIVEN a short fleet: two workers, both contending for leadership, publishing to CloudWatch
    seen: list[tuple[str, str | None, str, bytes]] = []
    for worker_id in ("w1", "w2"):
        config = WorkerConfig(
            app=app_name,
            stream=stream,
            worker_id=worker_id,
            lease=LeaseConfig(failover_time_ms=3_000),
            retrieval=RetrievalConfig(idle_time_between_reads_ms=READ_MS),
            discovery_interval_ms=DISCOVERY_MS,
            worker_metrics=WorkerMetricsConfig(
                sample_interval_ms=200, report_interval_ms=1_000, first_report_delay_ms=200
            ),
        )
        worker = Worker(
            config,
            lambda: PoisonedRecorder(seen, threading.Lock()),
            aws_config=moto_aws,  # CloudWatch too
            dynamodb=ddb,
            kinesis=kinesis,
        )
        workers.append(worker)
        worker.start()
    # (r7 is a poison record: the failure policy isolates it and sends it to the queue, so its metrics are put too)
    eventually_showing(
        lambda: len(seen) >= 39,
        bound_s=hang_bound_s(SHARD_SYNC_S + EMBEDDED_CYCLE_S + DISCOVERY_MS / 1000 + READ_MS / 1000),
        what="the fleet processed the 39 good records",
        detail=lambda: len(seen),
    )
    template = synthesized(app_name, namespace)
    wanted = referenced(template, namespace)
    # WHEN the metrics they put are listed (the leader's lag needs a report carrying lags, then a cycle)
    eventually_showing(
        lambda: wanted <= set(emitted(cloudwatch, namespace)),
        bound_s=hang_bound_s(REPORT_S + EMBEDDED_CYCLE_S + FLUSH_MS / 1000),
        what="every referenced metric emitted",
        detail=lambda: sorted(wanted - set(emitted(cloudwatch, namespace))),
    )
    put = emitted(cloudwatch, namespace)
    # THEN every metric the dashboard and the alarms reference is emitted with the same name and dimensions
    assert wanted <= set(put)
    # AND every emitted metric is on the dashboard or in an alarm, or listed as deliberately off it
    unexplained = {name for name, _ in set(put) - wanted} - off_dashboard()
    assert not unexplained, f"emitted but neither graphed nor listed in docs/operations.md: {sorted(unexplained)}"
    # AND each was put in the unit the names module gives it (what a unit-filtered graph or alarm would read)
    now = datetime.now(timezone.utc)
    for (name, _), dimensions in put.items():
        stats = cloudwatch.get_metric_statistics(
            Namespace=namespace,
            MetricName=name,
            Dimensions=dimensions,
            StartTime=now - timedelta(minutes=10),
            EndTime=now + timedelta(minutes=1),
            Period=60,
            Statistics=["SampleCount"],
            Unit=UNITS[name],
        )
        assert stats["Datapoints"], f"{name} was not put in {UNITS[name]}"
