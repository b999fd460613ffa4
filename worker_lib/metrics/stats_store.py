"""``<app>-WorkerMetricStats`` in KCL 3.x's format (reference §2): ``wid`` (S), ``lut`` (N, epoch seconds),
``sts`` (M: metric → list of N, newest last), ``opr`` (M: metric → list of N, first = max utilisation).

Workers write their item unconditionally (as KCL does); the leader scans all items and deletes stale ones
conditionally on the ``lut`` it saw. Items of another ``entityType`` and corrupt items are skipped with one log
line naming only their key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import boto3

from .. import aws
from ..clock import SYSTEM_CLOCK, Clock
from ..config import AwsConfig
from ..errors import CorruptItemError
from ..models import WorkerMetricStats
from ..tables.schema import WORKER_METRICS_ENTITY_TYPE, WorkerMetricsAttr, worker_metrics_table_name

log = logging.getLogger("shardlease.metrics.store")
A = WorkerMetricsAttr


def _number(value: float) -> dict[str, str]:
    text = repr(float(value))
    return {"N": text[:-2] if text.endswith(".0") else text}


def _metric_map(values: Mapping[str, tuple[float, ...]]) -> dict[str, Any]:
    return {"M": {name: {"L": [_number(v) for v in series]} for name, series in values.items()}}


def to_item(stats: WorkerMetricStats) -> dict[str, Any]:
    item: dict[str, Any] = {
        A.WORKER_ID: {"S": stats.worker_id},
        A.LAST_UPDATE: {"N": str(int(stats.last_update_epoch_s))},
        A.STATS: _metric_map(stats.stats),
        A.OPERATING_RANGE: _metric_map(stats.operating_range),
    }
    if stats.entity_type is not None:
        item[A.ENTITY_TYPE] = {"S": stats.entity_type}
    return item


def is_foreign(item: Mapping[str, Any]) -> bool:
    entity = item.get(A.ENTITY_TYPE, {}).get("S")
    return entity is not None and entity != WORKER_METRICS_ENTITY_TYPE


def _read_map(item: Mapping[str, Any], attr: str, key: str) -> dict[str, tuple[float, ...]]:
    raw = item.get(attr)
    if raw is None:
        return {}
    if "M" not in raw:
        raise CorruptItemError(key, f"{attr} is not a map")
    out: dict[str, tuple[float, ...]] = {}
    for name, series in raw["M"].items():
        if "L" not in series:
            raise CorruptItemError(key, f"{attr}.{name} is not a list")
        try:
            out[name] = tuple(float(v["N"]) for v in series["L"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptItemError(key, f"{attr}.{name} holds a non-number") from exc
    return out


def from_item(item: Mapping[str, Any]) -> WorkerMetricStats:
    key = str(item.get(A.WORKER_ID, {}).get("S", "?"))
    if A.WORKER_ID not in item or "S" not in item[A.WORKER_ID]:
        raise CorruptItemError(key, "no wid")
    try:
        lut = int(float(item[A.LAST_UPDATE]["N"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptItemError(key, "lut missing or not a number") from exc
    return WorkerMetricStats(
        worker_id=key,
        last_update_epoch_s=lut,
        stats=_read_map(item, A.STATS, key),
        operating_range=_read_map(item, A.OPERATING_RANGE, key),
        entity_type=item.get(A.ENTITY_TYPE, {}).get("S"),
    )


class WorkerMetricsStore:
    """The worker-metrics table. Satisfies the reporter's ``WorkerMetricsSink`` and the leader's source."""

    def __init__(
        self,
        app: str,
        *,
        aws_config: AwsConfig | None = None,
        boto3_session: boto3.Session | None = None,
        client: Any = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.table_name = worker_metrics_table_name(app)
        self._client = client or aws.client("dynamodb", aws_config or AwsConfig(), boto3_session)
        self._clock = clock

    def put(self, stats: WorkerMetricStats) -> None:
        with aws.translated("dynamodb PutItem", self.table_name):
            self._client.put_item(TableName=self.table_name, Item=to_item(stats))

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        with aws.translated("dynamodb GetItem", self.table_name):
            response = self._client.get_item(
                TableName=self.table_name, Key={A.WORKER_ID: {"S": worker_id}}, ConsistentRead=True
            )
        item = response.get("Item")
        if not item or is_foreign(item):
            return None
        try:
            return from_item(item)
        except CorruptItemError as exc:
            log.warning("skipping corrupt worker-metrics item wid=%s: %s", worker_id, exc)
            return None

    def list_all(self) -> list[WorkerMetricStats]:
        out: list[WorkerMetricStats] = []
        kwargs: dict[str, Any] = {"TableName": self.table_name}
        while True:
            with aws.translated("dynamodb Scan", self.table_name):
                response = self._client.scan(**kwargs)
            for item in response.get("Items", []):
                if is_foreign(item):
                    continue
                try:
                    out.append(from_item(item))
                except CorruptItemError as exc:
                    log.warning("skipping corrupt worker-metrics item: %s", exc)
            last = response.get("LastEvaluatedKey")
            if not last:
                return out
            kwargs["ExclusiveStartKey"] = last

    def delete_if_unchanged(self, worker_id: str, last_update_epoch_s: float) -> bool:
        """Delete a stale entry only if its ``lut`` is still the one seen (a revived worker keeps its entry)."""
        try:
            self._client.delete_item(
                TableName=self.table_name,
                Key={A.WORKER_ID: {"S": worker_id}},
                ConditionExpression="#lut = :seen",
                ExpressionAttributeNames={"#lut": A.LAST_UPDATE},
                ExpressionAttributeValues={":seen": {"N": str(int(last_update_epoch_s))}},
            )
        except Exception as exc:
            if aws.is_conditional_check_failed(exc):
                return False
            aws.raise_translated(exc, operation="dynamodb DeleteItem", resource=self.table_name)
        return True
