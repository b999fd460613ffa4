"""The three KCL 3.x tables, declared from :mod:`worker_lib.tables.schema` (never re-declared here).

Each table is built from the schema's own ``CreateTable`` request (``TableSpec.create_table_request``), so the
names, keys, attribute types, the GSI, its projection and the provisioned throughput CDK deploys are exactly what
``shardlease create-tables`` creates. The GSI is part of the table resource, i.e. created with the table.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from constructs import Construct

from worker_lib.tables.schema import BillingMode, TableKind, TableSpec, all_specs

_CONSTRUCT_IDS = {
    TableKind.LEASES: "LeaseTable",
    TableKind.WORKER_METRICS: "WorkerMetricStatsTable",
    TableKind.COORDINATOR_STATE: "CoordinatorStateTable",
}


_ATTRIBUTE_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}


def _attribute(name: str, types: dict[str, str]) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=_ATTRIBUTE_TYPES[types[name]])


def _key(key_schema: list[dict[str, str]], key_type: str) -> str | None:
    return next((k["AttributeName"] for k in key_schema if k["KeyType"] == key_type), None)


def build_table(
    scope: Construct,
    spec: TableSpec,
    *,
    app: str,
    billing: BillingMode,
    removal_policy: cdk.RemovalPolicy,
    encryption_key: kms.IKey | None,
) -> dynamodb.Table:
    request: dict[str, Any] = spec.create_table_request(app, billing)
    types = {a["AttributeName"]: a["AttributeType"] for a in request["AttributeDefinitions"]}
    hash_key = _key(request["KeySchema"], "HASH")
    assert hash_key is not None
    range_key = _key(request["KeySchema"], "RANGE")
    throughput = request.get("ProvisionedThroughput", {})
    table = dynamodb.Table(
        scope,
        _CONSTRUCT_IDS[spec.kind],
        table_name=request["TableName"],
        partition_key=_attribute(hash_key, types),
        sort_key=_attribute(range_key, types) if range_key else None,
        billing_mode=dynamodb.BillingMode(request["BillingMode"]),
        read_capacity=throughput.get("ReadCapacityUnits"),
        write_capacity=throughput.get("WriteCapacityUnits"),
        encryption=(
            dynamodb.TableEncryption.CUSTOMER_MANAGED if encryption_key else dynamodb.TableEncryption.AWS_MANAGED
        ),
        encryption_key=encryption_key,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=spec.point_in_time_recovery
        ),
        removal_policy=removal_policy,
        deletion_protection=removal_policy == cdk.RemovalPolicy.RETAIN and spec.kind is TableKind.LEASES,
    )
    for gsi in request.get("GlobalSecondaryIndexes", []):
        gsi_throughput = gsi.get("ProvisionedThroughput", {})
        gsi_range = _key(gsi["KeySchema"], "RANGE")
        gsi_hash = _key(gsi["KeySchema"], "HASH")
        assert gsi_hash is not None
        table.add_global_secondary_index(
            index_name=gsi["IndexName"],
            partition_key=_attribute(gsi_hash, types),
            sort_key=_attribute(gsi_range, types) if gsi_range else None,
            projection_type=dynamodb.ProjectionType(gsi["Projection"]["ProjectionType"]),
            read_capacity=gsi_throughput.get("ReadCapacityUnits"),
            write_capacity=gsi_throughput.get("WriteCapacityUnits"),
        )
    return table


def build_tables(
    scope: Construct,
    *,
    app: str,
    billing: BillingMode,
    removal_policy: cdk.RemovalPolicy,
    encryption_key: kms.IKey | None,
    specs: tuple[TableSpec, ...] | None = None,
) -> dict[TableKind, dynamodb.Table]:
    return {
        spec.kind: build_table(
            scope, spec, app=app, billing=billing, removal_policy=removal_policy, encryption_key=encryption_key
        )
        for spec in (specs or all_specs())
    }
