"""The three tables of KCL 3.x: names, keys, indexes and attribute names (docs/kcl-compatibility.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from worker_lib.core.config import validate_app_name


class BillingMode(enum.Enum):
    PAY_PER_REQUEST = "PAY_PER_REQUEST"
    PROVISIONED = "PROVISIONED"


class TableKind(enum.Enum):
    LEASES = "leases"
    WORKER_METRICS = "worker-metrics"
    COORDINATOR_STATE = "coordinator-state"


# --- lease table attributes (KCL names; do not rename) -------------------------------------------------------
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


LEASE_ENTITY_TYPE = "LEASE"


class WorkerMetricsAttr:
    WORKER_ID = "wid"
    LAST_UPDATE = "lut"
    STATS = "sts"
    OPERATING_RANGE = "opr"
    ENTITY_TYPE = "entityType"
    # Ours (docs/failover.md): the worker heartbeat and the leader's assignment notice. KCL readers ignore them.
    HEARTBEAT_COUNTER = "hbc"
    HEARTBEAT_WALL_MS = "hbt"
    HEARTBEAT_INTERVAL_MS = "hbi"
    HEARTBEAT_SESSION = "hbs"
    WORKER_STATE = "wst"
    LIVENESS_MODE = "lvm"
    EVENT_COUNTER = "evc"
    ASSIGNMENT_VERSION = "asv"
    ASSIGNED_KEYS = "asl"
    HANDOFF_REQUESTS = "hrq"
    CAPACITY = "cap"  # CPUs the worker can spend on its leases (docs/assignment.md, light-fleet evening)


WORKER_METRICS_ENTITY_TYPE = "WORKER_METRIC_STATS"


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
