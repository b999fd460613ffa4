"""An ECS service scaled by DesiredWorkers (docs/autoscaling.md): target tracking on DesiredWorkers ÷ the service's
DesiredTaskCount with target 1, the leader given the same bounds; cdk-nag stays clean. The KEDA ScaledObject in
docs/autoscaling.md asks for the same metric the same way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from worker_lib.cdk.coordination import ShardleaseCoordination
from worker_lib.core.errors import ConfigError

from .support import ACCOUNT, APP, REGION, REPO, STREAM_ARN

DOC = REPO / "docs" / "autoscaling.md"


def synth(*, min_workers: int = 2, max_workers: int = 20) -> Template:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Scaling", env=cdk.Environment(account=ACCOUNT, region=REGION))
    coordination = ShardleaseCoordination(stack, "Coordination", application_name=APP, stream=STREAM_ARN)
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Vpc",
        vpc_id="vpc-0123456789abcdef0",
        availability_zones=["eu-west-1a"],
        private_subnet_ids=["subnet-0123456789abcdef0"],
    )
    cluster = ecs.Cluster(stack, "Cluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENABLED)
    task = ecs.FargateTaskDefinition(stack, "Task")
    task.add_container(
        "worker",
        image=ecs.ContainerImage.from_registry("public.ecr.aws/example/worker:1"),
        logging=ecs.LogDrivers.aws_logs(stream_prefix="worker"),
    )
    service = ecs.FargateService(stack, "Workers", cluster=cluster, task_definition=task)
    coordination.scale_ecs_service(service, min_workers=min_workers, max_workers=max_workers)
    app.synth()  # an unacknowledged AwsSolutions finding about what the scaling added fails here
    return Template.from_stack(stack)


def the_one(template: Template, kind: str) -> dict[str, Any]:
    (resource,) = template.find_resources(kind).values()
    props: dict[str, Any] = resource["Properties"]
    return props


def test_the_service_tracks_desired_workers_per_task_at_one_and_the_leader_gets_the_bounds() -> None:
    # GIVEN the construct and an ECS service scaled by it between 2 and 20 tasks
    template = synth(min_workers=2, max_workers=20)
    # THEN the service's task count is a scalable target with those bounds
    target = the_one(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 20)
    assert target["ScalableDimension"] == "ecs:service:DesiredCount" and target["ServiceNamespace"] == "ecs"
    # AND one target-tracking policy holds DesiredWorkers ÷ DesiredTaskCount at 1 (new capacity = DesiredWorkers)
    policy = the_one(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
    assert policy["PolicyType"] == "TargetTrackingScaling"
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 1
    queries = tracking["CustomizedMetricSpecification"]["Metrics"]
    (expression,) = [q for q in queries if "Expression" in q]
    assert expression["Expression"] == "desired / IF(tasks > 0, tasks, 1)" and expression.get("ReturnData", True)
    stats = {q["Id"]: q["MetricStat"]["Metric"] for q in queries if "MetricStat" in q}
    assert all(q["MetricStat"]["Stat"] == "Maximum" and not q["ReturnData"] for q in queries if "MetricStat" in q)
    assert stats["desired"]["MetricName"] == "DesiredWorkers" and stats["desired"]["Namespace"] == "Shardlease"
    assert stats["desired"]["Dimensions"] == [{"Name": "Application", "Value": APP}]
    assert (stats["tasks"]["Namespace"], stats["tasks"]["MetricName"]) == ("ECS/ContainerInsights", "DesiredTaskCount")
    # AND the leader's signal is bounded the same way
    (leader,) = [
        r["Properties"]
        for r in template.find_resources("AWS::Lambda::Function").values()
        if "SHARDLEASE_APP" in r["Properties"].get("Environment", {}).get("Variables", {})
    ]
    variables = leader["Environment"]["Variables"]
    assert (variables["SHARDLEASE_SCALING_MIN_WORKERS"], variables["SHARDLEASE_SCALING_MAX_WORKERS"]) == ("2", "20")


def test_impossible_bounds_are_one_config_error() -> None:
    with pytest.raises(ConfigError, match="need 1 <= min_workers"):
        synth(min_workers=3, max_workers=2)


def keda_manifest(doc: Path) -> dict[str, Any]:
    """The ScaledObject in docs/autoscaling.md (the first ```yaml block holding one)."""
    for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.DOTALL):
        loaded = yaml.safe_load(block)
        if isinstance(loaded, dict) and loaded.get("kind") == "ScaledObject":
            return loaded
    raise AssertionError("docs/autoscaling.md has no ScaledObject")


def test_the_documented_keda_scaled_object_asks_for_desired_workers_replicas() -> None:
    # GIVEN the KEDA manifest the docs give EKS users
    manifest = keda_manifest(DOC)
    # THEN it is a KEDA ScaledObject on a Deployment, bounded, with one aws-cloudwatch trigger
    assert manifest["apiVersion"] == "keda.sh/v1alpha1"
    spec = manifest["spec"]
    assert spec["scaleTargetRef"]["kind"] == "Deployment"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "aws-cloudwatch"
    meta = trigger["metadata"]
    # AND it reads DesiredWorkers of the application, the maximum of a minute ...
    assert (meta["namespace"], meta["metricName"]) == ("Shardlease", "DesiredWorkers")
    assert (meta["dimensionName"], meta["metricStatType"]) == ("Application", "Maximum")
    assert meta["metricStatPeriod"] == "60"
    # ... with a target of 1 per replica, so the HPA's ceil(value / target) is DesiredWorkers itself
    assert meta["targetMetricValue"] == "1" and meta.get("metricType", "AverageValue") == "AverageValue"
    # AND scale-in is held back by a stabilization window (the leader's cool-downs are upstream of it)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 60
