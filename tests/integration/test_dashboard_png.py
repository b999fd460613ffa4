"""The demo's picture of the dashboard: the dashboard's graphs drawn from metrics put into moto's CloudWatch."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.telemetry.dashboard import Series
from worker_lib.telemetry.names import LeaderMetric, WorkerMetric
from worker_lib.telemetry.publisher import CloudWatchPublisher
from worker_lib.tools.dashboard_png import render_dashboard, series_lines


def test_the_dashboard_is_drawn_from_what_was_put_one_line_per_worker(
    moto_aws: AwsConfig, app_name: str, tmp_path: Path
) -> None:
    namespace = f"Picture/{app_name}"
    cloudwatch = aws.client("cloudwatch", moto_aws)
    start = datetime.now(timezone.utc) - timedelta(minutes=1)
    # GIVEN two workers' CPU and one leader metric in CloudWatch
    for worker, cpu in (("w1", 30.0), ("w2", 60.0)):
        publisher = CloudWatchPublisher(namespace=namespace, app=app_name, worker_id=worker, client=cloudwatch)
        publisher.add(WorkerMetric.CPU_UTILIZATION, cpu, unit="Percent", aggregation="last")
        publisher.flush()
    cloudwatch.put_metric_data(
        Namespace=namespace,
        MetricData=[
            {
                "MetricName": LeaderMetric.CYCLES,
                "Value": 1.0,
                "Unit": "Count",
                "Dimensions": [{"Name": "Application", "Value": app_name}],
            }
        ],
    )
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    # WHEN the series of the CPU graph are read THEN there is one line per worker, labelled by its id
    lines = series_lines(
        cloudwatch,
        Series(WorkerMetric.CPU_UTILIZATION, "Average", per_worker=True),
        namespace=namespace,
        app=app_name,
        start=start,
        end=end,
        period_s=60,
    )
    assert [(label, ys) for label, _, ys in lines] == [("w1", [30.0]), ("w2", [60.0])]
    # AND the whole picture is drawn
    path = render_dashboard(cloudwatch, tmp_path / "dash.png", namespace=namespace, app=app_name, start=start, end=end)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
