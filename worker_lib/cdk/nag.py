"""The cdk-nag (AwsSolutions) findings :class:`~worker_lib.cdk.coordination.ShardleaseCoordination` accepts, each with
its reason and scoped to the one construct it concerns."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

NAG_ACKNOWLEDGEMENTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "AwsSolutions-IAM5[Resource::*]",
        ("LeaderRole",),
        "Only xray:PutTraceSegments and xray:PutTelemetryRecords (added by active tracing) use Resource '*': X-Ray has "
        "no resource-level permissions. Every DynamoDB, Kinesis and Logs action is scoped to its table, index, "
        "stream or log group.",
    ),
    (
        "AwsSolutions-IAM5[Resource::*]",
        ("WorkerPolicy",),
        "Only cloudwatch:PutMetricData uses Resource '*' (it has no resource-level permissions); it is restricted "
        "to the application's namespace by a cloudwatch:namespace condition.",
    ),
    (
        "AwsSolutions-IAM5[Resource::*]",
        ("SparkWorkerPolicy",),
        "Only cloudwatch:PutMetricData uses Resource '*' (it has no resource-level permissions); it is restricted "
        "to the application's namespace by a cloudwatch:namespace condition.",
    ),
    (
        "AwsSolutions-L1",
        ("Leader",),
        "Python 3.13 is a current, supported Lambda runtime, pinned together with the public Powertools layer "
        "published and verified for it (AWSLambdaPowertoolsPythonV3-python313-arm64); move both together.",
    ),
    (
        "AwsSolutions-DDB3",
        ("WorkerMetricStatsTable",),
        "Worker metrics are rewritten by every worker every 30 s and swept by the leader; restoring old entries "
        "would feed stale load into assignment. Point-in-time recovery is on the lease table, which holds the "
        "checkpoints.",
    ),
    (
        "AwsSolutions-DDB3",
        ("CoordinatorStateTable",),
        "Holds the leader lock (valid for 30 s) and derived leader state, rebuilt by the next leader cycle; "
        "restoring an old lock item would be harmful. Point-in-time recovery is on the lease table.",
    ),
)
"""(rule, construct path below this construct, reason): the only cdk-nag findings accepted, with their reasons."""


def acknowledge_findings(construct: Construct) -> None:
    """Acknowledge :data:`NAG_ACKNOWLEDGEMENTS` below ``construct`` (a finding whose construct is absent is skipped:
    single-table mode has no worker-metrics or coordinator table)."""
    for id_, scope, reason in NAG_ACKNOWLEDGEMENTS:
        found = construct.node.try_find_child(scope[0])
        if found is None:
            continue
        target = found
        for part in scope[1:]:
            target = target.node.find_child(part)
        cdk.Validations.of(target).acknowledge(cdk.Acknowledgment(id=f"AwsSolutions::{id_}", reason=reason))


def nag_rendering(value: Any) -> str:
    """A resolved template value as cdk-nag writes it in a finding's id (``<Logical.Arn>``, ``<AWS::Partition>``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(nag_rendering(part) for part in parts)
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return f"<{'.'.join(value['Fn::GetAtt'])}>"
    return str(value)
