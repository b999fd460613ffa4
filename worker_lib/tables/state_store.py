"""``<app>-CoordinatorState``: small items keyed by ``key`` (KCL: the ``Leader`` lock, ``Migration3.0``; ours: the
published lease cap); in KCL 3.5's single-table mode the same items in the lease table, keyed by ``leaseKey`` and
marked ``entityType = LEADER`` (:class:`~worker_lib.tables.schema.TableLayout`). Generic on purpose: any leader
state fits. Every write is conditional; losing a condition is ``False``, not an exception; any other botocore error
becomes one of :mod:`worker_lib.core.errors`.

Values are plain Python (str, int, float, bool, None, lists/tuples, dicts, sets); numbers come back as ``int`` or
``float``, sets as lists. In ``expected`` mappings, ``None`` means "the attribute is absent".
"""

from __future__ import annotations

import collections
import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.tables.coordinator_items import (
    EXPIRY_OBSERVATIONS_KEY,
    KEY,
    LEASE_CAP_KEY,
    RECENT_DECISIONS_KEY,
    ExpiryObservationsAttr,
    LeaseCapAttr,
    from_item,
    plain_item,
    to_attribute,
)
from worker_lib.tables.schema import ItemPlace, TableLayout
from worker_lib.tables.store import TableStore

log = logging.getLogger(__name__)


class CoordinatorStateStore(TableStore):
    """Small state items keyed by name (see the module); in KCL 3.5's single-table mode in the lease table, keyed by
    ``leaseKey``."""

    @classmethod
    def place(cls, app: str, layout: TableLayout) -> ItemPlace:
        return layout.coordinator(app)

    def get(self, key: str) -> dict[str, Any] | None:
        """A strongly consistent read of one item (plain values), or ``None``."""
        with aws.translated("dynamodb GetItem", self.table_name):
            response = self._client.get_item(TableName=self.table_name, Key=self._place.key(key), ConsistentRead=True)
        item = response.get("Item")
        return from_item(self._place.as_read(item, KEY)) if item else None

    def put(self, key: str, attrs: Mapping[str, Any]) -> None:
        """Write the item ``key`` unconditionally (state whose every version is a fact, e.g. observations)."""
        item = self._place.as_stored(plain_item(key, attrs), KEY)
        with aws.translated("dynamodb PutItem", self.table_name):
            self._client.put_item(TableName=self.table_name, Item=item)

    def put_if_absent(self, key: str, attrs: Mapping[str, Any]) -> bool:
        """Create the item ``key`` with ``attrs``; False if an item with that key already exists."""
        item = self._place.as_stored(plain_item(key, attrs), KEY)
        return self._conditional(
            "PutItem",
            self._client.put_item,
            TableName=self.table_name,
            Item=item,
            ConditionExpression="attribute_not_exists(#k)",
            ExpressionAttributeNames={"#k": self._place.key_attr},
        )

    def update_if(self, key: str, attrs: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
        """Set ``attrs`` (``None`` removes) if the item exists and every ``expected`` attribute has the given value
        (``None``: absent). False if the item is missing or a condition does not hold."""
        if not attrs:
            raise ValueError("update_if needs at least one attribute to write")
        if KEY in attrs or self._place.key_attr in attrs:
            raise ValueError(f"the key attribute {KEY!r} cannot be updated")
        names: dict[str, str] = {"#k": self._place.key_attr}
        values: dict[str, Any] = {}
        written = _bind("a", attrs, names, values)
        sets = [f"#{p} = :{p}" for p, present in written if present]
        removes = [f"#{p}" for p, present in written if not present]
        conditions = _expected(expected, names, values)
        expression = " ".join(
            part
            for part in (f"SET {', '.join(sets)}" if sets else "", f"REMOVE {', '.join(removes)}" if removes else "")
            if part
        )
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": self._place.key(key),
            "UpdateExpression": expression,
            "ConditionExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        return self._conditional("UpdateItem", self._client.update_item, **kwargs)

    def delete_if(self, key: str, expected: Mapping[str, Any]) -> bool:
        """Delete the item if it exists and every ``expected`` attribute has the given value (``None``: absent)."""
        names: dict[str, str] = {"#k": self._place.key_attr}
        values: dict[str, Any] = {}
        conditions = _expected(expected, names, values)
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": self._place.key(key),
            "ConditionExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        return self._conditional("DeleteItem", self._client.delete_item, **kwargs)

    def _conditional(self, operation: str, call: Any, **kwargs: Any) -> bool:
        try:
            call(**kwargs)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            if aws.is_conditional_check_failed(exc):
                return False
            aws.raise_translated(exc, operation=f"dynamodb {operation}", resource=self.table_name)
        return True


def _bind(
    prefix: str, attrs: Mapping[str, Any], names: dict[str, str], values: dict[str, Any]
) -> list[tuple[str, bool]]:
    """Name each attribute ``#<prefix>i`` (and its value ``:<prefix>i``, unless it is ``None``) in ``names`` and
    ``values``; returns each placeholder with whether it has a value."""
    bound: list[tuple[str, bool]] = []
    for i, (name, value) in enumerate(attrs.items()):
        names[f"#{prefix}{i}"] = name
        if value is not None:
            values[f":{prefix}{i}"] = to_attribute(value)
        bound.append((f"{prefix}{i}", value is not None))
    return bound


def _expected(expected: Mapping[str, Any], names: dict[str, str], values: dict[str, Any]) -> list[str]:
    """The conditions of a write on an existing item (``#k`` in ``names``) whose ``expected`` attributes have the given
    values (``None``: absent)."""
    return ["attribute_exists(#k)"] + [
        f"#{p} = :{p}" if present else f"attribute_not_exists(#{p})"
        for p, present in _bind("e", expected, names, values)
    ]


class LeaseCapRecorder:
    """The lease-cap coordinator item, kept current: ``MaxLeasesPerWorker`` = the cap the leader used, with the shard
    and worker counts it came from. Written only when it changes, conditional on the value read (two leaders racing
    cannot interleave a stale value; the loser simply re-reads next cycle). The cap itself is recomputed every
    cycle from live counts, so this item is for operators and status tools, never an input that can go stale."""

    KEY = LEASE_CAP_KEY

    def __init__(self, store: CoordinatorStateStore) -> None:
        self._store = store
        self._last: tuple[int | None, int, int] | None = None

    def record(self, cap: int | None, *, shards: int, workers: int) -> None:
        current = (cap, shards, workers)
        if current == self._last:
            return
        item = self._store.get(self.KEY)
        attrs = {
            LeaseCapAttr.CAP: cap if cap is not None else -1,
            LeaseCapAttr.SHARDS: shards,
            LeaseCapAttr.WORKERS: workers,
        }
        if item is None:
            written = self._store.put_if_absent(self.KEY, {**attrs, LeaseCapAttr.VERSION: 1})
        else:
            seen = item.get(LeaseCapAttr.VERSION, 0)
            written = self._store.update_if(
                self.KEY, {**attrs, LeaseCapAttr.VERSION: int(seen) + 1}, {LeaseCapAttr.VERSION: seen}
            )
        if written:
            self._last = current


RECORDED_FIELDS = ("lease", "from", "to", "kind", "reason")
"""What :class:`DecisionRecorder` keeps of each decision's log fields (with ``at``, when it was recorded)."""


class DecisionRecorder:
    """The leader's latest assignment decisions with their reasons, newest first, for ``shardlease status``: one
    item, ``RecentDecisions``, written unconditionally (it is a display, last writer wins) only after a run that
    decided something, so a quiet fleet costs nothing. A new leader starts a new list."""

    KEY = RECENT_DECISIONS_KEY
    KEEP = 20

    def __init__(self, store: CoordinatorStateStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._clock = clock
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.KEEP)

    def record(self, decisions: Sequence[DecisionLike]) -> None:
        if not decisions:
            return
        at_ms = int(self._clock.wall() * 1000)
        for decision in decisions[-self.KEEP :]:  # the deque would push out any earlier ones
            logged = decision.to_log()
            self._recent.appendleft({**{name: logged[name] for name in RECORDED_FIELDS}, "at": at_ms})
        self._store.put(self.KEY, {"decisions": list(self._recent)})

    @staticmethod
    def read(store: CoordinatorStateStore) -> list[dict[str, Any]]:
        """The recorded decisions, newest first (empty when none or unreadable)."""
        item = store.get(DecisionRecorder.KEY) or {}
        decisions = item.get("decisions")
        return [d for d in decisions if isinstance(d, dict)] if isinstance(decisions, list) else []


class DecisionLike(Protocol):
    def to_log(self) -> Mapping[str, Any]:
        """The decision's log fields (:meth:`worker_lib.assignment.plan.Decision.to_log`); those named in
        :data:`RECORDED_FIELDS` are recorded."""
        ...


class ExpiryObservationStore:
    """The leader's lease-expiry observations, kept in ``<app>-CoordinatorState`` so that the next leader (the next
    Lambda invocation, a host that took over after a crash) need not start watching every counter from zero
    (docs/failover.md). One item, ``LeaseExpiryObservations``: ``obs`` = zlib-compressed JSON of
    ``[lease key, counter, wall epoch seconds since which the counter stood still]``, written unconditionally by
    the lock holder after each full cycle — every version is a set of facts, so last-writer-wins is safe; the reader
    trusts the dates only up to ``max_clock_skew_ms`` (:meth:`~worker_lib.assignment.snapshot.ExpiryTracker.restore`).
    """

    KEY = EXPIRY_OBSERVATIONS_KEY
    MAX_BYTES = 300_000  # DynamoDB items hold 400 KB; beyond this (about 30 000 leases) nothing is kept

    def __init__(self, store: CoordinatorStateStore, *, max_clock_skew_ms: int) -> None:
        self._store = store
        self.skew_s = max_clock_skew_ms / 1000

    def save(self, entries: list[tuple[str, int, float]]) -> bool:
        blob = zlib.compress(json.dumps([[k, c, round(w, 3)] for k, c, w in entries]).encode(), 6)
        if len(blob) > self.MAX_BYTES:
            log.warning("not keeping %d expiry observations: %d bytes compressed", len(entries), len(blob))
            return False
        self._store.put(
            self.KEY, {ExpiryObservationsAttr.OBSERVATIONS: blob, ExpiryObservationsAttr.COUNT: len(entries)}
        )
        return True

    def load(self) -> list[tuple[str, int, float]]:
        item = self._store.get(self.KEY)
        raw = item.get(ExpiryObservationsAttr.OBSERVATIONS) if item else None
        if not isinstance(raw, bytes | bytearray):
            return []
        try:
            entries = json.loads(zlib.decompress(bytes(raw)))
            return [(str(k), int(c), float(w)) for k, c, w in entries]
        except (ValueError, TypeError, zlib.error) as exc:
            log.warning("ignoring unreadable expiry observations: %s", exc)
            return []
