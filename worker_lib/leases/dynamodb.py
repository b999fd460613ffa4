"""The lease store over DynamoDB: every write conditional, every botocore error translated.

Write conditions follow KCL 3.x (docs/kcl-compatibility.md, "Lease table"), tightened where that costs nothing:
renewals and checkpoints also require the caller to be the processing owner, and the leader may require the
counter it observed so that a lease renewed after its scan is never taken.

Lost replies: a write that DynamoDB applied but whose reply was lost is retried by botocore, and the retry
fails its condition. Every write therefore re-reads the item after a failed condition and reports success when
the item already shows exactly the state this write would have produced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from worker_lib.core import aws
from worker_lib.core.errors import CorruptItemError, DependencyError, InvalidStateError
from worker_lib.core.models import SHARD_END, Checkpoint, Lease, ShardBlock
from worker_lib.leases import serializer
from worker_lib.leases.serializer import Item, number
from worker_lib.leases.store import LeaseScan
from worker_lib.tables.schema import LEASE_ENTITY_TYPE, LEASE_OWNER_INDEX, ItemPlace, TableLayout, lease_table_name
from worker_lib.tables.schema import LeaseAttr as A
from worker_lib.tables.store import TableStore

BATCH_GET_LIMIT = 100  # keys per BatchGetItem
BATCH_GET_ATTEMPTS = 4  # requests per batch while the service leaves keys unprocessed; then one GetItem each
OWNER_INDEX_RETRY_S = 60.0  # while the owner index is missing or backfilling, look again this often

log = logging.getLogger(__name__)


class _Update:
    """Builds one UpdateItem request with placeholder names for every attribute (several are reserved words)."""

    def __init__(self) -> None:
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.adds: list[str] = []
        self.conditions: list[str] = []
        self.names: dict[str, str] = {}
        self.values: dict[str, dict[str, Any]] = {}

    def name(self, attr: str) -> str:
        placeholder = f"#{attr}"
        self.names[placeholder] = attr
        return placeholder

    def value(self, tag: str, attr_value: dict[str, Any]) -> str:
        placeholder = f":{tag}"
        self.values[placeholder] = attr_value
        return placeholder

    def set(self, attr: str, attr_value: dict[str, Any]) -> _Update:
        self.sets.append(f"{self.name(attr)} = {self.value('set_' + attr, attr_value)}")
        return self

    def remove(self, attr: str) -> _Update:
        self.removes.append(self.name(attr))
        return self

    def add(self, attr: str, amount: int) -> _Update:
        self.adds.append(f"{self.name(attr)} {self.value('add_' + attr, number(amount))}")
        return self

    def require_equal(self, attr: str, attr_value: dict[str, Any]) -> _Update:
        self.conditions.append(f"{self.name(attr)} = {self.value('cond_' + attr, attr_value)}")
        return self

    def require_absent(self, attr: str) -> _Update:
        self.conditions.append(f"attribute_not_exists({self.name(attr)})")
        return self

    def require_present(self, attr: str) -> _Update:
        self.conditions.append(f"attribute_exists({self.name(attr)})")
        return self

    def require_equal_or_absent(self, attr: str, expected: str | None) -> _Update:
        if expected is None:
            return self.require_absent(attr)
        return self.require_equal(attr, {"S": expected})

    def require(self, expression: str) -> _Update:
        self.conditions.append(expression)
        return self

    def request(self, table: str, lease_key: str) -> dict[str, Any]:
        clauses = []
        if self.sets:
            clauses.append("SET " + ", ".join(self.sets))
        if self.removes:
            clauses.append("REMOVE " + ", ".join(self.removes))
        if self.adds:
            clauses.append("ADD " + ", ".join(self.adds))
        request: dict[str, Any] = {
            "TableName": table,
            "Key": {A.LEASE_KEY: {"S": lease_key}},
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": self.names,
            "ReturnValues": "ALL_NEW",
        }
        if self.conditions:
            request["ConditionExpression"] = " AND ".join(f"({c})" for c in self.conditions)
        if self.values:
            request["ExpressionAttributeValues"] = self.values
        return request


_SUB_SEQUENCE = {A.CHECKPOINT: A.CHECKPOINT_SUB_SEQUENCE, A.PENDING_CHECKPOINT: A.PENDING_CHECKPOINT_SUB_SEQUENCE}
"""Where a checkpoint's sub-sequence number is stored, beside it."""

_PENDING_ATTRS = (A.PENDING_CHECKPOINT, A.PENDING_CHECKPOINT_SUB_SEQUENCE, A.PENDING_CHECKPOINT_STATE)
"""A pending checkpoint's attributes, removed together by a checkpoint."""


class DynamoDBLeaseStore(TableStore):
    """:class:`~worker_lib.leases.store.LeaseStore` over the ``<app>`` lease table (the same in every layout)."""

    # The owner index (GSI) is queried until it fails as missing (an adopted KCL 2.x table before create-tables
    # added it); then the owner's keys come from a scan, and the index is tried again after a while.
    _owner_index_usable = True
    _owner_index_retry_at = 0.0

    @classmethod
    def place(cls, app: str, layout: TableLayout) -> ItemPlace:
        return ItemPlace(table_name=lease_table_name(app), key_attr=A.LEASE_KEY)

    # --- reading ---------------------------------------------------------------------------------------------
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
                    self._clock.sleep(min(0.05 * 2**attempt, 1.0))
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

    # --- writing ---------------------------------------------------------------------------------------------
    def create_lease_if_absent(self, lease: Lease) -> bool:
        if lease.entity_type is None:
            lease = replace(lease, entity_type=LEASE_ENTITY_TYPE)  # as KCL 3.5 creates leases; older KCL ignores it
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=serializer.to_item(lease),
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": A.LEASE_KEY},
            )
        except Exception as exc:
            if aws.is_conditional_check_failed(exc):
                # A lost reply looks the same as a concurrent creator; either way the lease exists now.
                return False
            aws.raise_translated(exc, operation="PutItem", resource=self.table_name)
        return True

    def create_leases_if_absent(self, leases: Iterable[Lease]) -> list[Lease]:
        return [lease for lease in leases if self.create_lease_if_absent(lease)]

    def renew_lease(self, lease: Lease, owner: str, *, throughput_kbps: float | None = None) -> Lease | None:
        def renewal(base: Lease) -> _Update:
            update = self._fenced_by_processing_owner(base, owner)
            if throughput_kbps is not None:
                update.set(A.THROUGHPUT_KBPS, number(throughput_kbps))
            return update

        return self._processing_owner_write(
            lease,
            owner,
            renewal,
            operation="renew",
            applied=lambda cur: (
                cur.lease_counter == lease.lease_counter + 1
                and cur.actual_owner == owner
                and (throughput_kbps is None or _close(cur.throughput_kbps, throughput_kbps))
                and cur.checkpoint == lease.checkpoint
            ),
        )

    def update_throughput(self, lease: Lease, owner: str, throughput_kbps: float) -> Lease | None:
        """``worker`` liveness mode: write ``throughputKBps`` alone, conditioned on the counter and on ``owner``
        processing the shard, *without* moving the counter — it is not a renewal, and the leader's writes
        (conditioned on the counter) are not disturbed by it. ``None`` if the condition failed."""
        update = _Update().require_equal(A.LEASE_COUNTER, number(lease.lease_counter))
        if lease.checkpoint_owner == owner:
            update.require_equal(A.CHECKPOINT_OWNER, {"S": owner})
        else:
            update.require_equal(A.LEASE_OWNER, {"S": owner}).require_absent(A.CHECKPOINT_OWNER)
        update.set(A.THROUGHPUT_KBPS, number(throughput_kbps))
        return self._update(lease.lease_key, update, operation="update throughput")

    def checkpoint(self, lease: Lease, owner: str, checkpoint: Checkpoint) -> Lease | None:
        return self._checkpoint_write(
            lease, owner, checkpoint, pending=False, stored=lambda cur: cur.checkpoint == checkpoint
        )

    def prepare_checkpoint(self, lease: Lease, owner: str, pending: Checkpoint) -> Lease | None:
        return self._checkpoint_write(
            lease, owner, pending, pending=True, stored=lambda cur: cur.pending_checkpoint == pending
        )

    def _checkpoint_write(
        self, lease: Lease, owner: str, value: Checkpoint, *, pending: bool, stored: Callable[[Lease], bool]
    ) -> Lease | None:
        """A checkpoint (``pending``: the first phase of a two-phase one) by the processing owner, with its
        sub-sequence number beside it; ``stored`` recognises the value in an item read back after a lost reply.

        A checkpoint also sets the owner switches back to 0 and removes the pending checkpoint's three attributes
        together, as KCL's updateLease does (application state must not outlive its pending checkpoint); a pending
        checkpoint comes without application state, so KCL's prepareCheckpoint removes any earlier one."""
        attr = A.PENDING_CHECKPOINT if pending else A.CHECKPOINT
        removed = (A.PENDING_CHECKPOINT_STATE,) if pending else _PENDING_ATTRS

        def write(base: Lease) -> _Update:
            update = self._fenced_by_processing_owner(base, owner)
            update.set(attr, {"S": value.sequence}).set(_SUB_SEQUENCE[attr], number(value.sub_sequence))
            if not pending:
                update.set(A.OWNER_SWITCHES, number(0))
            for name in removed:
                update.remove(name)
            return update

        return self._processing_owner_write(
            lease,
            owner,
            write,
            operation="prepare_checkpoint" if pending else "checkpoint",
            applied=lambda cur: (
                cur.lease_counter == lease.lease_counter + 1
                and stored(cur)
                and (pending or cur.pending_checkpoint is None)
                and cur.actual_owner == owner
            ),
        )

    def _processing_owner_write(
        self,
        lease: Lease,
        owner: str,
        build: Callable[[Lease], _Update],
        *,
        operation: str,
        applied: Callable[[Lease], bool],
    ) -> Lease | None:
        """A counter-moving write by the owner processing the shard (renewal, checkpoint, prepared checkpoint), with
        the one re-read and the one retry of the whole checkpoint path.

        After a lost condition the item is read once (consistently), and the write is either recognised as applied
        with its reply lost (``applied``), or — when the leader started a graceful hand-off away from us since our
        view (``leaseOwner`` moved, ``checkpointOwner`` = us, counter untouched) — sent once more as the checkpoint
        owner, on the item as read: we are still the one processing until we complete the hand-off. Anything else
        is the normal outcome of a race: ``None``. The returned lease shows a hand-off in progress by its owners."""
        result = self._update(lease.lease_key, build(lease), operation=operation)
        if result is not None:
            return result
        current = self.get_lease(lease.lease_key)
        if current is None:
            return None
        if applied(current):
            log.info("lease %s: %s reply was lost but the write was applied", lease.lease_key, operation)
            return current
        handoff_since = (
            lease.checkpoint_owner != owner
            and current.checkpoint_owner == owner
            and current.lease_owner != owner
            and current.lease_counter == lease.lease_counter
        )
        if handoff_since:
            return self._update(lease.lease_key, build(current), operation=f"{operation} as checkpoint owner")
        return None

    def _fenced_by_processing_owner(self, lease: Lease, owner: str) -> _Update:
        """Counter unchanged since the caller's view, and the caller is the one processing the shard."""
        update = _Update().require_equal(A.LEASE_COUNTER, number(lease.lease_counter))
        if lease.checkpoint_owner == owner:
            update.require_equal(A.CHECKPOINT_OWNER, {"S": owner})
        else:
            update.require_equal(A.LEASE_OWNER, {"S": owner}).require_absent(A.CHECKPOINT_OWNER)
        update.set(A.LEASE_COUNTER, number(lease.lease_counter + 1))
        return update

    def assign_lease(self, lease: Lease, new_owner: str, *, expected_counter: int | None = None) -> Lease | None:
        update = (
            _Update()
            .require_present(A.LEASE_KEY)
            .require_equal_or_absent(A.LEASE_OWNER, lease.lease_owner)
            .require_equal_or_absent(A.CHECKPOINT_OWNER, lease.checkpoint_owner)
        )
        if expected_counter is not None:
            update.require_equal(A.LEASE_COUNTER, number(expected_counter))
        update.set(A.LEASE_OWNER, {"S": new_owner}).remove(A.CHECKPOINT_OWNER).add(A.LEASE_COUNTER, 1)
        if new_owner != lease.actual_owner:
            update.add(A.OWNER_SWITCHES, 1)
        return self._update_or_recognise(
            lease,
            update,
            operation="assign",
            applied=lambda cur: (
                cur.lease_owner == new_owner
                and cur.checkpoint_owner is None
                and (expected_counter is None or cur.lease_counter == expected_counter + 1)
            ),
        )

    def initiate_graceful_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        current_owner = lease.lease_owner
        if current_owner is None or lease.checkpoint_owner is not None:
            raise InvalidStateError(f"lease {lease.lease_key} is unowned or already in a handoff")
        if current_owner == new_owner:
            raise InvalidStateError(f"lease {lease.lease_key} is already owned by {new_owner}")
        update = (
            _Update()
            .require_equal(A.LEASE_OWNER, {"S": current_owner})
            .require_absent(A.CHECKPOINT_OWNER)
            .set(A.LEASE_OWNER, {"S": new_owner})
            .set(A.CHECKPOINT_OWNER, {"S": current_owner})
        )
        return self._update_or_recognise(
            lease,
            update,
            operation="initiate_handoff",
            applied=lambda cur: cur.lease_owner == new_owner and cur.checkpoint_owner == current_owner,
        )

    def complete_handoff(self, lease: Lease, old_owner: str) -> Lease | None:
        if lease.checkpoint_owner != old_owner or lease.lease_owner is None:
            raise InvalidStateError(f"lease {lease.lease_key} is not being handed off by {old_owner}")
        return self.assign_lease(lease, lease.lease_owner)

    def evict_lease(self, lease: Lease, owner: str) -> Lease | None:
        if lease.checkpoint_owner == owner:
            # Giving up during a handoff means finishing it: the new owner is already chosen.
            return self.complete_handoff(lease, owner)
        update = (
            _Update()
            .require_equal(A.LEASE_OWNER, {"S": owner})
            .require_absent(A.CHECKPOINT_OWNER)
            .remove(A.LEASE_OWNER)
            .add(A.LEASE_COUNTER, 1)
        )
        return self._update_or_recognise(
            lease,
            update,
            operation="evict",
            applied=lambda cur: cur.lease_owner is None and cur.lease_counter > lease.lease_counter,
        )

    def mark_block(self, lease: Lease, owner: str, block: ShardBlock | None) -> Lease | None:
        """The processing owner records (or, with None, removes) the failure marker; fenced like a checkpoint."""

        def write(base: Lease) -> _Update:
            update = self._fenced_by_processing_owner(base, owner)
            return update.set(A.FAILURE, block.to_attribute()) if block is not None else update.remove(A.FAILURE)

        return self._processing_owner_write(
            lease, owner, write, operation="mark_block", applied=lambda cur: cur.block == block
        )

    def stop_shard(self, lease: Lease, owner: str, block: ShardBlock) -> Lease | None:
        """The processing owner gives the lease up and marks it stopped (policy stop-shard), in one write: the
        leader assigns a stopped lease to nobody (:meth:`resume_shard` ends that)."""
        update = self._fenced_by_processing_owner(lease, owner)
        update.set(A.FAILURE, block.to_attribute()).remove(A.LEASE_OWNER).remove(A.CHECKPOINT_OWNER)
        return self._update_or_recognise(
            lease,
            update,
            operation="stop_shard",
            applied=lambda cur: cur.is_stopped and cur.lease_owner is None and cur.lease_counter > lease.lease_counter,
        )

    def resume_shard(self, lease_key: str) -> Lease | None:
        """Remove a shard's failure marker (``shardlease resume-shard``); None if the lease has none."""
        update = _Update().require_present(A.FAILURE).remove(A.FAILURE)
        return self._update(lease_key, update, operation="resume_shard")

    def update_child_shard_ids(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease | None:
        children = sorted(set(child_shard_ids))
        if not children:
            raise ValueError("child_shard_ids must not be empty")
        update = _Update().require_present(A.LEASE_KEY).set(A.CHILD_SHARD_IDS, {"SS": children})
        return self._update(lease.lease_key, update, operation="update_child_shard_ids")

    def delete_lease(self, lease: Lease, *, only_if_finished: bool = True) -> bool:
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": {A.LEASE_KEY: {"S": lease.lease_key}},
            "ConditionExpression": "attribute_exists(#k)",
            "ExpressionAttributeNames": {"#k": A.LEASE_KEY},
        }
        if only_if_finished:
            kwargs["ConditionExpression"] += " AND #cp = :shard_end"
            kwargs["ExpressionAttributeNames"]["#cp"] = A.CHECKPOINT
            kwargs["ExpressionAttributeValues"] = {":shard_end": {"S": SHARD_END.sequence}}
        try:
            self._client.delete_item(**kwargs)
        except Exception as exc:
            if aws.is_conditional_check_failed(exc):
                # Gone already (possibly our own lost reply) counts as deleted; still there means we lost.
                return self._get_item(lease.lease_key) is None
            aws.raise_translated(exc, operation="DeleteItem", resource=self.table_name)
        return True

    # --- plumbing --------------------------------------------------------------------------------------------
    def _update(self, lease_key: str, update: _Update, *, operation: str) -> Lease | None:
        try:
            response = self._client.update_item(**update.request(self.table_name, lease_key))
        except Exception as exc:
            if aws.is_conditional_check_failed(exc):
                return None
            aws.raise_translated(exc, operation=f"UpdateItem ({operation})", resource=self.table_name)
        return serializer.from_item(response["Attributes"])

    def _update_or_recognise(
        self, lease: Lease, update: _Update, *, operation: str, applied: Callable[[Lease], bool]
    ) -> Lease | None:
        result = self._update(lease.lease_key, update, operation=operation)
        if result is not None:
            return result
        current = self.get_lease(lease.lease_key)
        if current is not None and applied(current):
            log.info("lease %s: %s reply was lost but the write was applied", lease.lease_key, operation)
            return current
        return None


def _lease_or_none(item: Item) -> Lease | None:
    """The lease an item read by key holds; None for a foreign entity or (with one log line) a corrupt item."""
    if serializer.is_foreign(item):
        return None
    try:
        return serializer.from_item(item)
    except CorruptItemError as exc:
        log.warning("skipping corrupt lease item: %s", exc)
        return None


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))
