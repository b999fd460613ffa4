"""The leader Lambda, its schedule, logs and configuration."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match

from worker_lib.cdk import ShardleaseCoordination
from worker_lib.cdk.bundling import LEADER_HANDLER
from worker_lib.telemetry.names import DEFAULT_NAMESPACE

from .conftest import Synth
from .support import APP, CMK_APP, STREAM_ARN


def test_given_default_stack_then_leader_is_python313_arm64_with_powertools_layer(synth: Synth) -> None:
    (fn,) = synth.default.find_resources("AWS::Lambda::Function").values()
    props = fn["Properties"]
    assert props["Runtime"] == "python3.13"
    assert props["Architectures"] == ["arm64"]
    assert props["Handler"] == LEADER_HANDLER == "worker_lib.leader.lambda_handler.handler"
    # a 65 s term (the 1-minute schedule + 5 s of overlap, so the next invocation is waiting) + the 10 s margin + 5 s
    assert props["Timeout"] == 80
    assert props["Environment"]["Variables"]["SHARDLEASE_LEADER_TERM_MS"] == "65000"
    assert props["TracingConfig"] == {"Mode": "Active"}
    (layer,) = props["Layers"]
    joined = "".join(part if isinstance(part, str) else "" for part in layer["Fn::Join"][1])
    assert joined.endswith(":017000801446:layer:AWSLambdaPowertoolsPythonV3-python313-arm64:27")


def test_given_default_stack_then_environment_names_the_app_stream_and_namespace(synth: Synth) -> None:
    synth.default.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": {
                    "SHARDLEASE_APP": APP,
                    "SHARDLEASE_STREAM": "orders-stream",
                    "SHARDLEASE_FAILOVER_TIME_MS": "10000",
                    "SHARDLEASE_INITIAL_POSITION": "LATEST",
                    "SHARDLEASE_LIVENESS_MODE": "lease",
                    "POWERTOOLS_METRICS_NAMESPACE": DEFAULT_NAMESPACE,
                    "POWERTOOLS_LOG_LEVEL": "INFO",
                }
            }
        },
    )


def test_given_cmk_construct_then_failover_time_namespace_and_stream_name_flow_into_the_environment(
    synth: Synth,
) -> None:
    synth.cmk.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "SHARDLEASE_APP": CMK_APP,
                        "SHARDLEASE_FAILOVER_TIME_MS": "20000",
                        "SHARDLEASE_LIVENESS_MODE": "worker",
                        "POWERTOOLS_METRICS_NAMESPACE": "Payments/Shardlease",
                        "SHARDLEASE_STREAM": {"Ref": Match.string_like_regexp("PaymentsStream")},
                    }
                )
            }
        },
    )


def test_given_default_stack_then_eventbridge_invokes_the_leader_every_minute_without_retries(synth: Synth) -> None:
    template = synth.default
    (fn_id,) = template.find_resources("AWS::Lambda::Function")
    (rule,) = template.find_resources("AWS::Events::Rule").values()
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 60, "MaximumRetryAttempts": 0}
    template.has_resource_properties(
        "AWS::Lambda::Permission", {"Principal": "events.amazonaws.com", "Action": "lambda:InvokeFunction"}
    )
    # a failed invocation is not retried asynchronously: the next scheduled one starts fresh
    template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig", {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}
    )


def test_given_default_stack_then_logs_go_to_a_log_group_with_retention(synth: Synth) -> None:
    template = synth.default
    (log_id,) = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"RetentionInDays": 30}})
    template.has_resource_properties("AWS::Lambda::Function", {"LoggingConfig": {"LogGroup": {"Ref": log_id}}})


def test_given_the_stack_then_outputs_name_the_lease_table_and_worker_policy(synth: Synth) -> None:
    outputs = synth.default.to_json()["Outputs"]
    assert any(k.startswith("CoordinationLeaseTableName") for k in outputs)
    assert any(k.startswith("CoordinationWorkerPolicyArn") for k in outputs)


def test_given_a_timeout_shorter_than_the_term_plus_margin_then_the_construct_refuses_it() -> None:
    # GIVEN a leader timeout that would end an invocation before it can hand the lock over cleanly
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    stack = cdk.Stack(app, "Short")
    # WHEN the construct is built with it
    # THEN it says what the timeout must cover
    with pytest.raises(ValueError, match="leader_timeout must be at least leader_term"):
        ShardleaseCoordination(
            stack,
            "Coordination",
            application_name="orders",
            stream=STREAM_ARN,
            leader_timeout=cdk.Duration.seconds(60),
        )


def test_given_an_unknown_liveness_mode_then_the_construct_names_the_allowed_ones() -> None:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    stack = cdk.Stack(app, "Modes")
    with pytest.raises(ValueError, match="expected lease, worker or auto"):
        ShardleaseCoordination(
            stack, "Coordination", application_name="orders", stream=STREAM_ARN, liveness_mode="sometimes"
        )
