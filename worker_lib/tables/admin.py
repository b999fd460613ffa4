"""Create the three tables idempotently and wait until they (and their indexes) are ACTIVE; adopt a KCL 2.x lease
table (add the owner index) and record KCL's client-version migration item."""

from __future__ import annotations

import logging
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock, wall_millis
from worker_lib.core.errors import ConfigError, CredentialsError, DependencyError, TableSchemaError
from worker_lib.tables.coordinator_items import (
    CLIENT_VERSION_3X,
    CLIENT_VERSIONS_2X_MODE,
    LOCK_KEY,
    MIGRATION_KEY,
    TABLE_MIGRATION_COMPLETE,
    TABLE_MIGRATION_KEY,
    TABLE_MIGRATION_STATUS,
    migration_attrs,
    migration_version,
)
from worker_lib.tables.schema import BillingMode, TableLayout, TableSpec
from worker_lib.tables.state_store import CoordinatorStateStore

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
                f"table {name} exists without index {index.name} (a KCL 2.x table?): run `shardlease create-tables` "
                "to add it (15-20 minutes in AWS; the table stays in use)"
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

    An existing table without our index gets it (a KCL 2.x lease table); one with other keys, or with an index of
    our name on other keys, raises :class:`TableSchemaError`.
    """
    name = spec.table_name(app)
    created = False
    description = _describe(ddb, name)
    if description is not None:
        description = _add_missing_indexes(spec, app, ddb, description, billing)
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


def _add_missing_indexes(
    spec: TableSpec, app: str, ddb: Any, description: dict[str, Any], billing: BillingMode
) -> dict[str, Any]:
    """Add the indexes an existing table lacks — a KCL 2.x lease table has no ``LeaseOwnerToLeaseKeyIndex`` — with
    UpdateTable. The table stays in use while DynamoDB builds the index (15–20 minutes in AWS); until then workers
    find their leases with a scan (DynamoDBLeaseStore.list_lease_keys_for_owner)."""
    existing = {g["IndexName"] for g in description.get("GlobalSecondaryIndexes", [])}
    # The index follows the table's own billing (KCL 2.x created provisioned tables by default): DynamoDB rejects
    # provisioned throughput on an index of an on-demand table, and requires it on a provisioned one.
    table_billing = description.get("BillingModeSummary", {}).get("BillingMode", BillingMode.PROVISIONED.value)
    request = spec.create_table_request(app, BillingMode(table_billing))
    missing = [g for g in request.get("GlobalSecondaryIndexes", []) if g["IndexName"] not in existing]
    if not missing:
        return description
    name = spec.table_name(app)
    for gsi in missing:  # DynamoDB accepts one index creation per UpdateTable
        log.info("adding index %s to the existing table %s (a KCL 2.x lease table?)", gsi["IndexName"], name)
        try:
            ddb.update_table(
                TableName=name,
                AttributeDefinitions=request["AttributeDefinitions"],
                GlobalSecondaryIndexUpdates=[{"Create": gsi}],
            )
        except Exception as exc:
            aws.raise_translated(exc, operation="UpdateTable (add index)", resource=name)
    return _describe(ddb, name) or description


def ensure_migration_state(
    app: str,
    ddb: Any,
    *,
    modified_by: str,
    clock: Clock = SYSTEM_CLOCK,
    layout: TableLayout = TableLayout.THREE_TABLES,
) -> str:
    """KCL's ``Migration3.0`` item in ``<app>-CoordinatorState``: create it as a KCL 3.x worker configured for 3.x
    does when there is none (a table from KCL 2.x, or a new one), so that a Java fleet started on this application
    later runs in 3.x mode too; returns the client version the item records.

    A version in which a Java fleet still takes leases the 2.x way (``CLIENT_VERSION_2X``,
    ``CLIENT_VERSION_UPGRADE_FROM_2X``) is left alone, with one warning: our leader's assignments and 2.x-style lease
    stealing would move leases back and forth; finish that migration (or roll it back) with KCL's tool first."""
    store = CoordinatorStateStore(app, client=ddb, clock=clock, layout=layout)
    found = store.get(MIGRATION_KEY)
    if found is None:
        if store.put_if_absent(MIGRATION_KEY, migration_attrs(modified_by=modified_by, now_ms=wall_millis(clock))):
            log.info("recorded client version %s in %s (%s)", CLIENT_VERSION_3X, store.table_name, MIGRATION_KEY)
            return CLIENT_VERSION_3X
        found = store.get(MIGRATION_KEY) or {}  # another writer created it between our read and our write
    version = migration_version(found) or "unreadable"
    if version in CLIENT_VERSIONS_2X_MODE:
        log.warning(
            "%s in %s says %s: a KCL fleet on this application takes leases the 2.x way; complete or roll back its "
            "migration with KCL's migration tool before running shardlease workers beside it",
            MIGRATION_KEY,
            store.table_name,
            version,
        )
    return version


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
    layout: TableLayout | None = None,
) -> dict[str, bool]:
    """The layout's tables (three, or the lease table alone in KCL 3.5's single-table mode; default
    ``SHARDLEASE_TABLE_LAYOUT``), adding the owner index to a KCL 2.x lease table, and KCL's migration item recording
    client version 3.x when there is none; returns table name → whether it was created now.

    Three tables are refused (:class:`ConfigError`, nothing created) beside a lease table a KCL 3.5 application
    runs in single-table mode: a new ``<app>-CoordinatorState`` would make that application believe its table
    migration had never started."""
    layout = layout or TableLayout.from_env()
    lease_spec, *others = layout.specs()
    # The lease table first: its schema is checked before the layout check reads items from it.
    created = {
        lease_spec.table_name(app): ensure_table(
            lease_spec, app, ddb, billing=billing, clock=clock, timeout_s=timeout_s
        )
    }
    check_layout(app, ddb, layout)
    for spec in others:
        created[spec.table_name(app)] = ensure_table(spec, app, ddb, billing=billing, clock=clock, timeout_s=timeout_s)
    ensure_migration_state(app, ddb, modified_by="shardlease", clock=clock, layout=layout)
    return created


def check_layout(app: str, ddb: Any, layout: TableLayout) -> None:
    """One clear error when the tables are laid out otherwise than configured (docs/kcl-compatibility.md,
    "Single-table mode"):

    - three tables configured, no ``<app>-CoordinatorState``, and KCL 3.5 single-table items (``Migration3.0`` or
      ``Leader``) in the lease table;
    - single table configured while ``<app>-CoordinatorState`` exists without a COMPLETE table migration (a KCL
      3.0–3.4 application, or one in the middle of KCL's migration: its state is still in the other tables)."""
    try:
        legacy = _describe(ddb, TableLayout.THREE_TABLES.coordinator(app).table_name) is not None
    except CredentialsError:
        # A single-table deployment grants nothing on a table that should not exist (AccessDenied): nothing to check.
        log.debug("cannot describe %s: layout check skipped", TableLayout.THREE_TABLES.coordinator(app).table_name)
        return
    lease_table = TableLayout.SINGLE_TABLE.coordinator(app)
    if not layout.single:
        if legacy or _describe(ddb, lease_table.table_name) is None:
            return
        for key in (MIGRATION_KEY, LOCK_KEY):
            with aws.translated("dynamodb GetItem", lease_table.table_name):
                item = ddb.get_item(TableName=lease_table.table_name, Key=lease_table.key(key), ConsistentRead=True)
            if "Item" in item:
                raise ConfigError(
                    f"{lease_table.table_name} holds KCL 3.5 single-table items ({key}) and there is no "
                    f"{TableLayout.THREE_TABLES.coordinator(app).table_name}: set SHARDLEASE_TABLE_LAYOUT=single-table "
                    "(create-tables --table-layout single-table)"
                )
        return
    if legacy:
        state = CoordinatorStateStore(app, client=ddb, layout=TableLayout.THREE_TABLES).get(TABLE_MIGRATION_KEY)
        status = (state or {}).get(TABLE_MIGRATION_STATUS)
        if status != TABLE_MIGRATION_COMPLETE:
            raise ConfigError(
                f"single-table layout configured, but {TableLayout.THREE_TABLES.coordinator(app).table_name} exists "
                f"and its table migration is {status or 'not started'}: finish KCL's table migration (status "
                "COMPLETE) or use the three-table layout"
            )
