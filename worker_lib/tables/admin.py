"""Create the three tables idempotently and wait until they (and their indexes) are ACTIVE."""

from __future__ import annotations

import logging
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError, TableSchemaError
from worker_lib.tables.schema import BillingMode, TableSpec, all_specs

log = logging.getLogger(__name__)


def check_schema(spec: TableSpec, app: str, description: dict[str, Any]) -> None:
    """Raise :class:`TableSchemaError` (one line) unless ``description`` (DescribeTable's ``Table``) has our keys and
    indexes. Used by ``create-tables`` for a table that exists and by every host's start check."""
    name = spec.table_name(app)
    keys = {k["AttributeName"]: k["KeyType"] for k in description.get("KeySchema", [])}
    if keys != {spec.hash_key: "HASH"}:
        raise TableSchemaError(
            f"table {name} exists with key {keys} but shardlease needs hash key {spec.hash_key!r} only"
        )
    existing = {g["IndexName"]: g for g in description.get("GlobalSecondaryIndexes", [])}
    for index in spec.indexes:
        gsi = existing.get(index.name)
        if gsi is None:
            raise TableSchemaError(
                f"table {name} exists without index {index.name}; create it (it can take 15-20 minutes in AWS)"
            )
        gsi_keys = {k["AttributeName"]: k["KeyType"] for k in gsi.get("KeySchema", [])}
        wanted = {index.hash_key: "HASH", **({index.range_key: "RANGE"} if index.range_key else {})}
        if gsi_keys != wanted:
            raise TableSchemaError(f"index {index.name} on {name} has keys {gsi_keys}, expected {wanted}")


def _is_active(description: dict[str, Any]) -> bool:
    if description.get("TableStatus") != "ACTIVE":
        return False
    return all(g.get("IndexStatus", "ACTIVE") == "ACTIVE" for g in description.get("GlobalSecondaryIndexes", []))


def ensure_table(
    spec: TableSpec,
    app: str,
    ddb: Any,
    *,
    billing: BillingMode = BillingMode.PAY_PER_REQUEST,
    clock: Clock = SYSTEM_CLOCK,
    timeout_s: float = 300.0,
    poll_s: float = 1.0,
) -> bool:
    """Create ``spec``'s table for ``app`` unless it exists; wait for ACTIVE. Returns True if it was created.

    An existing table with other keys or without the required index raises :class:`TableSchemaError`.
    """
    name = spec.table_name(app)
    created = False
    description = _describe(ddb, name)
    if description is None:
        try:
            ddb.create_table(**spec.create_table_request(app, billing))
            created = True
            log.info("created table %s", name)
        except Exception as exc:
            if aws.error_code(exc) != "ResourceInUseException":  # a concurrent create-tables won the race
                aws.raise_translated(exc, operation="CreateTable", resource=name)
        description = _describe(ddb, name)
        if description is None:
            raise DependencyError(f"table {name} was created but cannot be described")
    check_schema(spec, app, description)
    deadline = clock.monotonic() + timeout_s
    while not _is_active(description):
        if clock.monotonic() > deadline:
            raise DependencyError(f"table {name} did not become ACTIVE within {timeout_s:.0f} s")
        clock.sleep(poll_s)
        description = _describe(ddb, name) or description
    if created and spec.point_in_time_recovery:
        _enable_pitr(ddb, name)
    return created


def _enable_pitr(ddb: Any, name: str) -> None:
    """Point-in-time recovery on the lease table: checkpoints are the one state that cannot be rebuilt."""
    try:
        ddb.update_continuous_backups(
            TableName=name, PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True}
        )
    except Exception as exc:  # emulators (dynalite) lack the API; a missing backup setting is not fatal
        reason = aws.translate(exc, operation="UpdateContinuousBackups")
        log.warning("could not enable point-in-time recovery on %s: %s", name, reason)


def _describe(ddb: Any, name: str) -> dict[str, Any] | None:
    try:
        return dict(ddb.describe_table(TableName=name)["Table"])
    except Exception as exc:
        if aws.error_code(exc) == "ResourceNotFoundException":
            return None
        aws.raise_translated(exc, operation="DescribeTable", resource=name)


def ensure_tables(
    app: str,
    ddb: Any,
    *,
    billing: BillingMode = BillingMode.PAY_PER_REQUEST,
    clock: Clock = SYSTEM_CLOCK,
    timeout_s: float = 300.0,
) -> dict[str, bool]:
    """All three tables; returns table name → whether it was created now."""
    return {
        spec.table_name(app): ensure_table(spec, app, ddb, billing=billing, clock=clock, timeout_s=timeout_s)
        for spec in all_specs()
    }
