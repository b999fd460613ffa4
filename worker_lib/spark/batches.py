"""Recorded batch ends in ``<app>-CoordinatorState`` (one item per shard per micro-batch; first writer wins).

Executors write them (a replayed or speculative task reads the existing one and reads exactly up to it); the
driver reads them to plan the next offset and to checkpoint, and deletes them once they can no longer be needed.
Items carry a ``ttl`` attribute (7 days) so that a table with TTL enabled on ``ttl`` sweeps abandoned lineages.
The item format lives in :mod:`worker_lib.tables.coordinator_items` with the table's other items.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from worker_lib.core import aws
from worker_lib.spark.planning import BatchEnd
from worker_lib.tables.coordinator_items import KEY, BatchEndAttr, batch_end_item, parse_batch_end
from worker_lib.tables.schema import TableLayout

log = logging.getLogger(__name__)


def _from_item(item: dict[str, Any]) -> BatchEnd:
    return BatchEnd(**parse_batch_end(item))


class BatchEndStore:
    """Recorded batch ends of one application."""

    def __init__(self, app: str, client: Any, *, layout: TableLayout = TableLayout.THREE_TABLES) -> None:
        # In KCL 3.5's single-table mode they live in the lease table with the leader's other state.
        self._place = layout.coordinator(app)
        self.table_name = self._place.table_name
        self._client = client

    def get(self, key: str) -> BatchEnd | None:
        with aws.translated("GetItem", self.table_name):
            response = self._client.get_item(TableName=self.table_name, Key=self._place.key(key), ConsistentRead=True)
        item = response.get("Item")
        return _from_item(self._place.as_read(item, KEY)) if item else None

    def put_if_absent(self, key: str, end: BatchEnd, *, now_epoch_s: float) -> tuple[BatchEnd, bool]:
        """Record ``end`` unless an end is recorded already: one conditional PutItem, whose failure returns the
        end that stands. Returns that end and whether it is ours."""
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=self._place.as_stored(batch_end_item(key, end, now_epoch_s=now_epoch_s), KEY),
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": self._place.key_attr},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except Exception as exc:
            if not aws.is_conditional_check_failed(exc):
                aws.raise_translated(exc, operation="PutItem (batch end)", resource=self.table_name)
            old = getattr(exc, "response", {}).get("Item")
            existing = _from_item(self._place.as_read(old, KEY)) if old else self.get(key)
            if existing is None:  # deleted in between: cannot happen before the batch is committed
                raise
            return existing, False
        return end, True

    def touch(self, key: str, finished_epoch_s: float) -> None:
        """A re-read of a recorded batch (a second action on the same DataFrame) moves its finish time."""
        try:
            self._client.update_item(
                TableName=self.table_name,
                Key=self._place.key(key),
                UpdateExpression="SET #t1 = :t1",
                ConditionExpression="attribute_exists(#k) AND #t1 < :t1",
                ExpressionAttributeNames={"#t1": BatchEndAttr.FINISHED, "#k": self._place.key_attr},
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
                    "Keys": [self._place.key(key) for key in keys[i : i + 100]],
                    "ConsistentRead": True,
                }
            }
            while request:
                with aws.translated("BatchGetItem", self.table_name):
                    response = self._client.batch_get_item(RequestItems=request)
                for stored in response.get("Responses", {}).get(self.table_name, []):
                    item = self._place.as_read(stored, KEY)
                    found[item[KEY]["S"]] = _from_item(item)
                request = response.get("UnprocessedKeys") or {}
        return found

    def delete(self, keys: Iterable[str]) -> None:
        """Best effort, 25 keys per BatchWriteItem: a failure only leaves items for TTL."""
        requests = [{"DeleteRequest": {"Key": self._place.key(key)}} for key in keys]
        for i in range(0, len(requests), 25):
            chunk = requests[i : i + 25]
            for _ in range(3):  # unprocessed items (throttling) are retried a little, then left for TTL
                try:
                    response = self._client.batch_write_item(RequestItems={self.table_name: chunk})
                except Exception as exc:
                    log.debug("could not delete %d batch ends: %s", len(chunk), exc)
                    break
                chunk = response.get("UnprocessedItems", {}).get(self.table_name, [])
                if not chunk:
                    break
