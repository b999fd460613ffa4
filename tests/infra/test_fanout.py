"""The construct with enhanced fan-out: one stream consumer per stream, created by the stack and named after the
application; workers may subscribe through it and describe it, and register nothing; cdk-nag stays clean."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from worker_lib.cdk.coordination import ShardleaseCoordination

from .support import ACCOUNT, APP, REGION, STREAM_ARN

CLICKS_ARN = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/clicks-stream"


def synth(**kwargs: object) -> Template:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Fanout", env=cdk.Environment(account=ACCOUNT, region=REGION))
    ShardleaseCoordination(stack, "Coordination", application_name=APP, **kwargs)  # type: ignore[arg-type]
    app.synth()  # an unacknowledged AwsSolutions finding fails here
    return Template.from_stack(stack)


def kinesis_statements(template: Template) -> list[dict[str, Any]]:
    policies = {**template.find_resources("AWS::IAM::Policy"), **template.find_resources("AWS::IAM::ManagedPolicy")}
    found = []
    for policy in policies.values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("kinesis:") for a in actions):
                found.append({**statement, "Action": sorted(actions)})
    return found


def test_given_fanout_then_one_consumer_per_stream_named_after_the_application() -> None:
    template = synth(streams=[STREAM_ARN, CLICKS_ARN], retrieval="fanout")
    consumers = template.find_resources("AWS::Kinesis::StreamConsumer")
    assert sorted((c["Properties"]["ConsumerName"], c["Properties"]["StreamARN"]) for c in consumers.values()) == [
        (APP, CLICKS_ARN),
        (APP, STREAM_ARN),
    ]


def test_given_fanout_then_workers_subscribe_and_describe_that_consumer_and_register_nothing() -> None:
    template = synth(stream=STREAM_ARN, retrieval="fanout", fanout_consumer_name="orders-efo")
    statements = kinesis_statements(template)
    fanout = [s for s in statements if "kinesis:SubscribeToShard" in s["Action"]]
    # the worker policy and the Spark worker policy, each with exactly the two actions on the consumer's ARN
    assert len(fanout) == 2
    for statement in fanout:
        assert statement["Action"] == ["kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"]
        assert "ConsumerARN" in str(statement["Resource"]) and "Fn::GetAtt" in str(statement["Resource"])
    assert not any("kinesis:RegisterStreamConsumer" in s["Action"] for s in statements)
    outputs = template.find_outputs("*")
    assert any(key.startswith("CoordinationFanoutConsumerArn") for key in outputs)
    (consumer,) = template.find_resources("AWS::Kinesis::StreamConsumer").values()
    assert consumer["Properties"]["ConsumerName"] == "orders-efo"


def test_given_polling_then_no_consumer_and_no_fanout_permission() -> None:
    template = synth(stream=STREAM_ARN)
    assert template.find_resources("AWS::Kinesis::StreamConsumer") == {}
    assert not any("kinesis:SubscribeToShard" in s["Action"] for s in kinesis_statements(template))


def test_given_a_bad_retrieval_or_consumer_name_then_the_construct_refuses() -> None:
    with pytest.raises(ValueError, match="expected polling or fanout"):
        synth(stream=STREAM_ARN, retrieval="push")
    with pytest.raises(ValueError, match="invalid fanout_consumer_name"):
        synth(stream=STREAM_ARN, retrieval="fanout", fanout_consumer_name="has space")
