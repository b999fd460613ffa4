"""The CDK construct ``ShardleaseCoordination`` (tables, leader Lambda, IAM, dashboard, alarms), extra ``cdk``.

``pip install 'shardlease[cdk]'``, then ``from worker_lib.cdk import ShardleaseCoordination`` in any CDK app
(docs/deploy.md). The leader's code asset is built from the installed package (:mod:`worker_lib.cdk.bundling`).
Without aws-cdk-lib, importing this package raises :class:`~worker_lib.core.errors.MissingExtraError`.
Metric names and the namespace are defined once, in :mod:`worker_lib.telemetry.names` (re-exported here).
"""

from __future__ import annotations

from worker_lib.core.extras import require

require("aws_cdk", extra="cdk", what="the CDK construct")

from worker_lib.cdk.bundling import LEADER_HANDLER  # noqa: E402 - after the extra is checked
from worker_lib.cdk.coordination import ShardleaseCoordination  # noqa: E402
from worker_lib.cdk.leader import powertools_layer_arn  # noqa: E402
from worker_lib.cdk.observability import AlarmSettings  # noqa: E402
from worker_lib.tables.schema import BillingMode  # noqa: E402
from worker_lib.telemetry.names import DEFAULT_NAMESPACE, LeaderMetric, WorkerMetric  # noqa: E402

__all__ = [
    "DEFAULT_NAMESPACE",
    "LEADER_HANDLER",
    "AlarmSettings",
    "BillingMode",
    "LeaderMetric",
    "ShardleaseCoordination",
    "WorkerMetric",
    "powertools_layer_arn",
]
