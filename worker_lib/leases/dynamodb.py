"""The lease store over DynamoDB: every write conditional, every botocore error translated.

Write conditions follow KCL 3.x (docs/kcl-compatibility.md, "Lease table"), tightened where that costs nothing:
renewals and checkpoints also require the caller to be the processing owner, and the leader may require the
counter it observed so that a lease renewed after its scan is never taken.

Lost replies: a write that DynamoDB applied but whose reply was lost is retried by botocore, and the retry
fails its condition. Every write therefore re-reads the item after a failed condition and reports success when
the item already shows exactly the state this write would have produced.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from worker_lib.core import aws
from worker_lib.core.errors import InvalidStateError, OutputConditionError
from worker_lib.core.models import SHARD_END, Checkpoint, Lease, ShardBlock
from worker_lib.leases import serializer
from worker_lib.leases.dynamodb_reads import BATCH_GET_ATTEMPTS, BATCH_GET_LIMIT, OWNER_INDEX_RETRY_S, LeaseTableReads
from worker_lib.leases.serializer import number
from worker_lib.leases.update import LeaseUpdate
from worker_lib.tables.schema import LEASE_ENTITY_TYPE
from worker_lib.tables.schema import LeaseAttr as A

__all__ = ["BATCH_GET_ATTEMPTS", "BATCH_GET_LIMIT", "OWNER_INDEX_RETRY_S", "DynamoDBLeaseStore"]

log = logging.getLogger(__name__)


_SUB_SEQUENCE = {A.CHECKPOINT: A.CHECKPOINT_SUB_SEQUENCE, A.PENDING_CHECKPOINT: A.PENDING_CHECKPOINT_SUB_SEQUENCE}
"""Where a checkpoint's sub-sequence number is stored, beside it."""

_PENDING_ATTRS = (A.PENDING_CHECKPOINT, A.PENDING_CHECKPOINT_SUB_SEQUENCE, A.PENDING_CHECKPOINT_STATE)
"""A pending checkpoint's attributes, removed together by a checkpoint."""


class DynamoDBLeaseStore(LeaseTableReads):
    """:class:`~worker_lib.leases.store.LeaseStore` over the ``<app>`` lease table (the same in every layout): the
    reads of :class:`~worker_lib.leases.dynamodb_reads.LeaseTableReads`, and the conditional writes."""

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
        def renewal(base: Lease) -> LeaseUpdate:
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
        update = LeaseUpdate().require_equal(A.LEASE_COUNTER, number(lease.lease_counter))
        if lease.checkpoint_owner == owner:
            update.require_equal(A.CHECKPOINT_OWNER, {"S": owner})
        else:
            update.require_equal(A.LEASE_OWNER, {"S": owner}).require_absent(A.CHECKPOINT_OWNER)
        update.set(A.THROUGHPUT_KBPS, number(throughput_kbps))
        return self._update(lease.lease_key, update, operation="update throughput")

    def checkpoint(
        self, lease: Lease, owner: str, checkpoint: Checkpoint, *, writes: Sequence[Mapping[str, Any]] = ()
    ) -> Lease | None:
        return self._checkpoint_write(
            lease, owner, checkpoint, pending=False, stored=lambda cur: cur.checkpoint == checkpoint, writes=writes
        )

    def prepare_checkpoint(self, lease: Lease, owner: str, pending: Checkpoint) -> Lease | None:
        return self._checkpoint_write(
            lease, owner, pending, pending=True, stored=lambda cur: cur.pending_checkpoint == pending
        )

    def _checkpoint_write(
        self,
        lease: Lease,
        owner: str,
        value: Checkpoint,
        *,
        pending: bool,
        stored: Callable[[Lease], bool],
        writes: Sequence[Mapping[str, Any]] = (),
    ) -> Lease | None:
        """A checkpoint (``pending``: the first phase of a two-phase one) by the processing owner, with its
        sub-sequence number beside it; ``stored`` recognises the value in an item read back after a lost reply.
        With ``writes``, one ``TransactWriteItems``: the processor's outputs and the checkpoint, applied together or
        not at all (docs/exactly-once.md).

        A checkpoint also sets the owner switches back to 0 and removes the pending checkpoint's three attributes
        together, as KCL's updateLease does (application state must not outlive its pending checkpoint); a pending
        checkpoint comes without application state, so KCL's prepareCheckpoint removes any earlier one."""
        attr = A.PENDING_CHECKPOINT if pending else A.CHECKPOINT
        removed = (A.PENDING_CHECKPOINT_STATE,) if pending else _PENDING_ATTRS

        def write(base: Lease) -> LeaseUpdate:
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
            writes=writes,
            written=lambda base: replace(
                base,
                lease_counter=base.lease_counter + 1,
                checkpoint=value,
                pending_checkpoint=None,
                owner_switches_since_checkpoint=0,
                extra={k: v for k, v in base.extra.items() if k not in _PENDING_ATTRS},
            ),
        )

    def _processing_owner_write(
        self,
        lease: Lease,
        owner: str,
        build: Callable[[Lease], LeaseUpdate],
        *,
        operation: str,
        applied: Callable[[Lease], bool],
        writes: Sequence[Mapping[str, Any]] = (),
        written: Callable[[Lease], Lease] | None = None,
    ) -> Lease | None:
        """A counter-moving write by the owner processing the shard (renewal, checkpoint, prepared checkpoint), with
        the one re-read and the one retry of the whole checkpoint path. With ``writes`` it is one transaction with
        them, and ``written`` is the lease it leaves (a transaction returns no item).

        After a lost condition the item is read once (consistently), and the write is either recognised as applied
        with its reply lost (``applied``), or — when the leader started a graceful hand-off away from us since our
        view (``leaseOwner`` moved, ``checkpointOwner`` = us, counter untouched) — sent once more as the checkpoint
        owner, on the item as read: we are still the one processing until we complete the hand-off. Anything else
        is the normal outcome of a race: ``None``. The returned lease shows a hand-off in progress by its owners."""

        def send(base: Lease, what: str) -> Lease | None:
            if not writes:
                return self._update(base.lease_key, build(base), operation=what)
            assert written is not None
            return written(base) if self._transact(base.lease_key, build(base), writes, operation=what) else None

        result = send(lease, operation)
        if result is not None:
            return result
        # Not a retry of an error (LeaseCheckpointer retries those): only a read tells a lost condition from our own
        # write that landed before botocore's retry of it failed the condition.
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
        if handoff_since:  # a new condition (the item as read), sent once: the hand-off is ours to finish
            return send(current, f"{operation} as checkpoint owner")
        return None

    def _fenced_by_processing_owner(self, lease: Lease, owner: str) -> LeaseUpdate:
        """Counter unchanged since the caller's view, and the caller is the one processing the shard."""
        update = LeaseUpdate().require_equal(A.LEASE_COUNTER, number(lease.lease_counter))
        if lease.checkpoint_owner == owner:
            update.require_equal(A.CHECKPOINT_OWNER, {"S": owner})
        else:
            update.require_equal(A.LEASE_OWNER, {"S": owner}).require_absent(A.CHECKPOINT_OWNER)
        update.set(A.LEASE_COUNTER, number(lease.lease_counter + 1))
        return update

    def assign_lease(self, lease: Lease, new_owner: str, *, expected_counter: int | None = None) -> Lease | None:
        update = (
            LeaseUpdate()
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
            LeaseUpdate()
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
            LeaseUpdate()
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

        def write(base: Lease) -> LeaseUpdate:
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
        update = LeaseUpdate().require_present(A.FAILURE).remove(A.FAILURE)
        return self._update(lease_key, update, operation="resume_shard")

    def update_child_shard_ids(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease | None:
        children = sorted(set(child_shard_ids))
        if not children:
            raise ValueError("child_shard_ids must not be empty")
        update = LeaseUpdate().require_present(A.LEASE_KEY).set(A.CHILD_SHARD_IDS, {"SS": children})
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
    def _update(self, lease_key: str, update: LeaseUpdate, *, operation: str) -> Lease | None:
        try:
            response = self._client.update_item(**update.request(self.table_name, lease_key))
        except Exception as exc:
            if aws.is_conditional_check_failed(exc):
                return None
            aws.raise_translated(exc, operation=f"UpdateItem ({operation})", resource=self.table_name)
        return serializer.from_item(response["Attributes"])

    def _transact(
        self, lease_key: str, update: LeaseUpdate, writes: Sequence[Mapping[str, Any]], *, operation: str
    ) -> bool:
        """``writes`` and the lease's update in one transaction; False when the lease's condition failed (nothing
        was applied). A failed condition of the writes raises :class:`OutputConditionError`."""
        lease_action = {"Update": update.transaction_item(self.table_name, lease_key)}
        try:
            self._client.transact_write_items(TransactItems=[*writes, lease_action])
        except Exception as exc:
            cancelled = aws.error_code(exc) == "TransactionCanceledException"
            reasons = list(getattr(exc, "response", {}).get("CancellationReasons") or []) if cancelled else []
            codes = [str(reason.get("Code", "None")) for reason in reasons]
            if len(codes) == len(writes) + 1 and codes[-1] == "ConditionalCheckFailed":
                return False  # the lease moved: the fence refused the whole transaction
            failed = [i for i, code in enumerate(codes[: len(writes)]) if code == "ConditionalCheckFailed"]
            if failed:
                raise OutputConditionError(
                    f"lease {lease_key}: the condition of output {failed[0] + 1} of {len(writes)} failed; "
                    "nothing of the transaction was applied",
                    reasons=reasons,
                ) from exc
            aws.raise_translated(exc, operation=f"TransactWriteItems ({operation})", resource=self.table_name)
        return True

    def key_names(self, table: str) -> tuple[str, ...]:
        """The key attributes of ``table`` (DescribeTable, once per table)."""
        names = self._output_keys.get(table)
        if names is None:
            with aws.translated("DescribeTable", table):
                described = self._client.describe_table(TableName=table)["Table"]
            names = tuple(str(part["AttributeName"]) for part in described["KeySchema"])
            self._output_keys[table] = names
        return names

    @functools.cached_property
    def _output_keys(self) -> dict[str, tuple[str, ...]]:
        return {}

    def _update_or_recognise(
        self, lease: Lease, update: LeaseUpdate, *, operation: str, applied: Callable[[Lease], bool]
    ) -> Lease | None:
        result = self._update(lease.lease_key, update, operation=operation)
        if result is not None:
            return result
        current = self.get_lease(lease.lease_key)
        if current is not None and applied(current):
            log.info("lease %s: %s reply was lost but the write was applied", lease.lease_key, operation)
            return current
        return None


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))
