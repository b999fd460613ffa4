"""Reusable CDK constructs: ``ShardleaseCoordination`` (tables, leader, IAM, dashboard, alarms).

Metric names and the namespace are defined once, in :mod:`worker_lib.telemetry.names` (re-exported here).
"""

from __future__ import annotations

from worker_lib.cdk.coordination import ShardleaseCoordination, powertools_layer_arn
from worker_lib.cdk.observability import AlarmSettings
from worker_lib.telemetry.names import DEFAULT_NAMESPACE, LeaderMetric, WorkerMetric

__all__ = [
    "DEFAULT_NAMESPACE",
    "AlarmSettings",
    "LeaderMetric",
    "ShardleaseCoordination",
    "WorkerMetric",
    "powertools_layer_arn",
]
