"""The construct for a multi-stream application (every stream reaches the leader's environment and both IAM
policies, the dashboard graphs each) and in KCL 3.5's single-table layout (the lease table alone); cdk-nag
AwsSolutions stays clean in both."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks

from worker_lib.cdk.coordination import ShardleaseCoordination

from .support import ACCOUNT, APP, REGION

ARNS = [f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{name}" for name in ("orders-stream", "clicks-stream")]


def synth_multi() -> Template:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Multi", env=cdk.Environment(account=ACCOUNT, region=REGION))
    ShardleaseCoordination(stack, "Coordination", application_name=APP, streams=ARNS)
    app.synth()  # the AwsSolutions checks run here: an unacknowledged finding fails it
    return Template.from_stack(stack)


def test_given_two_streams_then_the_leader_is_told_both_in_multi_stream_mode() -> None:
    template = synth_multi()
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": Match.object_like(
                    {"SHARDLEASE_STREAM": "orders-stream,clicks-stream", "SHARDLEASE_MULTI_STREAM": "true"}
                )
            }
        },
    )


def test_given_two_streams_then_leader_and_workers_may_read_both_and_nothing_else() -> None:
    template = synth_multi()
    text = json.dumps(template.to_json())
    policies = {**template.find_resources("AWS::IAM::Policy"), **template.find_resources("AWS::IAM::ManagedPolicy")}
    stream_resources = set()
    for policy in policies.values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("kinesis:") for a in actions):
                resources = statement["Resource"]
                stream_resources |= set(resources if isinstance(resources, list) else [resources])
    assert stream_resources == set(ARNS)
    assert text.count("clicks-stream") >= 3  # environment, policies, dashboard


def test_given_both_stream_and_streams_then_the_construct_refuses() -> None:
    stack = cdk.Stack(cdk.App(context={"aws:cdk:bundling-stacks": []}), "Bad")
    with pytest.raises(ValueError, match="either stream or streams"):
        ShardleaseCoordination(stack, "Coordination", application_name=APP, stream=ARNS[0], streams=ARNS)


def test_given_the_single_table_layout_then_only_the_lease_table_is_made_and_nag_stays_clean() -> None:
    # GIVEN KCL 3.5's single-table mode
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Single", env=cdk.Environment(account=ACCOUNT, region=REGION))
    ShardleaseCoordination(stack, "Coordination", application_name=APP, stream=ARNS[0], table_layout="single-table")
    # WHEN synthesized (the AwsSolutions checks run here)
    app.synth()
    template = Template.from_stack(stack)
    # THEN one table, with point-in-time recovery, and the leader told the layout
    tables = template.find_resources("AWS::DynamoDB::Table")
    assert [t["Properties"]["TableName"] for t in tables.values()] == [APP]
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Environment": {"Variables": Match.object_like({"SHARDLEASE_TABLE_LAYOUT": "single-table"})}},
    )
    # AND every table permission names the lease table (or its index) only
    text = json.dumps(template.to_json())
    assert "-WorkerMetricStats" not in text and "-CoordinatorState" not in text
