"""``<app>-WorkerMetricStats`` in KCL 3.x's format (reference §2; item conversion in :mod:`.stats_serializer`).

Workers write their item unconditionally, as KCL does (each worker owns exactly one item). The leader scans all
items and deletes stale ones conditionally on the ``lut`` it saw, so a worker that came back in between keeps its
entry. Items of another ``entityType`` are skipped silently; corrupt items are skipped with one log line naming
only their key and the faulty attribute, never a payload.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from .. import aws
from ..clock import SYSTEM_CLOCK, Clock
from ..config import AwsConfig
from ..errors import CorruptItemError
from ..models import WorkerMetricStats
from ..tables.schema import WorkerMetricsAttr, worker_metrics_table_name
from .stats_serializer import from_item, is_foreign, key_of, number, to_item

if TYPE_CHECKING:
    import boto3

__all__ = ["WorkerMetricsStore", "from_item", "is_foreign", "to_item"]

log = logging.getLogger("shardlease.metrics.store")
A = WorkerMetricsAttr


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
        self._client = aws.client_or_new("dynamodb", client, aws_config, boto3_session)
        self._clock = clock

    def put(self, stats: WorkerMetricStats) -> None:
        """Write (replace) this worker's item, unconditionally as KCL does."""
        item = to_item(stats)
        with aws.translated("dynamodb PutItem", self.table_name):
            self._client.put_item(TableName=self.table_name, Item=item)

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        """One worker's entry (strongly consistent), or ``None`` if absent, foreign or corrupt."""
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
            log.warning(
                "skipping corrupt worker-metrics item table=%s wid=%s: %s", self.table_name, worker_id, exc.reason
            )
            return None

    def list_all(self) -> list[WorkerMetricStats]:
        """Every worker's entry (all scan pages), skipping foreign and corrupt items."""
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
                    log.warning(
                        "skipping corrupt worker-metrics item table=%s wid=%s: %s",
                        self.table_name,
                        key_of(item),
                        exc.reason,
                    )
            last = response.get("LastEvaluatedKey")
            if not last:
                return out
            kwargs["ExclusiveStartKey"] = last

    def delete_if_unchanged(self, worker_id: str, last_update_epoch_s: float) -> bool:
        """Delete a stale entry only if its ``lut`` is still the one seen; False if it changed or is gone."""
        try:
            self._client.delete_item(
                TableName=self.table_name,
                Key={A.WORKER_ID: {"S": worker_id}},
                ConditionExpression="#lut = :seen",
                ExpressionAttributeNames={"#lut": A.LAST_UPDATE},
                ExpressionAttributeValues={":seen": number(int(last_update_epoch_s))},
            )
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            if aws.is_conditional_check_failed(exc):
                return False
            aws.raise_translated(exc, operation="dynamodb DeleteItem", resource=self.table_name)
        return True
