"""An ECS service's task count driven by the leader's ``DesiredWorkers`` (docs/autoscaling.md).

Application Auto Scaling **target tracking** on the metric math ``DesiredWorkers ÷ the service's DesiredTaskCount``
with a target of 1: target tracking sets the new capacity to ``current × metric ÷ target`` = DesiredWorkers itself,
in one step, whatever the distance; and it changes nothing while the two are equal. Step scaling would need one
step per fleet size to land on an exact number (its adjustments are relative to alarm thresholds), and every
threshold crossing is an action: more churn for the same result. The leader's own hysteresis and cool-downs
(:class:`~worker_lib.scaling.config.ScalingConfig`) decide *when* the number changes; the policy only follows it,
with target tracking's alarm periods on top (3 one-minute datapoints to scale out, 15 to scale in).

``DesiredTaskCount`` is a Container Insights metric (``ECS/ContainerInsights``): the cluster needs Container
Insights on. The task count is the right denominator rather than our ``Workers`` (the workers reporting): a task
that is starting is in the service's count at once and would be asked for again if the ratio used workers.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_

from worker_lib.core.errors import ConfigError
from worker_lib.telemetry.names import APPLICATION_DIMENSION, LeaderMetric

CONTAINER_INSIGHTS_NAMESPACE = "ECS/ContainerInsights"


def desired_workers_metric(*, namespace: str, application_name: str) -> cw.Metric:
    """The leader's DesiredWorkers (published each full cycle; the maximum of a minute)."""
    return cw.Metric(
        namespace=namespace,
        metric_name=LeaderMetric.DESIRED_WORKERS,
        dimensions_map={APPLICATION_DIMENSION: application_name},
        statistic="Maximum",
        period=cdk.Duration.minutes(1),
    )


def scale_ecs_service(
    service: ecs.BaseService,
    *,
    namespace: str,
    application_name: str,
    min_workers: int,
    max_workers: int,
    leader_function: lambda_.Function | None = None,
) -> ecs.ScalableTaskCount:
    """Drive ``service``'s task count by DesiredWorkers between ``min_workers`` and ``max_workers``; the leader is
    given the same bounds (``SHARDLEASE_SCALING_MIN_WORKERS`` / ``_MAX_WORKERS``) so that the signal never asks for
    what the service cannot run."""
    if min_workers < 1 or max_workers < min_workers:
        raise ConfigError(f"scale_ecs_service: need 1 <= min_workers ({min_workers}) <= max_workers ({max_workers})")
    task_count = cw.Metric(
        namespace=CONTAINER_INSIGHTS_NAMESPACE,
        metric_name="DesiredTaskCount",
        dimensions_map={"ClusterName": service.cluster.cluster_name, "ServiceName": service.service_name},
        statistic="Maximum",
        period=cdk.Duration.minutes(1),
    )
    ratio = cw.MathExpression(
        expression="desired / IF(tasks > 0, tasks, 1)",
        using_metrics={
            "desired": desired_workers_metric(namespace=namespace, application_name=application_name),
            "tasks": task_count,
        },
        label="DesiredWorkers per task",
        period=cdk.Duration.minutes(1),
    )
    scaling = service.auto_scale_task_count(min_capacity=min_workers, max_capacity=max_workers)
    scaling.scale_to_track_custom_metric(
        "DesiredWorkers",
        metric=ratio,
        target_value=1.0,
        # The leader's cool-downs (ScalingConfig) already space its changes; these only stop the policy from acting
        # twice on one change while the task count catches up.
        scale_out_cooldown=cdk.Duration.minutes(1),
        scale_in_cooldown=cdk.Duration.minutes(1),
    )
    if leader_function is not None:
        leader_function.add_environment("SHARDLEASE_SCALING_MIN_WORKERS", str(min_workers))
        leader_function.add_environment("SHARDLEASE_SCALING_MAX_WORKERS", str(max_workers))
    return scaling


__all__ = ["desired_workers_metric", "scale_ecs_service"]
