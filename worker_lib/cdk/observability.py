"""The CloudWatch dashboard and alarms of one shardlease application (docs/deploy.md, section 4).

Metric names, dimensions and the namespace come from :mod:`worker_lib.telemetry.names`, the module the leader and the
workers publish with. Per-worker graphs use ``SEARCH`` expressions over ``{Application, WorkerId}``, so workers
that come and go need no dashboard change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from worker_lib.telemetry.dashboard import ROWS, Series
from worker_lib.telemetry.names import APPLICATION_DIMENSION, WORKER_DIMENSION, LeaderMetric

ONE_MINUTE = cdk.Duration.minutes(1)


@dataclass(frozen=True, kw_only=True)
class AlarmSettings:
    """N minutes for each alarm (all evaluated on one-minute periods)."""

    no_leader_minutes: int = 5
    unassigned_minutes: int = 5
    leader_error_minutes: int = 5
    foreign_owner_minutes: int = 5
    lag_threshold_minutes: int = 5  # how far behind the tip (MillisBehindLatest) counts as lagging
    lag_minutes: int = 5  # for how long
    expired_minutes: int = 5
    foreign_lock_minutes: int = 5
    blocked_minutes: int = 5  # a shard held up by its processor's failures (retrying) for this long

    def __post_init__(self) -> None:
        for name in (
            "no_leader_minutes",
            "unassigned_minutes",
            "leader_error_minutes",
            "foreign_owner_minutes",
            "lag_threshold_minutes",
            "lag_minutes",
            "expired_minutes",
            "foreign_lock_minutes",
            "blocked_minutes",
        ):
            if not 1 <= getattr(self, name) <= 60:
                raise ValueError(f"{name} must be between 1 and 60 minutes")


def dashboard_name(app: str) -> str:
    """Dashboard names allow ``[A-Za-z0-9_-]``; application names may also contain dots."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"shardlease-{app}")[:255]


class ShardleaseObservability(Construct):
    """Dashboard + alarms over the leader's metrics, the Lambda, the stream and the tables."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        app: str,
        namespace: str,
        function: lambda_.IFunction,
        streams: Sequence[kinesis.IStream],
        tables: Mapping[str, dynamodb.ITable],
        alarms: AlarmSettings,
        alarm_actions: Sequence[cw.IAlarmAction] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self._app, self._namespace = app, namespace

        self.no_leader_alarm = cw.Alarm(
            self,
            "NoLeaderCycleAlarm",
            alarm_description=(
                f"shardlease {app}: no successful leader cycle for {alarms.no_leader_minutes} minute(s); "
                "leases are neither synced with the shards nor assigned"
            ),
            metric=self.leader_metric(LeaderMetric.CYCLES, "Sum"),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=alarms.no_leader_minutes,
            datapoints_to_alarm=alarms.no_leader_minutes,
            treat_missing_data=cw.TreatMissingData.BREACHING,  # no data = no leader published anything
        )
        stuck = cw.MathExpression(
            label="unassigned or expired leases (minimum in the minute)",
            expression="MAX([FILL(unassigned, 0), FILL(expired, 0)])",
            using_metrics={
                "unassigned": self.leader_metric(LeaderMetric.UNASSIGNED_LEASES, "Minimum"),
                "expired": self.leader_metric(LeaderMetric.EXPIRED_LEASES, "Minimum"),
            },
            period=ONE_MINUTE,
        )
        self.unassigned_alarm = self._sustained(
            "LeasesUnassignedAlarm",
            f"shardlease {app}: leases stayed unassigned or expired for {alarms.unassigned_minutes} minute(s) "
            "(no worker with capacity, or workers not renewing)",
            stuck,
            minutes=alarms.unassigned_minutes,
        )
        self.leader_errors_alarm = cw.Alarm(
            self,
            "LeaderErrorsAlarm",
            alarm_description=f"shardlease {app}: the leader Lambda failed (errors or timeouts)",
            metric=function.metric_errors(period=cdk.Duration.minutes(alarms.leader_error_minutes), statistic="Sum"),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        self.foreign_owner_alarm = self._sustained(
            "ForeignLeaseOwnerAlarm",
            f"shardlease {app}: in worker liveness mode, leases held for {alarms.foreign_owner_minutes} "
            "minute(s) by an owner that does not heartbeat (a KCL worker, or one with SHARDLEASE_HEARTBEAT_"
            "INTERVAL_MS=0): it cannot judge worker-mode leases; run it in lease mode or move it off the table",
            self.leader_metric(LeaderMetric.FOREIGN_OWNERS, "Minimum"),  # lease mode publishes 0
            minutes=alarms.foreign_owner_minutes,
        )
        self.lag_alarm = self._sustained(
            "ConsumerLagAlarm",
            f"shardlease {app}: a shard's records were more than {alarms.lag_threshold_minutes} minute(s) "
            f"behind the tip of the stream for {alarms.lag_minutes} minute(s) (MillisBehindLatest the workers "
            "report): processing is slower than the stream (docs/operations.md, runbook)",
            self.leader_metric(LeaderMetric.MILLIS_BEHIND_MAX, "Maximum"),
            minutes=alarms.lag_minutes,
            threshold=alarms.lag_threshold_minutes * 60_000,
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
        )
        self.expired_alarm = self._sustained(
            "LeasesNotRenewedAlarm",
            f"shardlease {app}: leases renewed by nobody for {alarms.expired_minutes} minute(s) (their owner "
            "stopped renewing and no live worker took them over) (docs/operations.md, runbook)",
            self.leader_metric(LeaderMetric.EXPIRED_LEASES, "Minimum"),
            minutes=alarms.expired_minutes,
        )
        self.foreign_lock_alarm = self._sustained(
            "ForeignLeaderLockAlarm",
            f"shardlease {app}: the leader lock has been held for {alarms.foreign_lock_minutes} minute(s) in the "
            "lock client's own format (a KCL worker leads this application) (docs/operations.md, runbook)",
            self.leader_metric(LeaderMetric.FOREIGN_LOCK_HOLDER, "Maximum"),
            minutes=alarms.foreign_lock_minutes,
        )
        self.blocked_alarm = self._sustained(
            "ShardBlockedByFailuresAlarm",
            f"shardlease {app}: a shard's processor kept failing for {alarms.blocked_minutes} minute(s) (policy "
            "retry holds the shard at the failing record) (docs/failures.md; shardlease status names it)",
            self.leader_metric(LeaderMetric.SHARDS_BLOCKED, "Minimum"),
            minutes=alarms.blocked_minutes,
        )
        self.stopped_alarm = self._sustained(
            "ShardStoppedAlarm",
            f"shardlease {app}: a shard was stopped by the stop-shard failure policy: nothing is processed on it "
            "until `shardlease resume-shard` (docs/failures.md)",
            self.leader_metric(LeaderMetric.SHARDS_STOPPED, "Maximum"),
            minutes=1,
        )
        self.alarms: tuple[cw.Alarm, ...] = (
            self.no_leader_alarm,
            self.unassigned_alarm,
            self.leader_errors_alarm,
            self.foreign_owner_alarm,
            self.lag_alarm,
            self.expired_alarm,
            self.foreign_lock_alarm,
            self.blocked_alarm,
            self.stopped_alarm,
        )
        for alarm in self.alarms:
            for action in alarm_actions:
                alarm.add_alarm_action(action)

        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name(app))
        self.dashboard.add_widgets(cw.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms), width=24, height=3))
        aws_series: dict[str, list[cw.IMetric]] = {
            "stream-bytes": [
                metric
                for stream in streams
                for metric in (
                    stream.metric_incoming_bytes(statistic="Sum"),
                    stream.metric_get_records_bytes(statistic="Sum"),
                )
            ],
            "iterator-age": [
                stream.metric_get_records_iterator_age_milliseconds(statistic="Maximum") for stream in streams
            ],
            "lambda": [function.metric_errors(statistic="Sum"), function.metric_throttles(statistic="Sum")],
            "table-reads": [t.metric_consumed_read_capacity_units(statistic="Sum", label=n) for n, t in tables.items()],
            "table-writes": [
                t.metric_consumed_write_capacity_units(statistic="Sum", label=n) for n, t in tables.items()
            ],
        }
        aws_right: dict[str, list[cw.IMetric]] = {
            "lambda": [function.metric_duration(statistic="Average"), function.metric_duration(statistic="Maximum")],
        }
        for row in ROWS:  # worker_lib/telemetry/dashboard.py: the same graphs the demo's picture draws
            self.dashboard.add_widgets(
                *(
                    cw.GraphWidget(
                        title=graph.title,
                        left=aws_series.get(graph.aws_left or "", []) + [self._series(s) for s in graph.left],
                        right=aws_right.get(graph.aws_left or "", []) + [self._series(s) for s in graph.right],
                        width=graph.width,
                    )
                    for graph in row
                )
            )

    def _series(self, series: Series) -> cw.IMetric:
        if series.per_worker:
            return self._per_worker_search(series.metric, series.statistic)
        return self.leader_metric(series.metric, series.statistic)

    def _sustained(
        self,
        construct_id: str,
        description: str,
        metric: cw.IMetric,
        *,
        minutes: int,
        threshold: float = 1,
        operator: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
    ) -> cw.Alarm:
        """An alarm on a condition that held for ``minutes`` one-minute periods in a row; missing data (no leader
        published anything) is the no-leader alarm's business, not this one's."""
        return cw.Alarm(
            self,
            construct_id,
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            comparison_operator=operator,
            evaluation_periods=minutes,
            datapoints_to_alarm=minutes,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )

    def leader_metric(self, name: str, statistic: str) -> cw.Metric:
        return cw.Metric(
            namespace=self._namespace,
            metric_name=name,
            dimensions_map={APPLICATION_DIMENSION: self._app},
            statistic=statistic,
            period=ONE_MINUTE,
        )

    def _per_worker_search(self, name: str, statistic: str) -> cw.MathExpression:
        query = (
            f"{{{self._namespace},{APPLICATION_DIMENSION},{WORKER_DIMENSION}}} "
            f'MetricName="{name}" {APPLICATION_DIMENSION}="{self._app}"'
        )
        return cw.MathExpression(
            expression=f"SEARCH('{query}', '{statistic}', 60)", label="", period=ONE_MINUTE, using_metrics={}
        )
