"""The construct with a failure destination (docs/failures.md): it creates nothing, and grants workers exactly what
sending a report needs, on that queue, topic or bucket prefix alone; the failure alarms are there; cdk-nag stays
clean."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks
from constructs import Construct

from worker_lib.cdk.coordination import ShardleaseCoordination

from .support import ACCOUNT, APP, REGION, STREAM_ARN

QUEUE_ARN = f"arn:aws:sqs:{REGION}:{ACCOUNT}:orders-failed"
TOPIC_ARN = f"arn:aws:sns:{REGION}:{ACCOUNT}:orders-failed"
KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/11111111-2222-3333-4444-555555555555"
DESTINATION_SERVICES = ("sqs:", "sns:", "s3:")


def synth(
    destination: Callable[[Construct], Any] | None = None, **kwargs: object
) -> tuple[Template, ShardleaseCoordination]:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Failures", env=cdk.Environment(account=ACCOUNT, region=REGION))
    target = destination(stack) if destination is not None else None
    coordination = ShardleaseCoordination(
        stack,
        "Coordination",
        application_name=APP,
        stream=STREAM_ARN,
        failure_destination=target,
        **kwargs,  # type: ignore[arg-type]
    )
    app.synth()  # an unacknowledged AwsSolutions finding fails here
    return Template.from_stack(stack), coordination


def worker_statements(template: Template) -> list[dict[str, Any]]:
    """The statements of the two worker managed policies (worker and Spark worker) that touch a destination service."""
    found = []
    for policy in template.find_resources("AWS::IAM::ManagedPolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith(DESTINATION_SERVICES) or a.startswith("kms:Generate") for a in actions):
                found.append({**statement, "Action": sorted(actions)})
    return found


def test_given_a_queue_then_workers_may_send_to_it_alone_and_use_its_key() -> None:
    template, coordination = synth(
        lambda scope: sqs.Queue.from_queue_attributes(scope, "Failed", queue_arn=QUEUE_ARN, key_arn=KEY_ARN)
    )
    statements = worker_statements(template)
    queue = [s for s in statements if s["Action"] == ["sqs:GetQueueUrl", "sqs:SendMessage"]]
    keys = [s for s in statements if s["Action"] == ["kms:Decrypt", "kms:GenerateDataKey"]]
    assert len(queue) == 2 and all(s["Resource"] == QUEUE_ARN for s in queue)  # worker and Spark worker policies
    assert len(keys) == 2 and all(s["Resource"] == KEY_ARN for s in keys)
    assert len(statements) == 4  # nothing else on any destination service
    assert coordination.failure_destination_setting == QUEUE_ARN
    outputs = template.find_outputs("*")
    assert [v["Value"] for k, v in outputs.items() if k.startswith("CoordinationFailureDestination")] == [QUEUE_ARN]


def test_given_a_topic_then_workers_may_publish_to_it_alone() -> None:
    template, coordination = synth(lambda scope: sns.Topic.from_topic_arn(scope, "Failed", TOPIC_ARN))
    statements = worker_statements(template)
    assert statements and all(s["Action"] == ["sns:Publish"] and s["Resource"] == TOPIC_ARN for s in statements)
    assert coordination.failure_destination_setting == TOPIC_ARN


def test_given_a_bucket_then_workers_may_put_objects_under_the_prefix_alone() -> None:
    template, coordination = synth(
        lambda scope: s3.Bucket.from_bucket_name(scope, "Failed", "orders-failed"), failure_destination_prefix="dlq"
    )
    statements = worker_statements(template)
    assert statements and all(s["Action"] == ["s3:PutObject"] for s in statements)
    assert all("orders-failed/dlq/*" in str(s["Resource"]) for s in statements)
    assert coordination.failure_destination_setting == "s3://orders-failed/dlq/"


def test_given_no_destination_then_nothing_is_granted_on_any_destination_service_and_the_alarms_are_there() -> None:
    template, coordination = synth()
    assert worker_statements(template) == []
    assert coordination.failure_destination_setting is None
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    names = {alarm["Properties"]["MetricName"] for alarm in alarms.values() if "MetricName" in alarm["Properties"]}
    assert {"ShardsStopped", "ShardsBlockedByFailures"} <= names
