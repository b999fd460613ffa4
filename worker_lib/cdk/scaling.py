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

from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_

from worker_lib.core.errors import ConfigError
from worker_lib.telemetry.names import APPLICATION_DIMENSION, LeaderMetric

CONTAINER_INSIGHTS_NAMESPACE = "ECS/ContainerInsights"


def scale_ecs_service(
    service: ecs.BaseService,
    *,
    namespace: str,
    application_name: str,
    min_workers: int,
    max_workers: int,
    leader_function: lambda_.Function | None = None,
) -> appscaling.ScalableTarget:
    """Drive ``service``'s task count by DesiredWorkers between ``min_workers`` and ``max_workers``; the leader is
    given the same bounds (``SHARDLEASE_SCALING_MIN_WORKERS`` / ``_MAX_WORKERS``) so that the signal never asks for
    what the service cannot run. (CDK's L2 target tracking takes one metric only; the policy is written in L1.)"""
    if min_workers < 1 or max_workers < min_workers:
        raise ConfigError(f"scale_ecs_service: need 1 <= min_workers ({min_workers}) <= max_workers ({max_workers})")
    cluster, name = service.cluster.cluster_name, service.service_name
    target = appscaling.ScalableTarget(
        service,
        "DesiredWorkersTarget",
        service_namespace=appscaling.ServiceNamespace.ECS,
        scalable_dimension="ecs:service:DesiredCount",
        resource_id=f"service/{cluster}/{name}",
        min_capacity=min_workers,
        max_capacity=max_workers,
    )
    policy = appscaling.CfnScalingPolicy
    metric = policy.TargetTrackingMetricDataQueryProperty

    def stat(
        query_id: str, metric_namespace: str, metric_name: str, dimensions: dict[str, str]
    ) -> appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty:
        return metric(
            id=query_id,
            return_data=False,
            metric_stat=policy.TargetTrackingMetricStatProperty(
                stat="Maximum",
                metric=policy.TargetTrackingMetricProperty(
                    namespace=metric_namespace,
                    metric_name=metric_name,
                    dimensions=[
                        policy.TargetTrackingMetricDimensionProperty(name=key, value=value)
                        for key, value in dimensions.items()
                    ],
                ),
            ),
        )

    policy(
        service,
        "DesiredWorkersPolicy",
        policy_name=f"{application_name}-desired-workers",
        policy_type="TargetTrackingScaling",
        scaling_target_id=target.scalable_target_id,
        target_tracking_scaling_policy_configuration=policy.TargetTrackingScalingPolicyConfigurationProperty(
            target_value=1.0,
            # The leader's cool-downs (ScalingConfig) already space its changes; these only stop the policy from
            # acting twice on one change while the task count catches up.
            scale_out_cooldown=60,
            scale_in_cooldown=60,
            customized_metric_specification=policy.CustomizedMetricSpecificationProperty(
                metrics=[
                    stat("desired", namespace, LeaderMetric.DESIRED_WORKERS, {APPLICATION_DIMENSION: application_name}),
                    stat(
                        "tasks",
                        CONTAINER_INSIGHTS_NAMESPACE,
                        "DesiredTaskCount",
                        {"ClusterName": cluster, "ServiceName": name},
                    ),
                    metric(
                        id="ratio",
                        expression="desired / IF(tasks > 0, tasks, 1)",
                        label="DesiredWorkers per task",
                        return_data=True,
                    ),
                ]
            ),
        ),
    )
    if leader_function is not None:
        leader_function.add_environment("SHARDLEASE_SCALING_MIN_WORKERS", str(min_workers))
        leader_function.add_environment("SHARDLEASE_SCALING_MAX_WORKERS", str(max_workers))
    return target


__all__ = ["scale_ecs_service"]
