"""The fan-out stream consumer's registration rules (botocore's Stubber answers as Kinesis would)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import CredentialsError
from worker_lib.retrieval.fanout import StreamConsumers

STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
CONSUMER_ARN = f"{STREAM_ARN}/consumer/orders-app:1700000000"


@pytest.fixture
def kinesis() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("kinesis", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def summary(stubber: Stubber) -> None:
    stubber.add_response(
        "describe_stream_summary",
        {
            "StreamDescriptionSummary": {
                "StreamName": "orders",
                "StreamARN": STREAM_ARN,
                "StreamStatus": "ACTIVE",
                "RetentionPeriodHours": 24,
                "StreamCreationTimestamp": 0,
                "EnhancedMonitoring": [],
                "OpenShardCount": 1,
            }
        },
        {"StreamName": "orders"},
    )


def described(status: str) -> dict[str, Any]:
    return {
        "ConsumerDescription": {
            "ConsumerName": "orders-app",
            "ConsumerARN": CONSUMER_ARN,
            "ConsumerStatus": status,
            "ConsumerCreationTimestamp": 0,
            "StreamARN": STREAM_ARN,
        }
    }


def test_a_missing_consumer_is_registered_and_waited_on_until_active(kinesis: tuple[Any, Stubber]) -> None:
    client, stubber = kinesis
    # GIVEN no consumer yet: Describe says not found, Register succeeds, it is CREATING once, then ACTIVE
    summary(stubber)
    stubber.add_client_error("describe_stream_consumer", "ResourceNotFoundException")
    stubber.add_response(
        "register_stream_consumer",
        {
            "Consumer": {
                "ConsumerName": "orders-app",
                "ConsumerARN": CONSUMER_ARN,
                "ConsumerStatus": "CREATING",
                "ConsumerCreationTimestamp": 0,
            }
        },
        {"StreamARN": STREAM_ARN, "ConsumerName": "orders-app"},
    )
    stubber.add_response("describe_stream_consumer", described("CREATING"))
    stubber.add_response("describe_stream_consumer", described("ACTIVE"))
    clock = ManualClock()
    # WHEN its ARN is asked for twice
    consumers = StreamConsumers(client, consumer_name="orders-app", clock=clock)
    # THEN it is registered once, waited on, and cached
    assert consumers.arn_for("orders") == CONSUMER_ARN
    assert consumers.arn_for("orders") == CONSUMER_ARN
    assert clock.monotonic() > 0  # it waited (on the injected clock)


def test_another_worker_registering_first_is_no_error(kinesis: tuple[Any, Stubber]) -> None:
    client, stubber = kinesis
    summary(stubber)
    stubber.add_client_error("describe_stream_consumer", "ResourceNotFoundException")
    stubber.add_client_error("register_stream_consumer", "ResourceInUseException")
    stubber.add_response("describe_stream_consumer", described("ACTIVE"))
    assert StreamConsumers(client, consumer_name="orders-app", clock=ManualClock()).arn_for("orders") == CONSUMER_ARN


def test_registration_throttling_is_retried_with_a_backoff(kinesis: tuple[Any, Stubber]) -> None:
    client, stubber = kinesis
    summary(stubber)
    stubber.add_client_error("describe_stream_consumer", "ResourceNotFoundException")
    stubber.add_client_error("register_stream_consumer", "LimitExceededException")
    stubber.add_client_error("register_stream_consumer", "LimitExceededException")
    stubber.add_response(
        "register_stream_consumer",
        {
            "Consumer": {
                "ConsumerName": "orders-app",
                "ConsumerARN": CONSUMER_ARN,
                "ConsumerStatus": "CREATING",
                "ConsumerCreationTimestamp": 0,
            }
        },
    )
    stubber.add_response("describe_stream_consumer", described("ACTIVE"))
    clock = ManualClock()
    assert StreamConsumers(client, consumer_name="orders-app", clock=clock).arn_for("orders") == CONSUMER_ARN
    assert clock.monotonic() >= 0.5 + 1.0  # two backoffs with jitter: at least half of 1 s and of 2 s


def test_no_permission_to_register_is_one_line_naming_the_way_out(kinesis: tuple[Any, Stubber]) -> None:
    client, stubber = kinesis
    summary(stubber)
    stubber.add_client_error("describe_stream_consumer", "ResourceNotFoundException")
    stubber.add_client_error("register_stream_consumer", "AccessDeniedException", "not authorized")
    with pytest.raises(CredentialsError) as caught:
        StreamConsumers(client, consumer_name="orders-app", clock=ManualClock()).arn_for("orders")
    message = str(caught.value)
    assert "\n" not in message
    assert "kinesis:RegisterStreamConsumer" in message and "SHARDLEASE_FANOUT_CONSUMER_ARN" in message


def test_a_given_consumer_arn_is_used_as_it_is(kinesis: tuple[Any, Stubber]) -> None:
    client, _ = kinesis  # no call may be made
    consumers = StreamConsumers(client, consumer_name="orders-app", consumer_arn=CONSUMER_ARN)
    assert consumers.arn_for("orders") == CONSUMER_ARN
