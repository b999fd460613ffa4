"""The leader Lambda's runtime, architecture and Powertools layer (:class:`~worker_lib.cdk.coordination.
ShardleaseCoordination` creates the function; its code is :mod:`.bundling`'s)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_

LEADER_RUNTIME = lambda_.Runtime.PYTHON_3_13
LEADER_ARCHITECTURE = lambda_.Architecture.ARM_64
LEADER_DEADLINE_MARGIN_S = 10
"""LeaderConfig.deadline_margin_ms: the leader stops this long before its deadline to release the lock cleanly."""
POWERTOOLS_LAYER_ACCOUNT = "017000801446"
POWERTOOLS_LAYER_VERSION = 27
"""Layer version 27 of ``AWSLambdaPowertoolsPythonV3-python313-arm64`` is Powertools 3.23.0 (any 3.x has the
Logger, Metrics and Tracer APIs the handler uses). Pass ``powertools_layer`` to pin another."""


def powertools_layer_arn(version: int = POWERTOOLS_LAYER_VERSION) -> str:
    """The public Powertools for AWS Lambda (Python) v3 layer for the leader's runtime and architecture."""
    runtime = LEADER_RUNTIME.name.replace(".", "")  # python3.13 -> python313
    return (
        f"arn:{cdk.Aws.PARTITION}:lambda:{cdk.Aws.REGION}:{POWERTOOLS_LAYER_ACCOUNT}:layer:"
        f"AWSLambdaPowertoolsPythonV3-{runtime}-arm64:{version}"
    )
