"""The three tables of KCL 3.x: names, keys, indexes and attribute names (docs/kcl-compatibility.md)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker_lib.core.config import validate_app_name
from worker_lib.core.env import env_str, environ
from worker_lib.core.errors import ConfigError


class BillingMode(enum.Enum):
    PAY_PER_REQUEST = "PAY_PER_REQUEST"
    PROVISIONED = "PROVISIONED"


class TableKind(enum.Enum):
    LEASES = "leases"
    WORKER_METRICS = "worker-metrics"
    COORDINATOR_STATE = "coordinator-state"


# --- lease table attributes (KCL names; do not rename) -------------------------------------------------------
# Every attribute, who writes and reads it: docs/attributes.md, "Lease item".
class LeaseAttr:
    LEASE_KEY = "leaseKey"
    LEASE_COUNTER = "leaseCounter"
    LEASE_OWNER = "leaseOwner"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_SUB_SEQUENCE = "checkpointSubSequenceNumber"
    PENDING_CHECKPOINT = "pendingCheckpoint"
    PENDING_CHECKPOINT_SUB_SEQUENCE = "pendingCheckpointSubSequenceNumber"
    # The application state of a two-phase checkpoint (B; KCL's createLease writes an N here). Not modelled: carried
    # in Lease.extra, removed with the pending checkpoint as KCL's updateLease does.
    PENDING_CHECKPOINT_STATE = "pendingCheckpointState"
    OWNER_SWITCHES = "ownerSwitchesSinceCheckpoint"
    PARENT_SHARD_IDS = "parentShardId"
    CHILD_SHARD_IDS = "childShardIds"
    STARTING_HASH_KEY = "startingHashKey"
    ENDING_HASH_KEY = "endingHashKey"
    THROUGHPUT_KBPS = "throughputKBps"
    CHECKPOINT_OWNER = "checkpointOwner"
    ENTITY_TYPE = "entityType"
    STREAM_NAME = "streamName"  # multi-stream leases: the serialized stream identifier
    SHARD_ID = "shardId"  # multi-stream leases: the bare shard id
    # Ours, not KCL's (KCL ignores it): a shard held up by its processor's failures (core.models.ShardBlock).
    FAILURE = "shardleaseFailure"


LEASE_ENTITY_TYPE = "LEASE"


# Every attribute, who writes and reads it: docs/attributes.md, "Worker-metrics item".
class WorkerMetricsAttr:
    WORKER_ID = "wid"
    LAST_UPDATE = "lut"
    STATS = "sts"
    OPERATING_RANGE = "opr"
    ENTITY_TYPE = "entityType"
    # Ours (docs/attributes.md): the worker heartbeat and the leader's assignment notice. KCL readers ignore them.
    HEARTBEAT_COUNTER = "hbc"
    HEARTBEAT_WALL_MS = "hbt"
    HEARTBEAT_INTERVAL_MS = "hbi"
    HEARTBEAT_SESSION = "hbs"
    # The leader's certificate: the counter at which it declared the worker gone (written, conditionally on that
    # counter, before it moves any of the worker's leases); 0 from a leader that certifies but declared nothing.
    HEARTBEAT_GONE = "hbg"
    WORKER_STATE = "wst"
    LIVENESS_MODE = "lvm"
    EVENT_COUNTER = "evc"
    ASSIGNMENT_VERSION = "asv"
    ASSIGNED_KEYS = "asl"
    HANDOFF_REQUESTS = "hrq"
    CAPACITY = "cap"  # CPUs the worker can spend on its leases (docs/assignment.md, light-fleet evening)
    LAG = "lag"  # per lease: MillisBehindLatest of its last batch (docs/operations.md, shardlease status)
    LANES = "lanes"  # per lease processed in lanes: a map of the two below (docs/operations.md, shardlease status)
    LANE_IN_FLIGHT = "rif"  # in a ``lanes`` entry: records read and not yet done
    LANE_WATERMARK_LAG = "wml"  # in a ``lanes`` entry: ms the first record not yet done has waited


WORKER_METRICS_ENTITY_TYPE = "WORKER_METRIC_STATS"


# Every attribute, who writes and reads it: docs/attributes.md, "CoordinatorState items".
class CoordinatorAttr:
    KEY = "key"


@dataclass(frozen=True, kw_only=True)
class IndexSpec:
    name: str
    hash_key: str
    range_key: str | None
    projection: str  # KEYS_ONLY | ALL | INCLUDE


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    kind: TableKind
    suffix: str
    hash_key: str
    indexes: tuple[IndexSpec, ...] = ()
    point_in_time_recovery: bool = False

    def table_name(self, app: str) -> str:
        return validate_app_name(app) + self.suffix

    def attribute_definitions(self) -> list[dict[str, str]]:
        names = [self.hash_key]
        for index in self.indexes:
            names += [index.hash_key] + ([index.range_key] if index.range_key else [])
        seen: dict[str, None] = dict.fromkeys(names)
        return [{"AttributeName": n, "AttributeType": "S"} for n in seen]

    def create_table_request(self, app: str, billing: BillingMode = BillingMode.PAY_PER_REQUEST) -> dict[str, Any]:
        """Arguments for DynamoDB ``CreateTable``; GSIs are created with the table (only an adopted KCL 2.x table gets
        its owner index added later, by ``create-tables``: tables/admin.py)."""
        request: dict[str, Any] = {
            "TableName": self.table_name(app),
            "KeySchema": [{"AttributeName": self.hash_key, "KeyType": "HASH"}],
            "AttributeDefinitions": self.attribute_definitions(),
            "BillingMode": billing.value,
        }
        if billing is BillingMode.PROVISIONED:
            request["ProvisionedThroughput"] = {"ReadCapacityUnits": 10, "WriteCapacityUnits": 10}
        if self.indexes:
            gsis = []
            for index in self.indexes:
                key_schema = [{"AttributeName": index.hash_key, "KeyType": "HASH"}]
                if index.range_key:
                    key_schema.append({"AttributeName": index.range_key, "KeyType": "RANGE"})
                gsi: dict[str, Any] = {
                    "IndexName": index.name,
                    "KeySchema": key_schema,
                    "Projection": {"ProjectionType": index.projection},
                }
                if billing is BillingMode.PROVISIONED:
                    gsi["ProvisionedThroughput"] = {"ReadCapacityUnits": 10, "WriteCapacityUnits": 10}
                gsis.append(gsi)
            request["GlobalSecondaryIndexes"] = gsis
        return request


LEASE_OWNER_INDEX = IndexSpec(
    name="LeaseOwnerToLeaseKeyIndex",
    hash_key=LeaseAttr.LEASE_OWNER,
    range_key=LeaseAttr.LEASE_KEY,
    projection="KEYS_ONLY",
)

LEASES = TableSpec(
    kind=TableKind.LEASES,
    suffix="",
    hash_key=LeaseAttr.LEASE_KEY,
    indexes=(LEASE_OWNER_INDEX,),
    point_in_time_recovery=True,
)
WORKER_METRICS = TableSpec(
    kind=TableKind.WORKER_METRICS, suffix="-WorkerMetricStats", hash_key=WorkerMetricsAttr.WORKER_ID
)
COORDINATOR_STATE = TableSpec(
    kind=TableKind.COORDINATOR_STATE, suffix="-CoordinatorState", hash_key=CoordinatorAttr.KEY
)


def all_specs() -> tuple[TableSpec, ...]:
    return (LEASES, WORKER_METRICS, COORDINATOR_STATE)


def lease_table_name(app: str) -> str:
    return LEASES.table_name(app)


def worker_metrics_table_name(app: str) -> str:
    return WORKER_METRICS.table_name(app)


def coordinator_state_table_name(app: str) -> str:
    return COORDINATOR_STATE.table_name(app)


# --- table layouts ---------------------------------------------------------------------------------------------------

LEADER_ENTITY_TYPE = "LEADER"
"""KCL 3.5's entity type of its leader lock; in single-table mode ours on every leader-state item too (below)."""


@dataclass(frozen=True, kw_only=True)
class ItemPlace:
    """Where one kind of item lives: its table, its hash key attribute, and the ``entityType`` every item of ours
    there carries (None in the three-table layout, where the table says what an item is)."""

    table_name: str
    key_attr: str
    entity_type: str | None = None

    def key(self, value: str) -> dict[str, Any]:
        """The ``Key`` argument of a GetItem/UpdateItem/DeleteItem."""
        return {self.key_attr: {"S": value}}

    def as_stored(self, item: dict[str, Any], canonical_key: str) -> dict[str, Any]:
        """An item built with the three-table key attribute ``canonical_key``, as it is written here: the key under
        this place's attribute, and the entity type added unless the item names its own."""
        if self.key_attr != canonical_key and canonical_key in item:
            item = {k: v for k, v in item.items() if k != canonical_key} | {self.key_attr: item[canonical_key]}
        if self.entity_type is not None and "entityType" not in item:
            item = item | {"entityType": {"S": self.entity_type}}
        return item

    def as_read(self, item: dict[str, Any], canonical_key: str) -> dict[str, Any]:
        """A stored item with its key under ``canonical_key`` again (what the item parsers expect)."""
        if self.key_attr != canonical_key and self.key_attr in item:
            item = {k: v for k, v in item.items() if k != self.key_attr} | {canonical_key: item[self.key_attr]}
        return item


class TableLayout(enum.Enum):
    """Where worker metrics and coordinator state live (docs/kcl-compatibility.md, "Single-table mode").

    THREE_TABLES: KCL 3.0–3.4's layout and the default: ``<app>``, ``<app>-WorkerMetricStats``,
      ``<app>-CoordinatorState``.
    SINGLE_TABLE: KCL 3.5's single-table mode (a new 3.5 application, or one whose table migration is COMPLETE):
      everything in the lease table, keyed by ``leaseKey`` and told apart by ``entityType`` — worker metrics under
      the worker id (``WORKER_METRIC_STATS``), the lock under ``Leader`` (``LEADER``), ``Migration3.0``
      (``CLIENT_VERSION_MIGRATION``), and our own leader state (``LEADER``: the one coordinator type KCL 3.5 reads
      generically, so a KCL leader neither assigns these items as leases nor fails on them).
    """

    THREE_TABLES = "three-tables"
    SINGLE_TABLE = "single-table"

    @classmethod
    def parse(cls, raw: str) -> TableLayout:
        text = raw.strip().lower()
        aliases = {"three-tables": cls.THREE_TABLES, "three": cls.THREE_TABLES, "": cls.THREE_TABLES}
        aliases |= {"single-table": cls.SINGLE_TABLE, "single": cls.SINGLE_TABLE}
        if text not in aliases:
            raise ConfigError(f"invalid table layout {raw!r}: expected three-tables or single-table")
        return aliases[text]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TableLayout:
        """``SHARDLEASE_TABLE_LAYOUT`` (``three-tables``, the default, or ``single-table``)."""
        return cls.parse(env_str(environ(env), "SHARDLEASE_TABLE_LAYOUT"))

    @property
    def single(self) -> bool:
        return self is TableLayout.SINGLE_TABLE

    def specs(self) -> tuple[TableSpec, ...]:
        """The tables this layout needs."""
        return (LEASES,) if self.single else all_specs()

    def worker_metrics(self, app: str) -> ItemPlace:
        if self.single:
            return ItemPlace(
                table_name=lease_table_name(app), key_attr=LeaseAttr.LEASE_KEY, entity_type=WORKER_METRICS_ENTITY_TYPE
            )
        return ItemPlace(table_name=worker_metrics_table_name(app), key_attr=WorkerMetricsAttr.WORKER_ID)

    def coordinator(self, app: str) -> ItemPlace:
        if self.single:
            return ItemPlace(
                table_name=lease_table_name(app), key_attr=LeaseAttr.LEASE_KEY, entity_type=LEADER_ENTITY_TYPE
            )
        return ItemPlace(table_name=coordinator_state_table_name(app), key_attr=CoordinatorAttr.KEY)
