"""The failure destination of :class:`~worker_lib.cdk.coordination.ShardleaseCoordination` (docs/failures.md): an
SQS queue, an SNS topic or an S3 bucket created elsewhere; the workers' ``SHARDLEASE_FAILURE_DESTINATION`` for it,
exactly what sending to it needs, and the cdk-nag finding a bucket's object prefix raises."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import aws_cdk as cdk
from constructs import IConstruct

from worker_lib.cdk import permissions as p
from worker_lib.cdk.nag import nag_rendering


def destination_kind(target: object) -> str | None:
    """``sqs``, ``sns`` or ``s3`` for a queue, topic or bucket (jsii interfaces cannot be checked with isinstance)."""
    if target is None:
        return None
    for attribute, kind in (("queue_arn", "sqs"), ("topic_arn", "sns"), ("bucket_arn", "s3")):
        if hasattr(target, attribute):
            return kind
    raise TypeError(
        f"failure_destination must be an SQS queue, an SNS topic or an S3 bucket, not {type(target).__name__}"
    )


def object_prefix(prefix: str) -> str:
    """``prefix`` as a folder (``failed/``; empty for the bucket's root)."""
    return prefix.strip("/") + "/" if prefix.strip("/") else ""


def destination_setting(target: Any, prefix: str) -> str | None:
    """The workers' ``SHARDLEASE_FAILURE_DESTINATION`` for ``target`` (None without one)."""
    kind = destination_kind(target)
    if kind == "sqs":
        return str(target.queue_arn)
    if kind == "sns":
        return str(target.topic_arn)
    if kind == "s3":
        return f"s3://{target.bucket_name}/{prefix}"
    return None


def destination_permissions(target: Any, prefix: str) -> list[p.Permission]:
    """What sending to ``target`` needs, on it alone (objects under ``prefix`` in a bucket)."""
    if target is None:
        return []
    kind = destination_kind(target)
    if kind == "sqs":
        perms = [p.Permission(actions=p.FAILURE_QUEUE_ACTIONS, resources=(target.queue_arn,))]
        key = target.encryption_master_key
    elif kind == "sns":
        perms = [p.Permission(actions=p.FAILURE_TOPIC_ACTIONS, resources=(target.topic_arn,))]
        key = target.master_key
    else:
        objects = target.arn_for_objects(f"{prefix}*")
        perms = [p.Permission(actions=p.FAILURE_BUCKET_ACTIONS, resources=(objects,))]
        key = target.encryption_key
    if key is not None:
        perms.append(p.Permission(actions=p.FAILURE_KEY_ACTIONS, resources=(key.key_arn,)))
    return perms


def acknowledge_bucket_prefix(target: Any, prefix: str, policies: Iterable[IConstruct]) -> None:
    """A bucket destination: accept cdk-nag's wildcard finding on each of ``policies``. Objects are named per shard
    and sequence range (worker_lib.processing.destinations): the grant can only be a prefix. cdk-nag names the
    finding after the resource as written in the template."""
    if destination_kind(target) != "s3":
        return
    objects = destination_permissions(target, prefix)[0].resources[0]
    for policy in policies:
        finding = f"AwsSolutions-IAM5[Resource::{nag_rendering(cdk.Stack.of(policy).resolve(objects))}]"
        cdk.Validations.of(policy).acknowledge(
            cdk.Acknowledgment(
                id=f"AwsSolutions::{finding}",
                reason="s3:PutObject on the failure destination's prefix only: each report is an object named "
                "after its shard and sequence range, which cannot be listed in advance.",
            )
        )
