"""The CDK app: environment values only, read from ``cdk.json`` context (override with ``cdk deploy -c key=value``).

Context keys: ``shardlease:app`` (application name), ``shardlease:stream-arn`` or ``shardlease:stream-name``,
``shardlease:failover-time-ms``, ``shardlease:billing-mode``, ``shardlease:removal-policy``,
``shardlease:initial-position``, ``shardlease:liveness-mode``,
``shardlease:metrics-namespace``, ``shardlease:alarm-topic-arn``,
``shardlease:alarm-minutes``, ``shardlease:stack-name``. Account and region come from the CLI's environment
(``CDK_DEFAULT_ACCOUNT`` / ``CDK_DEFAULT_REGION``) when set; otherwise the stack is environment-agnostic.

Run by ``cdk.json`` as ``python -m infra`` (:mod:`infra.__main__`) from the repository root. The stacks are built
on the packaged construct (``worker_lib.cdk``, extra ``cdk``): this app is the example a pip user's own app follows
(docs/deploy.md).
"""

from __future__ import annotations

import os

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.stacks import ShardleaseStack


def _ctx(app: cdk.App, key: str, default: str | None = None) -> str | None:
    value = app.node.try_get_context(f"shardlease:{key}")
    return default if value in (None, "") else str(value)


def main() -> cdk.App:
    app = cdk.App()
    # cdk-nag 3: a validation plugin; any unacknowledged AwsSolutions finding fails `cdk synth`.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    account, region = os.environ.get("CDK_DEFAULT_ACCOUNT"), os.environ.get("CDK_DEFAULT_REGION")
    env = cdk.Environment(account=account, region=region) if account and region else None
    application = _ctx(app, "app")
    if not application:
        raise SystemExit("set the application name: cdk.json context shardlease:app or `-c shardlease:app=NAME`")
    ShardleaseStack(
        app,
        _ctx(app, "stack-name") or f"Shardlease-{application}".replace(".", "-"),
        env=env,
        description=f"shardlease coordination plane for {application} (tables, leader Lambda, IAM, dashboard)",
        application_name=application,
        stream_arn=_ctx(app, "stream-arn"),
        stream_name=_ctx(app, "stream-name"),
        failover_time_ms=int(_ctx(app, "failover-time-ms", "10000") or 10000),
        billing_mode=_ctx(app, "billing-mode", "PAY_PER_REQUEST") or "PAY_PER_REQUEST",
        removal_policy=_ctx(app, "removal-policy", "RETAIN") or "RETAIN",
        initial_position=_ctx(app, "initial-position", "LATEST") or "LATEST",
        liveness_mode=_ctx(app, "liveness-mode", "lease") or "lease",
        metrics_namespace=_ctx(app, "metrics-namespace"),
        alarm_topic_arn=_ctx(app, "alarm-topic-arn"),
        alarm_minutes=int(_ctx(app, "alarm-minutes", "5") or 5),
    )
    app.synth()
    return app


if __name__ == "__main__":
    main()
