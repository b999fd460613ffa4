"""The Spark application's load as a worker metric, and where it is written.

Metric ``C`` (the code KCL uses for CPU, so the leader balances a Spark application against ordinary workers on
the same 0–100 scale): the **duty cycle of micro-batches** — the share of wall time during which a micro-batch
was planned and its shard reads had not yet finished. CPU of the driver host says nothing about a Spark job
(the work runs on executors, often other hosts); executor CPU is not visible to a Python source. The duty cycle
is what Spark itself uses to judge a streaming query's health (processing time vs trigger interval): near 100 %
the application has no spare time and more shards would only add latency; near 0 % it idles. docs/spark.md
discusses the limits (work after a shuffle is not counted).

The sink is the WorkerMetricStats table in KCL's format (``wid``, ``lut``, ``sts``, ``opr``). When the project's
``worker_lib.workermetrics.stats_store.WorkerMetricsStore`` is available it is used; otherwise
:class:`RawWorkerMetricsSink` writes the same item with ``PutItem``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from decimal import Decimal
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.models import WorkerMetricStats
from worker_lib.tables.schema import WorkerMetricsAttr as W
from worker_lib.tables.schema import worker_metrics_table_name
from worker_lib.workermetrics.reporter import WorkerMetricsSink

log = logging.getLogger("shardlease.spark.load")


class BatchDutyCycle:
    """Metric ``C``: busy seconds reported by the driver ÷ wall seconds between samples, × 100.

    Busy time arrives when a batch is committed (it is only known then); :meth:`sample` spreads it over the time
    since the previous sample, so the reporter's 30 s window average is busy ÷ wall over that window.
    """

    name = "spark-batch-duty-cycle"
    code = "C"
    operating_range_max = 100.0

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = 0.0
        self._last: float | None = None

    def add_busy(self, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._busy += seconds

    def sample(self) -> float | None:
        with self._lock:
            now = self._clock.monotonic()
            last, self._last = self._last, now
            busy, self._busy = self._busy, 0.0
        if last is None or now <= last:
            return None if last is None else 0.0
        return min(100.0, 100.0 * busy / (now - last))


def _number(value: float) -> dict[str, str]:
    return {"N": str(Decimal(repr(float(value))).normalize())}


def stats_item(stats: WorkerMetricStats) -> dict[str, Any]:
    """The DynamoDB item of one worker's metrics in KCL 3.x's format."""
    return {
        W.WORKER_ID: {"S": stats.worker_id},
        W.LAST_UPDATE: {"N": str(int(stats.last_update_epoch_s))},
        W.STATS: {"M": {code: {"L": [_number(v) for v in values]} for code, values in stats.stats.items()}},
        W.OPERATING_RANGE: {
            "M": {code: {"L": [_number(v) for v in values]} for code, values in stats.operating_range.items()}
        },
    }


class RawWorkerMetricsSink:
    """Writes the item with an unconditional ``PutItem`` (KCL writes it the same way)."""

    def __init__(self, app: str, client: Any) -> None:
        self.table_name = worker_metrics_table_name(app)
        self._client = client

    def put(self, stats: WorkerMetricStats) -> None:
        with aws.translated("PutItem", self.table_name):
            self._client.put_item(TableName=self.table_name, Item=stats_item(stats))


def worker_metrics_sink(app: str, client: Any, clock: Clock = SYSTEM_CLOCK) -> WorkerMetricsSink:
    """The project's WorkerMetricStats store when present, else :class:`RawWorkerMetricsSink`."""
    try:
        module = importlib.import_module("worker_lib.workermetrics.stats_store")
        store: WorkerMetricsSink = module.WorkerMetricsStore(app, client=client, clock=clock)
    except (ImportError, AttributeError, TypeError) as exc:
        log.debug("WorkerMetricsStore unavailable (%s); writing worker metrics with PutItem", exc)
        return RawWorkerMetricsSink(app, client)
    return store
