"""A picture of the dashboard without AWS: the graphs of :mod:`worker_lib.telemetry.dashboard` (the same ones the CDK
dashboard shows), drawn with matplotlib from the metrics a run put into a CloudWatch (moto's, in ``shardlease demo``).

Per-worker series are found as CloudWatch's SEARCH would find them (ListMetrics on ``{Application, WorkerId}``);
every series is read with GetMetricStatistics at ``period_s``. The graphs of AWS's namespaces (the stream, the
leader Lambda, the tables) need AWS and are left out, which the picture says.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from worker_lib.telemetry.dashboard import ROWS, Graph, Series
from worker_lib.telemetry.names import APPLICATION_DIMENSION, WORKER_DIMENSION
from worker_lib.tools.simulator.plot import check_png_path, require_matplotlib

Line = tuple[str, list[float], list[float]]  # label, seconds since start, values


def series_lines(
    cloudwatch: Any, series: Series, *, namespace: str, app: str, start: datetime, end: datetime, period_s: int
) -> list[Line]:
    application = {"Name": APPLICATION_DIMENSION, "Value": app}
    if series.per_worker:
        found = cloudwatch.list_metrics(Namespace=namespace, MetricName=series.metric, Dimensions=[application])
        per_worker = {  # one series per worker (a listing may name a series more than once)
            next(d["Value"] for d in m["Dimensions"] if d["Name"] == WORKER_DIMENSION): m["Dimensions"]
            for m in found["Metrics"]
            if any(d["Name"] == WORKER_DIMENSION for d in m["Dimensions"])
        }
        targets = list(per_worker.items())
    else:
        targets = [(f"{series.metric} ({series.statistic})", [application])]
    lines: list[Line] = []
    for label, dimensions in sorted(targets, key=lambda t: t[0]):
        points = cloudwatch.get_metric_statistics(
            Namespace=namespace,
            MetricName=series.metric,
            Dimensions=dimensions,
            StartTime=start,
            EndTime=end,
            Period=period_s,
            Statistics=[series.statistic],
        )["Datapoints"]
        points.sort(key=lambda p: p["Timestamp"])
        xs = [(p["Timestamp"] - start).total_seconds() for p in points]
        ys = [float(p[series.statistic]) for p in points]
        lines.append((label, xs, ys))
    return lines


def _draw(ax: Any, graph: Graph, lines: dict[str, list[Line]]) -> None:
    handles, labels = [], []
    twin = ax.twinx() if lines["right"] else None
    for side, target, style in (("left", ax, "-"), ("right", twin, "--")):
        for label, xs, ys in lines[side]:
            if target is None:
                continue
            (handle,) = target.plot(xs, ys, style, linewidth=1.2, marker="." if len(xs) < 3 else None)
            handles.append(handle)
            labels.append(label + (" (right)" if side == "right" else ""))
        if target is not None:
            target.tick_params(labelsize=7)
    ax.set_title(graph.title + ("  [+ the AWS series: not here]" if graph.aws_left else ""), fontsize=8)
    ax.set_xlabel("seconds into the run", fontsize=7)
    if handles:
        ax.legend(handles, labels, fontsize=6, loc="upper left", frameon=False)
    else:
        ax.text(0.5, 0.5, "no data in this run", transform=ax.transAxes, ha="center", fontsize=8, color="0.5")


def render_dashboard(
    cloudwatch: Any,
    path: str | Path,
    *,
    namespace: str,
    app: str,
    start: datetime,
    end: datetime,
    period_s: int = 10,
) -> Path:
    """Draw every graph of our metrics into one PNG at ``path``; returns it. MissingExtraError without matplotlib."""
    require_matplotlib(what="the dashboard picture")
    import matplotlib.pyplot as plt

    target = check_png_path(path)
    graphs = [graph for row in ROWS for graph in row if graph.left or graph.right]
    aws_only = [graph.title for row in ROWS for graph in row if not (graph.left or graph.right)]
    cols = 3
    rows = math.ceil(len(graphs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(16, 3.4 * rows + 0.6), squeeze=False, layout="constrained")
    for i, graph in enumerate(graphs):
        lines = {
            side: [
                line
                for series in getattr(graph, side)
                for line in series_lines(
                    cloudwatch, series, namespace=namespace, app=app, start=start, end=end, period_s=period_s
                )
            ]
            for side in ("left", "right")
        }
        _draw(axes[i // cols][i % cols], graph, lines)
    for j in range(len(graphs), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    stamp = f"{start.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}–{end.astimezone(timezone.utc):%H:%M:%S} UTC"
    fig.suptitle(
        f"dashboard shardlease-{app} (namespace {namespace}), drawn from the run's metrics, {stamp}\n"
        f"needing AWS, not drawn: {', '.join(aws_only)}",
        fontsize=9,
    )
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target
