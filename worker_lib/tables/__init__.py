"""Table names, keys, indexes and attribute names: the one place that defines them.

Used by ``shardlease create-tables``, the stores and the CDK constructs alike.
"""

from worker_lib.tables.schema import (
    COORDINATOR_STATE,
    LEASE_OWNER_INDEX,
    LEASES,
    WORKER_METRICS,
    BillingMode,
    TableKind,
    TableSpec,
    all_specs,
)

__all__ = [
    "COORDINATOR_STATE",
    "LEASES",
    "LEASE_OWNER_INDEX",
    "WORKER_METRICS",
    "BillingMode",
    "TableKind",
    "TableSpec",
    "all_specs",
]
