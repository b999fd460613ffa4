"""``<app>-WorkerMetricStats`` in KCL 3.x's format (docs/kcl-compatibility.md; items in :mod:`.stats_serializer`).

Workers write their metrics unconditionally, as KCL does (each worker owns exactly one item) — as an UpdateItem
that sets ``lut``/``sts``/``opr``, so that the heartbeat and notice attributes (docs/attributes.md: ``hbc``,
``hbt``, ``hbi``, ``wst``, ``evc``, ``asv``, ``asl``) in the same item survive a metrics report. The leader scans all
items and deletes stale ones conditionally on the ``lut`` it saw, so a worker that came back in between keeps its
entry. Items of another ``entityType`` are skipped silently; corrupt items are skipped with one log line naming
only their key and the faulty attribute, never a payload.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence
from typing import Any

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.errors import CorruptItemError
from worker_lib.core.models import WorkerMetricStats, WorkerState
from worker_lib.tables.schema import ItemPlace, TableLayout, WorkerMetricsAttr
from worker_lib.tables.store import TableStore
from worker_lib.workermetrics.stats_serializer import from_item, is_foreign, key_of, number, to_item

__all__ = ["WorkerMetricsStore", "from_item", "is_foreign", "to_item"]

log = logging.getLogger(__name__)
A = WorkerMetricsAttr

MAX_NOTICE_KEYS = 100
"""A notice names at most this many leases (keeps the item small); a larger batch is announced without keys."""


def heartbeat_stamp_ms(wall_s: float) -> int:
    """``hbt`` for a beat sent at wall time ``wall_s``: rounded *up* to the ms, because a new leader dates a beat it
    first sees by ``hbt`` + the skew bound, which must not come before the real send time (docs/failover.md)."""
    return math.ceil(wall_s * 1000)


class WorkerMetricsStore(TableStore):
    """The worker-metrics table. Satisfies the reporter's ``WorkerMetricsSink`` and the leader's source."""

    @classmethod
    def place(cls, app: str, layout: TableLayout) -> ItemPlace:
        # In KCL 3.5's single-table mode the rows live in the lease table, keyed by leaseKey = worker id.
        return layout.worker_metrics(app)

    def put(self, stats: WorkerMetricStats) -> None:
        """Write this worker's metrics (``lut``, ``sts``, ``opr``), unconditionally as KCL does; other attributes
        of the item (heartbeat, notices) are kept."""
        item = self._place.as_stored(to_item(stats), A.WORKER_ID)
        item.pop(self._place.key_attr)
        names = {f"#a{i}": name for i, name in enumerate(item)}
        values = {f":a{i}": value for i, value in enumerate(item.values())}
        expression = "SET " + ", ".join(f"#a{i} = :a{i}" for i in range(len(item)))
        # No lease read (in lanes) any more: drop the last report's lags (lanes)
        gone = [attr for attr in (A.LAG, A.LANES) if attr not in item]
        names.update({f"#r{i}": attr for i, attr in enumerate(gone)})
        if gone:
            expression += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(gone)))
        with aws.translated("dynamodb UpdateItem", self.table_name):
            self._client.update_item(
                TableName=self.table_name,
                Key=self._place.key(stats.worker_id),
                UpdateExpression=expression,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )

    def heartbeat(
        self,
        worker_id: str,
        *,
        interval_ms: int,
        state: WorkerState,
        events: int,
        done_requests: Collection[str] = (),
        liveness: str | None = None,
        session: str | None = None,
    ) -> WorkerMetricStats | None:
        """One heartbeat: ``hbc`` + 1, ``hbt`` = our wall clock (ms), ``hbi``, ``wst``, ``evc``; creates the item
        (with ``lut`` = now) if it does not exist yet, and removes the notice's key list ``asl``. Returns the item as
        it was *before* the beat — so the worker reads the leader's notice (``asv``/``asl``) from the very write that
        consumes it: no read of its own, and the item the leader scans every second stays small — or ``None`` if
        there was no item (the first beat) or it cannot be read. ``done_requests``: hand-off requests (``hrq``)
        this worker is done with, removed in the same write (docs/liveness-modes.md). ``session``: the beating
        process's session (``hbs``)."""
        now_ms = heartbeat_stamp_ms(self._clock.wall())
        names = {
            "#asl": A.ASSIGNED_KEYS,
            "#hbc": A.HEARTBEAT_COUNTER,
            "#hbt": A.HEARTBEAT_WALL_MS,
            "#hbi": A.HEARTBEAT_INTERVAL_MS,
            "#wst": A.WORKER_STATE,
            "#evc": A.EVENT_COUNTER,
            "#lut": A.LAST_UPDATE,
        }
        values: dict[str, Any] = {
            ":now": number(now_ms),
            ":hbi": number(interval_ms),
            ":wst": {"S": state.value},
            ":evc": number(events),
            ":lut": number(now_ms // 1000),
            ":one": number(1),
        }
        expression = (
            "SET #hbt = :now, #hbi = :hbi, #wst = :wst, #evc = :evc, #lut = if_not_exists(#lut, :lut) "
            "ADD #hbc :one REMOVE #asl"
        )
        if liveness is not None:
            names["#lvm"] = A.LIVENESS_MODE
            values[":lvm"] = {"S": liveness}
            expression = expression.replace("SET ", "SET #lvm = :lvm, ", 1)
        if session is not None:
            names["#hbs"] = A.HEARTBEAT_SESSION
            values[":hbs"] = {"S": session}
            expression = expression.replace("SET ", "SET #hbs = :hbs, ", 1)
        if self._place.entity_type is not None:  # the beat may create the item: it must never look like a lease
            names["#et"] = A.ENTITY_TYPE
            values[":et"] = {"S": self._place.entity_type}
            expression = expression.replace("SET ", "SET #et = :et, ", 1)
        if done_requests:
            names["#hrq"] = A.HANDOFF_REQUESTS
            values[":done"] = {"SS": sorted(set(done_requests))}
            expression += " DELETE #hrq :done"
        with aws.translated("dynamodb UpdateItem", self.table_name):
            response = self._client.update_item(
                TableName=self.table_name,
                Key=self._place.key(worker_id),
                UpdateExpression=expression,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_OLD",
            )
        return self._parse(response.get("Attributes"), worker_id)

    def request_handoff(self, worker_id: str, elements: Sequence[str]) -> bool:
        """The leader, in ``worker`` liveness mode: ask ``worker_id`` to hand these leases over (``ADD`` to its
        ``hrq`` set, elements from :func:`handoff_request`). The set stays until the worker removes what it is done
        with, so every later beat of the worker brings the request back — a lost reply cannot lose it. False if
        the worker has no item."""
        if not elements:
            return True
        return self._conditional(
            "UpdateItem",
            worker_id,
            "attribute_exists(#wid)",
            names={"#hrq": A.HANDOFF_REQUESTS, "#wid": self._place.key_attr},
            values={":reqs": {"SS": sorted(set(elements))}},
            UpdateExpression="ADD #hrq :reqs",
        )

    def declare_gone(self, worker_id: str, counter: int) -> bool:
        """The leader's certificate, written before it moves any lease of a silent worker: ``hbg`` = ``counter``,
        on condition that the heartbeat counter still is ``counter``. False if a beat landed meanwhile (the worker
        is alive: move nothing). The worker's next beat reads it back and so learns whether its leases may have
        moved while its fence was out (docs/failover.md)."""
        return self._certify(worker_id, counter, "#hbc = :c")

    def certify_declarations(self, worker_id: str) -> bool:
        """``hbg`` = 0 where it is absent: this leader declares before it moves, so a worker whose fence ran out
        may trust a certificate's absence. Once per worker item; False if the item is gone."""
        return self._certify(worker_id, 0, "attribute_exists(#hbc)", only_if_absent=True)

    def _certify(self, worker_id: str, counter: int, condition: str, *, only_if_absent: bool = False) -> bool:
        return self._conditional(
            "UpdateItem",
            worker_id,
            condition,
            names={"#hbg": A.HEARTBEAT_GONE, "#hbc": A.HEARTBEAT_COUNTER},
            values={":c": number(counter)},
            UpdateExpression="SET #hbg = if_not_exists(#hbg, :c)" if only_if_absent else "SET #hbg = :c",
        )

    def notify_assigned(self, worker_id: str, lease_keys: Sequence[str]) -> bool:
        """The leader's (or a handing-over owner's) notice to ``worker_id``: ``asv`` + 1 and ``asl`` = the keys.
        The worker reads both back from its next heartbeat. False if the worker has no item (nothing to notify:
        it will find the leases with its periodic discovery)."""
        keys = sorted(set(lease_keys))
        if len(keys) > MAX_NOTICE_KEYS:
            keys = []  # announced without keys: the worker queries the GSI instead
        return self._conditional(
            "UpdateItem",
            worker_id,
            "attribute_exists(#wid)",
            names={"#asl": A.ASSIGNED_KEYS, "#asv": A.ASSIGNMENT_VERSION, "#wid": self._place.key_attr},
            values={":keys": {"L": [{"S": key} for key in keys]}, ":one": number(1)},
            UpdateExpression="SET #asl = :keys ADD #asv :one",
        )

    def _conditional(
        self,
        operation: str,
        worker_id: str,
        condition: str,
        *,
        names: dict[str, str],
        values: dict[str, Any],
        **request: Any,
    ) -> bool:
        """One conditional ``UpdateItem`` or ``DeleteItem`` of ``worker_id``'s item (condition as :meth:`_ours` makes
        it); False when the condition failed, a :class:`~worker_lib.core.errors.DependencyError` for anything else."""
        call = self._client.update_item if operation == "UpdateItem" else self._client.delete_item
        try:
            call(
                TableName=self.table_name,
                Key=self._place.key(worker_id),
                **request,
                **self._ours(condition, names=names, values=values),
            )
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            if aws.is_conditional_check_failed(exc):
                return False
            aws.raise_translated(exc, operation=f"dynamodb {operation}", resource=self.table_name)
        return True

    def _ours(self, condition: str, *, names: dict[str, str], values: dict[str, Any]) -> dict[str, Any]:
        """Condition arguments; in single-table mode also "the item is a worker-metrics item", so that a worker id
        equal to some lease key can never touch that lease."""
        if self._place.entity_type is not None:
            condition = f"({condition}) AND #et = :et"
            names = {**names, "#et": A.ENTITY_TYPE}
            values = {**values, ":et": {"S": self._place.entity_type}}
        return {
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }

    def _parse(self, item: Any, worker_id: str) -> WorkerMetricStats | None:
        if not item:
            return None
        item = self._place.as_read(item, A.WORKER_ID)
        if is_foreign(item):
            return None
        if not set(item) - {A.WORKER_ID, A.ENTITY_TYPE}:
            # Nothing but the key: an item being created. DynamoDB writes an item whole, but an emulator may show
            # it between putting the key and applying the update (moto's UpdateItem does): not corrupt, just empty.
            log.debug("worker-metrics item table=%s wid=%s holds only its key: skipped", self.table_name, worker_id)
            return None
        try:
            return from_item(item)
        except CorruptItemError as exc:
            log.warning(
                "skipping corrupt worker-metrics item table=%s wid=%s: %s", self.table_name, worker_id, exc.reason
            )
            return None

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        """One worker's entry (strongly consistent), or ``None`` if absent, foreign or corrupt."""
        with aws.translated("dynamodb GetItem", self.table_name):
            response = self._client.get_item(
                TableName=self.table_name, Key=self._place.key(worker_id), ConsistentRead=True
            )
        return self._parse(response.get("Item"), worker_id)

    def list_all(self, *, consistent: bool = False) -> list[WorkerMetricStats]:
        """Every worker's entry (all scan pages), skipping foreign and corrupt items. Eventually consistent by
        default (half the read cost): nothing unsafe is decided on this read alone (docs/failover.md)."""
        out: list[WorkerMetricStats] = []
        kwargs: dict[str, Any] = {"TableName": self.table_name}
        if consistent:
            kwargs["ConsistentRead"] = True
        if self._place.entity_type is not None:  # single-table mode: the lease table, worker rows only
            kwargs["FilterExpression"] = "#et = :et"
            kwargs["ExpressionAttributeNames"] = {"#et": A.ENTITY_TYPE}
            kwargs["ExpressionAttributeValues"] = {":et": {"S": self._place.entity_type}}
        while True:
            with aws.translated("dynamodb Scan", self.table_name):
                response = self._client.scan(**kwargs)
            for item in response.get("Items", []):
                stats = self._parse(item, key_of(self._place.as_read(item, A.WORKER_ID)))
                if stats is not None:
                    out.append(stats)
            last = response.get("LastEvaluatedKey")
            if not last:
                return out
            kwargs["ExclusiveStartKey"] = last

    def delete_if_heartbeat_unchanged(self, worker_id: str, heartbeat_counter: int) -> bool:
        """Delete a departed worker's item only if its heartbeat counter is still the one seen (a restart under the
        same id beats, and keeps its item); False if it changed or is gone."""
        return self._conditional(
            "DeleteItem",
            worker_id,
            "#hbc = :seen",
            names={"#hbc": A.HEARTBEAT_COUNTER},
            values={":seen": number(heartbeat_counter)},
        )

    def delete_if_unchanged(self, worker_id: str, last_update_epoch_s: float) -> bool:
        """Delete a stale entry only if its ``lut`` is still the one seen; False if it changed or is gone."""
        return self._conditional(
            "DeleteItem",
            worker_id,
            "#lut = :seen",
            names={"#lut": A.LAST_UPDATE},
            values={":seen": number(int(last_update_epoch_s))},
        )
