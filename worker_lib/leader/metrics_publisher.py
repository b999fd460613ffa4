"""The leader's metrics outside Lambda: the embedded leader thread and ``shardlease leader`` publish the same
values as the Lambda (:func:`~worker_lib.leader.cycle_metrics.cycle_metrics` and
:func:`~worker_lib.leader.cycle_metrics.worker_metrics`, dimensions ``{Application}`` and ``{Application,
WorkerId}``), chosen by ``SHARDLEASE_METRICS`` as the workers' are: ``cloudwatch`` (PutMetricData once per cycle),
``emf`` (one EMF line per cycle on stdout, for a CloudWatch agent or FireLens) or ``off``. In Lambda, Powertools does
this (:mod:`worker_lib.leader.observers`).

A failed publication is one warning line: metrics never stop the leader.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock, wall_millis
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import DependencyError
from worker_lib.leader.cycle_metrics import MetricValue, cycle_metrics, worker_metrics
from worker_lib.leader.leader import CycleReport
from worker_lib.telemetry.names import APPLICATION_DIMENSION, WORKER_DIMENSION
from worker_lib.telemetry.publisher import MetricsConfig

log = logging.getLogger(__name__)


def _dimensions(app: str, value: MetricValue) -> list[dict[str, str]]:
    dims = [{"Name": APPLICATION_DIMENSION, "Value": app}]
    if value.worker is not None:
        dims.append({"Name": WORKER_DIMENSION, "Value": value.worker})
    return dims


class LeaderMetricsPublisher:
    """``cycle(report)`` publishes one cycle's values (pass it as the leader loop's ``on_cycle``)."""

    def __init__(
        self,
        config: MetricsConfig,
        *,
        app: str,
        per_worker: bool = True,
        client: Any = None,
        aws_config: AwsConfig | None = None,
        stream: TextIO | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._config, self._app, self._per_worker = config, app, per_worker
        self._client = aws.client_or_new("cloudwatch", client, aws_config) if config.mode == "cloudwatch" else None
        self._stream = stream
        self._clock = clock

    def cycle(self, report: CycleReport) -> None:
        values = cycle_metrics(report) + (worker_metrics(report) if self._per_worker else [])
        if self._config.mode == "cloudwatch":
            self._put(values)
        elif self._config.mode == "emf":
            self._emf(values)

    def _put(self, values: Sequence[MetricValue]) -> None:
        data = [
            {"MetricName": v.name, "Value": v.value, "Unit": v.unit, "Dimensions": _dimensions(self._app, v)}
            for v in values
        ]
        for start in range(0, len(data), 20):
            try:
                with aws.translated("cloudwatch PutMetricData", self._config.namespace):
                    assert self._client is not None
                    self._client.put_metric_data(Namespace=self._config.namespace, MetricData=data[start : start + 20])
            except DependencyError as exc:
                log.warning("could not publish the leader's metrics: %s", exc)
                return

    def _emf(self, values: Sequence[MetricValue]) -> None:
        stream = self._stream or sys.stdout
        groups: dict[str | None, list[MetricValue]] = {}
        for value in values:
            groups.setdefault(value.worker, []).append(value)
        for worker, group in groups.items():
            dims = [APPLICATION_DIMENSION] + ([WORKER_DIMENSION] if worker is not None else [])
            doc: dict[str, Any] = {
                "_aws": {
                    "Timestamp": wall_millis(self._clock),
                    "CloudWatchMetrics": [
                        {
                            "Namespace": self._config.namespace,
                            "Dimensions": [dims],
                            "Metrics": [{"Name": v.name, "Unit": v.unit} for v in group],
                        }
                    ],
                },
                APPLICATION_DIMENSION: self._app,
                **({WORKER_DIMENSION: worker} if worker is not None else {}),
                **{v.name: v.value for v in group},
            }
            stream.write(json.dumps(doc, sort_keys=True) + "\n")
        stream.flush()
