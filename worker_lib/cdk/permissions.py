"""Least-privilege permission sets for the leader and for workers, derived from the calls the code makes.

The DynamoDB actions follow ``worker_lib``'s actual calls: the lease store (GetItem, PutItem, UpdateItem,
DeleteItem, Scan, Query on the ``LeaseOwnerToLeaseKeyIndex`` GSI), the leader lock and coordinator items
(GetItem, PutItem, UpdateItem, DeleteItem), worker metrics (PutItem/UpdateItem by workers; Scan and conditional
DeleteItem of stale entries by the leader), DescribeTable for preflight checks. Kinesis: ListShards and
DescribeStreamSummary for the leader's shard sync; GetShardIterator and GetRecords for workers.

Every action is named (no ``*`` in any action); every resource is a table, the one index, the stream or a KMS key
— except the two services that have no resource-level permissions: X-Ray (``PutTraceSegments``,
``PutTelemetryRecords``, added by the Lambda's active tracing) and CloudWatch ``PutMetricData``, which is
restricted by a ``cloudwatch:namespace`` condition instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_iam as iam

LEADER_LEASE_ACTIONS = (
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Scan",
    "dynamodb:Query",
)
LEADER_WORKER_METRICS_ACTIONS = (
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:Scan",
    "dynamodb:DeleteItem",
)
LEADER_COORDINATOR_ACTIONS = (
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
)
INDEX_QUERY_ACTIONS = ("dynamodb:Query",)
LEADER_STREAM_ACTIONS = ("kinesis:DescribeStreamSummary", "kinesis:ListShards")

WORKER_LEASE_ACTIONS = (
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:PutItem",  # child leases at SHARD_END (conditional on absence)
    "dynamodb:UpdateItem",  # renew, checkpoint, hand off, evict (all conditional)
    "dynamodb:Scan",
    "dynamodb:Query",
)
WORKER_METRICS_ACTIONS = ("dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
WORKER_COORDINATOR_ACTIONS = ("dynamodb:DescribeTable", "dynamodb:GetItem")
WORKER_STREAM_ACTIONS = (
    "kinesis:DescribeStreamSummary",
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
)
# Enhanced fan-out through a consumer the construct created: subscribe and describe, never register.
FANOUT_ACTIONS = ("kinesis:SubscribeToShard", "kinesis:DescribeStreamConsumer")
# The failure destination (worker_lib.processing.destinations): what sending a report calls, on it alone.
FAILURE_QUEUE_ACTIONS = ("sqs:GetQueueUrl", "sqs:SendMessage")
FAILURE_TOPIC_ACTIONS = ("sns:Publish",)
FAILURE_BUCKET_ACTIONS = ("s3:PutObject",)
FAILURE_KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")  # an SSE-KMS queue, topic or bucket
PUT_METRIC_DATA = ("cloudwatch:PutMetricData",)

# Spark sources (worker_lib.spark) record batch ends as items of CoordinatorState keyed "spark-batch#..."
# (worker_lib.spark.planning.batch_item_key): allowed for those keys only, never for the leader lock item.
SPARK_BATCH_KEY_PREFIX = "spark-batch#"
SPARK_BATCH_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",  # deleting committed batch ends, 25 per call
)

# DynamoDB encrypts and decrypts with a customer managed key on the caller's behalf (kms:ViaService).
TABLE_KEY_ACTIONS = (
    "kms:Decrypt",
    "kms:Encrypt",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
    "kms:DescribeKey",
)
STREAM_KEY_ACTIONS = ("kms:Decrypt",)


@dataclass(frozen=True, kw_only=True)
class Permission:
    """One statement: named actions on named resources, optionally conditioned."""

    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wild = [a for a in self.actions if "*" in a]
        if wild:
            raise ValueError(f"wildcard actions are not allowed: {wild}")

    def grant(self, grantee: iam.IGrantable) -> iam.Grant:
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(self.actions),
            resource_arns=list(self.resources),
            conditions=dict(self.conditions) or None,
        )

    def statement(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            actions=list(self.actions), resources=list(self.resources), conditions=dict(self.conditions) or None
        )


def grant_all(grantee: iam.IGrantable, permissions: Sequence[Permission]) -> iam.Grant:
    """Apply every permission to ``grantee``; one combined ``Grant``."""
    grants = [p.grant(grantee) for p in permissions]
    combined = grants[0]
    for grant in grants[1:]:
        combined = combined.combine(grant)
    return combined


def put_metric_data(namespace: str) -> Permission:
    return Permission(
        actions=PUT_METRIC_DATA,
        resources=("*",),  # PutMetricData has no resource-level permissions: the namespace condition scopes it
        conditions={"StringEquals": {"cloudwatch:namespace": namespace}},
    )


def spark_batch_keys_only() -> Mapping[str, Mapping[str, Any]]:
    return {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{SPARK_BATCH_KEY_PREFIX}*"]}}


def via_dynamodb(scope_region: str) -> Mapping[str, Mapping[str, Any]]:
    return {"StringEquals": {"kms:ViaService": f"dynamodb.{scope_region}.{cdk.Aws.URL_SUFFIX}"}}
