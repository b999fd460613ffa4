"""A stack holding one ``ShardleaseCoordination`` (what ``cdk deploy`` deploys from ``infra/app.py``).

Built only on the packaged construct (``worker_lib.cdk``), as a pip user's own stack would be (docs/deploy.md)."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_sns as sns
from constructs import Construct

from worker_lib.cdk import AlarmSettings, BillingMode, ShardleaseCoordination


class ShardleaseStack(cdk.Stack):
    """Coordination plane for an existing stream (by name or ARN); optional SNS topic for alarms."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        application_name: str,
        stream_arn: str | None = None,
        stream_name: str | None = None,
        failover_time_ms: int = 10_000,
        billing_mode: str = "PAY_PER_REQUEST",
        removal_policy: str = "RETAIN",
        initial_position: str = "LATEST",
        liveness_mode: str = "lease",
        metrics_namespace: str | None = None,
        alarm_topic_arn: str | None = None,
        alarm_minutes: int = 5,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        if bool(stream_arn) == bool(stream_name):
            raise ValueError("give exactly one of stream_arn and stream_name")
        stream: kinesis.IStream | str = (
            stream_arn
            if stream_arn
            else kinesis.Stream.from_stream_arn(
                self, "Stream", self.format_arn(service="kinesis", resource="stream", resource_name=stream_name)
            )
        )
        actions = (
            [cw_actions.SnsAction(sns.Topic.from_topic_arn(self, "AlarmTopic", alarm_topic_arn))]
            if alarm_topic_arn
            else []
        )
        extra: dict[str, Any] = {"metrics_namespace": metrics_namespace} if metrics_namespace else {}
        self.coordination = ShardleaseCoordination(
            self,
            "Coordination",
            application_name=application_name,
            stream=stream,
            failover_time=cdk.Duration.millis(failover_time_ms),
            billing_mode=BillingMode(billing_mode.upper()),
            removal_policy=cdk.RemovalPolicy(removal_policy.upper()),
            initial_position=initial_position.upper(),
            liveness_mode=liveness_mode,
            alarms=AlarmSettings(
                no_leader_minutes=alarm_minutes,
                unassigned_minutes=alarm_minutes,
                leader_error_minutes=alarm_minutes,
                foreign_owner_minutes=alarm_minutes,
            ),
            alarm_actions=actions,
            **extra,
        )
