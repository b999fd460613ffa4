"""Where enhanced fan-out subscriptions start, and the retrieval settings."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from worker_lib.core.config import InitialPosition
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Checkpoint
from worker_lib.retrieval.config import RetrievalConfig, RetrievalMode
from worker_lib.retrieval.fanout import after, first_position

WHEN = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("start", "timestamp", "position", "floor"),
    [
        # a checkpoint: AT its sequence number, dropping what was delivered up to it (inside an aggregate too)
        (
            Checkpoint(sequence="4959", sub_sequence=2),
            None,
            {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "4959"},
            Checkpoint(sequence="4959", sub_sequence=2),
        ),
        (Checkpoint(sequence="TRIM_HORIZON"), None, {"Type": "TRIM_HORIZON"}, None),
        (Checkpoint(sequence="LATEST"), None, {"Type": "LATEST"}, None),
        (Checkpoint(sequence="AT_TIMESTAMP"), WHEN, {"Type": "AT_TIMESTAMP", "Timestamp": WHEN}, None),
        (InitialPosition.TRIM_HORIZON, None, {"Type": "TRIM_HORIZON"}, None),
    ],
)
def test_the_first_subscription_starts_where_polling_would(
    start: Checkpoint | InitialPosition,
    timestamp: datetime | None,
    position: dict[str, object],
    floor: Checkpoint | None,
) -> None:
    first = first_position(start, timestamp)
    assert first.position == position and first.floor == floor


def test_a_renewal_starts_after_everything_received() -> None:
    renewal = after("4960")
    assert renewal.position == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "4960"} and renewal.floor is None


@pytest.mark.parametrize(
    ("start", "timestamp", "fragment"),
    [
        (Checkpoint(sequence="AT_TIMESTAMP"), None, "needs a timestamp"),
        (Checkpoint(sequence="4959"), WHEN, "only valid with AT_TIMESTAMP"),
        (Checkpoint(sequence="not-a-number"), None, "not a sequence number"),
    ],
)
def test_impossible_starts_are_config_errors(start: Checkpoint, timestamp: datetime | None, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        first_position(start, timestamp)


def test_retrieval_settings_from_the_environment() -> None:
    config = RetrievalConfig.from_env(
        {
            "SHARDLEASE_RETRIEVAL": "FanOut",
            "SHARDLEASE_FANOUT_CONSUMER_NAME": "orders-efo",
        }
    )
    assert config.mode is RetrievalMode.FANOUT and config.fanout
    assert config.consumer_name_for("orders") == "orders-efo"
    assert RetrievalConfig().consumer_name_for("orders") == "orders"  # KCL's default: the application's name
    assert not RetrievalConfig().fanout


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"mode": "push"}, "expected polling or fanout"),
        ({"consumer_name": "has space"}, "invalid fan-out consumer name"),
        ({"consumer_arn": "arn:aws:kinesis:us-east-1:123456789012:stream/s"}, "invalid fan-out consumer ARN"),
        ({"fanout_buffer_events": 0}, "at least 1"),
    ],
)
def test_bad_retrieval_settings_are_one_line(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        RetrievalConfig(**kwargs)  # type: ignore[arg-type]
