"""The lease store's reads over DynamoDB: consistent gets (batched), scans, and an owner's keys.

An owner's keys come from the owner index (GSI) — or, while the index is missing or still being built (a KCL 2.x
table being adopted: docs/kcl-compatibility.md), from a scan of the table, trying the index again after
``OWNER_INDEX_RETRY_S``. :class:`~worker_lib.leases.dynamodb.DynamoDBLeaseStore` adds the writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from worker_lib.core import aws
from worker_lib.core.backoff import Backoff
from worker_lib.core.errors import CorruptItemError, DependencyError
from worker_lib.core.models import Lease
from worker_lib.leases import serializer
from worker_lib.leases.serializer import Item
from worker_lib.leases.store import LeaseScan
from worker_lib.tables.schema import LEASE_OWNER_INDEX, ItemPlace, TableLayout, lease_table_name
from worker_lib.tables.schema import LeaseAttr as A
from worker_lib.tables.store import TableStore

BATCH_GET_LIMIT = 100  # keys per BatchGetItem
BATCH_GET_ATTEMPTS = 4  # requests per batch while the service leaves keys unprocessed; then one GetItem each
# Between those requests: 0.1 s, doubling, exact (one caller's batch: nothing to spread).
BATCH_GET_BACKOFF = Backoff(base_s=0.1, max_s=1.0)
OWNER_INDEX_RETRY_S = 60.0  # while the owner index is missing or backfilling, look again this often

log = logging.getLogger(__name__)


class LeaseTableReads(TableStore):
    """The reading half of :class:`~worker_lib.leases.store.LeaseStore` over the ``<app>`` lease table."""

    # The owner index (GSI) is queried until it fails as missing (an adopted KCL 2.x table before create-tables
    # added it); then the owner's keys come from a scan, and the index is tried again after a while.
    _owner_index_usable = True
    _owner_index_retry_at = 0.0

    @classmethod
    def place(cls, app: str, layout: TableLayout) -> ItemPlace:
        return ItemPlace(table_name=lease_table_name(app), key_attr=A.LEASE_KEY)

    def get_lease(self, lease_key: str) -> Lease | None:
        item = self._get_item(lease_key)
        return None if item is None else _lease_or_none(item)

    def get_leases(self, lease_keys: Iterable[str]) -> dict[str, Lease]:
        """BatchGetItem, strongly consistent, 100 keys per request (the service's limit); unprocessed keys (the
        service's partial answer under load) are asked again, up to ``BATCH_GET_ATTEMPTS`` times, then read one by
        one so that a key is never silently dropped."""
        wanted = list(dict.fromkeys(lease_keys))
        if len(wanted) == 1:  # one key: a plain GetItem (the same cost, and what KCL sends)
            single = self.get_lease(wanted[0])
            return {} if single is None else {single.lease_key: single}
        items: list[Item] = []
        for start in range(0, len(wanted), BATCH_GET_LIMIT):
            pending: list[dict[str, Any]] = [
                {A.LEASE_KEY: {"S": key}} for key in wanted[start : start + BATCH_GET_LIMIT]
            ]
            for attempt in range(BATCH_GET_ATTEMPTS):
                if not pending:
                    break
                if attempt:
                    self._clock.sleep(BATCH_GET_BACKOFF.delay_s(attempt))
                with aws.translated("BatchGetItem", self.table_name):
                    response = self._client.batch_get_item(
                        RequestItems={self.table_name: {"Keys": pending, "ConsistentRead": True}}
                    )
                items.extend(dict(item) for item in response.get("Responses", {}).get(self.table_name, []))
                pending = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
            items.extend(item for key in pending if (item := self._get_item(key[A.LEASE_KEY]["S"])) is not None)
        leases = (_lease_or_none(item) for item in items)
        return {lease.lease_key: lease for lease in leases if lease is not None}

    def get_raw_item(self, lease_key: str) -> Item | None:
        """The item exactly as stored (for tools and compatibility tests)."""
        return self._get_item(lease_key)

    def _get_item(self, lease_key: str) -> Item | None:
        with aws.translated("GetItem", self.table_name):
            response = self._client.get_item(
                TableName=self.table_name, Key={A.LEASE_KEY: {"S": lease_key}}, ConsistentRead=True
            )
        item = response.get("Item")
        return dict(item) if item else None

    def scan(self, *, segments: int = 1, page_size: int | None = None) -> LeaseScan:
        """All leases. ``segments`` > 1 scans in parallel (large tables); ``page_size`` caps items per call."""
        if segments < 1:
            raise ValueError("segments must be at least 1")
        if segments == 1:
            items = self._scan_segment(None, None, page_size)
        else:
            with ThreadPoolExecutor(max_workers=min(segments, 16), thread_name_prefix="lease-scan") as pool:
                parts = list(pool.map(lambda s: self._scan_segment(s, segments, page_size), range(segments)))
            items = [item for part in parts for item in part]
        leases: list[Lease] = []
        foreign: list[str] = []
        corrupt: list[str] = []
        for item in items:
            key = serializer.item_key(item)
            if serializer.is_foreign(item):
                foreign.append(key)
                continue
            try:
                leases.append(serializer.from_item(item))
            except CorruptItemError as exc:
                corrupt.append(key)
                log.warning("skipping corrupt lease item: %s", exc)
        if foreign:
            log.debug("skipped %d items of other entity types in %s", len(foreign), self.table_name)
        leases.sort(key=lambda lease: lease.lease_key)
        return LeaseScan(leases=leases, skipped_foreign=foreign, skipped_corrupt=corrupt)

    def _scan_segment(self, segment: int | None, total: int | None, page_size: int | None) -> list[Item]:
        # Eventually consistent, as KCL's scans: half the read units. A stale item is harmless — every decision made
        # on a scan is written conditioned on the owner and counter read, so a stale one fails its condition.
        kwargs: dict[str, Any] = {"TableName": self.table_name}
        if page_size:
            kwargs["Limit"] = page_size
        if segment is not None:
            kwargs.update(Segment=segment, TotalSegments=total)
        items: list[Item] = []
        while True:
            with aws.translated("Scan", self.table_name):
                response = self._client.scan(**kwargs)
            items.extend(response.get("Items", []))
            last = response.get("LastEvaluatedKey")
            if not last:
                return items
            kwargs["ExclusiveStartKey"] = last

    def list_leases(self, *, segments: int = 1) -> list[Lease]:
        return self.scan(segments=segments).leases

    def list_lease_keys_for_owner(self, owner: str) -> list[str]:
        """The keys ``owner`` holds, from the owner index — or, while the index is missing or still being built (a
        KCL 2.x table being adopted: docs/kcl-compatibility.md), from a scan of the table."""
        if not self._owner_index_usable:
            return self._scan_keys_for_owner(owner)
        try:
            return self._query_keys_for_owner(owner)
        except DependencyError as exc:
            cause = exc.__cause__
            # DynamoDB answers ValidationException for an index that does not exist or is backfilling (moto:
            # ResourceNotFoundException); if the table itself is gone, the scan says so.
            if cause is None or aws.error_code(cause) not in ("ValidationException", "ResourceNotFoundException"):
                raise
            log.warning(
                "lease table %s: owner index %s not usable (%s); finding leases with a scan until it is",
                self.table_name,
                LEASE_OWNER_INDEX.name,
                exc,
            )
            self._owner_index_usable = False
            self._owner_index_retry_at = self._clock.monotonic() + OWNER_INDEX_RETRY_S
            return self._scan_keys_for_owner(owner)

    def _scan_keys_for_owner(self, owner: str) -> list[str]:
        if self._clock.monotonic() >= self._owner_index_retry_at:
            self._owner_index_usable = True  # try the index again next time
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "FilterExpression": "#owner = :owner",
            "ProjectionExpression": "#key",
            "ExpressionAttributeNames": {"#owner": A.LEASE_OWNER, "#key": A.LEASE_KEY},
            "ExpressionAttributeValues": {":owner": {"S": owner}},
        }
        return self._all_keys(self._client.scan, request, operation="Scan", resource=self.table_name)

    def _query_keys_for_owner(self, owner: str) -> list[str]:
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": LEASE_OWNER_INDEX.name,
            "KeyConditionExpression": "#owner = :owner",
            "ExpressionAttributeNames": {"#owner": A.LEASE_OWNER},
            "ExpressionAttributeValues": {":owner": {"S": owner}},
        }
        resource = f"{self.table_name}/{LEASE_OWNER_INDEX.name}"
        return self._all_keys(self._client.query, request, operation="Query", resource=resource)

    @staticmethod
    def _all_keys(
        call: Callable[..., dict[str, Any]], request: dict[str, Any], *, operation: str, resource: str
    ) -> list[str]:
        """Every page of a Query or Scan: the lease keys found, sorted."""
        keys: list[str] = []
        while True:
            with aws.translated(operation, resource):
                response = call(**request)
            keys.extend(item[A.LEASE_KEY]["S"] for item in response.get("Items", []) if A.LEASE_KEY in item)
            last = response.get("LastEvaluatedKey")
            if not last:
                return sorted(keys)
            request["ExclusiveStartKey"] = last

    def is_empty(self) -> bool:
        """True when no *lease* exists (foreign entity items do not count)."""
        kwargs: dict[str, Any] = {"TableName": self.table_name, "Limit": 100}
        while True:
            with aws.translated("Scan", self.table_name):
                response = self._client.scan(**kwargs)
            if any(not serializer.is_foreign(item) for item in response.get("Items", [])):
                return False
            last = response.get("LastEvaluatedKey")
            if not last:
                return True
            kwargs["ExclusiveStartKey"] = last


def _lease_or_none(item: Item) -> Lease | None:
    """The lease an item read by key holds; None for a foreign entity or (with one log line) a corrupt item."""
    if serializer.is_foreign(item):
        return None
    try:
        return serializer.from_item(item)
    except CorruptItemError as exc:
        log.warning("skipping corrupt lease item: %s", exc)
        return None
