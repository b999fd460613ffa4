"""``<app>-CoordinatorState`` items: their keys, attribute names, and the functions that build and read them.

Three writers share the table, each with its own items, all keyed by ``key`` (S):

* the leader lock (:mod:`worker_lib.leader.lock`): the item ``Leader`` in the format of the DynamoDB lock client KCL
  uses (``ownerName``, ``leaseDuration`` (S, ms), ``recordVersionNumber`` (S), and ``isReleased`` (S ``"1"``) only
  once released) plus, as the lock client's "additional attributes", our ``expiresAtMillis``, ``lastUpdatedMillis``
  and ``releaseAtMillis`` (docs/leader-lock.md);
* the leader's state store (:mod:`worker_lib.tables.state_store`): items of plain values — ``MaxLeasesPerWorker``
  (the published lease cap) and ``LeaseExpiryObservations`` (docs/failover.md);
* the liveness mode (:mod:`worker_lib.leases.mode_store`): ``LivenessMode`` with ``mode`` and, during a switch,
  ``target`` (docs/liveness-modes.md), recorded by the first leader and changed by ``shardlease liveness``;
* the Spark source (:mod:`worker_lib.spark.batches`): one item per shard per micro-batch, recording where its read
  ended (docs/spark.md).

Items use DynamoDB's low-level attribute-value shapes (``{"S": ...}``), as the clients send and receive them.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

from worker_lib.tables.schema import LEADER_ENTITY_TYPE, CoordinatorAttr

KEY = CoordinatorAttr.KEY
Item = dict[str, Any]

# --- item keys ----------------------------------------------------------------------------------------------------
LOCK_KEY = "Leader"
LOCK_RELEASED_VALUE = "1"  # what the lock client writes into isReleased (a string)
LOCK_ENTITY_TYPE = LEADER_ENTITY_TYPE
LEASE_CAP_KEY = "MaxLeasesPerWorker"
EXPIRY_OBSERVATIONS_KEY = "LeaseExpiryObservations"
LIVENESS_MODE_KEY = "LivenessMode"
RECENT_DECISIONS_KEY = "RecentDecisions"  # the leader's last assignment decisions, for `shardlease status`
DESIRED_WORKERS_KEY = "DesiredWorkers"  # the fleet size the load needs, and why (docs/autoscaling.md)


def key_of(item_key: str) -> Item:
    """The ``Key`` argument of a GetItem/UpdateItem/DeleteItem for the item ``item_key``."""
    return {KEY: {"S": item_key}}


# --- the leader lock ------------------------------------------------------------------------------------------------


# Every attribute, who writes and reads it: docs/attributes.md, "The leader lock".
class LockAttr:
    OWNER = "ownerName"
    DURATION = "leaseDuration"
    VERSION = "recordVersionNumber"
    # The lock client reads a lock as released when the attribute is *present*, whatever its value, and writes the
    # string "1" on release (it conditions a takeover of a released lock on ``isReleased = "1"``).
    RELEASED = "isReleased"
    ENTITY_TYPE = "entityType"  # KCL 3.5 writes "LEADER" (EntityType.LEADER_LOCK) as an additional attribute
    EXPIRES = "expiresAtMillis"
    UPDATED = "lastUpdatedMillis"
    RELEASE_AT = "releaseAtMillis"


@dataclass(frozen=True, kw_only=True)
class LockRecord:
    """The lock item as read; an attribute of the wrong shape reads as absent (``None``)."""

    owner: str | None
    version: str | None
    duration_ms: int | None
    released: bool
    expires_ms: int | None
    updated_ms: int | None
    release_at_ms: int | None


def _s(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name, {})
    return str(value["S"]) if "S" in value else None


def _n(item: Mapping[str, Any], name: str) -> int | None:
    try:
        return int(item.get(name, {})["N"])
    except (KeyError, TypeError, ValueError):
        return None


def _released(item: Mapping[str, Any]) -> bool:
    """The lock client's rule: released when ``isReleased`` is present. One exception: shardlease up to 0.x wrote
    ``isReleased = false`` (BOOL) on a *held* lock, and a fleet being upgraded still has such holders."""
    marker = item.get(LockAttr.RELEASED)
    if marker is None:
        return False
    return not (isinstance(marker, Mapping) and marker.get("BOOL") is False)


def parse_lock(item: Mapping[str, Any]) -> LockRecord:
    # KCL writes the duration as a string; accept a number too.
    raw_duration = _s(item, LockAttr.DURATION) or item.get(LockAttr.DURATION, {}).get("N")
    try:
        duration_ms: int | None = int(str(raw_duration))
    except (TypeError, ValueError):
        duration_ms = None
    return LockRecord(
        owner=_s(item, LockAttr.OWNER),
        version=_s(item, LockAttr.VERSION),
        duration_ms=duration_ms,
        released=_released(item),
        expires_ms=_n(item, LockAttr.EXPIRES),
        updated_ms=_n(item, LockAttr.UPDATED),
        release_at_ms=_n(item, LockAttr.RELEASE_AT),
    )


def lock_item(*, owner: str, version: str, duration_ms: int, now_ms: int, release_at_ms: int | None) -> Item:
    """A freshly acquired lock: held by ``owner`` until ``now + duration``."""
    item: Item = {
        KEY: {"S": LOCK_KEY},
        LockAttr.OWNER: {"S": owner},
        LockAttr.DURATION: {"S": str(duration_ms)},
        LockAttr.VERSION: {"S": version},
        LockAttr.ENTITY_TYPE: {"S": LOCK_ENTITY_TYPE},
        LockAttr.EXPIRES: {"N": str(now_ms + duration_ms)},
        LockAttr.UPDATED: {"N": str(now_ms)},
    }
    if release_at_ms is not None:
        item[LockAttr.RELEASE_AT] = {"N": str(release_at_ms)}
    return item


def lock_acquire_condition(observed: LockRecord | None) -> dict[str, Any]:
    """The PutItem condition of an acquire: exactly the item that was read (none, malformed, or its version)."""
    if observed is None:
        return {"ConditionExpression": "attribute_not_exists(#k)", "ExpressionAttributeNames": {"#k": KEY}}
    if observed.version is None:  # a malformed item: whoever replaces it first wins
        return {
            "ConditionExpression": "attribute_exists(#k) AND attribute_not_exists(#v)",
            "ExpressionAttributeNames": {"#k": KEY, "#v": LockAttr.VERSION},
        }
    return {
        "ConditionExpression": "#v = :observed",
        "ExpressionAttributeNames": {"#v": LockAttr.VERSION},
        "ExpressionAttributeValues": {":observed": {"S": observed.version}},
    }


def lock_update(
    *,
    owner: str,
    held_version: str,
    version: str,
    duration_ms: int,
    now_ms: int,
    release: bool,
    release_at_ms: int | None,
) -> dict[str, Any]:
    """UpdateItem arguments (without ``TableName``) for a heartbeat or a release by the holder of ``held_version``.

    A heartbeat writes a new ``recordVersionNumber`` and the duration, as the lock client's heartbeat does, and
    extends our expiry by the duration; it removes ``isReleased`` (only an older shardlease holder has one: its
    ``false``). A release sets ``isReleased = "1"`` as the lock client does when it keeps the item, expires the lock
    now and drops the planned release time.
    """
    expires = now_ms if release else now_ms + duration_ms
    names = {
        "#v": LockAttr.VERSION,
        "#e": LockAttr.EXPIRES,
        "#u": LockAttr.UPDATED,
        "#d": LockAttr.DURATION,
        "#r": LockAttr.RELEASED,
        "#o": LockAttr.OWNER,
        "#ra": LockAttr.RELEASE_AT,
    }
    values: dict[str, Any] = {
        ":new": {"S": version},
        ":exp": {"N": str(expires)},
        ":now": {"N": str(now_ms)},
        ":dur": {"S": str(duration_ms)},
        ":me": {"S": owner},
        ":mine": {"S": held_version},
    }
    expression = "SET #v = :new, #e = :exp, #u = :now, #d = :dur"
    if release:
        expression += ", #r = :rel REMOVE #ra"
        values[":rel"] = {"S": LOCK_RELEASED_VALUE}
    elif release_at_ms is not None:
        expression += ", #ra = :ra REMOVE #r"
        values[":ra"] = {"N": str(release_at_ms)}
    else:
        expression += " REMOVE #ra, #r"
    return {
        "Key": key_of(LOCK_KEY),
        "UpdateExpression": expression,
        "ConditionExpression": "#o = :me AND #v = :mine",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }


# --- KCL's client-version migration item ---------------------------------------------------------------------------

MIGRATION_KEY = "Migration3.0"

# KCL 3.5's table migration (coordinator/migration/TableMigrationState.java): kept in <app>-CoordinatorState while
# an application moves its worker metrics and coordinator state into the lease table; COMPLETE = single-table mode.
TABLE_MIGRATION_KEY = "TableMigration3.5"
TABLE_MIGRATION_STATUS = "tm"
TABLE_MIGRATION_COMPLETE = "TABLE_MIGRATION_STATUS_COMPLETE"


# Every attribute, who writes and reads it: docs/attributes.md, "Migration3.0".
class MigrationAttr:
    """KCL 3.x ``MigrationState`` (coordinator/migration/MigrationState.java): the client version the fleet runs in."""

    CLIENT_VERSION = "cv"  # S: a ClientVersion name
    MODIFIED_BY = "mb"  # S: the worker that wrote it
    MODIFIED_AT = "mts"  # N: epoch milliseconds
    HISTORY = "h"  # L of M {cv, mb, mts}: earlier versions, newest first, at most 10
    ENTITY_TYPE = "entityType"  # "CLIENT_VERSION_MIGRATION" from KCL 3.5


CLIENT_VERSION_3X = "CLIENT_VERSION_3X"
CLIENT_VERSION_INIT = "CLIENT_VERSION_INIT"
# A Java fleet in one of these still takes leases the KCL 2.x way (by count, stealing): it does not follow a leader.
CLIENT_VERSIONS_2X_MODE = frozenset({"CLIENT_VERSION_2X", "CLIENT_VERSION_UPGRADE_FROM_2X"})
MIGRATION_ENTITY_TYPE = "CLIENT_VERSION_MIGRATION"


def migration_attrs(*, modified_by: str, now_ms: int) -> dict[str, Any]:
    """The item (plain values) a KCL 3.x worker configured for 3.x (``CLIENT_VERSION_CONFIG_3X``) creates when it
    finds none: version ``CLIENT_VERSION_3X``, with the local ``CLIENT_VERSION_INIT`` it came from as the one history
    entry (AbstractMigrationClientVersionState.ensureDdbStateMatchesClientVersion, MigrationState.update)."""
    stamp = {MigrationAttr.MODIFIED_BY: modified_by, MigrationAttr.MODIFIED_AT: now_ms}
    return {
        MigrationAttr.CLIENT_VERSION: CLIENT_VERSION_3X,
        **stamp,
        MigrationAttr.HISTORY: [{MigrationAttr.CLIENT_VERSION: CLIENT_VERSION_INIT, **stamp}],
        MigrationAttr.ENTITY_TYPE: MIGRATION_ENTITY_TYPE,
    }


def migration_version(attrs: Mapping[str, Any]) -> str | None:
    """The client version a migration item (plain values) records (None when malformed)."""
    version = attrs.get(MigrationAttr.CLIENT_VERSION)
    return version if isinstance(version, str) else None


# --- plain-valued items (the leader's state store) ----------------------------------------------------------------


# Every attribute, who writes and reads it: docs/attributes.md, "MaxLeasesPerWorker".
class LeaseCapAttr:
    CAP = "cap"  # -1: no cap
    SHARDS = "shards"
    WORKERS = "workers"
    VERSION = "version"


# Every attribute, who writes and reads it: docs/attributes.md, "LeaseExpiryObservations".
class ExpiryObservationsAttr:
    OBSERVATIONS = "obs"  # zlib-compressed JSON
    COUNT = "count"


# Every attribute, who writes and reads it: docs/attributes.md, "LivenessMode".
class LivenessModeAttr:
    MODE = "mode"  # "lease" | "worker"
    TARGET = "target"  # absent unless a switch is under way
    UPDATED = "updatedAtMillis"
    UPDATED_BY = "updatedBy"


_SERIALIZER = TypeSerializer()
_DESERIALIZER = TypeDeserializer()


def to_attribute(value: Any) -> Item:
    """A plain Python value (str, int, float, bool, None, bytes, lists/tuples, dicts, sets) as an attribute value."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"DynamoDB cannot store the number {value!r}")
        value = decimal.Decimal(repr(value))
    elif isinstance(value, Mapping):
        return {"M": {k: to_attribute(v) for k, v in value.items()}}
    elif isinstance(value, list | tuple):
        return {"L": [to_attribute(v) for v in value]}
    return dict(_SERIALIZER.serialize(value))


def _plain(value: Any) -> Any:
    if isinstance(value, Binary):
        return bytes(value.value)  # type: ignore[attr-defined]  # boto3 stubs omit Binary.value
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | set):
        return [_plain(v) for v in value]
    return value


def plain_item(item_key: str, attrs: Mapping[str, Any]) -> Item:
    """The item ``item_key`` holding ``attrs`` (plain values)."""
    item = {name: to_attribute(value) for name, value in attrs.items()}
    item[KEY] = {"S": item_key}
    return item


def from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """A low-level item as plain Python values: numbers as ``int`` or ``float``, sets as lists."""
    return {name: _plain(_DESERIALIZER.deserialize(value)) for name, value in item.items()}


# --- Spark batch ends -----------------------------------------------------------------------------------------------


# Every attribute, who writes and reads it: docs/attributes.md, "Spark batch ends".
class BatchEndAttr:
    LEASE_KEY = "lk"
    SEQUENCE = "seq"
    SUB_SEQUENCE = "sub"
    RECORDS = "n"
    BYTES = "b"
    CAUGHT_UP = "cu"
    STARTED = "t0"
    FINISHED = "t1"
    CPU = "cpu"  # CPU seconds the executor spent on the read (the load metric; absent in older items)
    MILLIS_BEHIND = "mbl"  # MillisBehindLatest of the read's last GetRecords (the shard's lag; absent if unknown)
    TTL = "ttl"  # a table with TTL enabled on it sweeps abandoned lineages
    CHILDREN = "ch"
