"""Worker-side CloudWatch metrics: records and bytes processed, millis behind latest, leases held, renewal and
checkpoint failures, CPU (docs/deploy.md for the dashboard; names in :mod:`worker_lib.telemetry.names`).

Three publishers behind one protocol, chosen by ``SHARDLEASE_METRICS`` (``off`` by default, and in tests):

* ``emf`` — CloudWatch Embedded Metric Format lines on stdout: free to emit, collected by the Lambda runtime or the
  CloudWatch agent / Fluent Bit / FireLens in containers. One JSON line per flush.
* ``cloudwatch`` — ``PutMetricData`` (for hosts with no EMF collector), batched per flush.
* ``off`` — nothing.

Values are aggregated in memory between flushes (sums for counts, maximum for lags, last value for gauges), so
the cost is one line or one API call per flush interval (60 s by default), never one per record.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock, wall_millis
from worker_lib.core.config import AwsConfig
from worker_lib.core.env import EnvSettings, env_lower, setting
from worker_lib.core.errors import ConfigError, DependencyError
from worker_lib.telemetry.names import APPLICATION_DIMENSION, DEFAULT_NAMESPACE, NAMESPACE_ENV, WORKER_DIMENSION

log = logging.getLogger(__name__)

AGGREGATIONS = ("sum", "max", "last")


class MetricsPublisher(Protocol):
    def add(self, name: str, value: float, *, unit: str = "Count", aggregation: str = "sum") -> None: ...

    def flush(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class MetricsConfig(EnvSettings):
    """mode: off | emf | cloudwatch (``SHARDLEASE_METRICS``, default off); namespace
    (``SHARDLEASE_METRICS_NAMESPACE``, default ``Shardlease``); flush_interval_ms (60 000)."""

    mode: str = setting("off", "SHARDLEASE_METRICS", env_lower)
    namespace: str = setting(DEFAULT_NAMESPACE, NAMESPACE_ENV)
    flush_interval_ms: int = setting(60_000, "SHARDLEASE_METRICS_FLUSH_INTERVAL_MS")

    def __post_init__(self) -> None:
        if self.mode not in ("off", "emf", "cloudwatch"):
            raise ConfigError(f"invalid SHARDLEASE_METRICS {self.mode!r}: expected off, emf or cloudwatch")
        if not self.namespace:
            raise ConfigError("the metrics namespace must not be empty")
        if self.flush_interval_ms < 1_000:
            raise ConfigError("metrics flush_interval_ms must be at least 1000")


@dataclass
class _Aggregate:
    unit: str
    aggregation: str
    value: float = 0.0
    samples: int = 0

    def add(self, value: float) -> None:
        if self.aggregation == "sum":
            self.value += value
        elif self.aggregation == "max":
            self.value = value if self.samples == 0 else max(self.value, value)
        else:
            self.value = value
        self.samples += 1


@dataclass
class _Buffer:
    lock: threading.Lock = field(default_factory=threading.Lock)
    values: dict[str, _Aggregate] = field(default_factory=dict)

    def add(self, name: str, value: float, unit: str, aggregation: str) -> None:
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}")
        with self.lock:
            entry = self.values.get(name)
            if entry is None:
                entry = self.values[name] = _Aggregate(unit=unit, aggregation=aggregation)
            entry.add(value)

    def drain(self) -> dict[str, _Aggregate]:
        with self.lock:
            values, self.values = self.values, {}
        return values


class NullPublisher:
    def add(self, name: str, value: float, *, unit: str = "Count", aggregation: str = "sum") -> None:
        pass

    def flush(self) -> None:
        pass


class EmfPublisher:
    """One EMF document per flush, dimensions ``{Application, WorkerId}``."""

    def __init__(
        self, *, namespace: str, app: str, worker_id: str, stream: TextIO | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._namespace, self._app, self._worker = namespace, app, worker_id
        self._stream = stream
        self._clock = clock
        self._buffer = _Buffer()

    def add(self, name: str, value: float, *, unit: str = "Count", aggregation: str = "sum") -> None:
        self._buffer.add(name, value, unit, aggregation)

    def document(self, values: Mapping[str, _Aggregate]) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "_aws": {
                "Timestamp": wall_millis(self._clock),
                "CloudWatchMetrics": [
                    {
                        "Namespace": self._namespace,
                        "Dimensions": [[APPLICATION_DIMENSION, WORKER_DIMENSION]],
                        "Metrics": [{"Name": name, "Unit": agg.unit} for name, agg in sorted(values.items())],
                    }
                ],
            },
            APPLICATION_DIMENSION: self._app,
            WORKER_DIMENSION: self._worker,
        }
        for name, agg in values.items():
            doc[name] = agg.value
        return doc

    def flush(self) -> None:
        values = self._buffer.drain()
        if values:
            stream = self._stream or sys.stdout
            stream.write(json.dumps(self.document(values), sort_keys=True) + "\n")
            stream.flush()


class CloudWatchPublisher:
    """``PutMetricData`` once per flush (20 metrics per call at most, as the API allows 1000 but keeps it simple)."""

    def __init__(
        self,
        *,
        namespace: str,
        app: str,
        worker_id: str,
        client: Any = None,
        aws_config: AwsConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._namespace, self._app, self._worker = namespace, app, worker_id
        self._client = aws.client_or_new("cloudwatch", client, aws_config)
        self._clock = clock
        self._buffer = _Buffer()

    def add(self, name: str, value: float, *, unit: str = "Count", aggregation: str = "sum") -> None:
        self._buffer.add(name, value, unit, aggregation)

    def flush(self) -> None:
        values = self._buffer.drain()
        if not values:
            return
        dimensions = [
            {"Name": APPLICATION_DIMENSION, "Value": self._app},
            {"Name": WORKER_DIMENSION, "Value": self._worker},
        ]
        data = [
            {"MetricName": name, "Value": agg.value, "Unit": agg.unit, "Dimensions": dimensions}
            for name, agg in sorted(values.items())
        ]
        for start in range(0, len(data), 20):
            try:
                with aws.translated("cloudwatch PutMetricData", self._namespace):
                    self._client.put_metric_data(Namespace=self._namespace, MetricData=data[start : start + 20])
            except DependencyError as exc:  # metrics must never stop processing
                log.warning("could not publish metrics: %s", exc)
                return


def make_publisher(
    config: MetricsConfig, *, app: str, worker_id: str, aws_config: AwsConfig | None = None, clock: Clock = SYSTEM_CLOCK
) -> MetricsPublisher:
    if config.mode == "emf":
        return EmfPublisher(namespace=config.namespace, app=app, worker_id=worker_id, clock=clock)
    if config.mode == "cloudwatch":
        return CloudWatchPublisher(
            namespace=config.namespace, app=app, worker_id=worker_id, aws_config=aws_config, clock=clock
        )
    return NullPublisher()
