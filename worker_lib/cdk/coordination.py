"""``ShardleaseCoordination``: the whole coordination plane of one application, as one reusable construct.

It creates

* the three tables from :mod:`worker_lib.tables.schema` (GSI with the table, point-in-time recovery on the lease
  table, encryption at rest with the AWS managed key or the customer managed key given);
* the leader Lambda (Python 3.13, arm64; handler ``worker_lib.leader.lambda_handler.handler``; code = that
  module's import closure, copied from the installed ``worker_lib`` without Docker by :mod:`.bundling`; Powertools
  from the public Powertools layer: :mod:`.leader`), its log group with a retention, and its own least-privilege
  role;
* an EventBridge rule invoking the leader on a schedule (``rate(1 minute)``);
* a ``ManagedPolicy`` for worker roles and :meth:`grant_worker` for any ``IGrantable`` (with what sending to a
  failure destination needs: :mod:`.destinations`);
* a CloudWatch dashboard and three alarms (:mod:`.observability`).

Usage in any CDK app::

    coordination = ShardleaseCoordination(self, "Orders", application_name="orders-consumer", stream=stream)
    coordination.grant_worker(task_definition.task_role)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from worker_lib.cdk import permissions as p
from worker_lib.cdk.bundling import LEADER_HANDLER, leader_code
from worker_lib.cdk.destinations import (
    acknowledge_bucket_prefix,
    destination_permissions,
    destination_setting,
    object_prefix,
)
from worker_lib.cdk.leader import (
    LEADER_ARCHITECTURE,
    LEADER_DEADLINE_MARGIN_S,
    LEADER_RUNTIME,
    powertools_layer_arn,
)
from worker_lib.cdk.nag import NAG_ACKNOWLEDGEMENTS, acknowledge_findings
from worker_lib.cdk.observability import AlarmSettings, ShardleaseObservability
from worker_lib.cdk.tables import build_tables
from worker_lib.core.config import validate_app_name
from worker_lib.leases.mode import parse_setting
from worker_lib.retrieval.config import CONSUMER_NAME_PATTERN, RetrievalMode
from worker_lib.tables.schema import (
    LEASE_OWNER_INDEX,
    BillingMode,
    TableKind,
    TableLayout,
    coordinator_state_table_name,
    lease_table_name,
    worker_metrics_table_name,
)
from worker_lib.telemetry.names import DEFAULT_NAMESPACE

__all__ = ["NAG_ACKNOWLEDGEMENTS", "ShardleaseCoordination", "powertools_layer_arn"]


class ShardleaseCoordination(Construct):
    """Tables, leader Lambda + schedule, IAM for leader and workers, dashboard and alarms of one application.

    Keyword arguments:

    application_name: the KCL application name = lease table name (``<app>``, ``<app>-WorkerMetricStats``,
      ``<app>-CoordinatorState``).
    stream: the Kinesis stream, as an ``IStream`` or a stream ARN.
    streams: instead of ``stream``, the streams of a multi-stream application (KCL's MultiStreamTracker; one lease
      table, keys ``account:stream:epoch:shardId``; docs/multi-stream.md). The leader and the workers get exactly
      these streams; a stream added later needs a deploy (or ``leader_environment`` with a tracker and a grant).
    multi_stream: multi-stream lease keys even with one stream (implied by several ``streams``).
    stream_encryption_key: the stream's customer managed KMS key, if any (workers get ``kms:Decrypt`` on it;
      taken from each ``IStream`` that knows its key).
    failover_time: lease duration (KCL failoverTimeMillis; 10 s).
    schedule: how often EventBridge invokes the leader (``rate(1 minute)``).
    leader_term: how long one invocation leads before it hands the lock to the next (65 s: the schedule's period
      plus 5 s, so the next invocation is already waiting and takes over with no leaderless gap; docs/failover.md).
      Keep it a few seconds above the schedule's period.
    leader_timeout: the Lambda timeout (80 s): at least the term plus the leader's 10 s deadline margin.
    billing_mode: ``worker_lib.tables.schema.BillingMode`` (PAY_PER_REQUEST).
    table_layout: ``three-tables`` (KCL 3.0–3.4's, the default) or ``single-table`` (KCL 3.5's single-table mode:
      only the lease table; worker metrics and coordinator state live in it). Workers need
      ``SHARDLEASE_TABLE_LAYOUT`` set the same way.
    removal_policy: for the tables (RETAIN; the lease table also gets deletion protection under RETAIN).
    encryption_key: a customer managed KMS key for the tables (default: the AWS managed key).
    initial_position: LATEST | TRIM_HORIZON (where leases of newly discovered shards start; LATEST as KCL).
    liveness_mode: ``lease`` (KCL-compatible: every lease renewed), ``worker`` (one heartbeat per worker; writes fall
      with workers, not shards) or ``auto`` (follow the mode stored for the application) — the leader's
      ``SHARDLEASE_LIVENESS_MODE``; give workers the same value (docs/liveness-modes.md).
    metrics_namespace: CloudWatch namespace of the leader's and the workers' metrics ("Shardlease").
    log_retention: the leader's log retention (one month).
    alarms: minutes for the three alarms; alarm_actions: e.g. ``cw_actions.SnsAction(topic)``.
    powertools_layer: the Powertools layer (default: the public layer, :func:`powertools_layer_arn`).
    leader_environment: extra ``SHARDLEASE_*`` variables for the leader (e.g. assignment strategy).
    retrieval: ``polling`` (GetRecords, the default) or ``fanout``: enhanced fan-out through a stream consumer per
      stream that this construct creates (``AWS::Kinesis::StreamConsumer``, named ``fanout_consumer_name``, default
      the application's name, as KCL names it); the worker policies then allow exactly SubscribeToShard and
      DescribeStreamConsumer on those consumers, and nothing that registers one. Give workers
      ``SHARDLEASE_RETRIEVAL=fanout`` (and, with one stream, ``SHARDLEASE_FANOUT_CONSUMER_ARN`` from the output
      ``FanoutConsumerArn``). Fan-out is billed per consumer-shard-hour (docs/fanout.md).
    failure_destination: where the workers' failure policy sends records it gives up on (docs/failures.md): an
      ``IQueue``, an ``ITopic`` or an ``IBucket`` created elsewhere — this construct creates none. Workers get
      exactly what sending needs (SQS SendMessage and GetQueueUrl on the queue; SNS Publish on the topic; S3
      PutObject under ``failure_destination_prefix`` in the bucket; the key's GenerateDataKey/Decrypt if it is
      encrypted with a customer managed key). Give workers ``SHARDLEASE_FAILURE_DESTINATION`` =
      :attr:`failure_destination_setting` (also the output ``FailureDestination``) and a policy
      (``SHARDLEASE_FAILURE_POLICY=skip-and-record``).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        application_name: str,
        stream: kinesis.IStream | str | None = None,
        streams: Sequence[kinesis.IStream | str] = (),
        multi_stream: bool = False,
        stream_encryption_key: kms.IKey | None = None,
        failover_time: cdk.Duration | None = None,
        schedule: events.Schedule | None = None,
        leader_timeout: cdk.Duration | None = None,
        leader_term: cdk.Duration | None = None,
        billing_mode: BillingMode = BillingMode.PAY_PER_REQUEST,
        table_layout: str | TableLayout = TableLayout.THREE_TABLES,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
        encryption_key: kms.IKey | None = None,
        initial_position: str = "LATEST",
        liveness_mode: str = "lease",
        metrics_namespace: str = DEFAULT_NAMESPACE,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        alarms: AlarmSettings | None = None,
        alarm_actions: Sequence[cw.IAlarmAction] = (),
        powertools_layer: lambda_.ILayerVersion | None = None,
        leader_environment: dict[str, str] | None = None,
        retrieval: str = "polling",
        fanout_consumer_name: str | None = None,
        failure_destination: sqs.IQueue | sns.ITopic | s3.IBucket | None = None,
        failure_destination_prefix: str = "failed/",
    ) -> None:
        super().__init__(scope, construct_id)
        self.application_name = validate_app_name(application_name)
        self.metrics_namespace = metrics_namespace
        failover_time = failover_time or cdk.Duration.seconds(10)
        leader_term = leader_term or cdk.Duration.seconds(65)
        leader_timeout = leader_timeout or cdk.Duration.seconds(80)
        if leader_timeout.to_seconds() < leader_term.to_seconds() + LEADER_DEADLINE_MARGIN_S:
            raise ValueError(
                f"leader_timeout must be at least leader_term + {LEADER_DEADLINE_MARGIN_S} s (the deadline margin)"
            )
        if initial_position not in {"LATEST", "TRIM_HORIZON"}:
            raise ValueError("initial_position must be LATEST or TRIM_HORIZON (AT_TIMESTAMP: use leader_environment)")

        liveness_mode = parse_setting(liveness_mode)  # a ConfigError names the allowed values

        if (stream is None) == (not streams):
            raise ValueError("give either stream or streams (a multi-stream application)")
        given = [stream] if stream is not None else list(streams)
        self.streams: list[kinesis.IStream] = [
            kinesis.Stream.from_stream_attributes(
                self, "Stream" if n == 0 else f"Stream{n}", stream_arn=s, encryption_key=stream_encryption_key
            )
            if isinstance(s, str)
            else s
            for n, s in enumerate(given)
        ]
        self.stream: kinesis.IStream = self.streams[0]  # the first (the only one unless multi-stream)
        self.multi_stream = multi_stream or len(self.streams) > 1
        keys = [stream_encryption_key] if stream_encryption_key is not None else []
        keys += [s.encryption_key for s in self.streams if s.encryption_key is not None]
        self.stream_encryption_keys: list[kms.IKey] = list({id(k): k for k in keys}.values())
        self.stream_encryption_key = self.stream_encryption_keys[0] if self.stream_encryption_keys else None
        self.encryption_key = encryption_key

        # --- tables ---------------------------------------------------------------------------------------
        self.table_layout = table_layout if isinstance(table_layout, TableLayout) else TableLayout.parse(table_layout)
        tables = build_tables(
            self,
            app=self.application_name,
            billing=billing_mode,
            removal_policy=removal_policy,
            encryption_key=encryption_key,
            specs=self.table_layout.specs(),
        )
        self.lease_table: dynamodb.Table = tables[TableKind.LEASES]
        # In single-table mode the lease table holds worker metrics and coordinator state too.
        self.worker_metrics_table: dynamodb.Table = tables.get(TableKind.WORKER_METRICS, self.lease_table)
        self.coordinator_state_table: dynamodb.Table = tables.get(TableKind.COORDINATOR_STATE, self.lease_table)
        self.lease_owner_index_arn = f"{self.lease_table.table_arn}/index/{LEASE_OWNER_INDEX.name}"

        # --- leader ---------------------------------------------------------------------------------------
        self.leader_log_group = logs.LogGroup(
            self, "LeaderLogs", retention=log_retention, removal_policy=cdk.RemovalPolicy.DESTROY
        )
        self.leader_role = iam.Role(
            self,
            "LeaderRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"shardlease leader of {self.application_name}: its tables and stream only",
        )
        self.leader_log_group.grant_write(self.leader_role)
        self.grant_leader(self.leader_role)
        environment = {
            "SHARDLEASE_APP": self.application_name,
            "SHARDLEASE_STREAM": cdk.Fn.join(",", [s.stream_name for s in self.streams]),
            **({"SHARDLEASE_MULTI_STREAM": "true"} if self.multi_stream else {}),
            **({"SHARDLEASE_TABLE_LAYOUT": self.table_layout.value} if self.table_layout.single else {}),
            "SHARDLEASE_FAILOVER_TIME_MS": str(int(failover_time.to_milliseconds())),
            "SHARDLEASE_LEADER_TERM_MS": str(int(leader_term.to_milliseconds())),
            "SHARDLEASE_INITIAL_POSITION": initial_position,
            "SHARDLEASE_LIVENESS_MODE": liveness_mode,
            "POWERTOOLS_METRICS_NAMESPACE": metrics_namespace,
            "POWERTOOLS_LOG_LEVEL": "INFO",
            **(leader_environment or {}),
        }
        self.leader_function = lambda_.Function(
            self,
            "Leader",
            description=f"shardlease leader of {self.application_name}: shard sync and lease assignment",
            runtime=LEADER_RUNTIME,
            architecture=LEADER_ARCHITECTURE,
            handler=LEADER_HANDLER,
            code=leader_code(),
            layers=[
                powertools_layer
                or lambda_.LayerVersion.from_layer_version_arn(self, "PowertoolsLayer", powertools_layer_arn())
            ],
            memory_size=256,
            timeout=leader_timeout,
            role=self.leader_role,
            log_group=self.leader_log_group,
            tracing=lambda_.Tracing.ACTIVE,
            environment=environment,
            retry_attempts=0,  # a failed run is not retried: the next scheduled invocation starts fresh
            max_event_age=cdk.Duration.minutes(1),
        )
        self.schedule_rule = events.Rule(
            self,
            "LeaderSchedule",
            description=f"invoke the shardlease leader of {self.application_name}",
            schedule=schedule or events.Schedule.rate(cdk.Duration.minutes(1)),
            targets=[
                targets.LambdaFunction(self.leader_function, retry_attempts=0, max_event_age=cdk.Duration.minutes(1))
            ],
        )

        # --- enhanced fan-out -------------------------------------------------------------------------------
        self.retrieval = RetrievalMode.parse(retrieval)
        self.fanout_consumer_name = fanout_consumer_name or self.application_name
        if not CONSUMER_NAME_PATTERN.match(self.fanout_consumer_name):
            raise ValueError(f"invalid fanout_consumer_name {self.fanout_consumer_name!r}")
        # Created here and never removed by a worker: a consumer deregistered when one worker stops would break
        # every other worker of the application.
        self.stream_consumers: list[kinesis.CfnStreamConsumer] = (
            [
                kinesis.CfnStreamConsumer(
                    self,
                    "StreamConsumer" if n == 0 else f"StreamConsumer{n}",
                    consumer_name=self.fanout_consumer_name,
                    stream_arn=s.stream_arn,
                )
                for n, s in enumerate(self.streams)
            ]
            if self.retrieval is RetrievalMode.FANOUT
            else []
        )

        # --- workers --------------------------------------------------------------------------------------
        self.failure_destination = failure_destination
        self.failure_destination_prefix = object_prefix(failure_destination_prefix)
        self.failure_destination_setting: str | None = destination_setting(
            failure_destination, self.failure_destination_prefix
        )
        """The workers' ``SHARDLEASE_FAILURE_DESTINATION`` for ``failure_destination``."""
        self.worker_policy = iam.ManagedPolicy(
            self,
            "WorkerPolicy",
            description=(
                f"shardlease workers of {self.application_name}: lease table read/write and GSI query, worker "
                f"metrics, stream read, PutMetricData to {metrics_namespace}"
            ),
            statements=[perm.statement() for perm in self.worker_permissions()],
        )

        self.spark_worker_policy = iam.ManagedPolicy(
            self,
            "SparkWorkerPolicy",
            description=(
                f"shardlease PySpark applications of {self.application_name} (EMR): the worker policy plus the "
                "Spark batch-end items"
            ),
            statements=[perm.statement() for perm in self.worker_permissions(spark=True)],
        )

        # --- observability --------------------------------------------------------------------------------
        self.observability = ShardleaseObservability(
            self,
            "Observability",
            app=self.application_name,
            namespace=metrics_namespace,
            function=self.leader_function,
            streams=self.streams,
            tables=self._tables_by_name(),
            alarms=alarms or AlarmSettings(),
            alarm_actions=alarm_actions,
        )
        self.dashboard = self.observability.dashboard

        acknowledge_findings(self)
        acknowledge_bucket_prefix(
            self.failure_destination, self.failure_destination_prefix, (self.worker_policy, self.spark_worker_policy)
        )

        cdk.CfnOutput(self, "LeaseTableName", value=self.lease_table.table_name)
        cdk.CfnOutput(self, "WorkerPolicyArn", value=self.worker_policy.managed_policy_arn)
        cdk.CfnOutput(self, "SparkWorkerPolicyArn", value=self.spark_worker_policy.managed_policy_arn)
        cdk.CfnOutput(self, "LeaderFunctionName", value=self.leader_function.function_name)
        if self.stream_consumers:
            cdk.CfnOutput(self, "FanoutConsumerArn", value=self.stream_consumers[0].attr_consumer_arn)
        if self.failure_destination_setting is not None:
            cdk.CfnOutput(self, "FailureDestination", value=self.failure_destination_setting)

    # --- permissions ---------------------------------------------------------------------------------------

    def _tables_by_name(self) -> dict[str, dynamodb.ITable]:
        app = self.application_name
        if self.table_layout.single:
            return {lease_table_name(app): self.lease_table}
        return {
            lease_table_name(app): self.lease_table,
            worker_metrics_table_name(app): self.worker_metrics_table,
            coordinator_state_table_name(app): self.coordinator_state_table,
        }

    def _stream_arns(self) -> tuple[str, ...]:
        return tuple(s.stream_arn for s in self.streams)

    def _key_permissions(self) -> list[p.Permission]:
        out = []
        if self.encryption_key is not None:
            out.append(
                p.Permission(
                    actions=p.TABLE_KEY_ACTIONS,
                    resources=(self.encryption_key.key_arn,),
                    conditions=p.via_dynamodb(cdk.Aws.REGION),
                )
            )
        return out

    def leader_permissions(self) -> list[p.Permission]:
        """What the leader calls: lease table + GSI, worker metrics sweep, lock/coordinator items, shard listing."""
        return [
            p.Permission(actions=p.LEADER_LEASE_ACTIONS, resources=(self.lease_table.table_arn,)),
            p.Permission(actions=p.INDEX_QUERY_ACTIONS, resources=(self.lease_owner_index_arn,)),
            p.Permission(actions=p.LEADER_WORKER_METRICS_ACTIONS, resources=(self.worker_metrics_table.table_arn,)),
            p.Permission(actions=p.LEADER_COORDINATOR_ACTIONS, resources=(self.coordinator_state_table.table_arn,)),
            p.Permission(actions=p.LEADER_STREAM_ACTIONS, resources=self._stream_arns()),
            *self._key_permissions(),
        ]

    def worker_permissions(self, *, embedded_leader: bool = False, spark: bool = False) -> list[p.Permission]:
        """What a worker calls; with ``embedded_leader`` also what the leader calls (``leader_mode="embedded"``);
        with ``spark`` the batch-end items a Spark source keeps in CoordinatorState (those keys only)."""
        perms = [
            p.Permission(actions=p.WORKER_LEASE_ACTIONS, resources=(self.lease_table.table_arn,)),
            p.Permission(actions=p.INDEX_QUERY_ACTIONS, resources=(self.lease_owner_index_arn,)),
            p.Permission(actions=p.WORKER_METRICS_ACTIONS, resources=(self.worker_metrics_table.table_arn,)),
            p.Permission(actions=p.WORKER_COORDINATOR_ACTIONS, resources=(self.coordinator_state_table.table_arn,)),
            p.Permission(actions=p.WORKER_STREAM_ACTIONS, resources=self._stream_arns()),
            *(
                [
                    p.Permission(
                        actions=p.FANOUT_ACTIONS, resources=tuple(c.attr_consumer_arn for c in self.stream_consumers)
                    )
                ]
                if self.stream_consumers
                else []
            ),
            p.put_metric_data(self.metrics_namespace),
            *self._key_permissions(),
            *destination_permissions(self.failure_destination, self.failure_destination_prefix),
        ]
        if self.stream_encryption_keys:
            perms.append(
                p.Permission(
                    actions=p.STREAM_KEY_ACTIONS, resources=tuple(k.key_arn for k in self.stream_encryption_keys)
                )
            )
        if spark:
            perms.append(
                p.Permission(
                    actions=p.SPARK_BATCH_ACTIONS,
                    resources=(self.coordinator_state_table.table_arn,),
                    conditions=p.spark_batch_keys_only(),
                )
            )
        if embedded_leader:
            perms += [perm for perm in self.leader_permissions() if perm not in perms]
        return perms

    def scale_ecs_service(self, service: ecs.BaseService, *, min_workers: int, max_workers: int) -> Any:
        """Drive the service's task count by the leader's DesiredWorkers (docs/autoscaling.md,
        :func:`worker_lib.cdk.scaling.scale_ecs_service`); returns the ``ScalableTarget``."""
        from worker_lib.cdk.scaling import scale_ecs_service

        return scale_ecs_service(
            service,
            namespace=self.metrics_namespace,
            application_name=self.application_name,
            min_workers=min_workers,
            max_workers=max_workers,
            leader_function=self.leader_function,
        )

    def grant_leader(self, grantee: iam.IGrantable) -> iam.Grant:
        """Grant what the leader needs (the Lambda role has it; use for a CLI or embedded leader's role)."""
        return p.grant_all(grantee, self.leader_permissions())

    def grant_worker(self, grantee: iam.IGrantable, *, embedded_leader: bool = False, spark: bool = False) -> iam.Grant:
        """Grant a worker role (EC2 instance profile, ECS task, EKS IRSA/Pod Identity, EMR job role) what it needs;
        ``spark=True`` for a PySpark application (driver and executors) using ``worker_lib.spark``."""
        return p.grant_all(grantee, self.worker_permissions(embedded_leader=embedded_leader, spark=spark))
