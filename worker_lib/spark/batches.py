"""Recorded batch ends in ``<app>-CoordinatorState`` (one item per shard per micro-batch; first writer wins).

Executors write them (a replayed or speculative task reads the existing one and reads exactly up to it); the
driver reads them to plan the next offset and to checkpoint, and deletes them once they can no longer be needed.
Items carry a ``ttl`` attribute (7 days) so that a table with TTL enabled on ``ttl`` sweeps abandoned lineages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from worker_lib.core import aws
from worker_lib.core.models import Checkpoint
from worker_lib.spark.planning import BatchEnd
from worker_lib.tables.schema import CoordinatorAttr, coordinator_state_table_name

log = logging.getLogger("shardlease.spark.batches")

TTL_S = 7 * 24 * 3600


def to_item(key: str, end: BatchEnd, *, now_epoch_s: float) -> dict[str, Any]:
    item: dict[str, Any] = {
        CoordinatorAttr.KEY: {"S": key},
        "lk": {"S": end.lease_key},
        "seq": {"S": end.position.sequence},
        "sub": {"N": str(end.position.sub_sequence)},
        "n": {"N": str(end.records)},
        "b": {"N": str(end.bytes)},
        "cu": {"BOOL": end.caught_up},
        "t0": {"N": repr(end.started_at)},
        "t1": {"N": repr(end.finished_at)},
        "ttl": {"N": str(int(now_epoch_s) + TTL_S)},
    }
    if end.children:
        item["ch"] = {"L": [{"S": child} for child in end.children]}
    return item


def from_item(item: dict[str, Any]) -> BatchEnd:
    return BatchEnd(
        lease_key=item["lk"]["S"],
        position=Checkpoint(sequence=item["seq"]["S"], sub_sequence=int(item["sub"]["N"])),
        records=int(item["n"]["N"]),
        bytes=int(item["b"]["N"]),
        caught_up=bool(item["cu"]["BOOL"]),
        children=tuple(child["S"] for child in item.get("ch", {}).get("L", [])),
        started_at=float(item["t0"]["N"]),
        finished_at=float(item["t1"]["N"]),
    )


class BatchEndStore:
    """Recorded batch ends of one application."""

    def __init__(self, app: str, client: Any) -> None:
        self.table_name = coordinator_state_table_name(app)
        self._client = client

    def get(self, key: str) -> BatchEnd | None:
        with aws.translated("GetItem", self.table_name):
            response = self._client.get_item(
                TableName=self.table_name, Key={CoordinatorAttr.KEY: {"S": key}}, ConsistentRead=True
            )
        item = response.get("Item")
        return from_item(item) if item else None

    def put_if_absent(self, key: str, end: BatchEnd, *, now_epoch_s: float) -> BatchEnd:
        """Record ``end`` unless an end is recorded already; return the one that stands."""
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=to_item(key, end, now_epoch_s=now_epoch_s),
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": CoordinatorAttr.KEY},
            )
        except Exception as exc:
            if not aws.is_conditional_check_failed(exc):
                aws.raise_translated(exc, operation="PutItem (batch end)", resource=self.table_name)
            existing = self.get(key)
            if existing is None:  # deleted in between: cannot happen before the batch is committed
                raise
            return existing
        return end

    def touch(self, key: str, finished_epoch_s: float) -> None:
        """A re-read of a recorded batch (a second action on the same DataFrame) moves its finish time."""
        try:
            self._client.update_item(
                TableName=self.table_name,
                Key={CoordinatorAttr.KEY: {"S": key}},
                UpdateExpression="SET #t1 = :t1",
                ConditionExpression="attribute_exists(#k) AND #t1 < :t1",
                ExpressionAttributeNames={"#t1": "t1", "#k": CoordinatorAttr.KEY},
                ExpressionAttributeValues={":t1": {"N": repr(finished_epoch_s)}},
            )
        except Exception as exc:
            if not aws.is_conditional_check_failed(exc):
                log.debug("could not update the finish time of %s: %s", key, exc)

    def get_many(self, keys: Sequence[str]) -> dict[str, BatchEnd]:
        """Recorded ends by item key (missing keys are absent from the result)."""
        found: dict[str, BatchEnd] = {}
        for i in range(0, len(keys), 100):
            request: dict[str, Any] = {
                self.table_name: {
                    "Keys": [{CoordinatorAttr.KEY: {"S": key}} for key in keys[i : i + 100]],
                    "ConsistentRead": True,
                }
            }
            while request:
                with aws.translated("BatchGetItem", self.table_name):
                    response = self._client.batch_get_item(RequestItems=request)
                for item in response.get("Responses", {}).get(self.table_name, []):
                    found[item[CoordinatorAttr.KEY]["S"]] = from_item(item)
                request = response.get("UnprocessedKeys") or {}
        return found

    def delete(self, keys: Iterable[str]) -> None:
        """Best effort: a failure only leaves items for TTL."""
        for key in keys:
            try:
                self._client.delete_item(TableName=self.table_name, Key={CoordinatorAttr.KEY: {"S": key}})
            except Exception as exc:
                log.debug("could not delete batch end %s: %s", key, exc)
