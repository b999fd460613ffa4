"""cdk-nag AwsSolutions (cdk-nag 3: a validation plugin) passes, with acknowledgements scoped to one construct each."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from cdk_nag import AwsSolutionsChecks

from infra.stacks import ShardleaseStack
from worker_lib.cdk.coordination import NAG_ACKNOWLEDGEMENTS

from .support import ACCOUNT, APP, REGION, STREAM_ARN


def _app_with_nag() -> tuple[cdk.App, ShardleaseStack]:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = ShardleaseStack(
        app, "Nag", env=cdk.Environment(account=ACCOUNT, region=REGION), application_name=APP, stream_arn=STREAM_ARN
    )
    return app, stack


def test_given_aws_solutions_checks_when_synthesizing_the_stack_then_no_unacknowledged_finding() -> None:
    # GIVEN the stack with the AwsSolutions validation plugin
    app, _ = _app_with_nag()
    # WHEN synthesizing THEN no finding fails it
    app.synth()


def test_given_the_acknowledgements_then_each_has_a_reason_and_names_one_rule() -> None:
    assert {rule for rule, _, _ in NAG_ACKNOWLEDGEMENTS} == {
        "AwsSolutions-IAM5[Resource::*]",
        "AwsSolutions-L1",
        "AwsSolutions-DDB3",
    }
    for _rule, path, reason in NAG_ACKNOWLEDGEMENTS:
        assert len(path) == 1 and len(reason) > 80


def test_given_a_new_wildcard_elsewhere_when_synthesizing_then_nag_still_fails() -> None:
    # GIVEN an extra role with a wildcard resource outside the acknowledged constructs
    app, stack = _app_with_nag()
    role = iam.Role(stack, "Stray", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=["*"]))
    # WHEN synthesizing THEN the finding is reported: the acknowledgements do not leak to other constructs
    with pytest.raises(RuntimeError, match=r"AwsSolutions-IAM5|Validation failed"):
        app.synth()
