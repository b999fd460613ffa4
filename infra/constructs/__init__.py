"""Reusable CDK constructs: ``ShardleaseCoordination`` (tables, leader, IAM, dashboard, alarms).

Metric names and the namespace are defined once, in :mod:`worker_lib.metrics.names` (re-exported here).
"""

from __future__ import annotations

from worker_lib.metrics.names import DEFAULT_NAMESPACE, LeaderMetric, WorkerMetric

from .coordination import ShardleaseCoordination, powertools_layer_arn
from .observability import AlarmSettings

__all__ = [
    "DEFAULT_NAMESPACE",
    "AlarmSettings",
    "LeaderMetric",
    "ShardleaseCoordination",
    "WorkerMetric",
    "powertools_layer_arn",
]
