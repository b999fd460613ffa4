"""Recorded batch ends in ``<app>-CoordinatorState`` (one item per shard per micro-batch; first writer wins).

Executors write them (a replayed or speculative task reads the existing one and reads exactly up to it); the
driver reads them to plan the next offset and to checkpoint, and deletes them once they can no longer be needed.
Items carry a ``ttl`` attribute (7 days) so that a table with TTL enabled on ``ttl`` sweeps abandoned lineages.
The attribute names live in :mod:`worker_lib.tables.coordinator_items` with the table's other items; the item's
encoding is here, beside :class:`~worker_lib.spark.planning.BatchEnd`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from worker_lib.core import aws
from worker_lib.core.models import Checkpoint
from worker_lib.spark.planning import BatchEnd
from worker_lib.tables.coordinator_items import KEY, BatchEndAttr, Item
from worker_lib.tables.schema import TableLayout

log = logging.getLogger(__name__)

BATCH_END_TTL_S = 7 * 24 * 3600


class BatchEndFields(TypedDict):
    """A batch-end item read back: the keyword arguments of :class:`worker_lib.spark.planning.BatchEnd`."""

    lease_key: str
    position: Checkpoint
    records: int
    bytes: int
    caught_up: bool
    children: tuple[str, ...]
    started_at: float
    finished_at: float
    cpu_seconds: float
    millis_behind_latest: int | None


def batch_end_item(item_key: str, end: BatchEnd, *, now_epoch_s: float) -> Item:
    item: Item = {
        KEY: {"S": item_key},
        BatchEndAttr.LEASE_KEY: {"S": end.lease_key},
        BatchEndAttr.SEQUENCE: {"S": end.position.sequence},
        BatchEndAttr.SUB_SEQUENCE: {"N": str(end.position.sub_sequence)},
        BatchEndAttr.RECORDS: {"N": str(end.records)},
        BatchEndAttr.BYTES: {"N": str(end.bytes)},
        BatchEndAttr.CAUGHT_UP: {"BOOL": end.caught_up},
        BatchEndAttr.STARTED: {"N": repr(end.started_at)},
        BatchEndAttr.FINISHED: {"N": repr(end.finished_at)},
        BatchEndAttr.CPU: {"N": repr(end.cpu_seconds)},
        BatchEndAttr.TTL: {"N": str(int(now_epoch_s) + BATCH_END_TTL_S)},
    }
    if end.children:
        item[BatchEndAttr.CHILDREN] = {"L": [{"S": child} for child in end.children]}
    if end.millis_behind_latest is not None:
        item[BatchEndAttr.MILLIS_BEHIND] = {"N": str(end.millis_behind_latest)}
    return item


def parse_batch_end(item: Mapping[str, Any]) -> BatchEndFields:
    return BatchEndFields(
        lease_key=item[BatchEndAttr.LEASE_KEY]["S"],
        position=Checkpoint(
            sequence=item[BatchEndAttr.SEQUENCE]["S"], sub_sequence=int(item[BatchEndAttr.SUB_SEQUENCE]["N"])
        ),
        records=int(item[BatchEndAttr.RECORDS]["N"]),
        bytes=int(item[BatchEndAttr.BYTES]["N"]),
        caught_up=bool(item[BatchEndAttr.CAUGHT_UP]["BOOL"]),
        children=tuple(child["S"] for child in item.get(BatchEndAttr.CHILDREN, {}).get("L", [])),
        started_at=float(item[BatchEndAttr.STARTED]["N"]),
        finished_at=float(item[BatchEndAttr.FINISHED]["N"]),
        cpu_seconds=float(item.get(BatchEndAttr.CPU, {}).get("N", 0.0)),
        millis_behind_latest=int(item[BatchEndAttr.MILLIS_BEHIND]["N"]) if BatchEndAttr.MILLIS_BEHIND in item else None,
    )


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
